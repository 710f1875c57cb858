"""What a job's own exporters may change about its detection, and no more.

Lifecycle events and health reports come from exporters, the least trusted writers:
any job's training code, any node agent. Believed as they came, one unsigned ``end``
dated a few minutes ahead resolved a running job's episodes and dropped its state (it
then hung unseen), one ``phase`` of a week and step 10**15 gave the hang clock ten
days, and one health report naming a node that never ran the job got that node
isolated. :class:`JobGuard` holds what the job's own records say against them, for
the detection core (:class:`~detectors.job.JobDetection`):

- **End.** An end is *pending* while the job's steps may still contradict it: a step
  after the end's step (or, without one, its time) refuses it, and the job stays
  watched; an end naming a step the job has already passed is refused at once. A
  pending end is confirmed ``end_confirm_s`` of event time later.
- **Phase.** The allowance is cut to ``max_phase_s``; a phase whose step is more than
  ``max_phase_lead_steps`` beyond the job's last step is refused.
- **Wait.** A wait for input gives the step after its own one allowance
  (:meth:`~detectors.hang.HangDetector.waiting`), under the phase's rules of step and
  time; one that names no step says nothing of the step in progress and is ignored.
- **Time.** An end, phase or wait dated more than ``max_lead_s`` ahead of the job's event
  time is taken as of that time.
- **Members.** The job's nodes are those seen in its steps or declared by its start
  event (bounded by ``max_nodes``); a health report of any other node is not judged
  for the job, only noticed once (an INFO recommending nothing).

Each refusal or cut is a ``lifecycle`` WARNING (one episode per kind of event, each
anomaly an update, resolved when the job ends).

Examples
--------
>>> from datetime import UTC, datetime
>>> from schemas import EndReason, JobEvent, JobEventKind
>>> guard = JobGuard("j")
>>> t = datetime(2026, 1, 1, tzinfo=UTC)
>>> end = JobEvent(job_id="j", kind=JobEventKind.END, reason=EndReason.COMPLETED, ts=t, step=9)
>>> guard.on_event(end, now=t.timestamp(), last_step=9).alerts, guard.ending.reason
([], 'completed')
>>> [a.summary[:40] for a in guard.contradict(step=10, ts=t.timestamp() + 1)]
['lifecycle anomaly: step 10 completed aft']
>>> guard.ending is None
True
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from detectors.errors import CapacityError
from schemas import (
    Alert,
    AlertKind,
    AlertState,
    Evidence,
    Grade,
    JobEvent,
    JobEventKind,
    NodeHealth,
    RecommendedAction,
    episode_fingerprint,
)
from schemas.lifecycle import MAX_NODES_PER_JOB

__all__ = ["MAX_OUTSIDERS", "JobGuard", "LifecycleLimits", "PendingEnd", "Verdict"]

#: Outside nodes whose health a job notices (one INFO each); more are only counted.
MAX_OUTSIDERS = 64


@dataclass(frozen=True, slots=True)
class LifecycleLimits:
    """How far a job's unsigned lifecycle events are trusted.

    Parameters
    ----------
    max_phase_s
        Longest allowance an announced phase gets (``STEPGUARD_MAX_PHASE_S``).
    end_confirm_s
        Event time an end stays pending (refused by any later step) before it takes
        effect (``STEPGUARD_END_CONFIRM_S``).
    max_lead_s
        How far ahead of the job's event time an end or phase may be dated.
    max_phase_lead_steps
        How far beyond the job's last step a phase's step may be.
    """

    max_phase_s: float = 3600.0
    end_confirm_s: float = 60.0
    max_lead_s: float = 30.0
    max_phase_lead_steps: int = 16

    def __post_init__(self) -> None:
        for name in ("max_phase_s", "end_confirm_s", "max_lead_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        if self.max_phase_lead_steps < 0:
            raise ValueError(
                f"max_phase_lead_steps must be >= 0, got {self.max_phase_lead_steps!r}"
            )


@dataclass(slots=True)
class PendingEnd:
    """An end the job's records have not contradicted yet: dated ``ts`` (cut to the
    job's event time), read at the job's event time ``since``."""

    reason: str
    ts: float
    step: int | None
    since: float


@dataclass(slots=True)
class Verdict:
    """What a lifecycle event may do: the anomalies it raised, and for an accepted
    phase its allowance (``phase``, event time, expected seconds, step), for an
    accepted wait for input its start (``wait``, event time, the step it follows)."""

    alerts: list[Alert] = field(default_factory=list)
    phase: tuple[str, float, float | None, int | None] | None = None
    wait: tuple[float, int] | None = None


class JobGuard:
    """The job's members and the trust its lifecycle events get (module docstring)."""

    def __init__(
        self,
        job_id: str,
        limits: LifecycleLimits | None = None,
        max_nodes: int = MAX_NODES_PER_JOB,
    ) -> None:
        if not 1 <= max_nodes <= MAX_NODES_PER_JOB:
            raise ValueError(f"max_nodes must be in [1, {MAX_NODES_PER_JOB}], got {max_nodes!r}")
        self.job_id = job_id
        self.limits = limits or LifecycleLimits()
        self.max_nodes = max_nodes
        #: nodes of the job: seen in its steps or declared by its start event
        self.members: set[str] = set()
        self._outsiders: set[str] = set()
        self.outside_reports = 0  #: health reports of nodes outside the job
        self.ending: PendingEnd | None = None
        #: open anomaly episodes: "end" | "phase" -> (fingerprint, seq, started)
        self._anomalies: dict[str, tuple[str, int, float]] = {}

    # -- members -------------------------------------------------------------------
    def join(self, node: str) -> None:
        """A node reporting a step is a member; :class:`CapacityError` beyond
        ``max_nodes`` (before anything grows)."""
        if node not in self.members:
            if len(self.members) >= self.max_nodes:
                raise CapacityError(
                    f"job {self.job_id} would have more than {self.max_nodes} nodes"
                )
            self.members.add(node)

    def learn(self, nodes: Iterable[str]) -> None:
        """Nodes of an assembled frame (a driver may hand frames over directly)."""
        if len(self.members) < self.max_nodes:
            self.members.update(nodes)

    def outsider(self, msg: NodeHealth, step: int) -> list[Alert]:
        """A report of a node outside the job: one INFO notice per node (bounded)."""
        self.outside_reports += 1
        if msg.node in self._outsiders or len(self._outsiders) >= MAX_OUTSIDERS:
            return []
        self._outsiders.add(msg.node)
        fp = episode_fingerprint(
            self.job_id, "outside-node", msg.node, None, round(msg.ts.timestamp() * 1000)
        )
        return [
            Alert(
                fingerprint=fp,
                seq=0,
                kind=AlertKind.HARDWARE,
                grade=Grade.INFO,
                state=AlertState.RESOLVED,
                job_id=self.job_id,
                node=msg.node,
                step=step,
                started_at=msg.ts,
                ts=msg.ts,
                evidence=Evidence(
                    metric="member_of_job",
                    value=0.0,
                    deviation=0.0,
                    detail="neither seen in the job's steps nor declared by its start",
                ),
                recommended_action=RecommendedAction.NONE,
                summary=f"health of {msg.node} names job {self.job_id}, which it is not a "
                "member of: not judged for the job (no isolation)",
            )
        ]

    # -- lifecycle -----------------------------------------------------------------
    def on_event(self, event: JobEvent, now: float | None, last_step: int) -> Verdict:
        """Judge a lifecycle event against the job's event time ``now`` and its last
        step; an accepted end becomes :attr:`ending`."""
        lim, out = self.limits, Verdict()
        if event.kind is JobEventKind.START:
            self.learn(event.nodes[: max(0, self.max_nodes - len(self.members))])
            return out
        what, ts = event.kind.value, event.ts.timestamp()
        if now is not None and ts > now + lim.max_lead_s:  # cut to the present
            ahead = ts - now
            why = f"{what} dated {ahead:.0f}s ahead of the job's records: taken as of now"
            out.alerts += self.anomaly(what, ahead, "seconds_ahead", why, now, last_step)
            ts = now
        at = now if now is not None else ts
        step = event.step
        if event.kind in (JobEventKind.PHASE, JobEventKind.WAIT) and (
            step is not None and last_step >= 0 and step > last_step + lim.max_phase_lead_steps
        ):
            why = f"{what} after step {step} while the job completed step {last_step}: refused"
            out.alerts += self.anomaly(what, step - last_step, "steps_ahead", why, at, last_step)
            return out
        if event.kind is JobEventKind.WAIT:
            if step is not None:  # one with no step says nothing of the step in progress
                out.wait = (ts, step)
            return out
        if event.kind is JobEventKind.PHASE and event.phase is not None:
            expected = event.expected_s
            if expected is not None and expected > lim.max_phase_s:
                why = f"phase of {expected:.0f}s cut to STEPGUARD_MAX_PHASE_S={lim.max_phase_s:.0f}"
                out.alerts += self.anomaly(what, expected, "expected_s", why, at, last_step)
                expected = lim.max_phase_s
            out.phase = (event.phase.value, ts, expected, step)
            return out
        if event.kind is JobEventKind.END and event.reason is not None:
            if event.step is not None and event.step < last_step:
                why = (
                    f"end at step {event.step} while the job completed step {last_step}: "
                    "refused, the job stays watched"
                )
                out.alerts += self.anomaly(what, last_step - event.step, "steps_after_end", why,
                                           at, last_step)  # fmt: skip
                return out
            self.ending = PendingEnd(event.reason.value, ts, event.step, max(ts, at))
        return out

    def contradict(self, step: int, ts: float) -> list[Alert]:
        """A step completed: if it is after a pending end, the end was not the job's."""
        end = self.ending
        if end is None or (step <= end.step if end.step is not None else ts <= end.ts):
            return []
        self.ending = None
        why = (
            f"step {step} completed after an end ({end.reason}) at step {end.step}: the end "
            "is refused, the job stays watched"
        )
        return self.anomaly("end", float(step), "step_after_end", why, ts, step)

    def due(self, now: float) -> PendingEnd | None:
        """The pending end, taken out, once ``end_confirm_s`` passed without a step."""
        end = self.ending
        if end is None or now < end.since + self.limits.end_confirm_s:
            return None
        self.ending = None
        return end

    # -- anomalies -----------------------------------------------------------------
    def anomaly(
        self, what: str, value: float, metric: str, why: str, ts: float, step: int
    ) -> list[Alert]:
        """A lifecycle WARNING: one episode per kind of event, each anomaly an update."""
        fp, seq, started = self._anomalies.get(what, ("", -1, ts))
        if not fp:
            fp = episode_fingerprint(self.job_id, f"lifecycle-{what}", None, None, round(ts * 1000))
        self._anomalies[what] = (fp, seq + 1, started)
        return [self._alert(fp, seq + 1, started, ts, AlertState.FIRING, value, metric, why, step)]

    def resolve(self, why: str, ts: float, step: int) -> list[Alert]:
        """The job ended: its open anomaly episodes resolve."""
        out = [
            self._alert(fp, seq + 1, started, max(ts, started), AlertState.RESOLVED, 0.0,
                        "lifecycle", why, step)
            for fp, seq, started in self._anomalies.values()
        ]  # fmt: skip
        self._anomalies.clear()
        return out

    def _alert(
        self, fp: str, seq: int, started: float, ts: float, state: AlertState, value: float,
        metric: str, why: str, step: int,
    ) -> Alert:  # fmt: skip
        return Alert(
            fingerprint=fp,
            seq=seq,
            kind=AlertKind.LIFECYCLE,
            grade=Grade.WARNING,
            state=state,
            job_id=self.job_id,
            step=max(step, 0),
            started_at=datetime.fromtimestamp(started, UTC),
            ts=datetime.fromtimestamp(ts, UTC),
            evidence=Evidence(metric=metric, value=value, deviation=0.0, detail=why[:500]),
            recommended_action=RecommendedAction.INVESTIGATE,
            summary=f"lifecycle anomaly: {why}",
        )
