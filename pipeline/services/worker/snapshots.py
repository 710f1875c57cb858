"""A job's snapshots: when one is due, how it is written, and how one is read back.
:class:`Snapshots` owns the step from "a record changed the job" to "its state is in the
table and its records may be acked" (:meth:`Snapshots.finish`: the record's token is
held until a snapshot covers it; a snapshot is due every ``snapshot_steps`` completed
steps or ``snapshot_interval_s`` wall seconds, but never sooner than its last cost
divided by ``snapshot_budget``; it is sealed, and refused when over
``max_snapshot_bytes``), and the way back (:meth:`Snapshots.stored`: a table entry that
is a snapshot, not the mark of an end; :meth:`Snapshots.read`: opened, decoded and
checked, or None, counted, when it is not this job's readable state). The blob is plain
data (:mod:`pipeline.io.statecodec`), never pickle.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pipeline.io.statecodec import StateFormatError
from pipeline.services.worker.book import JobBook
from pipeline.services.worker.ended import read_mark
from pipeline.services.worker.options import WorkerConfig
from pipeline.services.worker.records import Handled, JobState

__all__ = ["Snapshots"]

log = logging.getLogger(__name__)


class Snapshots:
    """Writes and reads a job's snapshots (see the module docstring)."""

    def __init__(self, config: WorkerConfig, book: JobBook) -> None:
        self.policy = config.snapshots
        self.seal = config.trust.seal
        self.clock = config.clock
        self.book = book

    def stored(self, job_id: str, load: Callable[[str], bytes | None]) -> bytes | None:
        """The job's snapshot in the table, or None: no entry, or the mark of its end
        (:mod:`pipeline.services.worker.ended`), which a newer run does not resume."""
        blob = load(job_id)
        if blob is not None and read_mark(job_id, blob, self.seal) is not None:
            return None
        return blob

    def read(self, job_id: str, blob: bytes) -> JobState | None:
        """A snapshot from the table, or None when it is unreadable: logged, counted,
        and the job's state is rebuilt from the records replayed after it."""
        counts = self.book.counts
        if self.seal is not None:
            opened = self.seal.open("snapshot", blob, job=job_id)
            if opened is None:
                counts.unsealed += 1
                counts.unreadable_snapshots += 1
                log.error("snapshot of job %s was not written by a worker of this group "
                          "(unsealed): starting it afresh", job_id)  # fmt: skip
                return None
            blob = opened
        try:
            st = JobState.from_bytes(blob, max_bytes=self.policy.max_state_bytes)
        except StateFormatError as exc:
            counts.unreadable_snapshots += 1
            log.error("snapshot of job %s is unreadable (%s): starting it afresh", job_id, exc)
            return None
        if st.job_id != job_id:
            counts.unreadable_snapshots += 1
            log.error("snapshot under %s holds job %s: starting it afresh", job_id, st.job_id)
            return None
        return st

    def finish(self, st: JobState, out: Handled, token: Any, records: int = 1) -> Handled:
        """Hold ``token`` (once for each of ``records``) until a snapshot covers it, and
        take that snapshot when it is due."""
        if not st.confirmed:  # pending: nothing of it is kept across a restart
            if token is not None:
                out.release += [token] * records
            return out
        if token is not None:
            self.book.held.setdefault(st.job_id, []).extend([token] * records)
        policy = self.policy
        wall = self.clock()
        since = wall - st.last_snapshot_wall
        due = since >= st.snapshot_cost_s / policy.snapshot_budget and (
            st.steps_since_snapshot >= policy.snapshot_steps
            or (st.dirty and since >= policy.snapshot_interval_s)
        )
        if due:
            self._write(st, out, wall)
        return out

    def _write(self, st: JobState, out: Handled, wall: float) -> None:
        st.steps_since_snapshot = 0
        st.dirty = False
        st.last_snapshot_wall = wall
        t0 = self.clock()
        blob = st.to_bytes()
        if self.seal is not None:
            blob = self.seal.seal("snapshot", blob, job=st.job_id)
        st.snapshot_cost_s = max(0.0, self.clock() - t0)
        if len(blob) > self.policy.max_snapshot_bytes:
            # the changelog would refuse it: keep the records unacked (they replay
            # after a crash) and say which limit to raise
            self.book.counts.oversized_snapshots += 1
            log.error(
                "snapshot of job %s is %d bytes, over STEPGUARD_WORKER_MAX_SNAPSHOT_BYTES"
                "=%d: not written, its records stay unacked",
                st.job_id, len(blob), self.policy.max_snapshot_bytes,
            )  # fmt: skip
            return
        out.snapshot = blob
        out.release += self.book.held.pop(st.job_id, [])
