"""What the members of :class:`~detectors.engine.DetectorSuite` are: the protocols it drives.

Every member is behind one protocol by what it consumes, so the suite iterates over
its members instead of naming each (River's habit: the same verbs for every member
of a kind):

=====================  ==================  ==================================================
protocol               consumes            members
=====================  ==================  ==================================================
:class:`StepMember`    a step's frame      ``score`` it into :class:`StepScores`, ``learn`` it
                                           once graded, ``forget`` rank slots: missing ranks,
                                           non-finite values, peer statistics, per-rank
                                           baselines (before the step detectors); replicas,
                                           groups (after them)
:class:`StepDetector`  a scored train      ``findings`` of the :class:`StepContext`, then
                       step                ``learn``: the train-step detectors
                                           (:mod:`detectors.step_detectors`)
:class:`ClockMember`   the clock           ``progress`` of a completed step, ``findings`` at a
                                           :class:`Tick`, ``restarted``: hang, silent nodes
:class:`HealthMember`  a health report     ``prepare``, ``findings``, then ``learn``: hardware,
                                           node presence
:class:`Grading`       findings            ``observe`` them into alert updates: the grader
=====================  ==================  ==================================================

The thin members around each family's classes are :mod:`detectors.suite_members`'s.
A train step is scored once (peer statistics, per-rank temporal baselines); every
step detector then reads that :class:`StepContext` and returns its findings, in the
suite's order (:func:`detectors.step_detectors.step_detectors`). Nothing is learned
while scoring: once the step is graded, each detector's :meth:`StepDetector.learn`
reads the same context (and what the detectors left in :class:`StepScores`).

Examples
--------
>>> from detectors.step_detectors import step_detectors
>>> from detectors.config import DetectorConfig
>>> suite = step_detectors(DetectorConfig())
>>> [d.name for d in suite][:4]
['slowdown', 'early_peer', 'waited_on', 'intermittent']
>>> [d.name for d in suite][4:]
['nic_flap', 'loss', 'imbalance', 'loss_drift']
>>> all(isinstance(d, StepDetector) for d in suite)
True
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt

from detectors.base import Finding, SubjectKey
from detectors.config import DetectorConfig
from detectors.frame import StepFrame
from detectors.registry import NodeRegistry
from detectors.steps.peer import PeerScores
from detectors.steps.replica import ReplicaStep
from detectors.steps.temporal import TemporalScores
from schemas.alerts import Alert, Grade
from schemas.telemetry import NodeHealth

__all__ = [
    "ClockMember",
    "Grading",
    "HealthMember",
    "StepContext",
    "StepDetector",
    "StepMember",
    "StepScores",
    "Tick",
]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


@dataclass(eq=False)
class StepScores:
    """What :meth:`DetectorSuite.score_step` found in one frame (nothing learned yet)."""

    frame: StepFrame
    slots: I64  #: dense slot of each frame row's rank (new ranks: provisional)
    node_ids: I64  #: global node id of each ``frame.nodes`` entry
    node_names: list[str]  #: node name by global id
    rank_node: I64  #: global node id of each frame row
    train: B  #: rows in the TRAIN phase
    train_step: bool  #: most rows are TRAIN: the step is graded and learned
    config: DetectorConfig
    #: the lowest score a signal's grading acts on
    floor: Callable[[str], float]
    nodes: NodeRegistry  #: the job's nodes (read while scoring)
    rank_ids: I64  #: rank id by dense slot
    missing: list[Finding] = field(default_factory=list)
    nonfinite: list[Finding] = field(default_factory=list)
    train_findings: list[Finding] = field(default_factory=list)
    peer: PeerScores | None = None  #: the step's peer statistics (a train step)
    values: F64 | None = None
    scales: F64 | None = None
    temporal: TemporalScores | None = None
    spikes: B | None = None
    slow: B | None = None  #: ranks clearly slow this step (intermittent stragglers)
    slow_excess: F64 | None = None
    stage_gaps: F64 | None = None  #: each stage's compute gap over the others
    #: each rank's waited-on score this step, before the median over the last steps
    waits: F64 | None = None
    waits_named: bool = False  #: a rank is waited on in most recent steps
    #: who arrived last in its stage this step, each row's unexplained share, and the
    #: evidence of the rows its peers keep waiting on (:class:`~detectors.steps.waits.LastArrivals`)
    arrivals: tuple[B, F64, F64] | None = None
    node_findings: list[Finding] = field(default_factory=list)  #: before grouping
    replica_findings: list[Finding] = field(default_factory=list)  #: group evidence only
    replicas: ReplicaStep | None = None
    #: what the step detectors read (a scored train step only)
    context: StepContext | None = None
    #: rows the baselines learn from (set once the step is graded: TRAIN rows not in a
    #: CRITICAL episode of a step signal)
    learn_mask: B | None = None

    @property
    def findings(self) -> list[Finding]:
        """Every finding of the step."""
        return [*self.missing, *self.nonfinite, *self.train_findings]


@dataclass(frozen=True, slots=True, eq=False)
class StepContext:
    """Everything a step detector reads of one scored train step."""

    frame: StepFrame
    slots: I64  #: dense slot of each frame row's rank
    rank_node: I64  #: global node id of each frame row
    node_names: list[str]  #: node name by global id
    train: B  #: rows in the TRAIN phase
    peer: PeerScores  #: the step's peer statistics
    temporal: TemporalScores  #: scores against each rank's own baselines
    config: DetectorConfig
    #: the lowest score a signal's grading acts on
    floor: Callable[[str], float]
    #: rows of ``frame`` covered by an open episode of a signal
    firing_rows: Callable[[str], B]
    #: global ids of nodes with an open node-level episode of a signal
    open_nodes: Callable[[str], set[int]]
    #: where detectors leave what they must learn from once the step is graded
    scores: StepScores


@runtime_checkable
class StepDetector(Protocol):
    """One detector of train steps: findings of a scored step, then learning from it.

    State hooks default to nothing; a detector subclassing this protocol overrides
    the ones it needs.
    """

    name: str

    def findings(self, ctx: StepContext) -> list[Finding]:
        """The detector's findings of the step; reads state only."""
        ...

    def learn(self, ctx: StepContext) -> None:
        """Learn from the graded step (a train step of a job with ranks)."""
        return None

    def forget(self, slots: I64) -> None:
        """These rank slots now run on other hardware: drop what was learned of them."""
        return None

    def restarted(self) -> None:
        """The job was relaunched (restart or rollback to a checkpoint)."""
        return None


