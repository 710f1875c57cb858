"""The worker core's configuration, grouped by what each part reads: how often a job is
snapshotted (:class:`SnapshotPolicy`), how much it holds (:class:`Capacity`), how its
clocks run (:class:`Timing`), whose word it takes (:class:`WorkerTrust`), and all of
them with the topics, the lifecycle limits and the wall clock as one frozen
:class:`WorkerConfig` that every collaborator of
:class:`~pipeline.services.worker.state.WorkerDetection` is handed. Each group checks
its fields when built (a ``ValueError`` naming the field). The fields keep the names of
:class:`~pipeline.services.worker.state.WorkerDetection`'s keywords
(:class:`FlatOptions`), so a caller may pass either a group or the flat keywords.

Examples
--------
>>> SnapshotPolicy(snapshot_steps=0)
Traceback (most recent call last):
...
ValueError: snapshot_steps must be >= 1
>>> groups = grouped({"max_jobs": 5, "snapshot_steps": 3})
>>> groups["capacity"].max_jobs, groups["snapshots"].snapshot_steps
(5, 3)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypedDict

from detectors.job_guard import LifecycleLimits
from pipeline.io.telemetry_auth import TelemetryVerifier
from pipeline.io.trust import PublicKeys
from pipeline.services.worker.records import CoreTopics
from pipeline.services.worker.seal import Seal
from schemas.codec import MAX_MESSAGE_BYTES
from schemas.lifecycle import MAX_NODES_PER_JOB
from schemas.telemetry import MAX_RANKS_PER_JOB

__all__ = [
    "Capacity",
    "FlatOptions",
    "SnapshotPolicy",
    "Timing",
    "WorkerConfig",
    "WorkerTrust",
    "grouped",
]


@dataclass(frozen=True, slots=True)
class SnapshotPolicy:
    """When a job's state goes to the table (see
    :class:`~pipeline.services.worker.state.WorkerDetection` for each field)."""

    snapshot_steps: int = 10
    snapshot_interval_s: float = 2.0
    snapshot_budget: float = 0.05
    max_snapshot_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.snapshot_steps < 1:
            raise ValueError("snapshot_steps must be >= 1")
        if self.snapshot_interval_s <= 0:
            raise ValueError("snapshot_interval_s must be positive")
        if not 0 < self.snapshot_budget <= 1:
            raise ValueError("snapshot_budget must be in (0, 1]")

    @property
    def max_state_bytes(self) -> int:
        """Largest inflated snapshot read back (the compressed limit x a generous ratio)."""
        return 16 * self.max_snapshot_bytes


@dataclass(frozen=True, slots=True)
class Capacity:
    """How much the worker holds: records, jobs, ranks and nodes per job, ended and
    pending jobs, and how long an idle job is kept."""

    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_jobs: int = 10_000
    job_idle_ttl_s: float = 3600.0
    max_ranks_per_job: int = MAX_RANKS_PER_JOB
    max_nodes_per_job: int = MAX_NODES_PER_JOB
    max_ended: int = 65_536
    max_pending_jobs: int = 1024
    pending_ttl_s: float = 300.0

    def __post_init__(self) -> None:
        if self.max_jobs < 1 or self.max_ended < 1:
            raise ValueError("max_jobs and max_ended must be >= 1")
        if self.job_idle_ttl_s <= 0:
            raise ValueError("job_idle_ttl_s must be positive")


@dataclass(frozen=True, slots=True)
class Timing:
    """How the worker's clocks relate: event seconds per wall second
    (``event_rate``), the silence that means the worker was cut off
    (``blind_after_s``), and how far ahead of the wall clock a record may be dated
    (``max_clock_skew_s``; None: no check)."""

    event_rate: float = 1.0
    blind_after_s: float = 5.0
    max_clock_skew_s: float | None = None

    def __post_init__(self) -> None:
        if not 0 < self.event_rate <= 1000:
            raise ValueError("event_rate must be in (0, 1000]")
        if self.blind_after_s <= 0:
            raise ValueError("blind_after_s must be positive")


@dataclass(frozen=True, slots=True)
class WorkerTrust:
    """Whose word the worker takes: the actuator's (``command_keys``), the job
    controllers' (``result_keys``), the executors' (``executor_keys``), its own
    (``seal``) and the telemetry writers' (``telemetry``); ``on_refused`` is told of
    every telemetry record refused for its proof. Empty or None: nothing of that kind is
    trusted, or (``seal``, ``telemetry``) nothing is checked."""

    command_keys: PublicKeys = field(default_factory=dict)
    result_keys: PublicKeys = field(default_factory=dict)
    executor_keys: PublicKeys = field(default_factory=dict)
    seal: Seal | None = None
    telemetry: TelemetryVerifier | None = None
    on_refused: Callable[[str, str], None] | None = None


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """Everything the core's collaborators read and nobody changes once built."""

    topics: CoreTopics
    n_partitions: int
    snapshots: SnapshotPolicy = SnapshotPolicy()
    capacity: Capacity = Capacity()
    timing: Timing = Timing()
    trust: WorkerTrust = WorkerTrust()
    #: how far jobs' lifecycle events are trusted (None: the detectors' defaults)
    limits: LifecycleLimits | None = None
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        if self.n_partitions < 1:
            raise ValueError("n_partitions must be >= 1")


class FlatOptions(TypedDict, total=False):
    """:class:`~pipeline.services.worker.state.WorkerDetection`'s keywords, each a field
    of one group (the form callers wrote before the groups)."""

    snapshot_steps: int
    snapshot_interval_s: float
    snapshot_budget: float
    max_snapshot_bytes: int
    max_message_bytes: int
    max_jobs: int
    job_idle_ttl_s: float
    max_ranks_per_job: int
    max_nodes_per_job: int
    max_ended: int
    max_pending_jobs: int
    pending_ttl_s: float
    event_rate: float
    blind_after_s: float
    max_clock_skew_s: float | None
    command_keys: PublicKeys | None
    result_keys: PublicKeys | None
    executor_keys: PublicKeys | None
    seal: Seal | None
    telemetry: TelemetryVerifier | None
    on_refused: Callable[[str, str], None] | None


_GROUPS: dict[str, Any] = {
    "snapshots": SnapshotPolicy(),
    "capacity": Capacity(),
    "timing": Timing(),
    "trust": WorkerTrust(),
}
_KEYS = ("command_keys", "result_keys", "executor_keys")


def grouped(flat: dict[str, Any], **groups: Any) -> dict[str, Any]:
    """The groups (``snapshots``, ``capacity``, ``timing``, ``trust``: those given in
    ``groups``, else the defaults) with the ``flat`` keywords set in the group that has
    the field; ``TypeError`` for a keyword no group has."""
    out = {name: groups.get(name) or default for name, default in _GROUPS.items()}
    left = dict(flat)
    for key in _KEYS:  # None: trust no key
        if key in left and left[key] is None:
            left[key] = {}
    for name, group in out.items():
        mine = {f.name: left.pop(f.name) for f in fields(group) if f.name in left}
        if mine:
            out[name] = replace(group, **mine)
    if left:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(left))}")
    return out
