"""The step detectors of a suite, each a thin :class:`~detectors.protocol.StepDetector`
around its family's module, in the order :class:`~detectors.engine.DetectorSuite`
scores them (:func:`step_detectors`).

Not in the list: the scoring every detector reads (peer statistics and per-rank
baselines, :class:`~detectors.protocol.StepContext`), the missing-rank and non-finite
findings (graded before, on every step with ranks) and the group collapse (replica
evidence and :class:`~detectors.steps.group.GroupFaults` turn the listed detectors'
findings into group findings afterwards).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from detectors.base import Finding
from detectors.config import DetectorConfig
from detectors.findings import loss_findings, loss_values
from detectors.protocol import F64, I64, StepContext, StepDetector
from detectors.steps.early import early_outliers
from detectors.steps.imbalance import StageImbalance
from detectors.steps.intermittent import IntermittentSlowdown, intermittent_findings, slow_steps
from detectors.steps.nic_flap import NicWindow, nic_flap_findings
from detectors.steps.slowdown import NODE_LEVEL_SIGNALS, rank_or_node_findings, slowdown_findings
from detectors.steps.waits import (
    LastArrivals,
    RecentScores,
    StepBaseline,
    last_arrivals,
    waited_on,
)
from detectors.steps.work import WorkImbalance, work_factor
from detectors.training.divergence import DivergenceDetector
from detectors.training.drift import LossDrift, drift_findings

__all__ = [
    "EarlyPeer",
    "Imbalance",
    "Intermittent",
    "Loss",
    "LossDriftStep",
    "NicFlap",
    "Slowdown",
    "WaitedOn",
    "step_detectors",
]


def step_detectors(cfg: DetectorConfig) -> list[StepDetector]:
    """A fresh detector of each kind with thresholds ``cfg``, in scoring order."""
    return [
        Slowdown(),
        EarlyPeer(),
        WaitedOn(StepBaseline(cfg.waits_warmup), last_span=cfg.waits_last_span),
        Intermittent(
            IntermittentSlowdown(
                cfg.intermittent_window,
                cfg.intermittent_min_slow,
                min_pulses=cfg.intermittent_min_pulses,
            )
        ),
        NicFlap(NicWindow(cfg.nic_window)),
        Loss(DivergenceDetector(cfg.div_window, cfg.div_warmup, cfg.mad_floor_rel)),
        Imbalance(
            StageImbalance(cfg.imbalance_alpha, cfg.imbalance_exit, cfg.imbalance_min_steps),
            WorkImbalance(exit=cfg.imbalance_exit, warmup_steps=cfg.imbalance_min_steps),
        ),
        LossDriftStep(LossDrift(warmup=max(cfg.div_window, 10))),
    ]


class Slowdown(StepDetector):
    """Stragglers, degradation and data stalls (:mod:`detectors.steps.slowdown`): reads
    the shared scoring only, learns nothing of its own."""

    __slots__ = ()
    name = "slowdown"

    def findings(self, ctx: StepContext) -> list[Finding]:
        return slowdown_findings(
            ctx.frame,
            ctx.peer,
            ctx.temporal,
            ctx.rank_node,
            ctx.node_names,
            config=ctx.config,
            floors={s: ctx.floor(s) for s in NODE_LEVEL_SIGNALS},
            degradation_rows=ctx.firing_rows("degradation"),
            open_nodes={s: ctx.open_nodes(s) for s in NODE_LEVEL_SIGNALS},
        )


class EarlyPeer(StepDetector):
    """Gross outliers among peers while their baselines warm
    (:mod:`detectors.steps.early`), graded as stragglers; learns nothing of its own.

    A subject the slowdown detector already found this step keeps that finding."""

    __slots__ = ()
    name = "early_peer"

    def findings(self, ctx: StepContext) -> list[Finding]:
        cfg, peer, t, s = ctx.config, ctx.peer, ctx.temporal, ctx.scores
        if s.values is None or s.scales is None:
            return []
        waits = peer.waits_in_comm(cfg.culprit_comm_max, cfg.straggler_z)
        waits |= peer.waits_for_data(cfg.culprit_comm_max, cfg.straggler_z)
        score = early_outliers(
            peer,
            s.values[0],
            s.scales[0],
            t.warmed,
            waits,
            floor=cfg.early_floor,
            k=cfg.early_z,
            min_peers=cfg.early_min_peers,
        )
        if not score.any():
            return []
        inv = peer.groups.inverse
        frame = ctx.frame

        def describe(
            idx: I64, sc: float, signal: str
        ) -> tuple[str, float, float, float | None, float | None, float | None, str]:
            med = float(np.median(peer.med_compute[inv[idx]]))
            val = float(np.median(frame.compute[idx]))
            z = float(np.median(peer.z_compute[idx]))
            return (
                "compute_s",
                val,
                z,
                med,
                None,
                None,
                f"compute {val:.3f}s is {sc:+.1%} vs peers {med:.3f}s ({z:.0f} robust "
                f"sigmas of the step's peers; own baseline still warming); comm wait "
                f"{float(np.median(frame.comm_wait[idx])):.3f}s vs peers "
                f"{float(np.median(peer.med_comm[inv[idx]])):.3f}s",
            )

        found = rank_or_node_findings(
            "straggler",
            score,
            ctx.floor("straggler"),
            frame,
            ctx.rank_node,
            np.bincount(ctx.rank_node, minlength=len(ctx.node_names)),
            cfg.node_fraction,
            describe,
            ctx.node_names,
            ctx.open_nodes("straggler"),
        )
        taken = {(f.signal, f.node, f.rank) for f in s.train_findings}
        return [f for f in found if (f.signal, f.node, f.rank) not in taken]


class WaitedOn(StepDetector):
    """The rank its stage peers wait on while the job's recent steps are slow
    (:mod:`detectors.steps.waits`), named on its scores' median over the last steps
    (:class:`~detectors.steps.waits.RecentScores`), graded as a straggler; learns the
    job's own step time.

    A node the compute rules already found this step keeps their finding (one episode,
    the compute evidence)."""

    __slots__ = ("arrivals", "base", "recent")
    name = "waited_on"

    def __init__(
        self,
        base: StepBaseline,
        recent: RecentScores | None = None,
        arrivals: LastArrivals | None = None,
        last_span: int = 10,
    ) -> None:
        self.base = base
        self.recent = recent if recent is not None else RecentScores(base.span)
        self.arrivals = arrivals if arrivals is not None else LastArrivals(last_span)

    def _upgrade(self) -> None:
        """Fill what a state written before the recent scores or the last arrivals
        lacks (a suite restored from an older snapshot): none of them yet."""
        if not hasattr(self.base, "span"):
            self.base.span, self.base.recent = 5, np.empty(0)
        if not hasattr(self, "recent"):
            self.recent = RecentScores(self.base.span)
        if not hasattr(self, "arrivals"):
            self.arrivals = LastArrivals()

    def _arrivals(self, ctx: StepContext, clock: F64) -> F64:
        """Who its peers keep waiting on, whatever the step's pace (every step: the
        last arrivals are learned from each)."""
        cfg = ctx.config
        last, share = last_arrivals(
            ctx.frame,
            ~ctx.train | ~ctx.temporal.warmed,
            compute=clock,
            node=ctx.rank_node,
            min_peers=cfg.early_min_peers,
        )
        ev = self.arrivals.evidence(ctx.slots, last, share, cfg.waits_floor, cfg.waits_last_p)
        ctx.scores.arrivals = (last, share, ev)
        return ev

    def _step_time(self, ctx: StepContext) -> float:
        st = ctx.frame.step_time[ctx.train]
        return float(np.median(st)) if st.shape[0] else float("nan")

    def findings(self, ctx: StepContext) -> list[Finding]:
        cfg, frame = ctx.config, ctx.frame
        self._upgrade()
        factor = work_factor(frame)  # the clock's own time, not per unit of work
        clock = frame.compute if factor is None else frame.compute / factor
        arrivals = self._arrivals(ctx, clock)
        slow = self.base.slowdown(self._step_time(ctx), k=4.0)
        if slow < cfg.waits_step_slow and not arrivals.any():
            return []
        t = ctx.temporal
        excluded = ~ctx.train | ~t.warmed
        ctx.scores.waits = waited_on(
            frame,
            slow,
            -t.excess[2],  # beyond its own normal (values: slowdown, data, comm excess)
            excluded,
            compute=clock,
            node=ctx.rank_node,
            floor=cfg.waits_floor,
            k=cfg.waits_z,
            min_peers=cfg.early_min_peers,
        )
        score = self.recent.median(ctx.slots, ctx.scores.waits)
        score = np.maximum(np.where(slow >= cfg.waits_step_slow, score, 0.0), arrivals)
        ctx.scores.waits_named = bool(score.any())  # the step is the fault's: not learned
        if not ctx.scores.waits_named:
            return []
        stage = frame.pp_stage

        def describe(
            idx: I64, sc: float, signal: str
        ) -> tuple[str, float, float, float | None, float | None, float | None, str]:
            peers = np.isin(stage, stage[idx]) & (score <= 0)
            med = float(np.median(frame.comm_wait[peers])) if peers.any() else 0.0
            own = float(np.median(frame.comm_wait[idx]))
            c_own = float(np.median(clock[idx]))
            c_med = float(np.median(clock[peers])) if peers.any() else c_own
            return (
                "comm_wait_deficit",
                med - own,
                sc,
                med,
                None,
                None,
                f"peers wait {med * 1e3:.0f} ms on it in the collectives vs its own "
                f"{own * 1e3:.0f} ms ({sc:.1%} of the step unexplained by its compute "
                f"{c_own:.3f}s vs peers {c_med:.3f}s); {self._why(ctx, idx, slow)}: "
                f"look for contention its compute clock cannot see "
                f"(a CPU hog on its cores, a throttled host thread, a slow NIC queue)",
            )

        found = rank_or_node_findings(
            "straggler",
            score,
            ctx.floor("straggler"),
            frame,
            ctx.rank_node,
            np.bincount(ctx.rank_node, minlength=len(ctx.node_names)),
            cfg.node_fraction,
            describe,
            ctx.node_names,
            ctx.open_nodes("straggler"),
        )
        named = {f.node for f in ctx.scores.train_findings if f.signal in _COMPUTE_SIGNALS}
        return [f for f in found if f.node not in named]

    def _why(self, ctx: StepContext, idx: I64, slow: float) -> str:
        """The evidence that named ``idx``: arriving last step after step, or the
        job's steps slower than its own recent ones."""
        arrivals = ctx.scores.arrivals
        if arrivals is not None and arrivals[2][idx].any():
            row = int(idx[np.argmax(arrivals[2][idx])])
            count, rate = self.arrivals.count_and_rate(
                ctx.slots[row : row + 1], arrivals[0][row : row + 1]
            )
            return (
                f"it arrived last in its stage in {count} of its last {self.arrivals.span} steps "
                f"(usually {rate:.0%} of them)"
            )
        return f"the step is {slow:+.1%} over the job's recent steps"

    def learn(self, ctx: StepContext) -> None:
        self._upgrade()
        st = self._step_time(ctx)
        k = 4.0  # a step slow on its own is no baseline either, before the median says so
        slow = max(self.base.slowdown(st, k=k), self.base.slowdown(st, k=k, span=1))
        named = ctx.scores.waits_named or bool(self.recent.values.any())  # lately: the fault's
        self.base.learn(st, slow=named or slow >= ctx.config.waits_step_slow)
        score = ctx.scores.waits
        self.recent.learn(ctx.slots, score if score is not None else np.zeros(ctx.slots.shape[0]))
        if ctx.scores.arrivals is not None:
            self.arrivals.learn(ctx.slots, *ctx.scores.arrivals)

    def forget(self, slots: I64) -> None:
        self._upgrade()
        self.recent.forget(slots)
        self.arrivals.forget(slots)


