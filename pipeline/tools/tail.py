"""Reading the last records of a topic, partition by partition, without joining a group
(``stepguard status`` and ``stepguard alerts``)."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from kafka import TopicPartition
from kafka.errors import KafkaError

from pipeline.io.errors import BrokerError
from pipeline.io.kafka import Decoded, assigned_consumer, registry_of
from pipeline.io.reach import reachable
from pipeline.io.settings import Settings
from schemas import (
    TOPICS,
    Rejected,
    decode,
)

__all__ = [
    "DEFAULT_WINDOW",
    "MAX_WINDOW",
    "TopicTail",
    "follow_reconnecting",
    "quiet_client_logs",
    "read_tail",
]

log = logging.getLogger(__name__)

#: records read from the end of each partition, by default
DEFAULT_WINDOW = 500


#: the most records kept per partition, whatever ``window`` asks
MAX_WINDOW = 100_000


class TopicTail:
    """The last records of every partition of one topic, then what follows them.

    Parameters
    ----------
    settings
        Broker and topic prefix.
    logical
        Logical topic name (``steps``, ``decisions``, ...).
    """

    def __init__(self, settings: Settings, logical: str) -> None:
        self.topic = registry_of(settings).name(logical)
        self.bootstrap = settings.kafka_bootstrap
        self.model = TOPICS[logical].model
        self.consumer = assigned_consumer(settings, [self.topic], None)
        self.parts: list[TopicPartition] = sorted(self.consumer.assignment())
        #: records that did not decode (skipped; their readers dead-lettered them)
        self.undecodable = 0
        #: partition -> the offset after the last record read (what :meth:`resume` takes)
        self.next_offsets: dict[int, int] = {}

    def close(self) -> None:
        self.consumer.close()

    def __enter__(self) -> TopicTail:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tail(self, last_n: int, timeout_s: float = 15.0) -> list[Decoded]:
        """The decodable records among the last ``last_n`` of each partition, in
        (timestamp, partition, offset) order; the consumer is left at the end.

        Gives up after ``timeout_s`` with what it has (a note in the log).
        """
        if not 1 <= last_n <= MAX_WINDOW:
            raise ValueError(f"last_n must be in 1..{MAX_WINDOW}")
        c = self.consumer
        try:
            begin = c.beginning_offsets(self.parts)
            end = c.end_offsets(self.parts)
            for tp in self.parts:
                c.seek(tp, max(begin[tp], end[tp] - last_n))
            kept: dict[TopicPartition, deque[Any]] = {tp: deque(maxlen=last_n) for tp in self.parts}
            done: set[TopicPartition] = set()
            deadline = time.monotonic() + timeout_s
            heard = time.monotonic()
            while len(done) < len(self.parts) and time.monotonic() < deadline:
                batches = c.poll(timeout_ms=200)
                for tp, records in batches.items():
                    kept[tp].extend(records)
                if batches:
                    heard = time.monotonic()
                elif time.monotonic() - heard > 2.0:  # silent: is the broker still there?
                    if not reachable(self.bootstrap):
                        raise BrokerError(f"{self.bootstrap} stopped answering")
                    heard = time.monotonic()
                for tp in self.parts:
                    high = c.highwater(tp)
                    if tp in done or high is None:
                        continue
                    pos = c.position(tp)
                    if pos < high - last_n:  # the reported end was short (Tansu)
                        c.seek(tp, high - last_n)
                        kept[tp].clear()
                    elif pos >= high:
                        done.add(tp)
            if len(done) < len(self.parts):
                log.info("%s: read the tail of %d of %d partitions in %.0fs",
                         self.topic, len(done), len(self.parts), timeout_s)  # fmt: skip
            self.next_offsets = {tp.partition: c.position(tp) for tp in self.parts}
        except KafkaError as exc:
            raise BrokerError(f"cannot read {self.topic}: {exc}") from exc
        out = [d for recs in kept.values() for d in self._decode(recs)]
        out.sort(key=lambda d: (d.timestamp_ms, d.partition, d.offset))
        return out

    def resume(self, next_offsets: dict[int, int]) -> None:
        """Go on from where another tail of the same topic stopped (a follower after a
        broker restart): each partition from its next offset, from its beginning when
        the log is now shorter (the broker lost it and it was made again), from its end
        when it was not read before."""
        c = self.consumer
        try:
            begin = c.beginning_offsets(self.parts)
            end = c.end_offsets(self.parts)
            for tp in self.parts:
                at = next_offsets.get(tp.partition)
                if at is None:
                    at = end[tp]
                elif at > end[tp] or at < begin[tp]:
                    at = begin[tp]
                c.seek(tp, at)
                self.next_offsets[tp.partition] = at
        except KafkaError as exc:
            raise BrokerError(f"cannot read {self.topic}: {exc}") from exc

    def follow(self, timeout_ms: int = 500) -> list[Decoded]:
        """What arrived since the last call (one poll)."""
        try:
            batches = self.consumer.poll(timeout_ms=timeout_ms)
        except KafkaError as exc:
            raise BrokerError(f"cannot read {self.topic}: {exc}") from exc
        out = [d for recs in batches.values() for d in self._decode(recs)]
        out.sort(key=lambda d: (d.timestamp_ms, d.partition, d.offset))
        return out

    def _decode(self, records: Iterable[Any]) -> Iterator[Decoded]:
        for rec in records:
            self.next_offsets[rec.partition] = rec.offset + 1
            msg = decode(self.model, rec.value, topic=rec.topic, partition=rec.partition,
                         offset=rec.offset)  # fmt: skip
            if isinstance(msg, Rejected):
                self.undecodable += 1
                continue
            yield Decoded(rec.topic, rec.partition, rec.offset, int(rec.timestamp), msg)


def follow_reconnecting(
    settings: Settings,
    logical: str,
    *,
    first: Callable[[TopicTail], None],
    each: Callable[[list[Decoded]], None],
    follow: bool,
    stop: Callable[[], bool],
    notice: Callable[[str], None],
    check_after_s: float = 2.0,
) -> None:
    """Read a topic's tail (``first``), then, with ``follow``, every new batch (``each``)
    until ``stop()``, across broker restarts.

    When no record has come for ``check_after_s``, a TCP probe asks whether the broker
    is still there; when it is not (or a read fails), ``notice`` gets one line, the
    follower waits for the broker (checking ``stop()`` every second) and goes on from the
    offsets it had reached, with one more line once it is back. A broker missing at the
    start is an error (:class:`BrokerError`), as for any command.
    """
    next_offsets: dict[int, int] | None = None
    lost = False
    while True:
        try:
            with TopicTail(settings, logical) as tail:
                if next_offsets is None:
                    first(tail)
                else:
                    tail.resume(next_offsets)
                if lost:
                    notice(f"reconnected to the broker at {settings.kafka_bootstrap}")
                    lost = False
                next_offsets = tail.next_offsets
                heard = time.monotonic()
                while follow and not stop():
                    batch = tail.follow(500)
                    next_offsets = tail.next_offsets
                    if batch:
                        each(batch)
                        heard = time.monotonic()
                    elif time.monotonic() - heard > check_after_s:
                        if not reachable(settings.kafka_bootstrap):
                            raise BrokerError(f"{settings.kafka_bootstrap} stopped answering")
                        heard = time.monotonic()
                return
        except BrokerError as exc:
            if next_offsets is None or not follow:
                raise
            if not lost:
                notice(f"broker lost ({exc}); reconnecting every second (Ctrl-C stops)")
                lost = True
        while not stop() and not reachable(settings.kafka_bootstrap):
            time.sleep(1.0)
        if stop():
            return


def read_tail(settings: Settings, logical: str, last_n: int) -> list[Decoded]:
    with TopicTail(settings, logical) as tail:
        return tail.tail(last_n)


def quiet_client_logs() -> None:
    """kafka-python logs an ERROR when a client closes during a metadata refresh (a
    short-lived reader does, every time): noise on a screen a person reads."""
    logging.getLogger("kafka.cluster").setLevel(logging.CRITICAL)
