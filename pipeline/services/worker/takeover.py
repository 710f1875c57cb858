"""Where a job's live state comes from, and how its clocks survive a gap the pipeline
caused. :class:`Takeover` owns a job's state coming into the worker
(:meth:`Takeover.state`: cached, else pending, else the table's snapshot, else new; only
a step confirms a job, and ``max_jobs`` bounds the confirmed ones), the tick loop's
adoption of jobs found in the table after a restart or rebalance
(:meth:`Takeover.adopt`), and resuming a job's hang clock without counting the gap
against it: after a takeover from a snapshot (:meth:`Takeover.resume`) and after a
broker outage in which no record came at all (:meth:`Takeover.saw_record`). New jobs'
detectors are built from ``detector_config``, which the control topic may replace at run
time (:mod:`pipeline.services.worker.control`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from detectors.engine import DetectorConfig
from detectors.job import JobDetection
from pipeline.io.errors import CapacityError
from pipeline.services.worker.book import JobBook
from pipeline.services.worker.ended import read_mark
from pipeline.services.worker.ending import Ending
from pipeline.services.worker.options import WorkerConfig
from pipeline.services.worker.records import JobState
from pipeline.services.worker.snapshots import Snapshots

__all__ = ["Takeover"]

log = logging.getLogger(__name__)


class Takeover:
    """A job's state: found, restored or made; its clocks resumed (module docstring)."""

    def __init__(
        self,
        config: WorkerConfig,
        book: JobBook,
        snapshots: Snapshots,
        ending: Ending,
        detector_config: DetectorConfig | None = None,
    ) -> None:
        self.config = config
        self.clock = config.clock
        self.timing = config.timing
        self.book = book
        self.snapshots = snapshots
        self.ending = ending
        #: thresholds of new jobs (replaced by the control topic's signed changes)
        self.detector_config = detector_config

    def state(
        self, job_id: str, load: Callable[[str], bytes | None], *, confirm: bool = True
    ) -> JobState:
        """The job's live state: cached, else the table's snapshot, else a new one.

        Only a step confirms a job (``confirm``): a job that health reports or a start
        event name, and that has no snapshot, is *pending* (:mod:`pipeline.services.worker.pending`:
        bounded, expiring, not counted against ``max_jobs``, its records acked at once)
        until its first step arrives."""
        book = self.book
        st = book.jobs.get(job_id)
        if st is not None:
            return st
        if not confirm:
            held = book.pending.get(job_id)
            if held is not None:
                return held
        blob = None if job_id in book.pending else self.snapshots.stored(job_id, load)
        if blob is None and not confirm:  # named, not proven: pending, never counted
            return book.pending.get_or_add(job_id, self._new_state_pending)
        max_jobs = self.config.capacity.max_jobs
        if len(book.jobs) >= max_jobs:
            raise CapacityError(
                f"worker holds {len(book.jobs)} jobs, STEPGUARD_WORKER_MAX_JOBS="
                f"{max_jobs}: job {job_id} is not taken on"
            )
        st = book.pending.pop(job_id)
        if st is not None:  # its first step: a job from now on
            st.confirmed = True
            st.active_wall = st.last_snapshot_wall = self.clock()
            book.jobs[job_id] = st
            return st
        st = self.snapshots.read(job_id, blob) if blob is not None else None
        if st is not None:
            self.resume(st)
        else:
            st = self.new_state(job_id)
        book.jobs[job_id] = st
        return st

    def new_state(self, job_id: str) -> JobState:
        capacity = self.config.capacity
        return JobState(
            job_id,
            JobDetection(
                job_id,
                self.detector_config,
                max_ranks=capacity.max_ranks_per_job,
                max_nodes=capacity.max_nodes_per_job,
                limits=self.config.limits,
            ),
            last_snapshot_wall=self.clock(),
            active_wall=self.clock(),
        )

    def _new_state_pending(self, job_id: str) -> JobState:
        st = self.new_state(job_id)
        st.confirmed = False
        return st

    def adopt(self, job_id: str, blob: bytes, owned: set[int]) -> bool:
        """Load a job found in the table (after a restart) when its partition is ours."""
        jobs = self.book.jobs
        if (
            job_id in jobs
            or job_id in self.ending.ended
            or len(jobs) >= self.config.capacity.max_jobs
        ):
            return False
        mark = read_mark(job_id, blob, self.config.trust.seal)
        if mark is not None:  # an ended job: its replayed records are the ended run's
            self.ending.mark(job_id, mark.end_ts)
            return False
        st = self.snapshots.read(job_id, blob)
        if st is None or st.partition not in owned:
            return False
        self.resume(st)
        jobs[job_id] = st
        return True

    def resume(self, st: JobState) -> None:
        """Take over a job from its snapshot (another worker's, or ours before a
        restart or rebalance).

        The clocks that measure absence must not count the gap the pipeline caused (the
        old owner's death, the rebalance, reading the backlog), yet a hang that began
        before it must still be raised promptly. So the hang clock is *resumed*, not
        restarted: the snapshot's step arrival time is kept (the old owner's wall clock;
        never later than ours), and while the job catches up (``blind_after_s``) a
        replayed step counts as arrived when its event time says, after the one before
        it. A job whose steps kept coming is judged on them once they are read (the
        worker ticks no partition whose steps it has not read); a job that stopped
        before the takeover is hung from its last step's event time on. Health reports
        travel another way (re-keyed by whichever worker owns the node's partition, and
        that may be the one that died): a node's silence counts only from the end of the
        catch-up (:meth:`~detectors.job.JobDetection.resume`).
        """
        wall = self.clock()
        blind = self.timing.blind_after_s
        st.arrived_wall = min(st.arrived_wall, wall)
        st.resume_wall = wall + blind
        st.resumed_wall = wall
        st.last_snapshot_wall = wall
        now = st.now_estimate(wall, self.timing.event_rate)
        if now is not None:
            st.detection.resume(now + blind)

    def saw_record(self) -> None:
        """Note that the broker delivered something; after a blind gap, restart every
        job's hang clock with a grace of ``blind_after_s``."""
        book = self.book
        wall = self.clock()
        last, book.last_record_wall = book.last_record_wall, wall
        blind = self.timing.blind_after_s
        if last is None or wall - last < blind or not book.jobs:
            return
        gap = wall - last
        book.counts.blind_periods += 1
        for st in book.jobs.values():
            # the same grace for silent nodes: their reports were cut off too
            now = st.now_estimate(wall, self.timing.event_rate)
            if now is not None:
                st.detection.resume(now + blind)
        log.warning(
            "no record for %.1fs (broker or network outage): the hang clocks of %d jobs "
            "restart in %.1fs",
            gap, len(book.jobs), blind,
        )  # fmt: skip
        for st in book.jobs.values():
            st.arrived_wall = max(st.arrived_wall, wall + blind)
