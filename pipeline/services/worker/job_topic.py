"""The records of the worker's own jobs topic, each into the job it names. What
:class:`~pipeline.services.worker.routing.Routing` forwarded there (health, relaunching
commands, SUCCEEDED results, lifecycle events) and the timer's ticks and expires
(:mod:`pipeline.services.worker.ticks`) arrive in the order of the job's partition.
:class:`JobTopic` owns their handling: the seal opened (a record no worker of this group
wrote is a dead letter, ``unsealed``), then by kind: a health report to its job's
detection (a job it names is only pending until its first step), a command puts the
job's hang clock in its relaunch grace, a result ends it (:meth:`JobDetection.on_result`),
a start names the job's nodes, a phase or an end goes to the job's detection (an end is
pending until the ticks confirm it; a job this worker holds no state of is marked ended
at once).
"""

from __future__ import annotations

import logging

from pipeline.io.errors import CapacityError
from pipeline.services.worker.admission import Admission
from pipeline.services.worker.book import JobBook
from pipeline.services.worker.ending import Ending
from pipeline.services.worker.options import WorkerConfig
from pipeline.services.worker.records import Handled, Load, Record
from pipeline.services.worker.routing import Routing
from pipeline.services.worker.seal import TickError, decode_watermarks, health_path
from pipeline.services.worker.snapshots import Snapshots
from pipeline.services.worker.takeover import Takeover
from pipeline.services.worker.ticks import Ticks
from schemas import Command, CommandResult, JobEvent, JobEventKind, NodeHealth, Rejected

__all__ = ["JobTopic"]

log = logging.getLogger(__name__)


