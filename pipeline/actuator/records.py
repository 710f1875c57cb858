"""Read-back of the actuator's output topics: its start-up rebuild and the CLI's views.

:func:`read_back` streams a topic from its beginning to the end offsets it saw when it
started, however many polls that takes, and logs its progress every few seconds (a
topic of months of actions takes a while). It gives up only when nothing arrives for
``stall_s`` seconds: then the broker is gone, and the caller exits non-zero.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from kafka.errors import KafkaError

from pipeline.errors import BrokerError
from pipeline.kafka import Decoded, assigned_consumer, create_topics, registry_of
from pipeline.settings import Settings
from schemas import TOPICS, ActionRecord, Rejected, decode

__all__ = ["latest_actions", "read_back"]

log = logging.getLogger(__name__)


def read_back(
    settings: Settings,
    logical: str,
    *,
    max_poll_records: int = 500,
    progress_s: float = 5.0,
    stall_s: float = 120.0,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[Decoded]:
    """Every decodable record of a topic, from its beginning to its end at the start.

    Records come in offset order per partition; undecodable ones are logged and
    skipped (their reader dead-lettered them when they were first consumed).
    ``clock`` paces the progress log and the stall check only, never what is read.

    Raises
    ------
    BrokerError
        The broker failed, or no record arrived for ``stall_s`` seconds while some
        partition was still short of its end.
    """
    if max_poll_records < 1:
        raise ValueError("max_poll_records must be >= 1")
    topic = registry_of(settings).name(logical)
    model = TOPICS[logical].model
    consumer = assigned_consumer(settings, [topic], None, max_poll_records=max_poll_records)
    try:
        parts = list(consumer.assignment())
        consumer.seek_to_beginning(*parts)
        start = consumer.beginning_offsets(parts)
        end = consumer.end_offsets(parts)
        total = sum(max(0, end[tp] - start[tp]) for tp in parts)
        read = skipped = polls = 0
        began = last_log = last_data = clock()
        while any(consumer.position(tp) < end[tp] for tp in parts):
            batches = consumer.poll(timeout_ms=200)
            polls += 1
            now = clock()
            if batches:
                last_data = now
            elif now - last_data >= stall_s:
                short = {f"{tp.partition}": (consumer.position(tp), end[tp]) for tp in parts}
                raise BrokerError(
                    f"reading {topic} back stalled for {stall_s:.0f}s at {read}/{total} "
                    f"records (partition: (position, end) {short})"
                )
            for tp, records in batches.items():
                for rec in records:
                    if rec.offset >= end[tp]:
                        continue  # written after we started: not part of the rebuild
                    read += 1
                    msg = decode(model, rec.value, topic=tp.topic, partition=tp.partition,
                                 offset=rec.offset)  # fmt: skip
                    if isinstance(msg, Rejected):
                        skipped += 1
                        log.warning("skipping undecodable %s[%d]@%d: %s", tp.topic,
                                    tp.partition, rec.offset, msg.error)  # fmt: skip
                        continue
                    yield Decoded(tp.topic, tp.partition, rec.offset, int(rec.timestamp), msg)
            if now - last_log >= progress_s:
                last_log = now
                log.info("reading %s back: %d/%d records", topic, read, total)
        log.info(
            "read %s back: %d/%d records (%d undecodable) in %d polls, %.1fs",
            topic, read, total, skipped, polls, clock() - began,
        )  # fmt: skip
    except KafkaError as exc:
        raise BrokerError(f"cannot read {topic} back: {exc}") from exc
    finally:
        consumer.close()


def latest_actions(settings: Settings) -> dict[str, ActionRecord]:
    """The latest record of every action id, in first-seen order."""
    create_topics(settings, ["actions"])
    latest: dict[str, ActionRecord] = {}
    for rec in read_back(settings, "actions"):
        msg = rec.message
        assert isinstance(msg, ActionRecord)
        latest[msg.action_id] = msg
    return latest
