"""The suite's members besides its step detectors, each a thin :mod:`detectors.protocol`
member around its family's class, in the order :class:`~detectors.engine.DetectorSuite`
drives them (:func:`suite_members`).

The family objects are the suite's state (``suite.hang``, ``suite.presence``, ...: a
snapshot names them), and these members only drive them: each holds the object it
wraps (the hang member the thresholds too) and no state of its own, so a snapshot
written before the members existed reads back and builds them on first use
(:attr:`DetectorSuite.members <detectors.engine.DetectorSuite.members>`).

Examples
--------
>>> from detectors.engine import DetectorSuite
>>> m = DetectorSuite("job-1").members
>>> [x.name for x in m.scorers], [x.name for x in m.collectors]
(['missing', 'nonfinite', 'peer', 'baselines'], ['replicas', 'groups'])
>>> [x.name for x in m.clock], [x.name for x in m.health]
(['hang', 'silent_nodes'], ['presence', 'hardware'])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from detectors.base import Finding
from detectors.config import DetectorConfig
from detectors.findings import missing_findings, nonfinite_findings
from detectors.frame import StepFrame
from detectors.hang.detector import HangDetector, HealthPresence, MissingRanks
from detectors.hardware.health import HEALTH_SIGNALS, HardwareDetector
from detectors.hardware.state import Prepared
from detectors.protocol import (
    I64,
    ClockMember,
    HealthMember,
    StepMember,
    StepScores,
    Tick,
)
from detectors.steps.first_step import anchor_first_step_outliers
from detectors.steps.group import GroupFaults
from detectors.steps.peer import PeerDetector
from detectors.steps.replica import ReplicaDrift
from detectors.steps.slowdown import replica_corrected
from detectors.steps.temporal import RankBaselines
from schemas.telemetry import NodeHealth

__all__ = [
    "Baselines",
    "Groups",
    "Hang",
    "Hardware",
    "Missing",
    "Nonfinite",
    "Peer",
    "Presence",
    "Replicas",
    "SilentNodes",
    "SuiteMembers",
    "suite_members",
]


@dataclass(frozen=True, slots=True, eq=False)
class SuiteMembers:
    """The suite's members by protocol, each tuple in the order the suite drives it."""

    #: read every step with ranks before the step detectors: what they read
    scorers: tuple[StepMember, ...]
    #: read a train step after the step detectors: their findings as group findings
    collectors: tuple[StepMember, ...]
    clock: tuple[ClockMember, ...]
    health: tuple[HealthMember[Any], ...]


def suite_members(
    cfg: DetectorConfig,
    *,
    missing: MissingRanks,
    peer: PeerDetector,
    baselines: RankBaselines,
    replicas: ReplicaDrift,
    groups: GroupFaults,
    hang: HangDetector,
    presence: HealthPresence,
    hardware: HardwareDetector,
) -> SuiteMembers:
    """The members driving these family objects with thresholds ``cfg``."""
    return SuiteMembers(
        scorers=(Missing(missing), Nonfinite(), Peer(peer), Baselines(baselines)),
        collectors=(Replicas(replicas), Groups(groups)),
        clock=(Hang(hang, cfg), SilentNodes(presence)),
        health=(Presence(presence), Hardware(hardware)),
    )


# -- per step ---------------------------------------------------------------------------
class Missing(StepMember):
    """Ranks the job expects and a step lacks (:class:`~detectors.hang.presence.MissingRanks`)."""

    __slots__ = ("det",)
    name = "missing"

    def __init__(self, det: MissingRanks) -> None:
        self.det = det

    def score(self, s: StepScores) -> None:
        s.missing = missing_findings(self.det, s.slots, s.floor("missing"), s.nodes, s.rank_ids)

    def learn(self, s: StepScores) -> None:
        self.det.learn(s.slots)


class Nonfinite(StepMember):
    """NaN or infinite values in a step (:func:`~detectors.findings.nonfinite_findings`):
    no state."""

    __slots__ = ()
    name = "nonfinite"

    def score(self, s: StepScores) -> None:
        s.nonfinite = nonfinite_findings(s.frame)


