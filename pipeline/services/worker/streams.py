"""The worker's Faust agents, timer and rebalance handlers, thin over its core.
:class:`WorkerStreams` owns what the worker does with Faust: the topics and the
``job-states`` table it declares, the job agent (a steps fetch or a jobs-topic record
into :class:`~pipeline.services.worker.state.WorkerDetection`, then :meth:`settle`: send
the alerts, signed, and the dead letters, write or delete the job's table entry, ack the
records a snapshot covers), the four routers (health, commands, results and lifecycle
re-keyed to their job's partition of the jobs topic), the tick timer (adopt jobs found in
the table, send the expire and tick records, watch table recovery, set the lag gauges)
and the rebalance handlers (drop revoked jobs and their ack lines, count the partitions
owned). Each is a named method; :meth:`register` attaches them to the app. The logic is
the core's: an agent only converts Faust's records to the core's
:class:`~pipeline.services.worker.records.Record` and acts on the
:class:`~pipeline.services.worker.records.Handled` it returns.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Callable
from typing import Any

import faust

from pipeline.io.settings import Settings
from pipeline.io.trust import SigningKey, sign
from pipeline.services.worker.bulk import AckLines, StepBatch
from pipeline.services.worker.consumer import JOB_QUEUE_EVENTS, lagging, owned, update_lag
from pipeline.services.worker.current import make_current
from pipeline.services.worker.metrics import WorkerMetrics
from pipeline.services.worker.records import Forward, Handled, Record
from pipeline.services.worker.state import KIND_HEADER, WorkerDetection
from schemas import Alert, DeadLetter, Rejected, encode

__all__ = ["RECOVERY_STALLED_EXIT", "TABLE_NAME", "RecoveryWatchdog", "WorkerStreams"]

log = logging.getLogger(__name__)

TABLE_NAME = "job-states"

#: Exit status of a worker whose table recovery stalled (EX_TEMPFAIL: restart it).
RECOVERY_STALLED_EXIT = 75

_RAW: dict[str, Any] = {"key_type": bytes, "value_type": bytes,
                        "key_serializer": "raw", "value_serializer": "raw"}  # fmt: skip


class WorkerStreams:
    """The agents, timer and handlers of one worker (see the module docstring)."""

    def __init__(
        self,
        app: faust.App,
        core: WorkerDetection,
        metrics: WorkerMetrics,
        settings: Settings,
        alert_key: SigningKey,
        out_topics: tuple[str, str, str],
    ) -> None:
        """``out_topics``: the decisions and dead-letter topics and the changelog."""
        self.app, self.core, self.metrics, self.settings = app, core, metrics, settings
        self.alert_key = alert_key
        names = self.names = core.topics
        n = core.n_partitions
        decisions, deadletter, self.changelog = out_topics
        # a steps event is a whole fetch of a partition (up to consumer_max_fetch_size):
        # a short queue bounds what waits in memory
        self.job_inputs = app.topic(names.steps, names.jobs, maxsize=JOB_QUEUE_EVENTS, **_RAW)
        self.jobs_out = app.topic(names.jobs, partitions=n, **_RAW)
        self.decisions = app.topic(decisions, **_RAW)
        self.deadletter = app.topic(deadletter, **_RAW)
        self.table = app.Table(TABLE_NAME, default=None, partitions=n, key_type=bytes,
                               value_type=bytes)  # fmt: skip
        # the job's state under its id (statecodec bytes, never pickle), both raw
        # (Faust would pick JSON here)
        self.table.key_serializer = self.table.value_serializer = "raw"
        self.last_read: dict[tuple[str, int], int] = {}
        #: per partition of the health topic, the newest event time forwarded from it
        #: (bounded by the topic's partitions: the watermarks of :meth:`send_watermarks`)
        self.health_ts: dict[int, float] = {}
        self.acks = AckLines()  # the steps partitions' batches, acked in offset order
        self.watchdog = RecoveryWatchdog(settings.worker_recovery_timeout_s)
        self._records: dict[str, Any] = {}

    def register(self) -> None:
        """Attach the agents, the timer and the rebalance handlers to the app."""
        app, names, core = self.app, self.names, self.core
        app.agent(self.job_inputs, name="stepguard.worker.jobs")(self.jobs_agent)
        routes: list[tuple[str, str, Callable[[Record], Any], Callable[[], None]]] = [
            (names.health, "health", core.routing.health, self.metrics.unrouted_health.inc),
            (names.commands, "command", core.routing.command, _nothing),
            (names.results, "result", core.routing.result, _nothing),
            (names.lifecycle, "lifecycle", core.routing.lifecycle, _nothing),
        ]
        for topic, what, route, on_none in routes:
            agent = _Router(self, what, route, on_none)
            app.agent(app.topic(topic, **_RAW), name=f"stepguard.worker.{what}")(agent.run)
        interval = self.settings.worker_tick_interval_s
        app.timer(interval=interval, name="stepguard.worker.tick")(self.tick_jobs)
        app.on_partitions_revoked.connect(self.on_revoked)
        app.on_partitions_assigned.connect(self.on_assigned)

    # -- acting on the core's outcomes --------------------------------------------------
    def load(self, job_id: str) -> bytes | None:
        """The table's entry under a job id (its snapshot or end mark)."""
        blob: bytes | None = self.table.get(job_id.encode())
        return blob

    async def settle(self, out: Handled) -> None:
        """Act on what the core made of one record: send its alerts and dead letters,
        write or delete the job's snapshot, ack the records the snapshot covers."""
        if out.alerts or out.dead_letters or out.rank_steps:
            await self.publish(out)
        table = self.table
        if out.snapshot is not None and out.job_id is not None:
            table[out.job_id.encode()] = out.snapshot  # or, ended, the mark of its end
            if not out.tombstone:
                self.metrics.snapshots.inc()
        elif out.tombstone and out.job_id is not None:
            # an end mark expired: a tombstone in the compacted changelog
            with contextlib.suppress(KeyError):
                del table[out.job_id.encode()]
        for held in out.release:
            held.ack()

    async def publish(self, out: Handled) -> None:
        for alert in out.alerts:
            await self.send_alert(alert)
        for letter in out.dead_letters:
            await self.send_dead(letter)
        if out.rank_steps:
            metrics = self.metrics
            metrics.rank_steps.inc(out.rank_steps)
            metrics.steps.inc(out.steps)
            wall = time.time()
            for ts in out.step_ts:
                metrics.step_latency.observe(max(0.0, wall - ts))

    async def send_alert(self, alert: Alert) -> None:
        signed = sign(alert, self.alert_key)
        await self.decisions.send(key=alert.job_id.encode(), value=encode(signed))
        self.metrics.alerts.labels(alert.grade.value, alert.state.value).inc()

    async def send_dead(self, letter: DeadLetter) -> None:
        log.warning(
            "dead letter from %s[%d]@%d: %s",
            letter.source_topic, letter.partition, letter.offset, letter.error,
        )  # fmt: skip
        await self.deadletter.send(key=letter.source_topic.encode(), value=encode(letter))
        self.metrics.dead_letters.labels(letter.stage).inc()

    async def forward(self, routed: Forward, kind: bytes) -> None:
        """Re-key a health report or command to its job's partition of the jobs topic."""
        await self.jobs_out.send(
            key=routed.job_id.encode(), value=routed.value, partition=routed.partition,
            headers=[(KIND_HEADER, kind)],
        )  # fmt: skip

    def read(self, topic: str, partition: int, offset: int, records: int = 1) -> None:
        """Count ``records`` read and note the offset the agents reached."""
        child = self._records.get(topic)  # labels() costs a lock per call
        if child is None:
            child = self._records[topic] = self.metrics.records.labels(topic)
        child.inc(records)
        self.last_read[(topic, partition)] = offset

    # -- the job agent --------------------------------------------------------------------
    async def jobs_agent(self, stream: Any) -> None:
        """The steps and jobs topics, many records per call: ``noack_take`` hands over
        what the consumer has buffered (up to ``worker_batch_max``, waiting
        ``worker_batch_within_s`` at most) and acks nothing, so a record is still acked
        only once a snapshot covers it; the gauges are set once per batch."""
        settings, core, metrics = self.settings, self.core, self.metrics
        async for events in stream.noack_take(
            settings.worker_batch_max, within=settings.worker_batch_within_s
        ):
            for event in events:
                if isinstance(event.message, StepBatch):
                    await self.handle_steps(event)
                else:
                    await self.handle(event)
            metrics.jobs.set(len(core.jobs))
            for name, value in core.job_states().items():
                metrics.job_states.labels(name).set(value)
            for name, value in core.counts().items():
                metrics.state_events.labels(name).set(value)

    async def handle(self, event: Any) -> None:
        """One record of the jobs topic (or of the steps topic, when not in a batch);
        never raises (Faust would ack it)."""
        msg = event.message
        started = time.perf_counter()
        make_current(event)  # the changelog partition of a table write (current.py)
        rec = Record(topic=msg.topic, partition=msg.partition, offset=msg.offset,
                     key=msg.key, value=msg.value, token=event, headers=msg.headers)  # fmt: skip
        try:
            if msg.topic == self.names.steps:  # a consumer that does not group steps
                out = self.core.steps.handle(rec, self.load)
            else:
                kind = _header(msg.headers, KIND_HEADER)
                out = self.core.job_topic.handle(rec, kind, self.load)
            await self.settle(out)
        except Exception:  # never let one record kill the agent (Faust acks it)
            log.exception("worker failed on %s", rec.where)
            event.ack()
        self.read(msg.topic, msg.partition, msg.offset)
        self.metrics.process_seconds.observe(time.perf_counter() - started)

    async def handle_steps(self, event: Any) -> None:
        """A fetch's records of one steps partition (:class:`StepBatch`) through the
        core at once (:meth:`StepIntake.handle_batch`: one outcome per job, and per
        record that went no further); the batch is acked once a snapshot covers each of
        them and every earlier batch of the partition is acked (:mod:`.bulk`)."""
        batch: StepBatch = event.message
        topic, partition, records = batch.topic, batch.partition, batch.records
        make_current(event)
        ticket = self.acks.line(partition).open(event.ack, len(records))
        started = time.perf_counter()
        try:
            for out in self.core.steps.handle_batch(_records(batch, ticket), self.load):
                if out.acts():
                    await self.settle(out)
        except Exception:  # never let one batch kill the agent (Faust would ack it)
            log.exception("worker failed on %s[%d]@%d-%d", topic, partition,
                          records[0].offset if records else -1, batch.offset)  # fmt: skip
            for _ in range(ticket.pending):
                ticket.ack()
        if records:  # a batch's records: their mean (one observation per record costs
            # a lock and a bucket search each, a tenth of what the core spends on one)
            mean = (time.perf_counter() - started) / len(records)
            self.metrics.process_seconds.observe(mean)
        self.read(topic, partition, batch.offset, len(records))
        # the ticket keeps the event until the batch is acked, which a job whose
        # snapshots are refused delays for good: not its records, which are read
        batch.records = []

    # -- the timer and the rebalance handlers ---------------------------------------------
    async def tick_jobs(self) -> None:
        """Adopt the table's jobs, expire old end marks, tick every job held whose
        steps are read; exit for a restart when table recovery stalls."""
        app, core, steps = self.app, self.core, self.names.steps
        busy = app.rebalancing or not app.tables.recovery.completed.is_set()
        stalled = self.watchdog.check(busy)
        if stalled is not None:
            # Faust's changelog recovery can wait forever for records after a
            # rebalance ("No event received for active tp"); a fresh process recovers
            log.critical(
                "table recovery has not completed for %.0fs "
                "(STEPGUARD_WORKER_RECOVERY_TIMEOUT_S): exiting for a restart", stalled,
            )  # fmt: skip
            logging.shutdown()
            os._exit(RECOVERY_STALLED_EXIT)
        if busy:
            return
        mine = owned(app, steps)
        left: list[tuple[str, bytes]] = []  # not adopted: ended jobs' marks among them
        for key, blob in list(self.table.items()):
            if blob is not None:
                with contextlib.suppress(Exception):
                    if not core.adopt(key.decode(), blob, mine):
                        left.append((key.decode(), blob))
        for job_id, partition, value in core.expiry_ticks(left, mine):
            await self._send_kind(job_id, partition, value, b"expire")
        # a partition with unread steps is *our* backlog, not a silent job: no tick
        behind = lagging(app, steps, self.last_read)
        for job_id in list(core.jobs):
            rec = core.tick_record(job_id)
            if rec is None or rec[0] not in mine or rec[0] in behind:
                continue
            await self._send_kind(job_id, rec[0], rec[1], b"tick")
        await self.send_watermarks()
        update_lag(app, self.metrics, self.last_read, skip=self.changelog)

    async def send_watermarks(self) -> None:
        """How far each health partition this worker reads has delivered, to every
        partition of the jobs topic, after what it forwarded from them
        (:mod:`pipeline.services.worker.seal`): ``None`` where it has read to the
        partition's end, else the event time of the newest report it forwarded (a
        partition not fetched yet, or with nothing forwarded, says nothing)."""
        topic = self.names.health
        wall = time.time()
        paths: list[tuple[int, float | None]] = []
        try:
            for tp in self.app.consumer.assignment():
                if tp.topic != topic:
                    continue
                hw = self.app.consumer.highwater(tp)
                if hw is not None and hw <= self.last_read.get((topic, tp.partition), -1) + 1:
                    paths.append((tp.partition, None))
                elif (ts := self.health_ts.get(tp.partition)) is not None:
                    paths.append((tp.partition, min(ts, wall)))
        except Exception:  # consumer not started: claim nothing
            return
        if not paths:
            return
        value = self.core.watermarks_record(paths)
        read = sum(1 for _, at in paths if at is None)
        self.metrics.health_watermarks.labels("read").inc(read)
        self.metrics.health_watermarks.labels("lagging").inc(len(paths) - read)
        for partition in range(self.core.n_partitions):
            await self.jobs_out.send(key=b"paths", value=value, partition=partition,
                                     headers=[(KIND_HEADER, b"paths")])  # fmt: skip

    async def _send_kind(self, job_id: str, partition: int, value: bytes, kind: bytes) -> None:
        await self.jobs_out.send(key=job_id.encode(), value=value, partition=partition,
                                 headers=[(KIND_HEADER, kind)])  # fmt: skip

    async def on_revoked(self, app: faust.App, revoked: set[Any], **kwargs: Any) -> None:
        names = self.names
        dropped = self.core.drop_partitions({tp.partition for tp in revoked if tp.topic in
                                             (names.steps, names.jobs)})  # fmt: skip
        self.acks.revoke(tp.partition for tp in revoked if tp.topic == names.steps)
        if dropped:
            log.info("rebalance: dropped %d cached jobs", dropped)

    async def on_assigned(self, app: faust.App, assigned: set[Any], **kwargs: Any) -> None:
        names = self.names
        mine = [tp for tp in assigned if tp.topic in (names.steps, names.jobs)]
        self.metrics.assigned.set(len(mine))
        self.metrics.readiness.polled()  # consuming: /readyz answers 200
        log.info("rebalance: own %d partitions of %s and %s", len(mine), names.steps,
                 names.jobs)  # fmt: skip


