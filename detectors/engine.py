"""JobMonitor: every detector of one job behind three calls.

``process_step(frame)`` scores one step (peer-relative stragglers, creep against
per-rank baselines, data-loader stalls, NIC flapping, missing ranks, divergence),
grades, then learns; ``process_health(msg)`` does the same for one node's hardware
report; ``tick(now)`` checks, on event time, for hangs and silent nodes when no data
arrives. Each returns the alert updates caused (new episode, escalation, re-open,
resolve) — usually none. The monitor is deterministic and pickles.

Examples
--------
>>> import numpy as np
>>> from detectors.frame import StepFrame
>>> mon = JobMonitor("job-1")
>>> rng = np.random.default_rng(0)
>>> alerts = []
>>> for step in range(40):
...     compute = 1.0 + 0.005 * rng.standard_normal(64)
...     if step >= 20:
...         compute[13] *= 1.2                      # rank 13 (node-1) turns slow
...     comm = compute.max() + 0.05 - compute        # everyone else waits for it
...     frame = StepFrame.from_arrays("job-1", step, ts=1.3 * step, compute=compute,
...                                   comm_wait=comm)
...     alerts += mon.process_step(frame)
>>> [(a.kind.value, a.grade.value, a.node, a.rank, a.step) for a in alerts]
[('straggler', 'warning', 'node-1', 13, 22), ('straggler', 'critical', 'node-1', 13, 27)]
>>> mon.tick(1.3 * 39 + 10.0)[0].kind.value     # no step for ~8 median step times
'hang'
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from detectors._stats import MAD_TO_SIGMA
from detectors.base import Finding
from detectors.config import MonitorConfig
from detectors.divergence import DivergenceDetector
from detectors.frame import PHASE_CODES, StepFrame
from detectors.grading import Grader
from detectors.hang import HangDetector, HealthPresence, MissingRanks
from detectors.hardware import HEALTH_SIGNALS, HardwareDetector
from detectors.peer import PeerDetector, PeerScores
from detectors.registry import NodeRegistry
from detectors.signals import TRAIN_SIGNALS
from detectors.temporal import RankBaselines, TemporalScores
from schemas.alerts import Alert, Grade
from schemas.telemetry import NodeHealth, Phase

__all__ = ["JobMonitor", "MonitorConfig", "StepScores"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

_TRAIN = PHASE_CODES[Phase.TRAIN]


@dataclass(eq=False)
class StepScores:
    """What :meth:`JobMonitor.score_step` found in one frame (nothing learned yet)."""

    frame: StepFrame
    node_ids: I64  #: global node id of each ``frame.nodes`` entry
    node_names: list[str]  #: node name by global id
    rank_node: I64  #: global node id of each frame row
    train: B  #: rows in the TRAIN phase
    train_step: bool  #: most rows are TRAIN: the step is graded and learned
    missing: list[Finding] = field(default_factory=list)
    nonfinite: list[Finding] = field(default_factory=list)
    train_findings: list[Finding] = field(default_factory=list)
    values: F64 | None = None
    scales: F64 | None = None
    temporal: TemporalScores | None = None
    spikes: B | None = None

    @property
    def findings(self) -> list[Finding]:
        """Every finding of the step."""
        return [*self.missing, *self.nonfinite, *self.train_findings]


@dataclass
class _NicWindow:
    """Per-node ring of spike indicators over the last ``window`` TRAIN steps."""

    window: int
    ring: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros((0, 0), dtype=bool))
    counts: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    t: int = 0

    def _grow(self, n_nodes: int) -> None:
        if n_nodes <= self.counts.shape[0]:
            return
        size = max(n_nodes, 2 * self.counts.shape[0])
        ring = np.zeros((self.window, size), dtype=bool)
        if self.ring.shape[0] == self.window:
            ring[:, : self.counts.shape[0]] = self.ring
        self.ring = ring
        counts = np.zeros(size, dtype=np.int64)
        counts[: self.counts.shape[0]] = self.counts
        self.counts = counts

    def score(self, spikes: npt.NDArray[np.bool_]) -> F64:
        """Spike fraction over the window including ``spikes`` (global node slots)."""
        n = spikes.shape[0]
        counts = np.zeros(n, dtype=np.int64)
        m = min(n, self.counts.shape[0])
        counts[:m] = self.counts[:m]
        if self.t >= self.window and m:
            counts[:m] -= self.ring[self.t % self.window, :m]
        counts += spikes
        return counts / min(self.t + 1, self.window)

    def learn(self, spikes: npt.NDArray[np.bool_]) -> None:
        self._grow(spikes.shape[0])
        row = self.t % self.window
        padded = np.zeros(self.counts.shape[0], dtype=bool)
        padded[: spikes.shape[0]] = spikes
        self.counts -= self.ring[row]
        self.ring[row] = padded
        self.counts += padded
        self.t += 1


class JobMonitor:
    """Every detector of one job; the one API the worker and benchmarks call.

    Parameters
    ----------
    job_id
        The job monitored; frames and health reports of other jobs are rejected/ignored.
    config
        Thresholds; :class:`MonitorConfig` defaults when omitted.
    """

    def __init__(self, job_id: str, config: MonitorConfig | None = None) -> None:
        if not job_id:
            raise ValueError("job_id must not be empty")
        self.job_id = job_id
        self.config = cfg = config if config is not None else MonitorConfig()
        self.peer = PeerDetector(mad_floor_rel=cfg.mad_floor_rel, min_group_size=cfg.min_group_size)
        self.baselines = RankBaselines(
            n_metrics=3,
            warmup_steps=cfg.warmup_steps,
            alpha=cfg.baseline_alpha,
            alpha_up=cfg.baseline_alpha_up,
            learn_gate_z=cfg.learn_gate_z,
            cusum_k=cfg.cusum_k,
            cusum_clip=cfg.cusum_clip,
        )
        self.hang = HangDetector(cfg.hang_factor, cfg.hang_window, cfg.hang_min_steps)
        self.missing = MissingRanks(cfg.missing_forget_steps)
        self.presence = HealthPresence(cfg.health_missing_factor)
        self.divergence = DivergenceDetector(cfg.div_window, cfg.div_warmup, cfg.mad_floor_rel)
        self.hardware = HardwareDetector(
            warmup_reports=cfg.hw_warmup_reports,
            temp_critical_c=cfg.thermal_extreme_c,
            clock_drop=cfg.clock_drop,
            fatal_xids=cfg.fatal_xids,
            fatal_latch_reports=cfg.fatal_latch_reports,
        )
        self.grader = Grader(job_id, cfg.policies())
        self.nodes = NodeRegistry()
        self._nic = _NicWindow(cfg.nic_window)
        self._last_step = -1  #: the last step completed before a relaunch
        self.steps_seen = 0

    @property
    def last_step(self) -> int:
        """The last step the job completed. A relaunch resets the hang clock's, not
        this: alerts raised while the job relaunches still name the job's step."""
        return self._last_step if self.hang.last_step is None else self.hang.last_step

    # -- steps ---------------------------------------------------------------------
    def score_step(self, frame: StepFrame) -> StepScores:
        """Score one step without changing any state: findings per signal family and
        what :meth:`process_step` needs to learn afterwards."""
        if frame.job_id != self.job_id:
            raise ValueError(f"frame of job {frame.job_id!r} given to monitor of {self.job_id!r}")
        node_ids, names = self.nodes.lookup(frame.nodes)
        rank_node = node_ids[frame.node_idx]
        train = frame.phase == _TRAIN
        train_step = bool(frame.n_ranks) and bool(train.mean() >= 0.5)
        out = StepScores(
            frame=frame,
            node_ids=node_ids,
            node_names=names,
            rank_node=rank_node,
            train=train,
            train_step=train_step,
        )
        if frame.n_ranks == 0:
            return out
        out.missing = self._missing_findings(*self.missing.score(frame.rank))
        out.nonfinite, loss_f = self._divergence(frame, train)
        if train_step:
            peer = self.peer.score_frame(frame)
            inv = peer.groups.inverse
            slowdown, c_scale = peer.slowdown, peer.compute_scale[inv]
            if self.config.replica_correction:
                slowdown, c_scale = _replica_corrected(
                    peer, frame.dp_group, rank_node, self.config.mad_floor_rel
                )
            out.values = np.stack((slowdown, peer.data_excess, peer.comm_excess))
            out.scales = np.stack((c_scale, peer.data_scale[inv], peer.comm_scale[inv]))
            out.temporal = self.baselines.score(frame.rank, out.values, out.scales)
            out.train_findings, out.spikes = self._step_findings(
                frame, peer, out.temporal, rank_node, names
            )
            out.train_findings += loss_f
        return out

    def process_step(self, frame: StepFrame) -> list[Alert]:
        """Score one step, grade, then learn from it. Returns the alert updates."""
        s = self.score_step(frame)
        step, ts = frame.step, frame.ts
        g = self.grader
        # progress: a completed step resolves a hang
        self.hang.learn_step(step, ts, frame.ts_start)
        self._last_step = self.last_step
        alerts = g.observe((), signals={"hang"}, step=step, ts=ts)
        if frame.n_ranks == 0:
            return alerts
        alerts += g.observe(s.missing, signals={"missing"}, step=step, ts=ts)
        alerts += g.observe(s.nonfinite, signals={"nonfinite"}, step=step, ts=ts)
        if s.train_step:
            alerts += g.observe(s.train_findings, signals=TRAIN_SIGNALS, step=step, ts=ts)
        # learn
        self.nodes.register(frame.nodes)
        moved = self.nodes.record_ranks(frame.rank, s.rank_node)
        if moved.shape[0]:  # these ranks now run on other hardware: fresh baselines
            self.baselines.forget(moved)
        self.missing.learn(frame.rank)
        if s.temporal is not None and s.values is not None and s.scales is not None:
            mask = s.train & ~self._critical_ranks(frame, s.rank_node)
            self.baselines.learn(frame.rank, s.values, s.scales, mask, s.temporal)
            if s.spikes is not None:
                self._nic.learn(s.spikes)
            loss, grad = self._loss_values(frame, s.train)
            self.divergence.learn_one(loss, grad)
        self.steps_seen += 1
        return alerts

    def _open_nodes(self, signal: str) -> set[int]:
        """Global ids of nodes with an open node-level episode of ``signal``."""
        ids = (
            self.nodes.node_id(node)
            for sig, node, rank in self.grader.firing()
            if sig == signal and rank is None and node is not None
        )
        return {i for i in ids if i is not None}

    def _firing_ranks(self, signal: str, frame: StepFrame, rank_node: I64) -> B:
        """Ranks of ``frame`` covered by an open episode of ``signal``."""
        subjects = [(node, rank) for sig, node, rank in self.grader.firing() if sig == signal]
        return self.nodes.rows_of(subjects, frame.rank, rank_node)

    def _critical_ranks(self, frame: StepFrame, rank_node: I64) -> B:
        """Ranks whose step-signal episode is CRITICAL: never learned from."""
        subjects = [
            (node, rank)
            for (signal, node, rank), grade in self.grader.firing().items()
            if grade is Grade.CRITICAL and signal in TRAIN_SIGNALS
        ]
        return self.nodes.rows_of(subjects, frame.rank, rank_node)

    def _loss_values(self, frame: StepFrame, train: B) -> tuple[float, float]:
        lmask = frame.has_loss & train & np.isfinite(frame.loss)
        gmask = frame.has_grad_norm & train & np.isfinite(frame.grad_norm)
        loss = float(np.median(frame.loss[lmask])) if lmask.any() else math.nan
        grad = float(np.median(frame.grad_norm[gmask])) if gmask.any() else math.nan
        return loss, grad

    def _divergence(self, frame: StepFrame, train: B) -> tuple[list[Finding], list[Finding]]:
        bad_l = frame.has_loss & ~np.isfinite(frame.loss)
        bad_g = frame.has_grad_norm & ~np.isfinite(frame.grad_norm)
        bad = bad_l | bad_g
        nonfinite: list[Finding] = []
        if bad.any():
            idx = np.flatnonzero(bad)
            reporting = int((frame.has_loss | frame.has_grad_norm).sum())
            node: str | None = None
            rank: int | None = None
            if idx.size * 2 < reporting:  # only some ranks: name the first one
                rank = int(frame.rank[idx[0]])
                node = frame.nodes[int(frame.node_idx[idx[0]])]
            i0 = int(idx[0])
            value = float(frame.loss[i0]) if bad_l[i0] else float(frame.grad_norm[i0])
            nonfinite.append(
                Finding(
                    "nonfinite",
                    node,
                    rank,
                    1.0,
                    "loss" if bad_l[i0] else "grad_norm",
                    value,
                    math.inf,
                    detail=f"{idx.size} of {reporting} ranks reported NaN/Inf loss or grad norm",
                )
            )
        loss, grad = self._loss_values(frame, train)
        s = self.divergence.score_one(loss, grad)
        loss_f: list[Finding] = []
        if s.score >= self.grader.min_score("loss"):
            use_loss = s.loss_z >= s.grad_z
            loss_f.append(
                Finding(
                    "loss",
                    None,
                    None,
                    s.score,
                    "loss" if use_loss else "grad_norm",
                    s.loss if use_loss else s.grad_norm,
                    s.score,
                    baseline=s.loss_median if use_loss else s.grad_median,
                    detail=(
                        f"loss {s.loss:.4g} (z {s.loss_z:.1f}), grad norm {s.grad_norm:.4g} "
                        f"(z {s.grad_z:.1f}) vs rolling median"
                    ),
                )
            )
        return nonfinite, loss_f

    def _missing_findings(self, ranks: I64, counts: I64) -> list[Finding]:
        floor = self.grader.min_score("missing")
        keep = counts >= floor
        ranks, counts = ranks[keep], counts[keep]
        if ranks.shape[0] == 0:
            return []
        rank_node, node_names = self.nodes.rank_node, self.nodes.names
        nodes = rank_node[ranks]
        absent = np.bincount(nodes, minlength=len(node_names))
        # ranks the job expects per node (seen recently)
        seen = self.missing.expected()
        seen = seen[seen < rank_node.shape[0]]
        per_node = np.bincount(rank_node[seen], minlength=len(node_names))
        out: list[Finding] = []
        for n in np.unique(nodes):
            name = node_names[int(n)]
            sel = nodes == n
            if absent[n] >= per_node[n] and per_node[n] > 1:
                c = float(np.median(counts[sel]))
                out.append(
                    Finding(
                        "missing",
                        name,
                        None,
                        c,
                        "steps_missing",
                        c,
                        c,
                        detail=f"all {int(per_node[n])} ranks silent for {int(c)} steps",
                    )
                )
                continue
            for r, c in zip(ranks[sel], counts[sel], strict=True):
                out.append(
                    Finding(
                        "missing",
                        name,
                        int(r),
                        float(c),
                        "steps_missing",
                        float(c),
                        float(c),
                        detail=f"rank {int(r)} silent for {int(c)} steps",
                    )
                )
        return out

    def _step_findings(
        self,
        frame: StepFrame,
        peer: PeerScores,
        t: TemporalScores,
        rank_node: I64,
        names: list[str],
    ) -> tuple[list[Finding], npt.NDArray[np.bool_]]:
        cfg = self.config
        inv = peer.groups.inverse
        warmed = t.warmed
        # straggler: slower than peers beyond the rank's own normal, and not waiting
        ex_c = np.minimum(t.excess[0], peer.slowdown)
        gate = warmed & (t.z[0] >= cfg.straggler_z) & (peer.comm_excess <= cfg.culprit_comm_max)
        # degradation: a creep seen by the smoothed excess or the CUSUM while the rank
        # is still below the straggler threshold (a sudden jump is a straggler); an
        # open degradation episode keeps following the smoothed excess and suppresses
        # the straggler signal on the same ranks (one episode per incident)
        degr_open = self._firing_ranks("degradation", frame, rank_node)
        creep = (t.smooth_z >= cfg.degradation_z) | (t.cusum >= cfg.degradation_cusum)
        creep &= (ex_c < cfg.straggler_warning) & (peer.comm_excess <= cfg.culprit_comm_max)
        smooth = np.minimum(t.smooth, np.maximum(peer.slowdown, 0.0))
        degr = np.where(warmed & (creep | degr_open), np.maximum(smooth, 0.0), 0.0)
        straggler = np.where(gate & ~degr_open, ex_c, 0.0)
        # data-loader stall: data wait above peers beyond the rank's own normal
        ex_d = np.minimum(t.excess[1], peer.data_excess)
        data = np.where(warmed & (t.z[1] >= cfg.data_stall_z), ex_d, 0.0)
        # NIC flapping: a node's ranks wait in comm while their compute is normal
        ex_m = np.minimum(t.excess[2], peer.comm_excess)
        spike_rank = (
            warmed & (t.z[2] >= cfg.nic_z) & (ex_m >= cfg.nic_spike) & (t.z[0] < cfg.straggler_z)
        )
        n_nodes = len(names)
        present = np.bincount(rank_node, minlength=n_nodes)
        spiking = np.bincount(rank_node[spike_rank], minlength=n_nodes)
        node_spike = (spiking * 2 >= present) & (spiking > 0)
        nic_frac = self._nic.score(node_spike)

        def compute_ev(
            idx: I64, s: float, signal: str
        ) -> tuple[str, float, float, float | None, float | None, float | None, str]:
            med = float(np.median(peer.med_compute[inv[idx]]))
            val = float(np.median(frame.compute[idx]))
            base = med * (1.0 + float(np.median(t.baseline[0, idx])))
            z = float(np.median(t.z[0, idx]))
            if signal == "degradation":
                z = float(np.median(t.smooth_z[idx]))
            return (
                "compute_s",
                val,
                z,
                med,
                base,
                float(np.median(t.trend[idx])),
                f"compute {val:.3f}s is {float(np.median(peer.slowdown[idx])):+.1%} vs peers "
                f"{med:.3f}s (own baseline {float(np.median(t.baseline[0, idx])):+.1%}); comm "
                f"wait {float(np.median(frame.comm_wait[idx])):.3f}s vs peers "
                f"{float(np.median(peer.med_comm[inv[idx]])):.3f}s",
            )

        def data_ev(
            idx: I64, s: float, signal: str
        ) -> tuple[str, float, float, float | None, float | None, float | None, str]:
            med = float(np.median(peer.med_data[inv[idx]]))
            val = float(np.median(frame.data_wait[idx]))
            return (
                "data_wait_s",
                val,
                float(np.median(t.z[1, idx])),
                med,
                None,
                None,
                f"data wait {val:.3f}s vs peers {med:.3f}s "
                f"({float(np.median(peer.data_excess[idx])):+.1%} of the step)",
            )

        out: list[Finding] = []
        out += _rank_or_node_findings(
            "straggler",
            straggler,
            self.grader.min_score("straggler"),
            frame,
            rank_node,
            present,
            cfg.node_fraction,
            compute_ev,
            names,
            self._open_nodes("straggler"),
        )
        out += _rank_or_node_findings(
            "degradation",
            degr,
            self.grader.min_score("degradation"),
            frame,
            rank_node,
            present,
            cfg.node_fraction,
            compute_ev,
            names,
            self._open_nodes("degradation"),
        )
        out += _rank_or_node_findings(
            "data_stall",
            data,
            self.grader.min_score("data_stall"),
            frame,
            rank_node,
            present,
            cfg.node_fraction,
            data_ev,
            names,
            self._open_nodes("data_stall"),
        )
        floor = self.grader.min_score("nic_flap")
        for n in np.flatnonzero(nic_frac >= floor).tolist():
            members = np.flatnonzero(rank_node == n)
            if members.size == 0:
                continue
            val = float(np.median(frame.comm_wait[members]))
            med = float(np.median(peer.med_comm[inv[members]]))
            frac = float(nic_frac[n])
            out.append(
                Finding(
                    "nic_flap",
                    names[int(n)],
                    None,
                    frac,
                    "comm_wait_s",
                    val,
                    float(np.median(t.z[2, members])),
                    peer_median=med,
                    detail=(
                        f"comm-wait spikes on {frac:.0%} of the last {cfg.nic_window} steps "
                        f"(now {val:.3f}s vs peers {med:.3f}s) while compute is normal"
                    ),
                )
            )
        return out, node_spike

    # -- health --------------------------------------------------------------------
    def process_health(self, msg: NodeHealth) -> list[Alert]:
        """Score one node's hardware report, grade, then learn from it."""
        if msg.job_id is not None and msg.job_id != self.job_id:
            return []
        if self.nodes.is_removed(msg.node):
            return []  # taken out of the job: its late reports are not the job's health
        ts = msg.ts.timestamp()
        step = max(self.last_step, 0)
        g = self.grader
        alerts = g.observe((), signals={"health_missing"}, step=step, ts=ts, node=msg.node)
        self.presence.learn(msg.node, ts, msg.interval_s)
        prep = self.hardware.prepare(msg)
        findings = [
            f for f in self.hardware.score_prepared(prep) if f.score >= g.min_score(f.signal)
        ]
        alerts += g.observe(findings, signals=HEALTH_SIGNALS, step=step, ts=ts, node=msg.node)
        firing = g.firing()
        anomalous = {f.signal for f in findings}
        anomalous |= {k[0] for k in firing if k[1] == msg.node}
        self.hardware.learn_prepared(prep, anomalous=anomalous)
        return alerts

    # -- clock ---------------------------------------------------------------------
    def restarted(self, now: float, removed_nodes: Iterable[str] = ()) -> None:
        """The job was relaunched at event time ``now`` (restart or rollback to a
        checkpoint, perhaps with ``removed_nodes`` swapped for spares).

        Step numbers may repeat from here on, the relaunch is not a hang for
        ``restart_grace_steps`` median step times, and removed nodes are no longer
        expected to report health (their late reports are ignored until they appear in
        the job's steps again).
        """
        self.hang.restart(now, self.config.restart_grace_steps)
        for node in removed_nodes:
            self.presence.forget(node)
            self.nodes.remove(node)

    def tick(self, now: float) -> list[Alert]:
        """Check for a hung job and silent nodes at event time ``now`` (epoch seconds)."""
        g = self.grader
        step = self.last_step + 1
        alerts: list[Alert] = []
        h = self.hang.score(now)
        hang_f: list[Finding] = []
        if h >= g.min_score("hang"):
            med = self.hang.median_step_time or 0.0
            hang_f.append(
                Finding(
                    "hang",
                    None,
                    None,
                    h,
                    "seconds_since_step",
                    now - (self.hang.last_ts or now),
                    h,
                    baseline=med,
                    detail=f"no step completed for {h:.1f} median step times ({med:.3f}s); "
                    f"last step {self.last_step}",
                )
            )
        alerts += g.observe(hang_f, signals={"hang"}, step=step, ts=now)
        silent = self.presence.score(now)
        floor = g.min_score("health_missing")
        miss_f = [
            Finding(
                "health_missing",
                node,
                None,
                s,
                "intervals_silent",
                s,
                s,
                detail=f"no health report for {s:.1f} intervals while other nodes report",
            )
            for node, s in sorted(silent.items())
            if s >= floor
        ]
        alerts += g.observe(miss_f, signals={"health_missing"}, step=step, ts=now)
        return alerts