class StepMember(Protocol):
    """A member that reads every step with ranks: scores it into :class:`StepScores`
    (before or after the step detectors), learns from it once graded."""

    name: str

    def score(self, s: StepScores) -> None:
        """Leave this member's scores or findings of the step in ``s``; reads state only."""
        ...

    def learn(self, s: StepScores) -> None:
        """Learn from the graded step (``s.learn_mask``: the rows to learn from)."""
        return None

    def forget(self, slots: I64) -> None:
        """These rank slots now run on other hardware: drop what was learned of them."""
        return None


@dataclass(frozen=True, slots=True, eq=False)
class Tick:
    """What a :class:`ClockMember` reads at a tick: event time and the job's progress."""

    now: float  #: event time of the tick (epoch seconds)
    last_step: int  #: the last step the job completed
    #: event time of the job's newest step most of its nodes reported (the job core's)
    stepping_at: float | None
    #: the lowest score a signal's grading acts on
    floor: Callable[[str], float]


class ClockMember(Protocol):
    """A member judged on event time, when nothing may arrive: learns the job's progress
    from each completed step, finds silence at a tick."""

    name: str
    #: the signals graded from its findings at every tick
    signals: frozenset[str]

    def progress(self, frame: StepFrame) -> frozenset[str]:
        """A step completed: learn it; the signals it settles (graded as not found)."""
        ...

    def findings(self, tick: Tick) -> list[Finding]:
        """Findings at the tick; reads state only."""
        ...

    def restarted(self, now: float, removed_nodes: tuple[str, ...]) -> None:
        """The job was relaunched at ``now``, without ``removed_nodes``."""
        return None


P = TypeVar("P")


class HealthMember(Protocol[P]):
    """A member that reads nodes' health reports: one report read once
    (:meth:`prepare`), scored, graded, then learned."""

    name: str
    #: the signals graded (for the report's node) from its findings of a report
    signals: frozenset[str]

    def prepare(self, msg: NodeHealth) -> P:
        """The report as this member reads it; reads state only."""
        ...

    def findings(self, prep: P, floor: Callable[[str], float]) -> list[Finding]:
        """Findings of the report scoring at least their signal's ``floor``; reads state only."""
        ...

    def learn(self, prep: P, anomalous: set[str]) -> None:
        """Learn the report; signals in ``anomalous`` (found, or firing on its node) do
        not move baselines."""
        ...


class Grading(Protocol):
    """Findings into alert updates, with hysteresis (:class:`~detectors.grading.grader.Grader`)."""

    def observe(
        self,
        findings: Iterable[Finding],
        *,
        signals: Collection[str],
        step: int,
        ts: float,
        node: str | None = None,
    ) -> list[Alert]:
        """One observation of every subject of ``signals``: the alert updates caused."""
        ...

    def firing(self) -> dict[SubjectKey, Grade]:
        """Subjects with an open episode and their grade."""
        ...

    def min_score(self, signal: str) -> float:
        """Findings of ``signal`` scoring below this can be left out of :meth:`observe`."""
        ...

    def close(self, why: str, *, step: int, ts: float, node: str | None = None) -> list[Alert]:
        """Resolve every open episode (of ``node``, if given), saying ``why``."""
        ...
