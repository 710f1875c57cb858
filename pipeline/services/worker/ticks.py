"""The worker's timer records. Faust's timer writes, for every job this worker holds, a
sealed ``tick`` to the job's partition of the jobs topic, and for every end mark due for
deletion an ``expire``; they come back through the job agent in order with the job's
other records. :class:`Ticks` owns what they carry and do: which jobs get a tick now
(:meth:`Ticks.tick_record`: not one just taken over before a fetch came back), which end
marks expire (:meth:`Ticks.expiry_ticks`: older than ``job_idle_ttl_s``, or the oldest
beyond ``max_ended``), a tick moving a job's clock (:meth:`Ticks.tick`: hang and silence
judged, an idle job abandoned, a pending end confirmed and the job dropped) and an expire
deleting a mark (:meth:`Ticks.expire`: only a mark no newer than the order, of a job this
worker does not hold).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable

from pipeline.services.worker.book import JobBook
from pipeline.services.worker.ended import read_mark
from pipeline.services.worker.ending import Ending
from pipeline.services.worker.options import WorkerConfig
from pipeline.services.worker.records import Handled, Record
from pipeline.services.worker.seal import Tick, TickError, decode_tick
from pipeline.services.worker.snapshots import Snapshots

__all__ = ["Ticks"]

log = logging.getLogger(__name__)


class Ticks:
    """Tick and expire records: written and handled (see the module docstring)."""

    def __init__(
        self, config: WorkerConfig, book: JobBook, ending: Ending, snapshots: Snapshots
    ) -> None:
        self.timing = config.timing
        self.job_idle_ttl_s = config.capacity.job_idle_ttl_s
        self.max_ended = config.capacity.max_ended
        self.seal = config.trust.seal
        self.clock = config.clock
        self.book = book
        self.ending = ending
        self.snapshots = snapshots

    # -- written by the timer -----------------------------------------------------------
    def tick_record(self, job_id: str) -> tuple[int, bytes] | None:
        """(partition, value) of a tick for ``job_id``, or None while it has no step."""
        st = self.book.jobs.get(job_id)
        if st is None or st.last_event_ts is None or st.partition < 0:
            return None
        wall = self.clock()
        resumed = st.resume_wall - self.timing.blind_after_s
        if wall < st.resume_wall and (self.book.last_record_wall or 0.0) < resumed:
            # just taken over and no record read since: its clock runs from its last
            # step (:meth:`Takeover.resume`), and until a fetch came back the driver
            # cannot know whether the steps of the gap are still unread (a partition's
            # end offset is known only from a fetch)
            return None
        return st.partition, self.value(job_id, wall, "tick")

    def expiry_ticks(
        self, stored: Iterable[tuple[str, bytes]], owned: set[int]
    ) -> list[tuple[str, int, bytes]]:
        """(job, partition, value) of the ``expire`` records that delete end marks
        among the table's ``stored`` entries: on partitions this worker owns, marks
        older than ``job_idle_ttl_s``, and the oldest beyond ``max_ended`` (jobs that
        start and end fast must not grow the table without bound). A table entry is
        deleted only while a record of its partition is handled (Faust writes the
        changelog to the current record's partition), so the tick loop sends these."""
        marks = []
        for job_id, blob in stored:
            mark = read_mark(job_id, blob, self.seal) if job_id not in self.book.jobs else None
            if mark is not None and mark.partition in owned:
                marks.append(mark)
        marks.sort(key=lambda m: m.wall_s)
        wall = self.clock()
        excess = len(marks) - self.max_ended
        due = [m for k, m in enumerate(marks)
               if k < excess or wall - m.wall_s >= self.job_idle_ttl_s]  # fmt: skip
        return [(m.job_id, m.partition, self.value(m.job_id, wall, "expire")) for m in due]

    def watermarks_value(self, paths: list[tuple[int, float | None]], wall: float) -> bytes:
        """The sealed body of a ``paths`` record sent at ``wall``: the watermarks of the
        health partitions this worker reads (:mod:`pipeline.services.worker.seal`)."""
        body = json.dumps({"wall_s": wall, "paths": paths}).encode()
        return self.seal.seal("paths", body) if self.seal is not None else body

    def value(self, job_id: str, wall: float, kind: str) -> bytes:
        """The sealed body of a ``kind`` record (tick, expire) sent at ``wall``."""
        body = json.dumps({"job_id": job_id, "wall_s": wall}).encode()
        return self.seal.seal(kind, body) if self.seal is not None else body

    # -- read back by the job agent -----------------------------------------------------
    def _read(self, rec: Record) -> Tick | Handled:
        """A tick or expire record's body, bounded and never beyond this worker's clock
        (plus the skew allowed); or its dead letter."""
        skew = self.timing.max_clock_skew_s
        max_wall = self.clock() + (skew if skew is not None else 300.0)
        try:
            return decode_tick(rec.value, max_wall=max_wall)
        except TickError as exc:
            return rec.refused(str(exc), "decode")

    def tick(self, rec: Record) -> Handled:
        """A tick of a job this worker holds: its clock moves to the tick's wall time."""
        tick = self._read(rec)
        if isinstance(tick, Handled):
            return tick
        job_id, wall = tick.job_id, tick.wall_s
        st = self.book.jobs.get(job_id)  # only jobs this worker holds are ticked
        out = Handled(job_id=job_id, release=[rec.token])
        if st is None or st.seen(rec.topic, rec.partition, rec.offset):
            return out
        if wall < st.resumed_wall:
            # sent before the job was restored here (a rebalance in between): its
            # steps since the snapshot may still be unread, so this tick knows nothing
            return out
        now = st.now_estimate(wall, self.timing.event_rate)
        if now is None or now <= (st.last_event_ts or now):
            return out
        idle = wall - st.active_wall
        if idle >= self.job_idle_ttl_s:
            out.alerts += st.detection.abandon(now, idle)
            log.warning(
                "job %s abandoned: no step, command or lifecycle record for %.0fs "
                "(STEPGUARD_JOB_IDLE_TTL_S=%.0f): its state is dropped",
                job_id, idle, self.job_idle_ttl_s,
            )  # fmt: skip
            return self.ending.drop(st, out, st.last_event_ts or now)
        held = st.detection.held_health
        out.add(st.detection.tick_detected(now))  # with steps the clock (or an end) let out
        if st.detection.ended is not None:  # a pending end, confirmed by the silence
            log.info("job %s ended (%s): its state is dropped", job_id, st.detection.ended)
            return self.ending.drop(st, out, st.detection.ended_at or now)
        if out.alerts:
            log.info(
                "tick for %s (sent %.3f, read %.3f): %.2fs since its newest step arrived "
                "-> %s", job_id, wall, self.clock(), wall - st.arrived_wall,
                ", ".join(f"{a.kind.value} {a.state.value}" for a in out.alerts),
            )  # fmt: skip
        if out.alerts or out.steps or st.detection.held_health != held:
            # the tick changed what an episode says, or processed held health: that
            # must survive a restart
            out.release.clear()
            st.offsets[(rec.topic, rec.partition)] = rec.offset
            st.dirty = True
        return self.snapshots.finish(st, out, rec.token if not out.release else None)

    def expire(self, rec: Record, load: Callable[[str], bytes | None]) -> Handled:
        """The tick loop's order to delete an ended job's mark (:meth:`expiry_ticks`):
        done only while the table holds a mark under the job's id no newer than the
        order (a replayed order never deletes the mark of a later end) and this worker
        holds no state of the job (a new run since keeps its snapshot)."""
        tick = self._read(rec)
        if isinstance(tick, Handled):
            return tick
        out = Handled(job_id=tick.job_id, release=[rec.token])
        if tick.job_id not in self.book.jobs:
            mark = read_mark(tick.job_id, load(tick.job_id), self.seal)
            out.tombstone = mark is not None and mark.wall_s <= tick.wall_s
        return out
