"""DetectorSuite: every detector of one job behind three calls.

``process_step(frame)`` scores one step (peer-relative stragglers, creep against
per-rank baselines, data-loader stalls, NIC flapping, missing ranks, divergence),
grades, then learns; ``process_health(msg)`` does the same for one node's hardware
report; ``tick(now)`` checks, on event time, for hangs and silent nodes when no data
arrives. Each returns the alert updates caused (new episode, escalation, re-open,
resolve) — usually none. The suite is deterministic and plain data
(:mod:`pipeline.io.statecodec` writes it to the worker's changelog).

Examples
--------
>>> import numpy as np
>>> from detectors.frame import StepFrame
>>> suite = DetectorSuite("job-1")
>>> rng = np.random.default_rng(0)
>>> alerts = []
>>> for step in range(40):
...     compute = 1.0 + 0.005 * rng.standard_normal(64)
...     if step >= 20:
...         compute[13] *= 1.2                      # rank 13 (node-1) turns slow
...     comm = compute.max() + 0.05 - compute        # everyone else waits for it
...     frame = StepFrame.from_arrays("job-1", step, ts=1.3 * step, compute=compute,
...                                   comm_wait=comm)
...     alerts += suite.process_step(frame)
>>> [(a.kind.value, a.grade.value, a.node, a.rank, a.step) for a in alerts]
[('straggler', 'warning', 'node-1', 13, 22), ('straggler', 'critical', 'node-1', 13, 27)]
>>> suite.tick(1.3 * 39 + 10.0)[0].kind.value   # no step for ~8 median step times
'hang'

The suite coordinates; each concern lives in its own module:

==========================  ==========================================================
:mod:`detectors.config`     :class:`DetectorConfig`, every threshold
:mod:`detectors.signals`    signal families (when each is graded) and grading policies
:mod:`detectors.steps.ranks`      dense rank slots: per-rank state is sized by ranks, not ids
:mod:`detectors.registry`   node ids, the rank -> node map, nodes removed at a relaunch
:mod:`detectors.steps.slowdown`   straggler, degradation and data-stall findings of a step
:mod:`detectors.steps.nic_flap`   NIC-flap findings and their window of spikes
:mod:`detectors.findings`   missing-rank, non-finite and diverging-loss findings
:mod:`detectors.steps.intermittent` intermittent stragglers: how often a rank is clearly slow
:mod:`detectors.steps.imbalance`    a pipeline stage slower as a whole: INFO, rebalance
:mod:`detectors.steps.group`        nodes that began to slow together: one group finding
:mod:`detectors.protocol`   what the suite drives: :class:`StepDetector` for a train step,
                            ``StepMember``, ``ClockMember``, ``HealthMember``, ``Grading``
:mod:`detectors.step_detectors`     the train-step detectors, in scoring order
:mod:`detectors.suite_members`      every other member around its family's class, in order
==========================  ==========================================================

The family objects (``peer``, ``baselines``, ``hang``, ``missing``, ``presence``,
``hardware``, ``groups``, ``replicas``, ``grader``, ``step_detectors``) are the suite's
state, under the names a snapshot holds; the suite drives them through
:attr:`DetectorSuite.members`, by protocol, never by name.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cached_property

import numpy as np
import numpy.typing as npt

from detectors.config import DetectorConfig
from detectors.frame import PHASE_CODES, StepFrame
from detectors.grading.grader import Grader
from detectors.hang.detector import HangDetector, HealthPresence, MissingRanks
from detectors.hardware.health import HardwareDetector
from detectors.protocol import Grading, StepContext, StepDetector, StepScores, Tick
from detectors.registry import NodeRegistry
from detectors.signals import TRAIN_SIGNALS
from detectors.step_detectors import step_detectors
from detectors.steps.group import GroupFaults
from detectors.steps.peer import PeerDetector
from detectors.steps.ranks import RankIndex
from detectors.steps.replica import ReplicaDrift
from detectors.steps.temporal import RankBaselines
from detectors.steps.work import per_work
from detectors.suite_members import SuiteMembers, suite_members
from schemas.alerts import Alert, Grade
from schemas.telemetry import NodeHealth, Phase

__all__ = ["DetectorConfig", "DetectorSuite", "StepScores"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

_TRAIN = PHASE_CODES[Phase.TRAIN]


class DetectorSuite:
    """Every detector of one job; the one API the worker and benchmarks call.

    Parameters
    ----------
    job_id
        The job monitored; frames and health reports of other jobs are rejected/ignored.
    config
        Thresholds; :class:`DetectorConfig` defaults when omitted.

    Attributes
    ----------
    ranks
        The dense slot of each rank id: every per-rank state array is indexed by slot.
    nodes
        The job's nodes and the node each rank runs on.
    grader
        Open alert episodes and their grades (the suite's :class:`Grading`).
    members
        Every other member by protocol (:class:`~detectors.suite_members.SuiteMembers`),
        driving the family objects held here (``peer``, ``baselines``, ``hang``, ...).
    steps_seen
        Steps processed.
    """

    #: event time of the job's newest step most of its nodes reported, set by the core
    #: before each :meth:`tick` (None: only completed steps count as progress)
    stepping_at: float | None = None

    def __init__(self, job_id: str, config: DetectorConfig | None = None) -> None:
        if not job_id:
            raise ValueError("job_id must not be empty")
        self.job_id = job_id
        self.config = cfg = config if config is not None else DetectorConfig()
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
        self.hang = HangDetector(
            cfg.hang_factor, cfg.hang_window, cfg.hang_min_steps,
            critical_factor=max(cfg.hang_factor, cfg.hang_critical_factor),
        )  # fmt: skip
        self.missing = MissingRanks(cfg.missing_forget_steps)
        self.presence = HealthPresence(cfg.health_missing_factor)
        self.hardware = HardwareDetector(
            warmup_reports=cfg.hw_warmup_reports,
            temp_critical_c=cfg.thermal_extreme_c,
            clock_drop=cfg.clock_drop,
            fatal_xids=cfg.fatal_xids,
            fatal_latch_reports=cfg.fatal_latch_reports,
        )
        #: the detectors of a train step, scored and learned in this order
        self.step_detectors: list[StepDetector] = step_detectors(cfg)
        self.groups = GroupFaults(cfg.group_window, cfg.group_min_nodes)
        self.replicas = ReplicaDrift(warmup_steps=cfg.warmup_steps)
        self.grader: Grading = Grader(job_id, cfg.policies())
        self.ranks = RankIndex()
        self.nodes = NodeRegistry()
        self._last_step = -1  #: the last step completed before a relaunch
        self.steps_seen = 0
        self.members  # noqa: B018  built now: scoring a new suite's first step changes nothing

    @cached_property
    def members(self) -> SuiteMembers:
        """The members around the family objects above, by protocol
        (:mod:`detectors.suite_members`): a new suite builds them at once, a state
        written before they existed on first use."""
        return suite_members(
            self.config,
            missing=self.missing,
            peer=self.peer,
            baselines=self.baselines,
            replicas=self.replicas,
            groups=self.groups,
            hang=self.hang,
            presence=self.presence,
            hardware=self.hardware,
        )

    @property
    def last_step(self) -> int:
        """The last step the job completed. A relaunch resets the hang clock's, not
        this: alerts raised while the job relaunches still name the job's step."""
        return self._last_step if self.hang.last_step is None else self.hang.last_step

    # -- steps ---------------------------------------------------------------------
    def score_step(self, frame: StepFrame) -> StepScores:
        """Score one step without changing any state: findings per signal family and
        what :meth:`process_step` needs to learn afterwards.

        Raises
        ------
        ValueError
            When ``frame`` is a step of another job, or has a rank id beyond the
            schema's ``MAX_RANKS_PER_JOB``.
        """
        if frame.job_id != self.job_id:
            raise ValueError(f"frame of job {frame.job_id!r} given to the suite of {self.job_id!r}")
        frame = per_work(frame)  # compute per unit of work, where ranks say their work
        slots = self.ranks.lookup(frame.rank)
        node_ids, names = self.nodes.lookup(frame.nodes)
        rank_node = node_ids[frame.node_idx]
        train = frame.phase == _TRAIN
        train_step = bool(frame.n_ranks) and bool(train.mean() >= 0.5)
        cfg, g = self.config, self.grader
        out = StepScores(
            frame=frame,
            slots=slots,
            node_ids=node_ids,
            node_names=names,
            rank_node=rank_node,
            train=train,
            train_step=train_step,
            config=cfg,
            floor=g.min_score,
            nodes=self.nodes,
            rank_ids=self.ranks.ids,
        )
        if frame.n_ranks == 0:
            return out
        members = self.members
        for m in members.scorers:  # missing, non-finite; a train step's peers, baselines
            m.score(out)
        if not train_step or out.peer is None or out.temporal is None:
            return out
        out.context = ctx = StepContext(
            frame=frame,
            slots=slots,
            rank_node=rank_node,
            node_names=names,
            train=train,
            peer=out.peer,
            temporal=out.temporal,
            config=cfg,
            floor=g.min_score,
            firing_rows=lambda signal: self._firing_ranks(signal, frame, rank_node),
            open_nodes=self._open_nodes,
            scores=out,
        )
        for det in self.step_detectors:
            out.train_findings += det.findings(ctx)
        for m in members.collectors:  # replica evidence, then the group collapse
            m.score(out)
        return out

    def process_step(self, frame: StepFrame) -> list[Alert]:
        """Score one step, grade, then learn from it. Returns the alert updates."""
        s = self.score_step(frame)
        # the context refers back to the scores: kept only until learned, or every
        # step's arrays would wait for the cycle collector (at 131k ranks the
        # suite's memory grew 33-fold and its throughput halved)
        ctx, s.context = s.context, None
        step, ts = frame.step, frame.ts
        g = self.grader
        members = self.members
        # progress: a completed step resolves a hang
        done: set[str] = set()
        for c in members.clock:
            done |= c.progress(frame)
        self._last_step = self.last_step
        alerts = g.observe((), signals=done, step=step, ts=ts)
        if frame.n_ranks == 0:
            return alerts
        alerts += g.observe(s.missing, signals={"missing"}, step=step, ts=ts)
        alerts += g.observe(s.nonfinite, signals={"nonfinite"}, step=step, ts=ts)
        if s.train_step:
            alerts += g.observe(s.train_findings, signals=TRAIN_SIGNALS, step=step, ts=ts)
        # learn (new ranks get the slots scoring gave them)
        self.ranks.assign(frame.rank)
        self.nodes.register(frame.nodes)
        moved = self.nodes.record_ranks(s.slots, s.rank_node)
        if moved.shape[0]:  # these ranks now run on other hardware: fresh baselines
            for m in members.scorers:
                m.forget(moved)
            for det in self.step_detectors:
                det.forget(moved)
            for m in members.collectors:
                m.forget(moved)
        if s.temporal is not None:
            s.learn_mask = s.train & ~self._critical_ranks(frame, s.rank_node)
        for m in members.scorers:
            m.learn(s)
        if ctx is not None:
            for det in self.step_detectors:
                det.learn(ctx)
        for m in members.collectors:
            m.learn(s)
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
        alerts: list[Alert] = []
        anomalous: set[str] = set()
        read = [(m, m.prepare(msg)) for m in self.members.health]
        for m, prep in read:  # a report settles its node's silence; hardware findings
            found = m.findings(prep, g.min_score)
            alerts += g.observe(found, signals=m.signals, step=step, ts=ts, node=msg.node)
            anomalous |= {f.signal for f in found}
        anomalous |= {k[0] for k in g.firing() if k[1] == msg.node}
        for m, prep in read:
            m.learn(prep, anomalous)
        return alerts

    # -- clock ---------------------------------------------------------------------
    @property
    def relaunching_since(self) -> float | None:
        """Event time the relaunch in progress began (:meth:`restarted`), or None: from
        then until the new run's first step the job is relaunching, not hung."""
        return self.hang.relaunching_since

    def state(self, now: float) -> str:
        """The job's state at event time ``now`` as the hang clock sees it:
        ``relaunching`` (since :meth:`restarted`, until the new run's first step, for
        at most ``relaunch_max_s``), ``relaunch_stuck`` past that, else ``running``."""
        since = self.relaunching_since
        if since is None:
            return "running"
        return "relaunch_stuck" if now - since >= self.config.relaunch_max_s else "relaunching"

    def restarted(self, now: float, removed_nodes: Iterable[str] = ()) -> None:
        """The job was relaunched at event time ``now`` (restart or rollback to a
        checkpoint, perhaps with ``removed_nodes`` swapped for spares).

        Step numbers may repeat from here on; until the new run's first step the job
        is relaunching (:meth:`state`), not hung, for up to ``relaunch_max_s`` (a
        step of the old run in flight does not end it), past which :meth:`tick`
        raises ``relaunch_stuck`` (investigate, never a RESTART); removed nodes are no longer
        expected to report health (their late reports are ignored until they appear in
        the job's steps again).
        """
        removed = tuple(removed_nodes)
        for c in self.members.clock:
            c.restarted(now, removed)
        for det in self.step_detectors:
            det.restarted()  # e.g. loss drift: a rollback resumes from an earlier, higher loss
        for node in removed:
            self.nodes.remove(node)

    def announce_phase(
        self,
        phase: str,
        ts: float,
        expected_s: float | None = None,
        after_step: int | None = None,
        *,
        max_s: float | None = None,
    ) -> None:
        """The job announced a long ``phase`` (checkpoint, eval) starting at event time
        ``ts`` after step ``after_step``: until the phase's step completes, the hang
        clock measures the silence against the phase's expected duration, a length it
        did not say at most ``max_s`` (:meth:`HangDetector.announce`)."""
        self.hang.announce(phase, ts, expected_s, after_step, max_s=max_s)

    def wait_for_input(self, ts: float, after_step: int, *, max_s: float | None = None) -> None:
        """The job's leader has waited for the input of the step after ``after_step``
        since event time ``ts``: the hang clock allows that step a slower pace
        (:meth:`HangDetector.waiting`)."""
        self.hang.waiting(ts, after_step, max_s=max_s)

    def close(self, why: str, ts: float, node: str | None = None) -> list[Alert]:
        """Resolve every open episode (of ``node``, if given) at event time ``ts``,
        saying ``why`` (the job ended or was abandoned, the node left the job);
        nothing re-opens from the old scores."""
        return self.grader.close(why, step=max(self.last_step, 0), ts=ts, node=node)

    def tick(self, now: float) -> list[Alert]:
        """Check for a hung job and silent nodes at event time ``now`` (epoch seconds)."""
        g = self.grader
        step = self.last_step + 1
        tick = Tick(now=now, last_step=self.last_step, stepping_at=self.stepping_at,
                    floor=g.min_score)  # fmt: skip
        alerts: list[Alert] = []
        for c in self.members.clock:  # the job's silence, then its nodes'
            alerts += g.observe(c.findings(tick), signals=c.signals, step=step, ts=now)
        return alerts