#: What the compute rules name: a node they found this step is not named again by waits.
_COMPUTE_SIGNALS = frozenset({"straggler", "degradation", "data_stall", "intermittent"})


class Intermittent(StepDetector):
    """Intermittent stragglers (:mod:`detectors.steps.intermittent`); leaves the step's
    clearly slow ranks in ``scores.slow`` / ``slow_excess``."""

    __slots__ = ("det",)
    name = "intermittent"

    def __init__(self, det: IntermittentSlowdown) -> None:
        self.det = det

    def findings(self, ctx: StepContext) -> list[Finding]:
        t, out = ctx.temporal, ctx.scores
        out.slow, out.slow_excess = slow_steps(t.z[0], t.excess[0], ctx.peer, t.warmed, ctx.config)
        busy = ctx.firing_rows("straggler")
        busy |= ctx.firing_rows("degradation")
        out.slow &= ~busy  # a steady straggler's slow steps say nothing of intermittence
        return intermittent_findings(
            self.det,
            ctx.slots,
            ctx.frame,
            ctx.rank_node,
            ctx.node_names,
            config=ctx.config,
            floor=ctx.floor("intermittent"),
            busy_rows=busy,
            open_nodes=ctx.open_nodes("intermittent"),
        )

    def learn(self, ctx: StepContext) -> None:
        out = ctx.scores
        if out.slow is not None and out.slow_excess is not None:
            self.det.learn(ctx.slots, out.slow, out.slow_excess, ctx.train)

    def forget(self, slots: I64) -> None:
        self.det.forget(slots)