class Peer(StepMember):
    """How far each rank of a train step stands from its peers
    (:class:`~detectors.steps.peer.PeerDetector`), corrected for slow replicas when
    ``replica_correction`` is on; leaves ``peer``, ``values`` and ``scales``."""

    __slots__ = ("det",)
    name = "peer"

    def __init__(self, det: PeerDetector) -> None:
        self.det = det

    def score(self, s: StepScores) -> None:
        if not s.train_step:
            return
        cfg = s.config
        s.peer = peer = self.det.score_frame(s.frame)
        inv = peer.groups.inverse
        slowdown, c_scale = peer.slowdown, peer.compute_scale[inv]
        if cfg.replica_correction:
            slowdown, c_scale = replica_corrected(
                peer, s.frame.dp_group, s.rank_node, cfg.mad_floor_rel
            )
        s.values = np.stack((slowdown, peer.data_excess, peer.comm_excess))
        s.scales = np.stack((c_scale, peer.data_scale[inv], peer.comm_scale[inv]))


class Baselines(StepMember):
    """Each rank against its own past (:class:`~detectors.steps.temporal.RankBaselines`);
    leaves ``temporal``. A rank slow from its first step is anchored to its peers
    (:func:`~detectors.steps.first_step.anchor_first_step_outliers`)."""

    __slots__ = ("det",)
    name = "baselines"

    def __init__(self, det: RankBaselines) -> None:
        self.det = det

    def score(self, s: StepScores) -> None:
        if s.values is not None and s.scales is not None:
            s.temporal = self.det.score(s.slots, s.values, s.scales)

    def learn(self, s: StepScores) -> None:
        if s.temporal is None or s.values is None or s.scales is None or s.learn_mask is None:
            return
        self.det.learn(s.slots, s.values, s.scales, s.learn_mask, s.temporal)
        anchor_first_step_outliers(  # slow from the first step: not its normal
            self.det,
            s.slots,
            s.frame.pp_stage.astype(np.int64),
            s.rank_node,
            s.learn_mask,
            floor=s.config.first_step_floor,
            k=s.config.first_step_z,
        )

    def forget(self, slots: I64) -> None:
        self.det.forget(slots)


class Replicas(StepMember):
    """Whole replicas slowing (:class:`~detectors.steps.replica.ReplicaDrift`), what the
    replica correction hides: group evidence in ``replica_findings``."""

    __slots__ = ("det",)
    name = "replicas"

    def __init__(self, det: ReplicaDrift) -> None:
        self.det = det

    def score(self, s: StepScores) -> None:
        if not s.config.replica_correction or s.peer is None:
            return
        s.replicas = self.det.score(s.peer.slowdown, s.frame.dp_group, s.rank_node, s.train)
        s.replica_findings = self.det.findings(
            s.replicas, s.frame.dp_group, s.rank_node, s.node_names, s.floor("group")
        )

    def learn(self, s: StepScores) -> None:
        if s.temporal is not None and s.replicas is not None:
            self.det.learn(s.replicas, s.config.straggler_warning)


class Groups(StepMember):
    """Nodes that began to slow together (:class:`~detectors.steps.group.GroupFaults`):
    the step detectors' node findings (kept in ``node_findings``) with a group's
    replaced by one group finding."""

    __slots__ = ("det",)
    name = "groups"

    def __init__(self, det: GroupFaults) -> None:
        self.det = det

    def score(self, s: StepScores) -> None:
        if not s.train_step:
            return
        s.node_findings = s.train_findings
        s.train_findings = self.det.collapse(s.train_findings, s.frame.step, s.replica_findings)

    def learn(self, s: StepScores) -> None:
        if s.temporal is not None:
            self.det.learn(s.node_findings, s.frame.step, s.replica_findings)


