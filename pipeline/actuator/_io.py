"""Kafka helpers shared by the actuator, its executors and the command listener.

- Output topics that are read back at start-up (commands, actions, control, results)
  are produced one record per batch: Tansu's end offsets are only right then
  (INFRA.md), and these topics carry a few messages a minute.
- Consumers are assigned every partition instead of joining a group (no rebalance
  wait); with a ``group_id`` they still commit and resume from committed offsets.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError

from pipeline.errors import BrokerError
from pipeline.kafka import Decoded, consumer_config, make_producer
from pipeline.settings import Settings
from schemas import TOPICS, Rejected, TopicRegistry, decode

__all__ = ["assigned_consumer", "control_producer", "read_to_end"]

log = logging.getLogger(__name__)


def control_producer(settings: Settings) -> KafkaProducer:
    """A producer for low-volume topics that are read back to their end."""
    return make_producer(settings, batch_size=1, linger_ms=0)


def _partitions(consumer: KafkaConsumer, topics: Iterable[str]) -> list[TopicPartition]:
    out = []
    for topic in topics:
        parts = None
        for _ in range(50):  # metadata of a just-created topic may lag a moment
            parts = consumer.partitions_for_topic(topic)
            if parts:
                break
            consumer.poll(timeout_ms=100)
        if not parts:
            raise BrokerError(f"topic {topic} has no partitions (was it created?)")
        out += [TopicPartition(topic, p) for p in sorted(parts)]
    return out


def assigned_consumer(
    settings: Settings, topics: Iterable[str], group_id: str | None, **overrides: Any
) -> KafkaConsumer:
    """A consumer assigned every partition of ``topics`` (manual commits)."""
    cfg = consumer_config(settings, group_id, **overrides)
    try:
        consumer = KafkaConsumer(**cfg)
        consumer.assign(_partitions(consumer, topics))
    except KafkaError as exc:
        raise BrokerError(f"cannot connect consumer to {settings.kafka_bootstrap}: {exc}") from exc
    return consumer


def read_to_end(
    settings: Settings, registry: TopicRegistry, logical: str, max_polls: int = 10_000
) -> list[Decoded]:
    """Every decodable record of a topic from the beginning to its current end.

    Undecodable records are logged and skipped (they were dead-lettered when first
    consumed by their reader); records come in offset order per partition.
    """
    topic = registry.name(logical)
    model = TOPICS[logical].model
    consumer = assigned_consumer(settings, [topic], None)
    try:
        parts = list(consumer.assignment())
        consumer.seek_to_beginning(*parts)
        end = consumer.end_offsets(parts)
        out: list[Decoded] = []
        for _ in range(max_polls):
            if all(consumer.position(tp) >= end[tp] for tp in parts):
                return out
            for tp, records in consumer.poll(timeout_ms=200).items():
                for rec in records:
                    if rec.offset >= end[tp]:
                        continue
                    msg = decode(model, rec.value, topic=tp.topic, partition=tp.partition,
                                 offset=rec.offset)  # fmt: skip
                    if isinstance(msg, Rejected):
                        log.warning("skipping undecodable %s[%d]@%d: %s", tp.topic,
                                    tp.partition, rec.offset, msg.error)  # fmt: skip
                        continue
                    out.append(Decoded(tp.topic, tp.partition, rec.offset,
                                       int(rec.timestamp), msg))  # fmt: skip
        raise BrokerError(f"could not read {topic} to its end {end}")
    except KafkaError as exc:
        raise BrokerError(f"cannot read {topic}: {exc}") from exc
    finally:
        consumer.close()
