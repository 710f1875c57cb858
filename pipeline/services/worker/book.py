"""The jobs one worker holds, and what it counts: the one piece of mutable state the core's
collaborators share. :class:`JobBook` owns the confirmed jobs (``jobs``: a
:class:`~pipeline.services.worker.records.JobState` each), the jobs named but not yet
proven by a step (``pending``, :mod:`pipeline.services.worker.pending`), the tokens of
records each job's next snapshot will cover (``held``), the wall time the broker last
delivered anything, and the counters of what was refused or unreadable
(:class:`Counts`, the worker's ``state_events`` metrics). It decides nothing: the
collaborators that handle records (:mod:`.intake`, :mod:`.job_topic`, :mod:`.ticks`)
and take over, snapshot and end jobs (:mod:`.takeover`, :mod:`.snapshots`,
:mod:`.ending`) read and change it.

Examples
--------
>>> from pipeline.services.worker.options import WorkerConfig
>>> from pipeline.services.worker.records import CoreTopics
>>> book = JobBook(WorkerConfig(CoreTopics("s", "h", "j"), 1))
>>> book.counts.refused += 1
>>> book.metrics()["refused_for_limit"], book.held_count("j")
(1, 0)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from detectors.job import JOB_STATES
from pipeline.services.worker.options import WorkerConfig
from pipeline.services.worker.pending import PendingJobs
from pipeline.services.worker.records import JobState

__all__ = ["Counts", "JobBook"]


@dataclass(slots=True)
class Counts:
    """What the worker refused or could not read, since it started."""

    unreadable_snapshots: int = 0
    oversized_snapshots: int = 0
    refused: int = 0  #: records dead-lettered for a capacity limit
    after_end: int = 0  #: records of ended jobs ignored
    future_dated: int = 0  #: records dead-lettered for an event time ahead of now
    refused_commands: int = 0  #: relaunch commands not obeyed (signature, expiry)
    refused_results: int = 0  #: SUCCEEDED results no trusted key signed (ignored)
    unsealed: int = 0  #: internal records and snapshots the worker did not write
    refused_proof: int = 0  #: telemetry records without their writer's proof
    blind_periods: int = 0  #: gaps in which the broker delivered nothing
    unrouted_health: int = 0  #: health reports that name no job


class JobBook:
    """The jobs held, pending and their held tokens; the counters (module docstring)."""

    def __init__(self, config: WorkerConfig) -> None:
        self.jobs: dict[str, JobState] = {}
        #: jobs named by health or a start event only, until their first step
        self.pending: PendingJobs[JobState] = PendingJobs(
            config.capacity.max_pending_jobs, config.capacity.pending_ttl_s, config.clock
        )
        #: job -> tokens of its records the next snapshot covers
        self.held: dict[str, list[Any]] = {}
        #: wall time the broker last delivered a record (None: not yet)
        self.last_record_wall: float | None = None
        self.counts = Counts()

    def held_count(self, job_id: str) -> int:
        return len(self.held.get(job_id, ()))

    def drop_partitions(self, partitions: Iterable[int]) -> int:
        """Forget jobs of revoked partitions and their unacked records (they come back
        from the committed offset to whoever owns the partition next)."""
        gone = set(partitions)
        drop = [j for j, st in self.jobs.items() if st.partition in gone or st.partition < 0]
        for job in drop:
            del self.jobs[job]
            self.held.pop(job, None)
        self.pending.drop(lambda st: st.partition not in gone and st.partition >= 0)
        return len(drop)

    def metrics(self) -> dict[str, int]:
        """The counters by metric label."""
        c = self.counts
        return {
            "unreadable_snapshot": c.unreadable_snapshots,
            "oversized_snapshot": c.oversized_snapshots,
            "refused_for_limit": c.refused,
            "after_end": c.after_end,
            "future_dated": c.future_dated,
            "refused_command": c.refused_commands,
            "refused_result": c.refused_results,
            "unsealed": c.unsealed,
            "refused_proof": c.refused_proof,
            "pending_expired": self.pending.expired + self.pending.evicted,
        }

    def job_states(self) -> dict[str, int]:
        """How many jobs held are in each state (:attr:`JobDetection.state`): a job
        relaunching is shown as such, not as silent (metrics)."""
        counts = dict.fromkeys(JOB_STATES, 0)
        for st in self.jobs.values():
            state = st.detection.state
            counts[state] = counts.get(state, 0) + 1
        return counts
