"""The end of a job, as the worker remembers it. :class:`Ending` owns the ended-job marks
in memory (``ended``: job -> event time of its end, at most ``max_ended``, oldest
forgotten first) and decides whether a record belongs to an ended run
(:meth:`Ending.ended_before`: up to the end it does and is ignored; a newer record is a
new run under the same id and un-ends the job; a job this worker never held may have
ended on another, whose mark in the table, :mod:`pipeline.services.worker.ended`, says
so). It drops an ended or abandoned job (:meth:`Ending.drop`: its held records acked,
its table entry the sealed mark of its end, :meth:`Ending.end_mark`). Deleting marks
once they are old is the tick loop's (:mod:`pipeline.services.worker.ticks`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from pipeline.services.worker.book import JobBook
from pipeline.services.worker.ended import EndMark, read_mark, write_mark
from pipeline.services.worker.options import WorkerConfig
from pipeline.services.worker.records import Handled, JobState, Load, no_table

__all__ = ["Ending"]


class Ending:
    """Ended jobs: remembered, recognised, dropped (see the module docstring)."""

    def __init__(self, config: WorkerConfig, book: JobBook) -> None:
        self.max_ended = config.capacity.max_ended
        self.seal = config.trust.seal
        self.clock = config.clock
        self.book = book
        #: job -> event time of its end: records up to then are the ended run's
        self.ended: OrderedDict[str, float] = OrderedDict()

    def mark(self, job_id: str, ts: float) -> None:
        """Remember that ``job_id`` ended at event time ``ts`` (the later of two ends)."""
        self.ended[job_id] = max(ts, self.ended.get(job_id, ts))
        self.ended.move_to_end(job_id)
        while len(self.ended) > self.max_ended:
            self.ended.popitem(last=False)

    def ended_before(self, job_id: str, ts: float, load: Load = no_table) -> bool:
        """True for a record of an ended run; a newer record un-ends the job. A job this
        worker does not hold may have ended on another (its table entry is the mark of
        its end, :mod:`pipeline.services.worker.ended`): then this is a record replayed
        past a takeover, or a late one."""
        end = self.ended.get(job_id)
        if end is None and job_id not in self.book.jobs:
            mark = read_mark(job_id, load(job_id), self.seal)
            if mark is not None:
                self.mark(job_id, mark.end_ts)
                end = self.ended.get(job_id)
        if end is None:
            return False
        if ts <= end:
            self.book.counts.after_end += 1
            return True
        del self.ended[job_id]
        return False

    def drop(self, st: JobState, out: Handled, end_ts: float, token: Any = None) -> Handled:
        """Forget an ended job: its held records are acked, its table entry becomes the
        mark of its end."""
        self.book.jobs.pop(st.job_id, None)
        self.mark(st.job_id, max(end_ts, st.last_event_ts or end_ts))
        out.release += self.book.held.pop(st.job_id, [])
        if token is not None:
            out.release.append(token)
        out.tombstone = True
        out.snapshot = self.end_mark(st.job_id, st.partition)
        return out

    def end_mark(self, job_id: str, partition: int) -> bytes | None:
        """The table value that remembers ``job_id``'s end (None without a partition:
        a plain tombstone)."""
        if partition < 0:
            return None
        mark = EndMark(job_id, end_ts=self.ended[job_id], partition=partition,
                       wall_s=self.clock())  # fmt: skip
        return write_mark(mark, self.seal)
