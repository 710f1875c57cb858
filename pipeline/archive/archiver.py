"""``stepguard archiver``: every topic into ClickHouse, offsets committed after insert.

A crash between insert and commit replays the batch; the ReplacingMergeTree tables
collapse the duplicates, so readers using FINAL see each message once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kafka import KafkaConsumer, KafkaProducer

from pipeline.archive.backend import ArchiveBackend
from pipeline.archive.rows import rows_for
from pipeline.errors import ArchiveError
from pipeline.kafka import consume_decoded, make_consumer, make_producer, registry_of
from pipeline.settings import Settings
from schemas import TOPICS, Message

__all__ = ["Archiver", "ArchiverStats"]

log = logging.getLogger(__name__)


@dataclass
class ArchiverStats:
    messages: int = 0
    rows: int = 0
    batches: int = 0
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
        consumer: KafkaConsumer | None = None,
        producer: KafkaProducer | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        if max_wait_s <= 0:
            raise ValueError("max_wait_s must be positive")
        self.settings = settings
        self.backend = backend
        self.registry = registry_of(settings)
        logical = topics or list(TOPICS)
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.stats = ArchiverStats()
        self._producer = producer or make_producer(settings)
        self._consumer = consumer or make_consumer(
            settings,
            [self.registry.name(t) for t in logical],
            group_id or f"{settings.consumer_group}.archiver",
            max_poll_records=max_batch,  # one poll can fill a batch
        )

    def poll_batch(self) -> int:
        """Fill one batch (size or time bound), insert it, commit. Returns messages."""
        batch: list[tuple[Message, int]] = []
        deadline = time.monotonic() + self.max_wait_s
        while len(batch) < self.max_batch and time.monotonic() < deadline:
            for rec in consume_decoded(self._consumer, self.registry, self._producer, 200):
                batch.append((rec.message, rec.timestamp_ms))
        if batch:
            self._insert_with_retry(batch)
        self._consumer.commit()
        return len(batch)

    def _insert_with_retry(self, batch: list[tuple[Message, int]], attempts: int = 8) -> None:
        tables = rows_for(batch)
        for table, columns in tables.items():
            delay = 0.5
            for attempt in range(1, attempts + 1):
                try:
                    n = self.backend.insert(table, columns)
                    break
                except ArchiveError as exc:
                    if attempt == attempts:
                        raise
                    log.warning("insert into %s failed (%s); retry in %.1fs", table, exc, delay)
                    time.sleep(delay)
                    delay = min(delay * 2, 30.0)
            self.stats.rows += n
            self.stats.rows_by_table[table] = self.stats.rows_by_table.get(table, 0) + n
        self.stats.messages += len(batch)
        self.stats.batches += 1

    def run(self, stop: Callable[[], bool]) -> ArchiverStats:
        while not stop():
            self.poll_batch()
        return self.stats

    def close(self) -> None:
        self._consumer.close()
        self._producer.flush()
        self._producer.close()
