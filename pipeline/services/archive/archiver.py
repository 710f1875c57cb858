"""``stepguard archiver``: every topic into ClickHouse, offsets committed after insert.

A crash between insert and commit replays the batch; the ReplacingMergeTree tables
collapse the duplicates, so readers using FINAL see each message once. Their version
is the record's offset (:func:`~pipeline.services.archive.rows.ingest_version`): a replay
stores the same versions, and the first record under a key stays, whatever times a
writer puts in its messages.

Throughput (BENCHMARKS.md, "Archive ingest"): the consumer is aiokafka on an event loop
of its own thread, so it fetches ahead while batches are decoded and inserted; the steps
topic (by far the largest) is decoded in bulk by :mod:`pipeline.io.fastdecode` into numpy
columns, with no Python object per row. That decode is most of the archiver's CPU, so
with ``decode_processes`` it runs in a pool of processes (one GIL each) while this
process fetches and inserts; batches are still stored and committed in fetch order.
Every other topic, and any steps message the fast path leaves aside, goes through
``schemas.decode``.

The archiver never stops on data: a message that does not decode, or whose rows the
archive refuses (a value beyond a column's type, a string longer than a FixedString, an
Enum element the column lacks, a block spread over too many partitions: by ClickHouse's
error code, :mod:`~pipeline.services.archive.refusals`), goes to the dead-letter topic
with the error and its source topic/partition/offset; a refused insert is halved until
the smallest set of messages that fails is found, and the rest of the batch is stored.
The tables are partitioned by when the archive stored a row (``received``, migration
013), not by the writer's own time, so no burst of past- or future-dated records
spreads one insert over many partitions. Only ClickHouse being down or unwell is
retried, with backoff; after the last attempt :class:`~pipeline.io.errors.ArchiveError`
ends the service with nothing committed, so nothing is lost.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

import numpy as np
import numpy.typing as npt
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from kafka import KafkaProducer

from pipeline.io.errors import ArchiveError, ArchiveRowError, BrokerError
from pipeline.io.fastdecode import from_models
from pipeline.io.kafka import aiokafka_consumer_config, make_producer, publish, registry_of
from pipeline.io.metrics import ArchiverMetrics
from pipeline.io.settings import Settings
from pipeline.services.archive.backend import ArchiveBackend, Columns
from pipeline.services.archive.decode_pool import (
    DecodePool,
)
from pipeline.services.archive.limits import QueryLimits
from pipeline.services.archive.rows import (
    StepRows,
    ingest_version,
    rows_for,
    step_rows,
    step_rows_of,
)
from pipeline.services.archive.serve import QueryServer
from pipeline.services.archive.trust import SignatureCheck
from schemas import TOPICS, DeadLetter, Message, Rejected, StepTelemetry, decode

__all__ = ["Archiver", "ArchiverStats"]

log = logging.getLogger(__name__)
T = TypeVar("T")
Record: TypeAlias = ConsumerRecord[bytes, bytes]


@dataclass
class ArchiverStats:
    fetched: int = 0  # messages fetched (stored, or in the insert thread's hands)
    messages: int = 0  # messages stored (as rows or dead letters) and committed
    rows: int = 0
    batches: int = 0
    dead_letters: int = 0
    rows_by_table: dict[str, int] = field(default_factory=dict)


class Archiver:
    """Consume topics, batch by size and time, insert, then commit."""

    def __init__(
        self,
        settings: Settings,
        backend: ArchiveBackend,
        *,
        topics: list[str] | None = None,
        group_id: str | None = None,
        max_batch: int = 5000,
        max_wait_s: float = 1.0,
        producer: KafkaProducer | None = None,
        insert_attempts: int = 8,
        decode_processes: int = 0,
        metrics: ArchiverMetrics | None = None,
        query_socket: Path | None = None,
        query_limits: QueryLimits | None = None,
    ) -> None:
        self._metrics_init(metrics)
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        if max_wait_s <= 0:
            raise ValueError("max_wait_s must be positive")
        if insert_attempts < 1:
            raise ValueError("insert_attempts must be >= 1")
        if decode_processes < 0:
            raise ValueError("decode_processes must be >= 0")
        self.settings = settings
        self.backend = backend
        self.registry = registry_of(settings)
        # signed messages no public key of their writers' role verifies: archived unsigned
        self._signatures = SignatureCheck(settings)
        logical = topics or list(TOPICS)
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.insert_attempts = insert_attempts
        self.stats = ArchiverStats()
        self._producer = producer or make_producer(settings)
        # one insert thread: batches are stored and committed one after another, in order
        self._inserter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="archiver-insert")
        # batches handed to it: one being stored while the next ones are decoded
        self._in_flight: deque[Future[None]] = deque()
        self._depth = decode_processes + 1
        self._broken: BaseException | None = None  # a batch failed: store nothing after it
        self._raised = False  # ... and the caller was told
        self._decoders = DecodePool(decode_processes) if decode_processes else None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="archiver-consumer", daemon=True
        )
        self._thread.start()
        config = aiokafka_consumer_config(
            settings, group_id or f"{settings.consumer_group}.archiver"
        )
        try:
            self._consumer = self._call(
                self._start([self.registry.name(t) for t in logical], config)
            )
        except KafkaError as exc:
            self._stop_loop()
            self._inserter.shutdown()
            if self._decoders is not None:
                self._decoders.close()
            raise BrokerError(
                f"cannot connect consumer to {settings.kafka_bootstrap}: {exc}"
            ) from exc
        # chDB has one owner: while it runs, the archiver answers read-only queries
        # (``stepguard sql``/``query``/``report``) on this socket (pipeline.services.archive.serve)
        self._queries: QueryServer | None = None
        if query_socket is not None:
            try:
                chdb: Any = backend  # the query socket serves chDB (stepguard archiver)
                self._queries = QueryServer(chdb, query_socket, query_limits).start()
            except BaseException:
                self.close()
                raise

    # -- metrics (``stepguard archiver`` serves them on archiver_metrics_port) -------

    def _metrics_init(self, metrics: ArchiverMetrics | None) -> None:
        self.metrics = metrics or ArchiverMetrics()
        self._counted = ArchiverStats()  # what the counters already hold
        self._next_offsets: dict[TopicPartition, int] = {}

    def _update_metrics(self, fetched: dict[TopicPartition, int]) -> None:
        """Bring the counters up to :attr:`stats` (the insert thread updates them) and
        set the lag: per topic, the partitions' high watermarks less the next offset to
        fetch (partitions not fetched from yet count from 0 only once seen)."""
        m, s, c = self.metrics, self.stats, self._counted
        m.readiness.polled()  # after every poll of its topics
        m.messages.inc(max(0, s.messages - c.messages))
        m.dead_letters.inc(max(0, s.dead_letters - c.dead_letters))
        for table, rows in list(s.rows_by_table.items()):
            m.rows.labels(table).inc(max(0, rows - c.rows_by_table.get(table, 0)))
            c.rows_by_table[table] = rows
        c.messages, c.dead_letters = s.messages, s.dead_letters
        self._next_offsets.update(fetched)
        lag: dict[str, int] = defaultdict(int)
        assigned = self._consumer.assignment()
        for tp, nxt in self._next_offsets.items():
            high = self._consumer.highwater(tp) if tp in assigned else None
            if high is not None:
                lag[tp.topic] += max(0, high - nxt)
        for topic, value in lag.items():
            m.lag.labels(self.registry.logical_of(topic) or topic).set(value)

    # -- the consumer's event loop ------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @staticmethod
    async def _start(topics: list[str], config: dict[str, Any]) -> AIOKafkaConsumer:
        consumer = AIOKafkaConsumer(*topics, **config)
        await consumer.start()
        return consumer

    async def _fetch(self) -> dict[TopicPartition, list[Record]]:
        """Up to ``max_batch`` records by partition (in offset order), waiting at most
        ``max_wait_s`` for them."""
        records: dict[TopicPartition, list[Record]] = {}
        count = 0
        deadline = time.monotonic() + self.max_wait_s
        while count < self.max_batch:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                break
            got = await self._consumer.getmany(
                timeout_ms=left_ms, max_records=self.max_batch - count
            )
            for tp, batch in got.items():
                records.setdefault(tp, []).extend(batch)
                count += len(batch)
        return records

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        """Commit a stored batch. Partitions that moved to another archiver in a
        rebalance are left to it: it replays them, and FINAL reads collapse the rows."""
        assigned = self._consumer.assignment()
        mine = {tp: offset for tp, offset in offsets.items() if tp in assigned}
        if len(mine) < len(offsets):
            log.warning("not committing %s: reassigned, they will be replayed",
                        sorted(str(tp) for tp in offsets.keys() - mine.keys()))  # fmt: skip
        if not mine:
            return
        try:
            await self._consumer.commit(mine)
        except (CommitFailedError, IllegalStateError) as exc:
            log.warning("commit after a rebalance failed (%s); the batch will be replayed", exc)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    # -- one batch -------------------------------------------------------------------

    def poll_batch(self) -> int:
        """Fetch one batch (size or time bound), start decoding it, and hand it to the
        insert thread, which inserts it and commits its offsets. Returns its messages.

        The insert of one batch overlaps the fetch and decode of the next ones (up to
        ``decode_processes`` decoding at once); commits stay in batch order, each after
        the inserts it covers, and nothing is stored after a batch that failed. A poll
        that fetches nothing in ``max_wait_s`` waits for the batches in flight, as
        :meth:`flush` does, so ``stats`` is complete after a poll returns 0.
        """
        records = self._call(self._fetch())
        if not records:
            self._finish_in_flight()
            self._update_metrics({})
            return 0
        batch = self._prepare(records)
        self.stats.fetched += batch.size
        while len(self._in_flight) >= self._depth:
            self._wait_oldest()
        self._in_flight.append(self._inserter.submit(self._store_batch, batch))
        self._update_metrics(batch.offsets)
        return batch.size

    def flush(self) -> None:
        """Wait until every batch in flight is inserted and committed (the first
        error, if any, is raised here)."""
        self._finish_in_flight()

    def _finish_in_flight(self) -> None:
        """Wait for the batches handed to the insert thread; a failure is raised here."""
        while self._in_flight:
            self._wait_oldest()

    def _wait_oldest(self) -> None:
        job = self._in_flight.popleft()
        try:
            job.result()
        except BaseException:
            self._raised = True
            raise

    def _prepare(self, records: dict[TopicPartition, list[Record]]) -> _Batch:
        """Decode a batch and build its rows (or start to); nothing here touches the
        archive."""
        # the archiver's own clock: what bounds a command result's at_ms (rows.result_at_ms)
        batch = _Batch(size=sum(map(len, records.values())), received_ms=int(time.time() * 1000))
        by_topic: dict[str, list[Record]] = defaultdict(list)
        for tp, recs in records.items():
            by_topic[tp.topic].extend(recs)
            batch.offsets[tp] = recs[-1].offset + 1
        for topic, recs in by_topic.items():
            logical = self.registry.logical_of(topic)
            if logical is None:
                continue
            if logical == "steps":
                self._prepare_steps(recs, batch)
                continue
            model = TOPICS[logical].model
            for rec in recs:
                out = self._decode(model, rec)
                if isinstance(out, Rejected):
                    batch.letters.append((rec, out.letter if logical != "deadletter" else None))
                else:
                    batch.generic.append((rec, self._signatures.mark(out)))
        return batch

    @staticmethod
    def _decode(model: type[Message], rec: Record) -> Message | Rejected:
        return decode(
            model, rec.value, topic=rec.topic, partition=rec.partition, offset=rec.offset,
            key=rec.key,
        )  # fmt: skip

    def _prepare_steps(self, recs: list[Record], batch: _Batch) -> None:
        """Start decoding the steps topic's records in bulk into the steps table's
        columns: in a decode process if there are any, else here and now."""
        values = [r.value for r in recs]
        if self._decoders is None:
            decoded = step_rows(values)
            batch.steps.append((recs, lambda: decoded))
        else:
            batch.steps.append((recs, self._decoders.submit(values)))

    def _step_parts(
        self,
        recs: list[Record],
        rows: Callable[[], StepRows],
        letters: list[tuple[Record, DeadLetter | None]],
    ) -> list[_StepRows]:
        """The decoded steps rows, and the records they leave aside: rows the table
        refuses become dead letters; records the fast path left to pydantic become
        dead letters or more rows, built the same way."""
        decoded = rows()
        for i, reason in decoded.rejected.items():
            letters.append((recs[i], _rejected_row(recs[i], reason)))
        offsets = np.fromiter((r.offset for r in recs), dtype=np.int64, count=len(recs))
        table = {**decoded.columns, "ver": ingest_version(offsets[decoded.row_value])}
        parts = [_StepRows(table, decoded.row_value, recs, decoded.stored)]
        models: list[StepTelemetry] = []
        model_recs: list[Record] = []
        for i in decoded.slow:
            out = self._decode(StepTelemetry, recs[i])
            if isinstance(out, Rejected):
                letters.append((recs[i], out.letter))
            else:
                assert isinstance(out, StepTelemetry)
                models.append(out)
                model_recs.append(recs[i])
        if models:
            more = step_rows_of(from_models(models))
            more_offsets = np.array([r.offset for r in model_recs], dtype=np.int64)
            more_table = {**more.columns, "ver": ingest_version(more_offsets[more.row_value])}
            for i in more.slow:
                error = "steps: an integer exceeds int64"
                letters.append((model_recs[i], _rejected_row(model_recs[i], error)))
            for i, reason in more.rejected.items():
                letters.append((model_recs[i], _rejected_row(model_recs[i], reason)))
            parts.append(_StepRows(more_table, more.row_value, model_recs, more.stored))
        return parts

    def _store_batch(self, batch: _Batch) -> None:
        """On the insert thread: insert, send the dead letters, then commit; after a
        batch failed, refuse the ones queued behind it (their commit would skip it)."""
        if self._broken is not None:
            raise ArchiveError("not stored: an earlier batch failed") from self._broken
        try:
            self._store_batch_now(batch)
        except BaseException as exc:
            self._broken = exc
            raise

    def _store_batch_now(self, batch: _Batch) -> None:
        for recs, rows in batch.steps:
            for part in self._step_parts(recs, rows, batch.letters):
                for unit, error in self._store("steps", part.units, part.build):
                    rec = part.recs[unit]
                    batch.letters.append((rec, _rejected_row(rec, error)))
        self._store_generic(batch.generic, batch.letters, batch.received_ms)
        self._send_letters(batch.letters)
        self._call(self._commit(batch.offsets))
        self.stats.messages += batch.size
        self.stats.batches += 1

    def _store_generic(
        self,
        items: list[tuple[Record, Message]],
        letters: list[tuple[Record, DeadLetter | None]],
        received_ms: int,
    ) -> None:
        """Insert decoded models table by table (``rows_for``)."""
        by_table: dict[str, list[tuple[Record, Message]]] = defaultdict(list)
        for rec, msg in items:
            for table in rows_for([(msg, rec.timestamp)]):
                by_table[table].append((rec, msg))
        for table, units in by_table.items():

            def build(subset: Sequence[tuple[Record, Message]], table: str = table) -> Columns:
                pairs = [(msg, rec.timestamp) for rec, msg in subset]
                offsets = [rec.offset for rec, _ in subset]
                return rows_for(pairs, offsets, received_ms=received_ms)[table]

            for (rec, msg), error in self._store(table, units, build):
                is_letter = isinstance(msg, DeadLetter)
                letters.append((rec, None if is_letter else _rejected_row(rec, error)))

    def _store(
        self, table: str, units: Sequence[T], build: Callable[[Sequence[T]], Columns]
    ) -> list[tuple[T, str]]:
        """Insert the rows of ``units``; the units whose rows the table refuses are
        found by halving and returned with the error, the others are stored."""
        if not units:
            return []
        try:
            self._insert_with_retry(table, build(units))
            return []
        except ArchiveRowError as exc:
            if len(units) == 1:
                return [(units[0], str(exc))]
            half = len(units) // 2
            return self._store(table, units[:half], build) + self._store(table, units[half:], build)

    def _insert_with_retry(self, table: str, columns: Columns) -> None:
        delay = 0.5
        for attempt in range(1, self.insert_attempts + 1):
            try:
                began = time.perf_counter()
                n = self.backend.insert(table, columns)
                self.metrics.insert_seconds.labels(table).observe(time.perf_counter() - began)
                break
            except ArchiveRowError:
                raise
            except ArchiveError as exc:
                if attempt == self.insert_attempts:
                    log.error("insert into %s failed %d times; giving up: %s", table, attempt, exc)
                    raise
                log.warning(
                    "insert into %s failed (attempt %d of %d: %s); retry in %.1fs",
                    table, attempt, self.insert_attempts, exc, delay,
                )  # fmt: skip
                time.sleep(delay)
                delay = min(delay * 2, 30.0)
        self.stats.rows += n
        self.stats.rows_by_table[table] = self.stats.rows_by_table.get(table, 0) + n

    def _send_letters(self, letters: list[tuple[Record, DeadLetter | None]]) -> None:
        """Produce the batch's dead letters and wait for them before the commit."""
        futures = []
        for rec, letter in letters:
            where = f"{rec.topic}[{rec.partition}]@{rec.offset}"
            if letter is None:  # never loop: a broken dead letter is logged, not re-sent
                log.warning("dropped an undecodable or unstorable dead letter at %s", where)
                continue
            log.warning("dead letter (%s) from %s: %s", letter.stage, where, letter.error)
            futures.append(publish(self._producer, self.registry, "deadletter", letter))
        for fut in futures:
            fut.get(timeout=30)
        self.stats.dead_letters += len(futures)

    def run(
        self,
        stop: Callable[[], bool],
        progress: Callable[[ArchiverStats], None] | None = None,
        every_s: float = 30.0,
    ) -> ArchiverStats:
        """Archive until ``stop()``; ``progress(stats)`` every ``every_s`` seconds."""
        due = time.monotonic() + every_s
        while not stop():
            self.poll_batch()
            if progress is not None and time.monotonic() >= due:
                progress(self.stats)
                due = time.monotonic() + every_s
        self._finish_in_flight()
        return self.stats

    def close(self) -> None:
        """Finish the batches in flight (insert and commit), then stop the clients.
        After a failure the caller has already seen, the batches queued behind it
        are dropped uncommitted without raising again."""
        if self._queries is not None:
            self._queries.close()
            self._queries = None
        try:
            already_raised = self._raised
            try:
                self._finish_in_flight()
            except Exception:
                if not already_raised:
                    raise
        finally:
            self._inserter.shutdown()
            if self._decoders is not None:
                self._decoders.close()
            try:
                self._call(self._consumer.stop())
            finally:
                self._stop_loop()
                self._producer.flush()
                self._producer.close()


