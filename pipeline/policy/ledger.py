"""The ledger: commands issued (their ids, so a replay issues nothing twice) and the
latest record of every action, with the holds among them.

Examples
--------
>>> from datetime import UTC, datetime
>>> from pipeline.policy.memory import Cap
>>> ledger = Ledger(Cap(10))
>>> ledger.issue("cmd-1", datetime(2026, 1, 1, tzinfo=UTC))
>>> "cmd-1" in ledger.issued, ledger.held
(True, [])
"""

from __future__ import annotations

from datetime import datetime

from pipeline.policy.memory import Cap, drop_front, touch
from schemas import ActionRecord, ActionState

__all__ = ["Ledger"]


class Ledger:
    """Issued command ids and action records, ordered oldest first, capped by ``cap``."""

    def __init__(self, cap: Cap) -> None:
        self._cap = cap
        #: command id -> when issued
        self.issued: dict[str, datetime] = {}
        #: latest record per action id, oldest first
        self.actions: dict[str, ActionRecord] = {}
        #: held action id -> held since
        self.holding: dict[str, datetime] = {}

    @property
    def held(self) -> list[ActionRecord]:
        return [self.actions[a] for a in self.holding]

    def issue(self, cid: str, now: datetime) -> None:
        touch(self.issued, cid, now)
        self._cap(self.issued)

    def keep(self, rec: ActionRecord) -> None:
        """Remember ``rec`` as the latest record of its action."""
        touch(self.actions, rec.action_id, rec)
        if rec.state is ActionState.HELD:
            touch(self.holding, rec.action_id, rec.ts)
        else:
            self.holding.pop(rec.action_id, None)
        self._cap(self.actions, also=self.holding)  # an evicted action is not held

    def record(
        self,
        base: ActionRecord,
        state: ActionState,
        now: datetime,
        detail: str,
        by: str | None = None,
    ) -> ActionRecord:
        """A new record of ``base``'s action in ``state``, remembered."""
        rec = base.model_copy(
            update={"state": state, "detail": detail, "ts": now, "by": by or base.by}
        )
        self.keep(rec)
        return rec

    def prune(self, cut: datetime, *, full: bool) -> None:
        """Forget ids and records older than ``cut``; a hold leaves by expiring
        (``hold_ttl_s`` <= the horizon), never by pruning."""
        if full:
            self.issued = {k: t for k, t in self.issued.items() if t >= cut}
            self.actions = {
                k: r for k, r in self.actions.items()
                if r.ts >= cut or r.state is ActionState.HELD
            }  # fmt: skip
        drop_front(self.issued, lambda t: t < cut)
        drop_front(self.actions, lambda r: r.ts < cut and r.state is not ActionState.HELD)