def _replica_corrected(
    peer: PeerScores, replica: npt.NDArray[np.int32], rank_node: I64, floor_rel: float
) -> tuple[F64, F64]:
    """Slowdown minus the mean slowdown of the *other nodes* of the same model replica
    (``dp_group``), and its robust scale per rank.

    Sequence-length imbalance makes a whole replica slower or faster from one step to
    the next; its ranks on other nodes measure that common mode, so a node's own
    excess stands out from it. Ranks whose replica has no other node keep their
    slowdown.
    """
    x = peer.slowdown
    rep = replica.astype(np.int64)
    n_nodes = int(rank_node.max()) + 1 if rank_node.shape[0] else 0
    _, pair = np.unique(rep * max(n_nodes, 1) + rank_node, return_inverse=True)
    pair_sum = np.bincount(pair, weights=x)
    pair_cnt = np.bincount(pair)
    rep_sum = np.bincount(rep, weights=x)
    rep_cnt = np.bincount(rep)
    other_cnt = rep_cnt[rep] - pair_cnt[pair]
    if not other_cnt.any():
        return x, peer.compute_scale[peer.groups.inverse]
    other_sum = rep_sum[rep] - pair_sum[pair]
    common = np.where(other_cnt > 0, other_sum / np.maximum(other_cnt, 1), 0.0)
    corrected = x - common
    _, mad = peer.groups.median_and_mad(corrected[None, :])
    scale = np.maximum(MAD_TO_SIGMA * mad[0], floor_rel)
    return corrected, scale[peer.groups.inverse]