# -- the clock --------------------------------------------------------------------------
class Hang(ClockMember):
    """The job's silence against its own step times, and a relaunch past
    ``relaunch_max_s`` (:class:`~detectors.hang.detector.HangDetector`)."""

    __slots__ = ("config", "det")
    name = "hang"
    signals = frozenset({"hang", "relaunch_stuck"})

    def __init__(self, det: HangDetector, config: DetectorConfig) -> None:
        self.det = det
        self.config = config

    def progress(self, frame: StepFrame) -> frozenset[str]:
        self.det.learn_step(frame.step, frame.ts, frame.ts_start)  # a step resolves a hang
        if self.det.relaunching_since is not None:
            return frozenset({"hang"})
        return self.signals

    def findings(self, tick: Tick) -> list[Finding]:
        return [*self._hang(tick), *self._relaunch(tick)]

    def _hang(self, tick: Tick) -> list[Finding]:
        # silence counts from the job's last progress: a step most of its nodes
        # reported (``stepping_at``, set by the core) is progress even while one node's
        # record of it is missing (refused, or that node died: the missing detector's)
        now, last, stepping = tick.now, self.det.last_ts, tick.stepping_at
        at = now
        if stepping is not None and last is not None and stepping > last:
            at = now - (min(stepping, now) - last)
        h = self.det.graded(at)
        if h < tick.floor("hang"):
            return []
        baseline, why = self.det.explain(at)
        return [
            Finding(
                "hang",
                None,
                None,
                h,
                "seconds_since_step",
                at - (self.det.last_ts or at),
                h,
                baseline=baseline,
                detail=f"{why}; last step {tick.last_step}",
            )
        ]

    def _relaunch(self, tick: Tick) -> list[Finding]:
        """A relaunch past ``relaunch_max_s``: the job's one ``relaunch_stuck`` finding,
        scored in maximums (WARNING from 1)."""
        since = self.det.relaunching_since
        limit = self.config.relaunch_max_s
        if since is None or tick.now - since < limit:
            return []
        took = tick.now - since
        return [
            Finding(
                "relaunch_stuck",
                None,
                None,
                took / max(limit, 1e-9),
                "seconds_relaunching",
                took,
                took / max(limit, 1e-9),
                baseline=limit,
                detail=(
                    f"relaunch_stuck: relaunching for {took:.0f}s since the relaunch, past "
                    f"the {limit:.0f}s a relaunch may take, and no step of the new run; "
                    f"investigate the scheduler and the job's start (not restarted again); "
                    f"last step {tick.last_step}"
                ),
            )
        ]

    def restarted(self, now: float, removed_nodes: tuple[str, ...]) -> None:
        cfg = self.config
        self.det.restart(now, cfg.restart_grace_steps, getattr(cfg, "restart_grace_min_s", 0.0))


class SilentNodes(ClockMember):
    """Nodes whose health reports stopped while others report
    (:class:`~detectors.hang.presence.HealthPresence`, learned by :class:`Presence`),
    found at a tick."""

    __slots__ = ("det",)
    name = "silent_nodes"
    signals = frozenset({"health_missing"})

    def __init__(self, det: HealthPresence) -> None:
        self.det = det

    def progress(self, frame: StepFrame) -> frozenset[str]:
        return frozenset()  # a node is missing only when its own reports stop

    def findings(self, tick: Tick) -> list[Finding]:
        floor = tick.floor("health_missing")
        return [
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
            for node, s in sorted(self.det.score(tick.now).items())
            if s >= floor
        ]

    def restarted(self, now: float, removed_nodes: tuple[str, ...]) -> None:
        for node in removed_nodes:  # no longer expected to report
            self.det.forget(node)


# -- health reports ---------------------------------------------------------------------
class Presence(HealthMember[NodeHealth]):
    """When each node's health reports arrive (:class:`~detectors.hang.presence.HealthPresence`):
    a report settles its node's silence (``health_missing`` graded as not found)."""

    __slots__ = ("det",)
    name = "presence"
    signals = frozenset({"health_missing"})

    def __init__(self, det: HealthPresence) -> None:
        self.det = det

    def prepare(self, msg: NodeHealth) -> NodeHealth:
        return msg

    def findings(self, prep: NodeHealth, floor: Callable[[str], float]) -> list[Finding]:
        return []

    def learn(self, prep: NodeHealth, anomalous: set[str]) -> None:
        self.det.learn(prep.node, prep.ts.timestamp(), prep.interval_s)


class Hardware(HealthMember[Prepared]):
    """What a node's health report says of its GPUs and links
    (:class:`~detectors.hardware.health.HardwareDetector`)."""

    __slots__ = ("det",)
    name = "hardware"
    signals = HEALTH_SIGNALS

    def __init__(self, det: HardwareDetector) -> None:
        self.det = det

    def prepare(self, msg: NodeHealth) -> Prepared:
        return self.det.prepare(msg)

    def findings(self, prep: Prepared, floor: Callable[[str], float]) -> list[Finding]:
        return [f for f in self.det.score_prepared(prep) if f.score >= floor(f.signal)]

    def learn(self, prep: Prepared, anomalous: set[str]) -> None:
        self.det.learn_prepared(prep, anomalous=anomalous)
