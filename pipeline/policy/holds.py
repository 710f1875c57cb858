"""Approval holds: what a held action tells people, when it expires, when it is cancelled.

Held actions (approve mode) are announced: a NOTIFY command for the webhook and a
GUARDRAIL alert on the decisions topic, both naming the action id and the held alert's
kind, grade, node, rank and age. Undecided after ``hold_ttl_s`` a hold expires: a
CANCELLED record whose detail starts with :data:`EXPIRED`; the GUARDRAIL alert resolves
whenever the hold ends (approved, rejected, expired, cancelled).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pipeline.policy.ledger import Ledger
from pipeline.policy.params import Outcome
from schemas import (
    ActionRecord,
    ActionState,
    ActuatorMode,
    Alert,
    AlertKind,
    AlertState,
    Command,
    CommandKind,
    Evidence,
    Grade,
    RecommendedAction,
    command_id,
)

__all__ = ["EXPIRED", "Holds"]

#: detail of the record of a hold that nobody decided in time (state CANCELLED)
EXPIRED = "expired"


class Holds:
    """The holds among the ledger's records, decided within ``hold_ttl_s``."""

    def __init__(self, ledger: Ledger, hold_ttl_s: float) -> None:
        self.ledger = ledger
        self.hold_ttl_s = hold_ttl_s

    def expire(self, now: datetime) -> Outcome:
        """Holds nobody decided within ``hold_ttl_s``: CANCELLED (expired)."""
        out = Outcome()
        ttl = self.hold_ttl_s
        for aid, since in list(self.ledger.holding.items()):
            if (now - since).total_seconds() >= ttl:
                held = self.ledger.actions[aid]
                why = f"{EXPIRED}: neither approved nor rejected within {ttl:.0f}s"
                out.records.append(self.ledger.record(held, ActionState.CANCELLED, now, why))
                out.alerts.append(self.notice(held, now, why))
        return out

    def cancel(self, fingerprint: str, now: datetime) -> Outcome:
        """The episode ``fingerprint`` resolved: its holds are cancelled."""
        out = Outcome()
        for rec in self.ledger.held:
            if fingerprint in rec.reason:
                out.records.append(
                    self.ledger.record(rec, ActionState.CANCELLED, now, "episode resolved")
                )
                out.alerts.append(self.notice(rec, now, "cancelled: episode resolved"))
        return out

    def text(self, held: ActionRecord) -> tuple[str, float]:
        """What a person needs to decide on a hold, and the held alert's age (s)."""
        a, aid = held.alert, held.action_id
        if a is None:  # records always carry their alert; older ones may not
            what, age = "alert", 0.0
        else:
            age = max(0.0, (a.ts - a.started_at).total_seconds())
            where = f"node {a.node}" if a.node else "the whole job"
            rank = "" if a.rank is None else f" rank {a.rank}"
            what = f"{a.kind.value} {a.grade.value} on {where}{rank}, firing for {age:.0f}s"
        return (
            f"waiting for approval: {aid} ({what}) in job {held.job_id}: {held.summary}; "
            f"`stepguard approve {aid}` or `stepguard reject {aid} --reason ...` "
            f"within {self.hold_ttl_s:.0f}s"
        ), age

    def notice(self, held: ActionRecord, now: datetime, ended: str = "") -> Alert:
        """The decisions-topic side of a hold: FIRING while held, RESOLVED once it ends
        (``ended`` says how). ``held`` is the HELD record."""
        text, age = self.text(held)
        a = held.alert
        return Alert(
            fingerprint="held-" + held.action_id.removeprefix("act-"), seq=1 if ended else 0,
            kind=AlertKind.GUARDRAIL, grade=a.grade if a else Grade.WARNING,
            state=AlertState.RESOLVED if ended else AlertState.FIRING, job_id=held.job_id,
            node=a.node if a else None, rank=a.rank if a else None, step=a.step if a else None,
            started_at=held.ts, ts=now,
            evidence=Evidence(metric="held_alert_age_s", value=age, deviation=0.0,
                              detail=ended or f"action {held.action_id} awaits approval"),
            recommended_action=RecommendedAction.INVESTIGATE,
            summary=f"{ended}: {held.action_id}" if ended else text,
        )  # fmt: skip

    def command(self, held: ActionRecord, now: datetime) -> Command:
        """The NOTIFY that carries a hold to people (the webhook executor posts it)."""
        text, _ = self.text(held)
        a = held.alert
        targets = (a.node,) if a is not None and a.node else ()
        return Command(
            command_id=command_id(held.reason, f"notify-held:{held.action_id}", targets),
            kind=CommandKind.NOTIFY, job_id=held.job_id, targets=targets,
            reason=held.reason, mode=ActuatorMode.APPROVE, issued_at=now,
            expires_at=now + timedelta(seconds=self.hold_ttl_s), summary=text[:500],
            grade=a.grade if a is not None else None,
        )  # fmt: skip