class NicFlap(StepDetector):
    """NIC flapping (:mod:`detectors.steps.nic_flap`); leaves the step's spikes in
    ``scores.spikes`` for its window."""

    __slots__ = ("window",)
    name = "nic_flap"

    def __init__(self, window: NicWindow) -> None:
        self.window = window

    def findings(self, ctx: StepContext) -> list[Finding]:
        flaps, ctx.scores.spikes = nic_flap_findings(
            ctx.frame,
            ctx.peer,
            ctx.temporal,
            ctx.rank_node,
            ctx.node_names,
            config=ctx.config,
            floor=ctx.floor("nic_flap"),
            window=self.window,
        )
        return flaps

    def learn(self, ctx: StepContext) -> None:
        if ctx.scores.spikes is not None:
            self.window.learn(ctx.scores.spikes)


class Loss(StepDetector):
    """A diverging loss or gradient norm (:mod:`detectors.training.divergence`)."""

    __slots__ = ("det",)
    name = "loss"

    def __init__(self, det: DivergenceDetector) -> None:
        self.det = det

    def findings(self, ctx: StepContext) -> list[Finding]:
        return loss_findings(ctx.frame, ctx.train, self.det, ctx.floor("loss"))

    def learn(self, ctx: StepContext) -> None:
        loss, grad = loss_values(ctx.frame, ctx.train)
        self.det.learn_one(loss, grad)