def _records(batch: StepBatch, ticket: Any) -> list[Record]:
    """A fetch's raw records as the core's, each holding the batch's ticket."""
    topic, part = batch.topic, batch.partition
    return [Record(topic=topic, partition=part, offset=r.offset, key=r.key, value=r.value,
                   token=ticket, headers=r.headers) for r in batch.records]  # fmt: skip


def _nothing() -> None:
    return None


class _Router:
    """An agent that re-keys one topic's records to their job's partition of the jobs
    topic (header ``what``); bad records are dead letters, per record."""

    def __init__(
        self,
        streams: WorkerStreams,
        what: str,
        route: Callable[[Record], Forward | Rejected | None],
        on_none: Callable[[], None],
    ) -> None:
        self.streams, self.what, self.route, self.on_none = streams, what, route, on_none

    async def run(self, stream: Any) -> None:
        streams = self.streams
        async for event in stream.events():
            msg = event.message
            rec = Record(topic=msg.topic, partition=msg.partition, offset=msg.offset,
                         key=msg.key, value=msg.value, headers=msg.headers)  # fmt: skip
            try:
                routed = self.route(rec)
                if isinstance(routed, Rejected):
                    await streams.send_dead(routed.letter)
                elif routed is None:
                    self.on_none()
                else:
                    await streams.forward(routed, (routed.kind or self.what).encode())
                    if routed.ts is not None and math.isfinite(routed.ts):
                        seen = streams.health_ts
                        seen[msg.partition] = max(routed.ts, seen.get(msg.partition, routed.ts))
            except Exception:
                log.exception("%s routing failed on %s", self.what, rec.where)
            streams.read(msg.topic, msg.partition, msg.offset)


def _header(headers: Any, name: str) -> str:
    if not headers:
        return ""
    items = headers.items() if isinstance(headers, dict) else headers
    for k, v in items:
        if k == name:
            return v.decode() if isinstance(v, bytes) else str(v)
    return ""


class RecoveryWatchdog:
    """How long the worker has been rebalancing or recovering without a break.

    >>> t = [0.0]
    >>> w = RecoveryWatchdog(10.0, clock=lambda: t[0])
    >>> w.check(True), t.__setitem__(0, 9.0), w.check(True)
    (None, None, None)
    >>> t[0] = 10.5; w.check(True)
    10.5
    >>> w.check(False), w.check(True)  # recovered: the clock starts again
    (None, None)
    """

    def __init__(self, timeout_s: float, clock: Any = time.monotonic) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.timeout_s = timeout_s
        self.clock = clock
        self._since: float | None = None

    def check(self, recovering: bool) -> float | None:
        """Seconds stalled when over the timeout, else None."""
        if not recovering:
            self._since = None
            return None
        now = self.clock()
        if self._since is None:
            self._since = now
        stalled = now - self._since
        return stalled if stalled > self.timeout_s else None
