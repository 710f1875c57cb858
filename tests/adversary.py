"""Drive the detection core the way the worker does, with hostile or glitchy records.

:func:`play` plays a simulator :class:`~pipeline.tools.simulator.Scenario` through
:class:`~detectors.job.JobDetection` as node messages (``on_step``), health reports and
ticks, and lets an *injection* rewrite or add records on the way. :class:`Outcome` says
what the honest reader of the alerts would conclude: which nodes were named, which were
judged CRITICAL or recommended for isolation, whether the job was called hung.

The catalogue of injections and the defence that handles each is in
``docs/adversary.md``; :mod:`tests.property.test_adversary` runs them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from detectors.errors import CapacityError
from detectors.frame import NodeStep
from detectors.job import JobDetection
from pipeline.tools.simulator import Scenario, simulate
from schemas import Alert, JobEvent, NodeHealth, RecommendedAction

__all__ = ["Inject", "Outcome", "play"]

#: An injection: given the step and the honest messages of one step, the records to
#: feed instead (messages, health reports or lifecycle events, in order).
Inject = Callable[[int, Sequence[NodeStep]], Iterable[object]]

_ISOLATING = {RecommendedAction.ISOLATE, RecommendedAction.REPLACE_AT_CHECKPOINT}


@dataclass
class Outcome:
    """What the alerts of one run say."""

    alerts: list[Alert] = field(default_factory=list)
    refused: int = 0  #: records the core refused (CapacityError / ValueError)

    def firing(self, kind: str | None = None) -> list[Alert]:
        return [
            a
            for a in self.alerts
            if a.state.value == "firing" and (kind is None or a.kind.value == kind)
        ]

    def first_step(self, kind: str, node: str) -> int | None:
        """The first step an alert of ``kind`` fired naming ``node``."""
        return min((a.step for a in self.firing(kind) if a.node == node), default=None)

    def named(self) -> set[tuple[str, str | None]]:
        return {(a.kind.value, a.node) for a in self.firing()}

    def condemned(self) -> set[str]:
        """Nodes judged CRITICAL or recommended for isolation or replacement."""
        return {
            a.node
            for a in self.firing()
            if a.node is not None
            and (a.grade.value == "critical" or a.recommended_action in _ISOLATING)
        }

    def job_hangs(self) -> list[Alert]:
        """Job-level hang alerts (no node named)."""
        return [a for a in self.firing("hang") if a.node is None]


def play(
    scenario: Scenario,
    inject: Inject | None = None,
    *,
    tick_s: float = 1.0,
    clock_from_records: bool = True,
    bounded: bool = True,
) -> Outcome:
    """Play ``scenario`` into a fresh core, through ``inject`` when given.

    Ticks come every ``tick_s`` of event time between records, as the worker's timer
    does; with ``clock_from_records`` the tick time is the worker's estimate (the
    newest step record's event time plus the time since it arrived), not the
    simulator's truth; ``bounded`` bounds that record time as the worker does
    (:meth:`JobDetection.clock_at`; False: the worker before issue 39).
    """
    det = JobDetection(scenario.job)
    out = Outcome()
    #: the worker's clock: newest step record time it took, and when it arrived
    newest: tuple[float, float] | None = None
    arrived = scenario.start_ts

    def clock(t: float) -> float:
        """Event time now, as the worker estimates it at simulated time ``t``."""
        if not clock_from_records or newest is None:
            return t
        return newest[0] + max(0.0, t - newest[1])

    def feed(rec: object) -> None:
        nonlocal newest
        try:
            if isinstance(rec, NodeHealth):
                out.alerts += det.on_health(rec)
            elif isinstance(rec, JobEvent):
                out.alerts += det.on_lifecycle(rec)
            else:
                msg: NodeStep = rec  # type: ignore[assignment]
                ts = msg.ts_end.timestamp()
                if newest is None or ts >= newest[0]:  # the worker's rule
                    newest = (det.clock_at(ts) if bounded else ts, arrived)
                out.alerts += det.on_step(msg).alerts
        except (CapacityError, ValueError):
            out.refused += 1

    last = scenario.start_ts
    for ev in simulate(scenario):
        # the worker's timer: event time moves on from the newest record it read
        t = last + tick_s
        while t < ev.ts:
            out.alerts += det.tick(clock(t))
            t += tick_s
        arrived = ev.ts
        for h in ev.health:
            feed(h)
        if ev.frame is not None:
            msgs = ev.frame.to_messages()
            recs = inject(ev.frame.step, msgs) if inject is not None else msgs
            for rec in recs:
                feed(rec)
        out.alerts += det.tick(clock(ev.ts))
        last = ev.ts
    out.alerts += det.flush()
    return out