class JobTopic:
    """The jobs topic's records by kind (see the module docstring)."""

    def __init__(self, config: WorkerConfig, book: JobBook, admission: Admission,
                 takeover: Takeover, ending: Ending, ticks: Ticks,
                 routing: Routing) -> None:  # fmt: skip
        self.seal = config.trust.seal
        self.clock = config.clock
        self.max_clock_skew_s = config.timing.max_clock_skew_s
        self.event_rate = config.timing.event_rate
        self.book = book
        self.admission = admission
        self.takeover = takeover
        self.snapshots: Snapshots = takeover.snapshots
        self.ending = ending
        self.ticks = ticks
        self.routing = routing

    def handle(self, rec: Record, kind: str, load: Load) -> Handled:
        """One record of the jobs topic, of ``kind`` (its ``stepguard-kind`` header)."""
        self.takeover.saw_record()
        if self.seal is not None:
            payload = self.seal.open(kind, rec.value)
            if payload is None:  # not written by a worker of this group
                self.book.counts.unsealed += 1
                log.warning("%s refused: a %r record no worker sealed", rec.where, kind[:32])
                why = f"unsealed {kind[:32]!r} record on the worker's jobs topic"
                return rec.refused(why, "auth")
            rec = rec._replace(value=payload)
        if kind == "tick":
            return self.ticks.tick(rec)
        if kind == "expire":
            return self.ticks.expire(rec, load)
        if kind == "command":
            return self.command(rec)
        if kind == "lifecycle":
            return self.lifecycle(rec, load)
        if kind == "result":
            return self.result(rec)
        if kind == "paths":
            return self.watermarks(rec)
        return self.health(rec, load, health_path(kind))

    def health(self, rec: Record, load: Load, path: int | None = None) -> Handled:
        """A node's health report, forwarded to its job's partition from partition
        ``path`` of the health topic (None: a router that did not say)."""
        msg = self.admission.decoded(NodeHealth, rec)
        if isinstance(msg, Handled):
            return msg
        if msg.job_id is None:
            return rec.released()
        st = self.admission.take(rec, msg.job_id, msg.ts.timestamp(), load, confirm=False)
        if isinstance(st, Handled):
            return st
        out = Handled(job_id=msg.job_id)
        st.dirty = True
        try:
            out.alerts += st.detection.on_health(msg, path)
        except Exception as exc:
            log.exception("detector failed on %s", rec.where)
            out.dead_letters.append(rec.letter(f"detect: {exc!r}", "detect"))
        return self.snapshots.finish(st, out, rec.token)

    def watermarks(self, rec: Record) -> Handled:
        """A worker's watermarks of the health partitions it reads
        (:mod:`pipeline.services.worker.seal`), to every job held on this partition:
        everything that worker forwarded before them is already read here, so each
        job may judge its nodes' silence as far as their partition delivered."""
        skew = self.max_clock_skew_s
        max_wall = self.clock() + (skew if skew is not None else 300.0)
        try:
            marks = decode_watermarks(rec.value, max_wall=max_wall)
        except TickError as exc:
            return rec.refused(str(exc), "decode")
        if marks.paths:
            for st in self.book.jobs.values():
                if st.partition == rec.partition:
                    st.detection.delivered(marks.paths)
        return rec.released()

    def command(self, rec: Record) -> Handled:
        """A relaunching command for a job we hold: its silence from now on is the
        relaunch, not a hang (:meth:`JobDetection.on_command`: relaunching until the
        new run's first step, at most relaunch_max_s), and the nodes it names stop
        reporting."""
        msg = rec.decode(Command)
        if isinstance(msg, Rejected):
            return rec.released()
        st = self.book.jobs.get(msg.job_id)
        out = Handled(job_id=msg.job_id)
        now = st.now_estimate(self.clock(), self.event_rate) if st is not None else None
        if st is None or now is None or st.seen(rec.topic, rec.partition, rec.offset):
            out.release.append(rec.token)
            return out
        st.offsets[(rec.topic, rec.partition)] = rec.offset
        st.dirty = True
        st.active_wall = self.clock()
        out.alerts += st.detection.on_command(msg, now=now)
        log.info(
            "%s %s issued: its hang clock allows for the relaunch (nodes %s)",
            msg.job_id, msg.kind.value, ", ".join(msg.targets) or "none",
        )  # fmt: skip
        return self.snapshots.finish(st, out, rec.token)

    def result(self, rec: Record) -> Handled:
        """A SUCCEEDED result for a job we hold (:meth:`JobDetection.on_result`)."""
        msg = rec.decode(CommandResult)
        if isinstance(msg, Rejected):
            return rec.released()
        if self.routing.result_problem(msg) is not None:  # written to jobs directly
            self.book.counts.refused_results += 1
            return rec.released()
        st = self.book.jobs.get(msg.job_id)
        if st is None or st.seen(rec.topic, rec.partition, rec.offset):
            return rec.released(msg.job_id)
        st.offsets[(rec.topic, rec.partition)] = rec.offset
        st.dirty = True
        out = Handled(job_id=msg.job_id, alerts=st.detection.on_result(msg))
        return self.snapshots.finish(st, out, rec.token)

    def lifecycle(self, rec: Record, load: Load) -> Handled:
        """A job's start, long phase or end. An end resolves the job's episodes and
        drops its state (tombstone); its late records are ignored from then on, until
        a record newer than the end (a new run under the same id) starts afresh."""
        msg = self.admission.decoded(JobEvent, rec)
        if isinstance(msg, Handled):
            return msg
        ts = msg.ts.timestamp()
        future = self.admission.from_the_future(ts, rec)
        if future is not None:
            return future
        if self.ending.ended_before(msg.job_id, ts, load):
            return rec.released()
        if msg.kind is JobEventKind.START:  # the nodes it declares are the job's
            if msg.nodes:
                try:
                    named = self.takeover.state(msg.job_id, load, confirm=False)
                    named.detection.on_lifecycle(msg)
                except CapacityError as exc:
                    return self.admission.refuse(exc, rec)
            return rec.released(msg.job_id)
        st = self.book.jobs.get(msg.job_id)
        if st is None and msg.kind is JobEventKind.END:
            self.book.pending.pop(msg.job_id)
            try:  # a snapshot stored before this worker took the partition
                stored = self.snapshots.stored(msg.job_id, load) is not None
                st = self.takeover.state(msg.job_id, load) if stored else None
            except CapacityError:
                st = None
            if st is None:
                self.ending.mark(msg.job_id, ts)
                mark = self.ending.end_mark(msg.job_id, rec.partition)
                return Handled(job_id=msg.job_id, release=[rec.token], tombstone=True,
                               snapshot=mark)  # fmt: skip
        if st is None or st.seen(rec.topic, rec.partition, rec.offset):
            return rec.released(msg.job_id)
        st.offsets[(rec.topic, rec.partition)] = rec.offset
        st.dirty = True
        st.active_wall = self.clock()
        out = Handled(job_id=msg.job_id)
        # an end is pending until the job's records stop contradicting it (the ticks
        # confirm it: :meth:`Ticks.tick`); a refused or cut one is a lifecycle anomaly
        out.alerts += st.detection.on_lifecycle(msg)
        return self.snapshots.finish(st, out, rec.token)
