"""Guardrails: the circuit breaker per job, the isolation budget across all jobs, node and
relaunch cooldowns, the protective-checkpoint interval and repair marks.

:meth:`Guardrails.check` says why a plan may not run now as a typed
:class:`Refusal` (``kind`` for code, ``text`` for people); the policy opens a breaker on
:attr:`RefusalKind.BREAKER` and trips the global budget on
:attr:`RefusalKind.GLOBAL_BUDGET`, never by reading the text.

Isolations are bounded per job (the circuit breaker: ``max_isolations`` or
``max_isolation_pct`` of the job's nodes per ``window_s``) and across all jobs
(``max_isolations_global`` per window), so invented job ids do not bypass the bound.

Examples
--------
>>> Refusal(RefusalKind.NODE_COOLDOWN, "node n1 is cooling down").trips
False
>>> kind_of_detail("circuit breaker: 3 isolations in the last 3600s, limit 3")
<RefusalKind.BREAKER: 'breaker'>
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from pipeline.policy.memory import Cap, drop_front, touch
from pipeline.policy.params import PolicyParams
from schemas import (
    Alert,
    AlertKind,
    AlertState,
    Command,
    CommandKind,
    Evidence,
    Grade,
    RecommendedAction,
    episode_fingerprint,
)

__all__ = ["GLOBAL_BUDGET", "Breaker", "Guardrails", "Refusal", "RefusalKind", "kind_of_detail"]

#: start of the detail of an isolation refused by the budget across all jobs
GLOBAL_BUDGET = "global isolation budget"
_BREAKER_TRIP = "circuit breaker:"
_RELAUNCH = (CommandKind.RESTART, CommandKind.ROLLBACK)


class RefusalKind(StrEnum):
    """Why a guardrail refused a plan."""

    RELAUNCH_COOLDOWN = "relaunch-cooldown"
    NODE_COOLDOWN = "node-cooldown"
    BREAKER_OPEN = "breaker-open"
    #: the per-job isolation limit is reached: opens the job's breaker
    BREAKER = "breaker"
    GLOBAL_OPEN = "global-open"
    #: the isolation budget across all jobs is spent: trips the global breaker
    GLOBAL_BUDGET = "global-budget"


@dataclass(frozen=True, slots=True)
class Refusal:
    """A guardrail's refusal: ``kind`` for code, ``text`` for records and people."""

    kind: RefusalKind
    text: str

    @property
    def trips(self) -> bool:
        """Whether this refusal opens a breaker (per job or global)."""
        return self.kind in (RefusalKind.BREAKER, RefusalKind.GLOBAL_BUDGET)


def kind_of_detail(detail: str) -> RefusalKind | None:
    """The tripping refusal kind a REFUSED record's detail was written for (records read
    back from the actions topic carry the text the actuator wrote), else ``None``."""
    if detail.startswith(_BREAKER_TRIP):
        return RefusalKind.BREAKER
    if detail.startswith(GLOBAL_BUDGET + ":"):
        return RefusalKind.GLOBAL_BUDGET
    return None


@dataclass(slots=True)
class Breaker:
    fingerprint: str
    open_until: datetime
    step: int | None
    node: str | None
    job: str  # the job it guards, or the job whose isolation tripped the global budget
    everywhere: bool = False  # the global isolation budget rather than one job's


