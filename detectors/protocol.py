"""What a step detector is: the protocol :class:`~detectors.engine.DetectorSuite` drives.

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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from detectors.base import Finding
from detectors.config import DetectorConfig
from detectors.frame import StepFrame
from detectors.steps.peer import PeerScores
from detectors.steps.replica import ReplicaStep
from detectors.steps.temporal import TemporalScores

__all__ = ["StepContext", "StepDetector", "StepScores"]

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
    missing: list[Finding] = field(default_factory=list)
    nonfinite: list[Finding] = field(default_factory=list)
    train_findings: list[Finding] = field(default_factory=list)
    values: F64 | None = None
    scales: F64 | None = None
    temporal: TemporalScores | None = None
    spikes: B | None = None
    slow: B | None = None  #: ranks clearly slow this step (intermittent stragglers)
    slow_excess: F64 | None = None
    stage_gaps: F64 | None = None  #: each stage's compute gap over the others
    node_findings: list[Finding] = field(default_factory=list)  #: before grouping
    replica_findings: list[Finding] = field(default_factory=list)  #: group evidence only
    replicas: ReplicaStep | None = None
    #: what the step detectors read (a scored train step only)
    context: StepContext | None = None

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
