"""``stepguard archiver``: every topic into ClickHouse, offsets committed after insert.

A crash between insert and commit replays the batch; the ReplacingMergeTree tables
collapse the duplicates, so readers using FINAL see each message once.

Throughput (BENCHMARKS.md, "Archive ingest"): the consumer is aiokafka on an event loop
of its own thread, so it fetches ahead while this thread decodes and inserts; the steps
topic (by far the largest) is decoded in bulk by :mod:`pipeline.fastdecode` into numpy
columns, with no Python object per row. Every other topic, and any steps message the
fast path leaves aside, goes through ``schemas.decode``.

Bad input never stops the archiver: a message that does not decode, or whose rows the
table refuses (a value beyond a column's type), goes to the dead-letter topic with the
error and its source topic/partition/offset, and the rest of the batch is stored.
ClickHouse being unreachable is different: the insert is retried with backoff, and
after the last attempt :class:`~pipeline.errors.ArchiveError` ends the service with
nothing committed, so nothing is lost.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeAlias, TypeVar

import numpy as np
import numpy.typing as npt
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from kafka import KafkaProducer

from pipeline.archive.backend import ArchiveBackend, Columns
from pipeline.archive.rows import rows_for, step_table
from pipeline.errors import ArchiveError, ArchiveRowError, BrokerError
from pipeline.fastdecode import StepColumns, decode_steps, from_models
from pipeline.kafka import aiokafka_consumer_config, make_producer, publish, registry_of
from pipeline.settings import Settings
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
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        if max_wait_s <= 0:
            raise ValueError("max_wait_s must be positive")
        if insert_attempts < 1:
            raise ValueError("insert_attempts must be >= 1")
        self.settings = settings
        self.backend = backend
        self.registry = registry_of(settings)
        logical = topics or list(TOPICS)
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.insert_attempts = insert_attempts
        self.stats = ArchiverStats()
        self._producer = producer or make_producer(settings)
        # one insert thread: batches are stored and committed one after another, in order
        self._inserter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="archiver-insert")
        self._in_flight: Future[None] | None = None
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
            raise BrokerError(
                f"cannot connect consumer to {settings.kafka_bootstrap}: {exc}"
            ) from exc

    # -- the consumer's event loop ------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @staticmethod
    async def _start(topics: list[str], config: dict[str, Any]) -> AIOKafkaConsumer:
        consumer = AIOKafkaConsumer(*topics, **config)
        await consumer.start()
        return consumer

    async def _fetch(self) -> list[Record]:
        """Up to ``max_batch`` records, waiting at most ``max_wait_s`` for them."""
        records: list[Record] = []
        deadline = time.monotonic() + self.max_wait_s
        while len(records) < self.max_batch:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                break
            got = await self._consumer.getmany(
                timeout_ms=left_ms, max_records=self.max_batch - len(records)
            )
            for batch in got.values():
                records.extend(batch)
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
        """Fetch and decode one batch (size or time bound), then hand it to the insert
        thread, which inserts it and commits its offsets. Returns its messages.

        The insert of one batch overlaps the fetch and decode of the next; commits stay
        in batch order, each after the inserts it covers. A poll that fetches nothing
        in ``max_wait_s`` waits for the batch in flight, as :meth:`flush` does, so
        ``stats`` is complete after a poll returns 0.
        """
        records = self._call(self._fetch())
        if not records:
            self._finish_in_flight()
            return 0
        self.stats.fetched += len(records)
        batch = self._prepare(records)
        self._finish_in_flight()
        self._in_flight = self._inserter.submit(self._store_batch, batch)
        return len(records)

    def flush(self) -> None:
        """Wait until the batch in flight is inserted and committed (its error, if
        any, is raised here)."""
        self._finish_in_flight()

    def _finish_in_flight(self) -> None:
        """Wait for the batch being inserted; its failure is raised here."""
        job, self._in_flight = self._in_flight, None
        if job is not None:
            job.result()

    def _prepare(self, records: list[Record]) -> _Batch:
        """Decode a batch and build its rows; nothing here touches the archive."""
        batch = _Batch(size=len(records))
        by_topic: dict[str, list[Record]] = defaultdict(list)
        for rec in records:
            by_topic[rec.topic].append(rec)
            tp = TopicPartition(rec.topic, rec.partition)
            batch.offsets[tp] = max(batch.offsets.get(tp, 0), rec.offset + 1)
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
                    batch.generic.append((rec, out))
        return batch

    @staticmethod
    def _decode(model: type[Message], rec: Record) -> Message | Rejected:
        return decode(
            model, rec.value, topic=rec.topic, partition=rec.partition, offset=rec.offset,
            key=rec.key,
        )  # fmt: skip

    def _prepare_steps(self, recs: list[Record], batch: _Batch) -> None:
        """Decode the steps topic's records in bulk into the steps table's columns.
        Records the fast path leaves aside are decoded by pydantic: dead letters, or
        models whose columns are built the same way."""
        cols = decode_steps([r.value for r in recs])
        self._add_step_columns(cols, [recs[i] for i in cols.messages.tolist()], batch)
        models: list[StepTelemetry] = []
        model_recs: list[Record] = []
        for i in cols.slow:
            out = self._decode(StepTelemetry, recs[i])
            if isinstance(out, Rejected):
                batch.letters.append((recs[i], out.letter))
            else:
                assert isinstance(out, StepTelemetry)
                models.append(out)
                model_recs.append(recs[i])
        if models:
            more = from_models(models)
            for i in more.slow:
                error = "steps: an integer exceeds int64"
                batch.letters.append((model_recs[i], _rejected_row(model_recs[i], error)))
            self._add_step_columns(more, [model_recs[i] for i in more.messages.tolist()], batch)

    @staticmethod
    def _add_step_columns(cols: StepColumns, recs: list[Record], batch: _Batch) -> None:
        if not recs:
            return
        table, rejected = step_table(cols)
        for pos, reason in rejected.items():
            batch.letters.append((recs[pos], _rejected_row(recs[pos], reason)))
        kept = cols.sample_message
        if rejected:
            kept = kept[~np.isin(kept, np.fromiter(rejected, dtype=np.int64))]
        units = [pos for pos in range(len(recs)) if pos not in rejected]
        batch.steps.append(_StepRows(table, kept, [recs[pos] for pos in units], units))

    def _store_batch(self, batch: _Batch) -> None:
        """On the insert thread: insert, send the dead letters, then commit."""
        for part in batch.steps:
            for pos, error in self._store("steps", part.units, part.build):
                rec = part.recs[part.units.index(pos)]
                batch.letters.append((rec, _rejected_row(rec, error)))
        self._store_generic(batch.generic, batch.letters)
        self._send_letters(batch.letters)
        self._call(self._commit(batch.offsets))
        self.stats.messages += batch.size
        self.stats.batches += 1

    def _store_generic(
        self,
        items: list[tuple[Record, Message]],
        letters: list[tuple[Record, DeadLetter | None]],
    ) -> None:
        """Insert decoded models table by table (``rows_for``)."""
        by_table: dict[str, list[tuple[Record, Message]]] = defaultdict(list)
        for rec, msg in items:
            for table in rows_for([(msg, rec.timestamp)]):
                by_table[table].append((rec, msg))
        for table, units in by_table.items():

            def build(subset: Sequence[tuple[Record, Message]], table: str = table) -> Columns:
                return rows_for([(msg, rec.timestamp) for rec, msg in subset])[table]

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
                n = self.backend.insert(table, columns)
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

    def run(self, stop: Callable[[], bool]) -> ArchiverStats:
        while not stop():
            self.poll_batch()
        self._finish_in_flight()
        return self.stats

    def close(self) -> None:
        """Finish the batch in flight (insert and commit), then stop the clients."""
        try:
            self._finish_in_flight()
        finally:
            self._inserter.shutdown()
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
    sample_unit: npt.NDArray[np.int64]  # per row: the unit (message position) it is from
    recs: list[Record]  # per unit
    units: list[int]

    def build(self, subset: Sequence[int]) -> Columns:
        if len(subset) == len(self.units):
            return self.table
        mask = np.isin(self.sample_unit, np.asarray(subset, dtype=np.int64))
        return {name: values[mask] for name, values in self.table.items()}


@dataclass
class _Batch:
    """One fetched batch, decoded: what the insert thread stores and then commits."""

    size: int
    offsets: dict[TopicPartition, int] = field(default_factory=dict)
    steps: list[_StepRows] = field(default_factory=list)
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