class Guardrails:
    """Breaker, budget, cooldown and repair state, with the checks over it.

    Parameters
    ----------
    params
        The policy's current parameters (the policy replaces them on a control change).
    cap
        The hard cap shared by every map of the policy.
    """

    def __init__(self, params: PolicyParams, cap: Cap) -> None:
        self.params = params
        self._cap = cap
        #: nodes isolated twice within a window -> when marked (never spares again)
        self.repair: dict[str, datetime] = {}
        #: job -> its size in nodes (control messages)
        self.job_nodes: dict[str, int] = {}
        #: (issued_at, job, node) of every isolation, oldest first
        self.isolations: list[tuple[datetime, str, str]] = []
        self.last_acted: dict[str, datetime] = {}
        self.last_checkpoint: dict[str, datetime] = {}
        #: job -> its last relaunch that replaced no node / that replaced one
        self.last_relaunch: dict[str, datetime] = {}
        self.last_replacement: dict[str, datetime] = {}
        self.breakers: dict[str, Breaker] = {}
        self.global_breaker: Breaker | None = None

    # -- checks ------------------------------------------------------------------------
    def check(
        self, alert: Alert, commands: tuple[Command, ...], isolated: str | None, now: datetime
    ) -> Refusal | None:
        """Why the plan (``commands``, removing node ``isolated``) may not run now."""
        if not any(c.kind is not CommandKind.NOTIFY for c in commands):
            return None
        # a relaunch that replaces a node is governed by the circuit breaker; one that
        # only relaunches (hang, divergence) must not loop
        relaunches = isolated is None and any(c.kind in _RELAUNCH for c in commands)
        last = self.last_relaunch.get(alert.job_id)
        replaced = self.last_replacement.get(alert.job_id)
        if replaced is not None and any(c.kind is CommandKind.RESTART for c in commands):
            last = replaced if last is None else max(last, replaced)
        if relaunches and last is not None:
            since = (now - last).total_seconds()
            if since < self.params.relaunch_cooldown_s:
                cool = self.params.relaunch_cooldown_s
                return Refusal(
                    RefusalKind.RELAUNCH_COOLDOWN,
                    f"job {alert.job_id} relaunched {since:.0f}s ago (< {cool:.0f}s)",
                )
        node = alert.node
        if node is not None and node in self.last_acted:
            since = (now - self.last_acted[node]).total_seconds()
            if since < self.params.node_cooldown_s:
                cool = self.params.node_cooldown_s
                return Refusal(
                    RefusalKind.NODE_COOLDOWN,
                    f"node {node} is cooling down ({since:.0f}s < {cool:.0f}s)",
                )
        if isolated is None:
            return None
        job = alert.job_id
        if job in self.breakers:
            return Refusal(RefusalKind.BREAKER_OPEN, f"circuit breaker open for job {job}")
        count, limit = self.isolations_in_window(job, now), self.isolation_limit(job)
        if count + 1 > limit:
            return Refusal(
                RefusalKind.BREAKER,
                f"{_BREAKER_TRIP} {count} isolations in the last {self.params.window_s:.0f}s, "
                f"limit {limit}",
            )
        if self.global_breaker is not None:
            return Refusal(RefusalKind.GLOBAL_OPEN, f"{GLOBAL_BUDGET} exhausted (breaker open)")
        total, budget = self.isolations_in_window(None, now), self.params.max_isolations_global
        if total + 1 > budget:
            return Refusal(
                RefusalKind.GLOBAL_BUDGET,
                f"{GLOBAL_BUDGET}: {total} isolations across all jobs in the last "
                f"{self.params.window_s:.0f}s, limit {budget}",
            )
        return None

    def checkpointed_recently(self, job: str, now: datetime) -> bool:
        """Whether a protective checkpoint of ``job`` was issued within
        ``checkpoint_min_interval_s``."""
        recent = self.last_checkpoint.get(job)
        return recent is not None and (now - recent).total_seconds() < (
            self.params.checkpoint_min_interval_s
        )

    # -- bookkeeping -------------------------------------------------------------------
    def apply_issue(self, cmd: Command, now: datetime, spares: list[str]) -> None:
        """Bookkeeping of an issued command: cooldowns, isolation ledger, repair marks;
        spares it brings in (or marks for repair) leave ``spares``."""
        cap = self._cap
        if cmd.kind is CommandKind.CHECKPOINT:
            touch(self.last_checkpoint, cmd.job_id, now)
            cap(self.last_checkpoint)
        if cmd.kind in _RELAUNCH:
            # a node replacement's restart counts for restarts: the job is relaunching
            # and its silence must not be answered with another restart; it does not
            # block a rollback (a further replacement is the circuit breaker's business)
            into = self.last_replacement if cmd.targets else self.last_relaunch
            touch(into, cmd.job_id, now)
            cap(into)
        for node in cmd.targets:
            if cmd.kind is not CommandKind.NOTIFY:
                touch(self.last_acted, node, max(now, self.last_acted.get(node, now)))
                cap(self.last_acted)
        for spare in cmd.replacements:
            if spare in spares:
                spares.remove(spare)
        if cmd.kind is not CommandKind.ISOLATE:
            return
        since = now - timedelta(seconds=self.params.window_s)
        for node in cmd.targets:
            previous = [ts for ts, _, n in self.isolations if n == node and ts > since]
            bisect.insort(self.isolations, (now, cmd.job_id, node), key=lambda i: i[0])
            if previous:
                touch(self.repair, node, now)  # oldest mark first out at the cap
                cap(self.repair)
                if node in spares:
                    spares.remove(node)
        excess = len(self.isolations) - self.params.max_tracked
        if excess > 0:
            del self.isolations[:excess]
            cap.evicted += excess

    def trip(self, alert: Alert, refusal: Refusal, now: datetime) -> list[Alert]:
        """Open the breaker a tripping refusal of an isolation calls for (once)."""
        if refusal.kind is RefusalKind.BREAKER and alert.job_id not in self.breakers:
            return [self._open_breaker(alert, now, refusal.text)]
        if refusal.kind is RefusalKind.GLOBAL_BUDGET and self.global_breaker is None:
            return [self._open_global_breaker(alert, now, refusal.text)]
        return []

    def restore_refusal(self, kind: RefusalKind, alert: Alert, ts: datetime) -> None:
        """A tripping refusal read back at start-up opens its breaker again until its
        window ends."""
        a, until = alert, ts + timedelta(seconds=self.params.window_s)
        if kind is RefusalKind.BREAKER:
            fp = episode_fingerprint(a.job_id, AlertKind.GUARDRAIL.value, None, None,
                                     int(ts.timestamp()))  # fmt: skip
            b = self.breakers.get(a.job_id)
            if b is None or b.open_until < until:
                touch(self.breakers, a.job_id, Breaker(fp, until, a.step, a.node, a.job_id))
                self._cap(self.breakers)
        elif kind is RefusalKind.GLOBAL_BUDGET:
            g = self.global_breaker
            if g is None or g.open_until < until:
                fp = episode_fingerprint("*", "global-" + AlertKind.GUARDRAIL.value, None,
                                         None, int(ts.timestamp()))  # fmt: skip
                self.global_breaker = Breaker(fp, until, a.step, a.node, a.job_id, True)

    def reset(self, sent: datetime, now: datetime, *, replay: bool) -> list[Alert]:
        """An operator's ``reset_breaker`` sent at ``sent``: close the breakers (in a
        replay, only those that tripped before it was sent)."""

        def resets(b: Breaker) -> bool:
            return not replay or self._tripped_at(b) <= sent

        alerts = [self._resolve_breaker(j, now) for j, b in list(self.breakers.items())
                  if resets(b)]  # fmt: skip
        if self.global_breaker is not None and resets(self.global_breaker):
            alerts.append(self._resolve_global_breaker(now))
        return alerts

    def close_expired(self, now: datetime) -> list[Alert]:
        alerts = []
        for job, b in list(self.breakers.items()):
            if now >= b.open_until or len(self.breakers) > self.params.max_tracked:
                alerts.append(self._resolve_breaker(job, now))
        if self.global_breaker is not None and now >= self.global_breaker.open_until:
            alerts.append(self._resolve_global_breaker(now))
        return alerts

    def prune(self, cut: datetime, now: datetime, *, full: bool) -> None:
        """Forget cooldowns and isolations older than ``cut``; ``full`` scans everything
        and drops breakers rebuilt from records whose window is over."""
        maps = (self.last_acted, self.last_checkpoint, self.last_relaunch, self.last_replacement)
        if full:
            for d in maps:
                for key in [k for k, t in d.items() if t < cut]:
                    del d[key]
            self.breakers = {k: b for k, b in self.breakers.items() if b.open_until > now}
            if self.global_breaker is not None and self.global_breaker.open_until <= now:
                self.global_breaker = None
        for d in maps:
            drop_front(d, lambda t: t < cut)
        stale = bisect.bisect_left(self.isolations, cut, key=lambda i: i[0])
        del self.isolations[:stale]

    # -- queries -----------------------------------------------------------------------
    def isolations_in_window(self, job_id: str | None, now: datetime) -> int:
        """Isolations of ``job_id`` (``None``: of every job) within the guard window."""
        since = now - timedelta(seconds=self.params.window_s)
        return sum(
            1 for ts, job, _ in self.isolations if (job_id is None or job == job_id) and ts > since
        )

    def isolation_limit(self, job_id: str) -> int:
        size = self.job_nodes.get(job_id, self.params.default_job_nodes)
        limit = self.params.max_isolations
        if size > 0 and self.params.max_isolation_pct > 0:
            # rounded up, like Kubernetes' maxUnavailable: a small job may still lose
            # one node per window (5 % of 16 nodes allows 1, not 0)
            limit = min(limit, math.ceil(size * self.params.max_isolation_pct / 100 - 1e-9))
        elif size > 0:
            limit = 0
        return limit

    # -- breaker alerts ----------------------------------------------------------------
    def _tripped_at(self, b: Breaker) -> datetime:
        return b.open_until - timedelta(seconds=self.params.window_s)

    def _open_breaker(self, alert: Alert, now: datetime, why: str) -> Alert:
        job = alert.job_id
        count, limit = self.isolations_in_window(job, now), self.isolation_limit(job)
        fp = episode_fingerprint(job, AlertKind.GUARDRAIL.value, None, None, int(now.timestamp()))
        self.breakers[job] = b = Breaker(
            fp, now + timedelta(seconds=self.params.window_s), alert.step, alert.node, job
        )
        return self._breaker_alert(b, AlertState.FIRING, 0, now, count, limit, why)

    def _open_global_breaker(self, alert: Alert, now: datetime, why: str) -> Alert:
        """Trip the global isolation budget: one guardrail alert for all jobs."""
        total, budget = self.isolations_in_window(None, now), self.params.max_isolations_global
        fp = episode_fingerprint("*", "global-" + AlertKind.GUARDRAIL.value, None, None,
                                 int(now.timestamp()))  # fmt: skip
        self.global_breaker = b = Breaker(
            fp, now + timedelta(seconds=self.params.window_s), alert.step, alert.node,
            alert.job_id, everywhere=True,
        )  # fmt: skip
        return self._breaker_alert(b, AlertState.FIRING, 0, now, total, budget, why)

    def _breaker_alert(
        self, b: Breaker, state: AlertState, seq: int, now: datetime, count: int, limit: int,
        why: str,
    ) -> Alert:  # fmt: skip
        what = (
            f"actuator {GLOBAL_BUDGET} (all jobs; tripped by job {b.job})"
            if b.everywhere else f"actuator circuit breaker for job {b.job}"
        )  # fmt: skip
        return Alert(
            fingerprint=b.fingerprint, seq=seq, kind=AlertKind.GUARDRAIL, grade=Grade.CRITICAL,
            state=state, job_id=b.job, node=b.node, step=b.step,
            started_at=b.open_until - timedelta(seconds=self.params.window_s), ts=now,
            evidence=Evidence(metric="isolations_in_window", value=float(count),
                              deviation=float(count) / max(limit, 1), detail=why),
            recommended_action=RecommendedAction.INVESTIGATE,
            summary=f"{what}: {why}",
        )  # fmt: skip

    def _resolve_breaker(self, job: str, now: datetime) -> Alert:
        count, limit = self.isolations_in_window(job, now), self.isolation_limit(job)
        b = self.breakers.pop(job)
        return self._breaker_alert(b, AlertState.RESOLVED, 1, now, count, limit, "closed")

    def _resolve_global_breaker(self, now: datetime) -> Alert:
        b = self.global_breaker
        assert b is not None
        self.global_breaker = None
        total, budget = self.isolations_in_window(None, now), self.params.max_isolations_global
        return self._breaker_alert(b, AlertState.RESOLVED, 1, now, total, budget, "closed")
