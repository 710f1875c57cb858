# ruff: noqa: E501  (the catalogue reads one injection a line)
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
from datetime import timedelta

from detectors.errors import CapacityError
from detectors.frame import NodeStep
from detectors.job import JobDetection
from pipeline.tools.simulator import Scenario, simulate
from schemas import (
    Alert,
    EndReason,
    GpuHealth,
    JobEvent,
    JobEventKind,
    NodeHealth,
    Phase,
    RecommendedAction,
)

__all__ = ["CATALOGUE", "JOB_LEVEL", "SCENARIOS", "Inject", "Outcome", "changed", "play"]

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
                    # (a core without clock_at: the worker before issue 39)
                    bound = getattr(det, "clock_at", None) if bounded else None
                    took = bound(ts) if bound is not None else ts
                    newest = (took if newest is None else max(newest[0], took), arrived)
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


# -- the catalogue ---------------------------------------------------------------------


def _at(at: int, rewrite: Callable[[Sequence[NodeStep]], list[object]]) -> Inject:
    def inject(step: int, msgs: Sequence[NodeStep]) -> Iterable[object]:
        return rewrite(msgs) if step == at else list(msgs)

    return inject


def _shift(m: NodeStep, seconds: float) -> NodeStep:
    d = timedelta(seconds=seconds)
    return m.model_copy(update={"ts_end": m.ts_end + d, "ts_start": m.ts_start + d})  # type: ignore[attr-defined,no-any-return]


def _sample(m: NodeStep, **update: object) -> NodeStep:
    first = m.samples[0].model_copy(update=update)  # type: ignore[attr-defined]
    return m.model_copy(update={"samples": (first, *m.samples[1:])})  # type: ignore[attr-defined,no-any-return]


def _end(m: NodeStep) -> JobEvent:
    return JobEvent(job_id=m.job_id, kind=JobEventKind.END, ts=m.ts_end, step=m.step,
                    reason=EndReason.COMPLETED)  # fmt: skip


#: name -> (what it is, the defence that handles it, injection at a step)
CATALOGUE: dict[str, tuple[str, str, Callable[[int], Inject]]] = {
    "duplicate": ("every record of a step sent twice", "assembler: one record per node and step",
                  lambda s: _at(s, lambda ms: [*ms, *ms])),
    "impostor": ("another node's record under an outside node's name, then a fatal XID in that node's health",
                 "rule 8: a rank held by a reporting node does not move; rule 7: health judges members only",
                 lambda s: _at(s, lambda ms: [*ms, ms[2].model_copy(update={"node": "login-01"}), _xid79(ms[0], "login-01")])),  # type: ignore[attr-defined]
    "ahead_290s": ("one record dated +290 s (inside the skew)", "step_times + clock_at",
                   lambda s: _at(s, lambda ms: [*ms[:4], _shift(ms[4], 290.0), *ms[5:]])),
    "behind_290s": ("one record dated -290 s", "step_times (start bounded by the nodes' median)",
                    lambda s: _at(s, lambda ms: [*ms[:4], _shift(ms[4], -290.0), *ms[5:]])),
    "ahead_3600s": ("one record dated +1 h (beyond the skew; the core's worst case)",
                    "step_times + clock_at",
                    lambda s: _at(s, lambda ms: [*ms[:4], _shift(ms[4], 3600.0), *ms[5:]])),
    "behind_3600s": ("one record dated -1 h (beyond the skew)", "step_times (start bounded by the nodes' median); a late record of a step already out is dropped",
                     lambda s: _at(s, lambda ms: [*ms[:4], _shift(ms[4], -3600.0), *ms[5:]])),
    "duplicate_altered": ("a second copy of a node's record with its first rank's compute at 10^6 s", "as compute_1e6: the copy speaks only for the node's own ranks",
                          lambda s: _at(s, lambda ms: [*ms, _sample(ms[1], compute_s=1e6)])),
    "compute_1e6": ("one rank's compute_s = 10^6 s (the schema's maximum)",
                    "replica_corrected winsorised pooling; temporal learn gate and clipped noise",
                    lambda s: _at(s, lambda ms: [ms[0], _sample(ms[1], compute_s=1e6), *ms[2:]])),
    "step_time_1e6": ("one rank's step_time_s and compute_s = 10^6 s",
                      "as compute_1e6; hang intervals from robust frame times",
                      lambda s: _at(s, lambda ms: [ms[0], _sample(ms[1], compute_s=1e6,
                                                                  step_time_s=1e6), *ms[2:]])),
    "zero_interval": ("one record whose step lasted 0 s (start = end)",
                      "step_times (start bounded by the nodes' median)",
                      lambda s: _at(s, lambda ms: [*ms[:3], ms[3].model_copy(update={"ts_start": ms[3].ts_end}), *ms[4:]])),  # type: ignore[attr-defined]
    "step_jump": ("one record 100000 steps ahead", "refused beyond max_lag_steps strides",
                  lambda s: _at(s, lambda ms: [*ms, ms[3].model_copy(update={"step": ms[3].step + 100_000})])),  # type: ignore[attr-defined]
    "far_rank": ("a record of a new node with rank 900000", "rule 8: far beyond the job's ranks",
                 lambda s: _at(s, lambda ms: [*ms, _sample(ms[0], rank=900_000).model_copy(update={"node": "node-0099"})])),  # type: ignore[attr-defined]
    "other_job": ("a record naming another job", "the core refuses records of other jobs",
                  lambda s: _at(s, lambda ms: [*ms, ms[0].model_copy(update={"job_id": "other"})])),  # type: ignore[attr-defined]
    "end_mid_job": ("an END while the job keeps stepping", "job_guard: a step after an end refuses it",
                    lambda s: _at(s, lambda ms: [_end(ms[0]), *ms])),
    "phase_3600s": ("a checkpoint PHASE of 3600 s announced at the step", "job_guard: cut to max_phase_s; the next step ends it",
                    lambda s: _at(s, lambda ms: [_event(ms[0], JobEventKind.PHASE, phase=Phase.CHECKPOINT, expected_s=3600.0), *ms])),
    "wait_at_step": ("a WAIT for input announced at the step", "hang detector: a wait is bounded by max_phase_s and the job's own waits",
                     lambda s: _at(s, lambda ms: [_event(ms[0], JobEventKind.WAIT), *ms])),
    "end_at_step": ("an END dated at the step (a hang that follows looks like the end)", "job_guard: pending for end_confirm_s, refused by any later step",
                    lambda s: _at(s, lambda ms: [_event(ms[0], JobEventKind.END, reason=EndReason.COMPLETED), *ms])),
    "health_tiny_interval": ("an honest node's health report with interval_s = 0.001 s", "presence: silence is judged against a node's own reports and arrivals",
                             lambda s: _at(s, lambda ms: [*ms, NodeHealth(job_id=ms[2].job_id, node=ms[2].node, ts=ms[2].ts_end, interval_s=1e-3)])),
    "health_ahead_290s": ("an honest node's health report dated +290 s", "core rule 2: held until the steps or a tick pass its time",
                          lambda s: _at(s, lambda ms: [*ms, NodeHealth(job_id=ms[2].job_id, node=ms[2].node, ts=ms[2].ts_end + timedelta(seconds=290))])),
    "health_outsider_xid79": ("XID 79 health of a node outside the job", "core rule 7: health judges members only",
                              lambda s: _at(s, lambda ms: [*ms, _xid79(ms[0], "login-01")])),
}  # fmt: skip


