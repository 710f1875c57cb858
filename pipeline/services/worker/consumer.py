"""The worker's Kafka consumer: Faust's aiokafka consumer, made to wait less and to hand
the steps topic over a fetch at a time. :class:`LowLatencyConsumer` owns how records
leave the broker for the worker's streams: a 50 ms broker-side fetch wait
(:data:`FETCH_MAX_WAIT_MS`; Faust hard-codes 1,500 ms, most of a step's latency at 16k
ranks), each record handed to its stream without a task when the stream has room
(:mod:`pipeline.services.worker.eager`), and the records of its ``bulk_topic`` (the
steps topic) grouped into one :class:`~pipeline.services.worker.bulk.StepBatch` per
partition and fetch (:mod:`pipeline.services.worker.bulk`). :data:`JOB_QUEUE_EVENTS`
bounds what waits in the job agent's queue. What the consumer's assignment and
highwaters say is read here too: the partitions owned, those with unread records, and
the lag gauges.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import faust
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaConsumer
from mode.services import WaitResults

from pipeline.services.worker.bulk import grouped
from pipeline.services.worker.eager import eager_first

__all__ = [
    "FETCH_MAX_WAIT_MS",
    "JOB_QUEUE_EVENTS",
    "LowLatencyConsumer",
    "lagging",
    "owned",
    "update_lag",
]

log = logging.getLogger(__name__)


#: Broker-side wait of the worker's fetches (Faust hard-codes 1,500 ms).
FETCH_MAX_WAIT_MS = 50


class LowLatencyConsumerThread(AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        if hasattr(consumer, "_fetch_max_wait_ms"):  # aiokafka 0.8-0.14: read by start()
            consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS
        else:
            log.warning("cannot shorten the consumer's fetch wait: steps may wait 1.5 s")
        return consumer


#: Events the job agent's queue holds before the consumer waits for room. A steps event
#: is a whole fetch of a partition, so this bounds the steps waiting in memory to 32
#: fetches (Faust's default, 4,096, would allow 4,096). Measured at 16,384 nodes x 14
#: steps on Apache Kafka: 175,395 rank-steps/s and 673 MB peak with 32, 182,677 and
#: 695 MB with 256.
JOB_QUEUE_EVENTS = 32


class LowLatencyConsumer(AIOKafkaConsumer):
    """Faust's aiokafka consumer with a short fetch wait (see ``FETCH_MAX_WAIT_MS``),
    handing each record to its stream without a task when the stream has room for it
    (:mod:`pipeline.services.worker.eager`), and the records of ``bulk_topic`` a fetch
    per partition at a time (:mod:`pipeline.services.worker.bulk`)."""

    #: the topic whose records are grouped into one StepBatch per partition and fetch
    bulk_topic: str = ""

    def _to_message(self, tp: Any, record: Any) -> Any:
        if tp.topic == self.bulk_topic:
            return record  # kept raw: getmany groups them
        return super()._to_message(tp, record)

    async def getmany(self, timeout: float) -> Any:
        generation = self.app.consumer_generation_id
        batches: dict[Any, list[Any]] = {}
        async for tp, message in super().getmany(timeout):
            if tp.topic == self.bulk_topic:
                batches.setdefault(tp, []).append(message)
            else:
                yield tp, message
        for tp, batch in grouped(batches, generation):
            yield tp, batch

    def _new_consumer_thread(self) -> AIOKafkaConsumerThread:
        return LowLatencyConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def wait_first(self, *coros: Any, timeout: Any = None) -> WaitResults:
        # eager_first yields to the loop once: the streams run between records
        won = await eager_first(super().wait_first, self._won, *coros, timeout=timeout)
        return cast(WaitResults, won)

    def _won(self, coro: Any, value: Any) -> WaitResults:
        if self._stopped.is_set() or self._crashed.is_set():
            return WaitResults([], [], True)  # as mode answers once stopped
        return WaitResults([coro], [value], False)


def owned(app: faust.App, steps_topic: str) -> set[int]:
    try:
        return {tp.partition for tp in app.consumer.assignment() if tp.topic == steps_topic}
    except Exception:  # consumer not started yet
        return set()


def lagging(app: faust.App, topic: str, read: dict[Any, int]) -> set[int]:
    """Partitions of ``topic`` whose highwater is beyond what the agent has read."""
    out: set[int] = set()
    try:
        for tp in app.consumer.assignment():
            if tp.topic != topic:
                continue
            hw = app.consumer.highwater(tp)
            if hw is not None and hw > read.get((tp.topic, tp.partition), -1) + 1:
                out.add(tp.partition)
    except Exception:  # consumer not started: tick nothing rather than guess
        return set(range(1 << 16))
    return out


def update_lag(app: faust.App, metrics: Any, read: dict[Any, int], skip: str = "") -> None:
    """consumer_lag = highwater - (last offset read + 1), per owned partition of the
    topics the agents read (not ``skip``: the table's changelog, which Faust reads
    only while recovering, so it never shows a lag of 0)."""
    try:
        assignment = app.consumer.assignment()
        for tp in assignment:
            if tp.topic == skip:
                continue
            hw = app.consumer.highwater(tp)
            if hw is None:
                continue
            lag = max(0, hw - (read.get((tp.topic, tp.partition), -1) + 1))
            metrics.lag.labels(tp.topic, str(tp.partition)).set(lag)
    except Exception:  # metrics must never break the timer (consumer not started yet)
        return
