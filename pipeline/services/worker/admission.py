"""The checks a record passes before it reaches a job, shared by every kind of record.
:class:`Admission` owns the refusals: a value that does not decode (at most
``max_message_bytes``), a record dated beyond the wall clock + ``max_clock_skew_s``
(stage ``clock``), a capacity limit (stage ``limit``), a telemetry record without its
writer's proof (stage ``auth``, counted per claimed node); and the way a job's record
is taken (:meth:`Admission.take`: the job's state with the record's offset noted, or
what becomes of the record instead: acked when it belongs to an ended run or the state
already reflects it, dead-lettered when refused). Each refusal is counted in the
:class:`~pipeline.services.worker.book.Counts` and comes back as the record's
:class:`~pipeline.services.worker.records.Handled`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from pipeline.io.clockskew import future_dated
from pipeline.io.errors import CapacityError
from pipeline.services.worker.book import JobBook
from pipeline.services.worker.ending import Ending
from pipeline.services.worker.options import WorkerConfig
from pipeline.services.worker.records import Handled, JobState, Record
from pipeline.services.worker.takeover import Takeover
from schemas import DeadLetter, Message, Rejected

__all__ = ["Admission"]

log = logging.getLogger(__name__)
_M = TypeVar("_M", bound=Message)


class Admission:
    """Refuses what must not reach a job; takes what may (see the module docstring)."""

    def __init__(
        self, config: WorkerConfig, book: JobBook, takeover: Takeover, ending: Ending
    ) -> None:
        self.max_message_bytes = config.capacity.max_message_bytes
        self.max_clock_skew_s = config.timing.max_clock_skew_s
        self.on_refused = config.trust.on_refused
        self.book = book
        self.takeover = takeover
        self.ending = ending

    def decoded(self, model: type[_M], rec: Record) -> _M | Handled:
        """The record's value read as ``model`` (at most ``max_message_bytes``), or,
        when it cannot be, what becomes of the record: dead-lettered and released."""
        msg = rec.decode(model, self.max_message_bytes)
        if isinstance(msg, Rejected):
            return Handled(dead_letters=[msg.letter], release=[rec.token])
        return msg

    def take(
        self,
        rec: Record,
        job_id: str,
        ts: float,
        load: Callable[[str], bytes | None],
        confirm: bool = True,
    ) -> JobState | Handled:
        """The state a job's record goes to, its offset recorded; or what to do with
        the record instead: ack it (a record of an ended run, or a replay the state
        already reflects) or dead-letter it (dated in the future, or a capacity
        limit). Only a step (``confirm``) makes a job more than pending."""
        future = self.from_the_future(ts, rec)
        if future is not None:
            return future
        if self.ending.ended_before(job_id, ts, load):
            return rec.released()
        try:
            st = self.takeover.state(job_id, load, confirm=confirm)
        except CapacityError as exc:
            return self.refuse(exc, rec)
        if st.seen(rec.topic, rec.partition, rec.offset):
            return rec.released(job_id)
        st.offsets[(rec.topic, rec.partition)] = rec.offset
        st.partition = rec.partition
        return st

    def from_the_future(self, ts: float, rec: Record) -> Handled | None:
        """A dead letter for a record dated beyond wall clock + ``max_clock_skew_s``."""
        skew = self.max_clock_skew_s
        if skew is None or ts <= time.time() + skew:  # nearly every record: no call
            return None
        error = future_dated(ts, skew, now=time.time(), field="event time", whose="this worker's")
        if error is None:
            return None
        self.book.counts.future_dated += 1
        log.warning("%s refused: %s", rec.where, error)
        return rec.refused(error, "clock")

    def refuse(self, exc: CapacityError, rec: Record) -> Handled:
        """A record refused for a capacity limit: dead-lettered, counted."""
        self.book.counts.refused += 1
        log.warning("%s refused: %s", rec.where, exc)
        return rec.refused(str(exc), "limit")

    def unproven(self, node: str, problem: str, rec: Record) -> DeadLetter:
        """The dead letter of a telemetry record without its writer's proof, counted
        per claimed node."""
        self.book.counts.refused_proof += 1
        if self.on_refused is not None:
            self.on_refused(rec.topic, node)
        return rec.letter(f"unauthenticated: {problem}", "auth")