#: job-level lifecycle: what one node's credentials cannot write once the job
#: controller's key is checked at the intake (issue 39, authenticated telemetry). The
#: core bounds them (phases cut to max_phase_s, an end pending and refused by a later
#: step) but cannot tell an END or a long PHASE dated at a hang's onset from the truth:
#: a hang that follows is held as the end or the phase. Only "no honest node
#: condemned" is asserted for them; their other changes are reported apart.
JOB_LEVEL = frozenset({"phase_3600s", "wait_at_step", "end_at_step", "end_mid_job"})


def _event(m: NodeStep, kind: JobEventKind, **kw: object) -> JobEvent:
    return JobEvent(job_id=m.job_id, kind=kind, ts=m.ts_end, step=m.step, **kw)  # type: ignore[arg-type]


def _xid79(m: NodeStep, node: str) -> NodeHealth:
    gpu = GpuHealth(index=0, temperature_c=60, power_w=500, sm_clock_mhz=1800,
                    utilization_pct=99, xid_codes=(79,))  # fmt: skip
    return NodeHealth(job_id=m.job_id, node=node, ts=m.ts_end, gpus=(gpu,))


#: small jobs of the suite's fault kinds (a rank straggler with replicas across nodes, a
#: hang, an ECC storm ending in a crash, a single-step blip trap; a 0.2 s step)
SCENARIOS: dict[str, dict[str, object]] = {
    "straggler_rank_30pct_8n": {
        "name": "adv-straggler", "nodes": 8, "gpus_per_node": 2, "tp": 2, "pp": 4,
        "steps": 220, "seed": 3, "base_compute_s": 0.2,
        "faults": [{"kind": "straggler", "node": 3, "gpu": 1, "onset_step": 150,
                    "magnitude": 0.3}],
    },
    "hang_8n": {
        "name": "adv-hang", "nodes": 8, "gpus_per_node": 2, "tp": 2, "steps": 200, "seed": 4,
        "base_compute_s": 0.2,
        "faults": [{"kind": "hang", "onset_step": 150, "duration_steps": 30}],
    },
    "ecc_storm_8n": {
        "name": "adv-ecc", "nodes": 8, "gpus_per_node": 2, "tp": 2, "steps": 200, "seed": 6,
        "base_compute_s": 0.2,
        "faults": [{"kind": "ecc_storm", "node": 5, "gpu": 1, "onset_step": 100,
                    "magnitude": 40, "duration_steps": 40}],
    },
    "trap_blip_8n": {
        "name": "adv-trap", "nodes": 8, "gpus_per_node": 2, "tp": 2, "steps": 200, "seed": 5,
        "base_compute_s": 0.2,
        "faults": [{"kind": "single_step_blip", "node": 2, "onset_step": 120, "magnitude": 0.5}],
    },
}  # fmt: skip

#: alert kinds that are notes about records, not outcomes of the job
_NOTES = {"guardrail", "lifecycle"}


def changed(honest: Outcome, attacked: Outcome, hostile_nodes: set[str]) -> list[str]:
    """How the attacked run's honest outcome differs from the honest run's: an honest
    node condemned, a fault missed (a kind and node the honest run named), a job-level
    hang the honest run did not have, or a job silenced (no alert where there were)."""
    why: list[str] = []
    extra = attacked.condemned() - honest.condemned() - hostile_nodes
    if extra:
        why.append(f"honest nodes condemned: {sorted(extra)}")
    named = {k for k in honest.named() if k[0] not in _NOTES}
    missed = named - attacked.named()
    if missed:
        why.append(f"faults missed: {sorted(missed, key=str)}")
    if attacked.job_hangs() and not honest.job_hangs():
        why.append("job called hung")
    return why