_EvFn = Callable[
    [I64, float, str],
    tuple[str, float, float, float | None, float | None, float | None, str],
]


def _rank_or_node_findings(
    signal: str,
    score: F64,
    floor: float,
    frame: StepFrame,
    rank_node: I64,
    present: I64,
    node_fraction: float,
    ev: _EvFn,
    node_names: Sequence[str],
    sticky: Collection[int] = (),
) -> list[Finding]:
    """Findings for ranks scoring >= floor; a node with at least ``node_fraction`` of
    its ranks flagged (or with an open node-level episode, ``sticky``) becomes one
    node-level finding instead."""
    cand = np.flatnonzero(score >= floor)
    if cand.size == 0:
        return []
    n_nodes = present.shape[0]
    flagged = np.bincount(rank_node[cand], minlength=n_nodes)
    node_level = (flagged >= node_fraction * present) & (present >= 2) & (flagged >= 2)
    for n in sticky:
        if n < n_nodes and flagged[n] > 0:
            node_level[n] = True
    out: list[Finding] = []
    for n in np.flatnonzero(node_level).tolist():
        members = np.flatnonzero(rank_node == n)
        s = float(np.median(score[members]))
        metric, val, dev, med, base, trend, detail = ev(members, s, signal)
        out.append(
            Finding(
                signal,
                node_names[int(n)],
                None,
                s,
                metric,
                val,
                dev,
                peer_median=med,
                baseline=base,
                trend=trend,
                detail=f"{int(flagged[n])}/{int(present[n])} ranks: {detail}",
            )
        )
    for i in cand.tolist():
        n = int(rank_node[i])
        if node_level[n]:
            continue
        idx = np.array([i])
        s = float(score[i])
        metric, val, dev, med, base, trend, detail = ev(idx, s, signal)
        out.append(
            Finding(
                signal,
                node_names[n],
                int(frame.rank[i]),
                s,
                metric,
                val,
                dev,
                peer_median=med,
                baseline=base,
                trend=trend,
                detail=detail,
            )
        )
    return out