class Imbalance(StepDetector):
    """A pipeline stage slower as a whole (:mod:`detectors.steps.imbalance`), and work
    persistently unequal across stages or ranks (:mod:`detectors.steps.work`): one
    job-level finding, the larger gap's, the other's detail after it. Leaves the
    step's stage gaps in ``scores.stage_gaps``."""

    __slots__ = ("det", "work")
    name = "imbalance"

    def __init__(self, det: StageImbalance, work: WorkImbalance | None = None) -> None:
        self.det = det
        self.work = work if work is not None else WorkImbalance()

    def findings(self, ctx: StepContext) -> list[Finding]:
        floor = ctx.floor("imbalance")
        found = sorted(self.det.findings(floor) + self.work.findings(floor), key=lambda f: -f.score)
        ctx.scores.stage_gaps = self.det.score(ctx.frame, ctx.train)
        if len(found) > 1:  # one episode of the job's imbalance: both said
            top = found[0]
            found = [dataclasses.replace(top, detail="; ".join(f.detail for f in found))]
        return found

    def learn(self, ctx: StepContext) -> None:
        if ctx.scores.stage_gaps is not None:
            self.det.learn(ctx.scores.stage_gaps, ctx.frame.step)
        self.work.learn(ctx.frame, ctx.train)


class LossDriftStep(StepDetector):
    """A loss drifting up slowly (:mod:`detectors.training.drift`); a relaunch resets
    it (a rollback resumes from an earlier, higher loss)."""

    __slots__ = ("det",)
    name = "loss_drift"

    def __init__(self, det: LossDrift) -> None:
        self.det = det

    def findings(self, ctx: StepContext) -> list[Finding]:
        return drift_findings(
            self.det, loss_values(ctx.frame, ctx.train)[0], ctx.floor("loss_drift")
        )

    def learn(self, ctx: StepContext) -> None:
        self.det.learn_one(loss_values(ctx.frame, ctx.train)[0])

    def restarted(self) -> None:
        self.det.reset()