@dataclass
class _StepRows:
    """The steps table's rows of one group of messages, ready to insert."""

    table: Columns
    row_unit: npt.NDArray[np.int64]  # per row: the unit (index into recs) it is from
    recs: list[Record]
    units: list[int]  # the units whose rows are in table

    def build(self, subset: Sequence[int]) -> Columns:
        if len(subset) == len(self.units):
            return self.table
        mask = np.isin(self.row_unit, np.asarray(subset, dtype=np.int64))
        return {name: values[mask] for name, values in self.table.items()}


@dataclass
class _Batch:
    """One fetched batch: what the insert thread stores and then commits. The steps
    records' rows may still be decoding (in a decode process)."""

    size: int
    received_ms: int  # when it was fetched, by the archiver's clock
    offsets: dict[TopicPartition, int] = field(default_factory=dict)
    steps: list[tuple[list[Record], Callable[[], StepRows]]] = field(default_factory=list)
    generic: list[tuple[Record, Message]] = field(default_factory=list)
    letters: list[tuple[Record, DeadLetter | None]] = field(default_factory=list)


def _rejected_row(rec: Record, error: str) -> DeadLetter:
    """The dead letter of a message whose rows the archive refused."""
    return DeadLetter(
        source_topic=rec.topic,
        partition=rec.partition,
        offset=rec.offset,
        key=rec.key,
        raw=rec.value or b"",
        error=error[:2000],
        stage="archive",
        ts=datetime.now(UTC),
    )
