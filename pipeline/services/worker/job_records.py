"""The worker core's handling of a job's own records: what arrives on the worker's jobs
topic (health, commands, results, lifecycle events, ticks), routed there by the job's
key, and the end of a job (:class:`_JobRecords`, mixed into
:class:`~pipeline.services.worker.state.WorkerDetection`, whose state it reads: the jobs, the
ended-job marks, the pending jobs, the seal and the limits)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from pipeline.io.clockskew import future_dated
from pipeline.io.errors import CapacityError
from pipeline.services.worker.ended import EndMark, read_mark, write_mark
from pipeline.services.worker.records import (
    Handled,
    JobState,
    _dead_letter,
)
from pipeline.services.worker.seal import Tick, TickError, decode_tick
from schemas import (
    Command,
    CommandResult,
    JobEvent,
    JobEventKind,
    Message,
    NodeHealth,
    Rejected,
    decode,
)

log = logging.getLogger("pipeline.services.worker.state")
_M = TypeVar("_M", bound=Message)


class _JobRecords:
    """Per-record handling of the job topic (see the module docstring)."""

    def handle_job_record(
        self,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        kind: str,
        token: Any,
        load: Callable[[str], bytes | None] = lambda _: None,
    ) -> Handled:
        """One record of the internal job topic: forwarded health, command or
        lifecycle event, or a timer tick."""
        self._saw_record()
        topic = self.topics.jobs
        if self.seal is not None:
            payload = self.seal.open(kind, value)
            if payload is None:  # not written by a worker of this group
                self.unsealed += 1
                log.warning("%s[%d]@%d refused: a %r record no worker sealed", topic,
                            partition, offset, kind[:32])  # fmt: skip
                why = f"unsealed {kind[:32]!r} record on the worker's jobs topic"
                letter = _dead_letter(value, why, topic, partition, offset, key, "auth")
                return Handled(dead_letters=[letter], release=[token])
            value = payload
        if kind == "tick":
            return self._tick(partition, offset, key, value, token)
        if kind == "expire":
            return self._expire(partition, offset, key, value, token, load)
        if kind == "command":
            return self._command(partition, offset, key, value, token)
        if kind == "lifecycle":
            return self._lifecycle(partition, offset, key, value, token, load)
        if kind == "result":
            return self._result(partition, offset, key, value, token)
        msg = self._decoded(NodeHealth, value, topic, partition, offset, key, token)
        if isinstance(msg, Handled):
            return msg
        if msg.job_id is None:
            return Handled(release=[token])
        ts = msg.ts.timestamp()
        st = self._take(msg.job_id, ts, topic, partition, offset, key, value, token, load,
                        confirm=False)  # fmt: skip
        if isinstance(st, Handled):
            return st
        out = Handled(job_id=msg.job_id)
        st.dirty = True
        try:
            out.alerts += st.detection.on_health(msg)
        except Exception as exc:
            log.exception("detector failed on %s[%d]@%d", topic, partition, offset)
            out.dead_letters.append(
                _dead_letter(value, f"detect: {exc!r}", topic, partition, offset, key, "detect")
            )
        return self._finish(st, out, token)

    def _decoded(
        self,
        model: type[_M],
        value: bytes | None,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        token: Any,
    ) -> _M | Handled:
        """``value`` read as ``model`` (at most ``max_message_bytes``), or, when it cannot
        be, what becomes of the record: dead-lettered and its offset released."""
        msg = decode(
            model, value, topic=topic, partition=partition, offset=offset, key=key,
            max_bytes=self.max_message_bytes,
        )  # fmt: skip
        if isinstance(msg, Rejected):
            return Handled(dead_letters=[msg.letter], release=[token])
        return msg

    def _saw_record(self) -> None:
        """Note that the broker delivered something; after a blind gap, restart every
        job's hang clock with a grace of ``blind_after_s``."""
        wall = self.clock()
        last, self._last_record_wall = self._last_record_wall, wall
        if last is None or wall - last < self.blind_after_s or not self.jobs:
            return
        gap = wall - last
        self.blind_periods += 1
        for st in self.jobs.values():
            # the same grace for silent nodes: their reports were cut off too
            now = st.now_estimate(wall, self.event_rate)
            if now is not None:
                st.detection.resume(now + self.blind_after_s)
        log.warning(
            "no record for %.1fs (broker or network outage): the hang clocks of %d jobs "
            "restart in %.1fs",
            gap, len(self.jobs), self.blind_after_s,
        )  # fmt: skip
        for st in self.jobs.values():
            st.arrived_wall = max(st.arrived_wall, wall + self.blind_after_s)

    def _command(
        self, partition: int, offset: int, key: bytes | None, value: bytes | None, token: Any
    ) -> Handled:
        """A relaunching command for a job we hold: its silence from now on is the
        relaunch, not a hang (:meth:`JobDetection.on_command`: relaunching until the
        new run's first step, at most relaunch_max_s), and the nodes it names stop
        reporting."""
        topic = self.topics.jobs
        msg = decode(Command, value, topic=topic, partition=partition, offset=offset, key=key)
        if isinstance(msg, Rejected):
            return Handled(release=[token])
        st = self.jobs.get(msg.job_id)
        out = Handled(job_id=msg.job_id)
        now = st.now_estimate(self.clock(), self.event_rate) if st is not None else None
        if st is None or now is None or st.seen(topic, partition, offset):
            out.release.append(token)
            return out
        st.offsets[(topic, partition)] = offset
        st.dirty = True
        st.active_wall = self.clock()
        out.alerts += st.detection.on_command(msg, now=now)
        log.info(
            "%s %s issued: its hang clock allows for the relaunch (nodes %s)",
            msg.job_id, msg.kind.value, ", ".join(msg.targets) or "none",
        )  # fmt: skip
        return self._finish(st, out, token)

    def _result(
        self, partition: int, offset: int, key: bytes | None, value: bytes | None, token: Any
    ) -> Handled:
        """A SUCCEEDED result for a job we hold (:meth:`JobDetection.on_result`)."""
        topic = self.topics.jobs
        msg = decode(CommandResult, value, topic=topic, partition=partition, offset=offset,
                     key=key)  # fmt: skip
        if isinstance(msg, Rejected):
            return Handled(release=[token])
        if self._result_problem(msg) is not None:  # written to jobs directly
            self.refused_results += 1
            return Handled(release=[token])
        st = self.jobs.get(msg.job_id)
        if st is None or st.seen(topic, partition, offset):
            return Handled(job_id=msg.job_id, release=[token])
        st.offsets[(topic, partition)] = offset
        st.dirty = True
        out = Handled(job_id=msg.job_id, alerts=st.detection.on_result(msg))
        return self._finish(st, out, token)

    def _read_tick(
        self, partition: int, offset: int, key: bytes | None, value: bytes | None, token: Any
    ) -> Tick | Handled:
        """A tick or expire record's body, bounded and never beyond this worker's clock
        (plus the skew allowed); or its dead letter."""
        skew = self.max_clock_skew_s if self.max_clock_skew_s is not None else 300.0
        try:
            return decode_tick(value, max_wall=self.clock() + skew)
        except TickError as exc:
            letter = _dead_letter(value, str(exc), self.topics.jobs, partition, offset, key,
                                  "decode")  # fmt: skip
            return Handled(dead_letters=[letter], release=[token])

    def _tick(
        self, partition: int, offset: int, key: bytes | None, value: bytes | None, token: Any
    ) -> Handled:
        tick = self._read_tick(partition, offset, key, value, token)
        if isinstance(tick, Handled):
            return tick
        job_id, wall = tick.job_id, tick.wall_s
        st = self.jobs.get(job_id)  # only jobs this worker holds are ticked
        out = Handled(job_id=job_id, release=[token])
        if st is None or st.seen(self.topics.jobs, partition, offset):
            return out
        if wall < st.resumed_wall:
            # sent before the job was restored here (a rebalance in between): its
            # steps since the snapshot may still be unread, so this tick knows nothing
            return out
        now = st.now_estimate(wall, self.event_rate)
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
            return self._drop(st, out, st.last_event_ts or now)
        held = st.detection.held_health
        out.add(st.detection.tick_detected(now))  # with steps the clock (or an end) let out
        if st.detection.ended is not None:  # a pending end, confirmed by the silence
            log.info("job %s ended (%s): its state is dropped", job_id, st.detection.ended)
            return self._drop(st, out, st.detection.ended_at or now)
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
            st.offsets[(self.topics.jobs, partition)] = offset
            st.dirty = True
        return self._finish(st, out, token if not out.release else None)

    def _expire(
        self,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        token: Any,
        load: Callable[[str], bytes | None],
    ) -> Handled:
        """The tick loop's order to delete an ended job's mark (:meth:`expiry_ticks`):
        done only while the table holds a mark under the job's id no newer than the
        order (a replayed order never deletes the mark of a later end) and this worker
        holds no state of the job (a new run since keeps its snapshot)."""
        tick = self._read_tick(partition, offset, key, value, token)
        if isinstance(tick, Handled):
            return tick
        out = Handled(job_id=tick.job_id, release=[token])
        if tick.job_id not in self.jobs:
            mark = read_mark(tick.job_id, load(tick.job_id), self.seal)
            out.tombstone = mark is not None and mark.wall_s <= tick.wall_s
        return out

    def _lifecycle(
        self,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        token: Any,
        load: Callable[[str], bytes | None],
    ) -> Handled:
        """A job's start, long phase or end. An end resolves the job's episodes and
        drops its state (tombstone); its late records are ignored from then on, until
        a record newer than the end (a new run under the same id) starts afresh."""
        topic = self.topics.jobs
        msg = self._decoded(JobEvent, value, topic, partition, offset, key, token)
        if isinstance(msg, Handled):
            return msg
        ts = msg.ts.timestamp()
        future = self._from_the_future(ts, value, topic, partition, offset, key, token)
        if future is not None:
            return future
        if self._ended_before(msg.job_id, ts, load):
            return Handled(release=[token])
        if msg.kind is JobEventKind.START:  # the nodes it declares are the job's
            if msg.nodes:
                try:
                    st = self.state(msg.job_id, load, confirm=False)
                    st.detection.on_lifecycle(msg)
                except CapacityError as exc:
                    return self._refuse(exc, value, topic, partition, offset, key, token)
            return Handled(job_id=msg.job_id, release=[token])
        st = self.jobs.get(msg.job_id)
        if st is None and msg.kind is JobEventKind.END:
            self.pending.pop(msg.job_id)
            try:  # a snapshot stored before this worker took the partition
                stored = self._snapshot(msg.job_id, load) is not None
                st = self.state(msg.job_id, load) if stored else None
            except CapacityError:
                st = None
            if st is None:
                self._mark_ended(msg.job_id, ts)
                return Handled(job_id=msg.job_id, release=[token], tombstone=True,
                               snapshot=self._end_mark(msg.job_id, partition))  # fmt: skip
        if st is None or st.seen(topic, partition, offset):
            return Handled(job_id=msg.job_id, release=[token])
        st.offsets[(topic, partition)] = offset
        st.dirty = True
        st.active_wall = self.clock()
        out = Handled(job_id=msg.job_id)
        # an end is pending until the job's records stop contradicting it (the ticks
        # confirm it: :meth:`_tick`); a refused or cut one is a lifecycle anomaly
        out.alerts += st.detection.on_lifecycle(msg)
        return self._finish(st, out, token)

    def _take(
        self,
        job_id: str,
        ts: float,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        token: Any,
        load: Callable[[str], bytes | None],
        confirm: bool = True,
    ) -> JobState | Handled:
        """The state a job's record goes to, its offset recorded; or what to do with
        the record instead: ack it (a record of an ended run, or a replay the state
        already reflects) or dead-letter it (dated in the future, or a capacity
        limit). Only a step (``confirm``) makes a job more than pending."""
        future = self._from_the_future(ts, value, topic, partition, offset, key, token)
        if future is not None:
            return future
        if self._ended_before(job_id, ts, load):
            return Handled(release=[token])
        try:
            st = self.state(job_id, load, confirm=confirm)
        except CapacityError as exc:
            return self._refuse(exc, value, topic, partition, offset, key, token)
        if st.seen(topic, partition, offset):
            return Handled(job_id=job_id, release=[token])
        st.offsets[(topic, partition)] = offset
        st.partition = partition
        return st

    def _from_the_future(
        self,
        ts: float,
        value: bytes | None,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        token: Any,
    ) -> Handled | None:
        """A dead letter for a record dated beyond wall clock + ``max_clock_skew_s``."""
        skew = self.max_clock_skew_s
        if skew is None or ts <= time.time() + skew:  # nearly every record: no call
            return None
        error = future_dated(
            ts, self.max_clock_skew_s, now=time.time(), field="event time", whose="this worker's"
        )
        if error is None:
            return None
        self.future_dated += 1
        log.warning("%s[%d]@%d refused: %s", topic, partition, offset, error)
        letter = _dead_letter(value, error, topic, partition, offset, key, "clock")
        return Handled(dead_letters=[letter], release=[token])

    def _ended_before(
        self, job_id: str, ts: float, load: Callable[[str], bytes | None] = lambda _: None
    ) -> bool:
        """True for a record of an ended run; a newer record un-ends the job. A job this
        worker does not hold may have ended on another (its table entry is the mark of
        its end, :mod:`pipeline.services.worker.ended`): then this is a record replayed
        past a takeover, or a late one."""
        end = self.ended.get(job_id)
        if end is None and job_id not in self.jobs:
            mark = read_mark(job_id, load(job_id), self.seal)
            if mark is not None:
                self._mark_ended(job_id, mark.end_ts)
                end = self.ended.get(job_id)
        if end is None:
            return False
        if ts <= end:
            self.after_end += 1
            return True
        del self.ended[job_id]
        return False

    def _mark_ended(self, job_id: str, ts: float) -> None:
        self.ended[job_id] = max(ts, self.ended.get(job_id, ts))
        self.ended.move_to_end(job_id)
        while len(self.ended) > self.max_ended:
            self.ended.popitem(last=False)

    def _drop(self, st: JobState, out: Handled, end_ts: float, token: Any = None) -> Handled:
        """Forget an ended job: its held records are acked, its table entry becomes the
        mark of its end."""
        self.jobs.pop(st.job_id, None)
        self._mark_ended(st.job_id, max(end_ts, st.last_event_ts or end_ts))
        out.release += self._held.pop(st.job_id, [])
        if token is not None:
            out.release.append(token)
        out.tombstone = True
        out.snapshot = self._end_mark(st.job_id, st.partition)
        return out

    def _end_mark(self, job_id: str, partition: int) -> bytes | None:
        """The table value that remembers ``job_id``'s end (None without a partition:
        a plain tombstone)."""
        if partition < 0:
            return None
        mark = EndMark(job_id, end_ts=self.ended[job_id], partition=partition,
                       wall_s=self.clock())  # fmt: skip
        return write_mark(mark, self.seal)

    def _refuse(
        self,
        exc: CapacityError,
        value: bytes | None,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        token: Any,
    ) -> Handled:
        self.refused += 1
        log.warning("%s[%d]@%d refused: %s", topic, partition, offset, exc)
        letter = _dead_letter(value, str(exc), topic, partition, offset, key, "limit")
        return Handled(dead_letters=[letter], release=[token])

    def _finish(self, st: JobState, out: Handled, token: Any, records: int = 1) -> Handled:
        """Hold ``token`` (once for each of ``records``) until a snapshot covers it, and
        take that snapshot when it is due."""
        if not st.confirmed:  # pending: nothing of it is kept across a restart
            if token is not None:
                out.release += [token] * records
            return out
        if token is not None:
            self._held.setdefault(st.job_id, []).extend([token] * records)
        wall = self.clock()
        since = wall - st.last_snapshot_wall
        due = since >= st.snapshot_cost_s / self.snapshot_budget and (
            st.steps_since_snapshot >= self.snapshot_steps
            or (st.dirty and since >= self.snapshot_interval_s)
        )
        if due:
            st.steps_since_snapshot = 0
            st.dirty = False
            st.last_snapshot_wall = wall
            t0 = self.clock()
            blob = st.to_bytes()
            if self.seal is not None:
                blob = self.seal.seal("snapshot", blob, job=st.job_id)
            st.snapshot_cost_s = max(0.0, self.clock() - t0)
            if len(blob) > self.max_snapshot_bytes:
                # the changelog would refuse it: keep the records unacked (they replay
                # after a crash) and say which limit to raise
                self.oversized_snapshots += 1
                log.error(
                    "snapshot of job %s is %d bytes, over STEPGUARD_WORKER_MAX_SNAPSHOT_BYTES"
                    "=%d: not written, its records stay unacked",
                    st.job_id, len(blob), self.max_snapshot_bytes,
                )  # fmt: skip
                return out
            out.snapshot = blob
            out.release += self._held.pop(st.job_id, [])
        return out

    # -- timer --------------------------------------------------------------------------
    def tick_record(self, job_id: str) -> tuple[int, bytes] | None:
        """(partition, value) of a tick for ``job_id``, or None while it has no step."""
        st = self.jobs.get(job_id)
        if st is None or st.last_event_ts is None or st.partition < 0:
            return None
        wall = self.clock()
        resumed = st.resume_wall - self.blind_after_s
        if wall < st.resume_wall and (self._last_record_wall or 0.0) < resumed:
            # just taken over and no record read since: its clock runs from its last
            # step (:meth:`_resume`), and until a fetch came back the driver cannot
            # know whether the steps of the gap are still unread (a partition's end
            # offset is known only from a fetch)
            return None
        return st.partition, self._tick_value(job_id, wall, "tick")

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
            mark = read_mark(job_id, blob, self.seal) if job_id not in self.jobs else None
            if mark is not None and mark.partition in owned:
                marks.append(mark)
        marks.sort(key=lambda m: m.wall_s)
        wall = self.clock()
        excess = len(marks) - self.max_ended
        due = [m for k, m in enumerate(marks)
               if k < excess or wall - m.wall_s >= self.job_idle_ttl_s]  # fmt: skip
        return [(m.job_id, m.partition, self._tick_value(m.job_id, wall, "expire")) for m in due]

    def _tick_value(self, job_id: str, wall: float, kind: str) -> bytes:
        body = json.dumps({"job_id": job_id, "wall_s": wall}).encode()
        return self.seal.seal(kind, body) if self.seal is not None else body
