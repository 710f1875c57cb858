"""kafka-python clients built from KafkaSettings, topic creation, and dead-letter routing.

Every client is configured here, so security settings and the Tansu workarounds are
applied in one place rather than sprinkled around the services.

Low-volume topics that are read back at start-up (commands, actions, control, results;
the actuator, its executors and the training-side command listener):

- they are produced one record per batch (:func:`control_producer`): Tansu's end
  offsets are only right then (docs/backends.md), and these topics carry a few messages a
  minute;
- their consumers are assigned every partition instead of joining a group
  (:func:`assigned_consumer`, no rebalance wait); with a ``group_id`` they still commit
  and resume from committed offsets;
- :func:`read_back` reads one back from its beginning to the end it had at the start,
  however many polls that takes, with progress (it gives up only when nothing
  arrives for ``stall_s`` seconds).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import (
    KafkaError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    for_code,
)
from kafka.net.compat import KafkaNetClient as KafkaClient

from pipeline.io.errors import BrokerError
from pipeline.io.reach import BROKER_DEADLINE_S, require_broker, unset_bootstrap_message
from pipeline.io.settings import KafkaSettings
from schemas import TOPICS, Message, Rejected, TopicRegistry, decode, encode, key_of

if TYPE_CHECKING:
    from pipeline.io.telemetry_auth import TelemetryProver

__all__ = [
    "Decoded",
    "aiokafka_consumer_config",
    "assigned_consumer",
    "client_config",
    "consume_decoded",
    "consumer_config",
    "control_producer",
    "create_topics",
    "make_consumer",
    "make_producer",
    "publish",
    "read_back",
    "reach",
    "registry_of",
]

log = logging.getLogger(__name__)
M = TypeVar("M", bound=Message)


def registry_of(settings: KafkaSettings) -> TopicRegistry:
    return TopicRegistry(prefix=settings.topic_prefix)


def client_config(settings: KafkaSettings) -> dict[str, Any]:
    """Connection and security options shared by every kafka-python client."""
    if not settings.kafka_bootstrap:
        raise BrokerError(unset_bootstrap_message(getattr(settings, "state_dir", None)))
    cfg: dict[str, Any] = {
        "bootstrap_servers": settings.kafka_bootstrap.split(","),
        "security_protocol": settings.kafka_security_protocol,
        # kafka-python backs off up to 30 s between reconnects; after a broker restart
        # telemetry would then arrive seconds after the broker is back (and the worker
        # restarts its hang clocks with a bounded grace)
        "reconnect_backoff_max_ms": 1000,
    }
    if settings.kafka_security_protocol.startswith("SASL"):
        cfg["sasl_mechanism"] = settings.kafka_sasl_mechanism
        cfg["sasl_plain_username"] = settings.kafka_sasl_username
        password = settings.kafka_sasl_password
        cfg["sasl_plain_password"] = password.get_secret_value() if password else None
    if settings.kafka_security_protocol in ("SSL", "SASL_SSL"):
        if settings.kafka_ssl_cafile:
            cfg["ssl_cafile"] = str(settings.kafka_ssl_cafile)
        if settings.kafka_ssl_certfile:
            cfg["ssl_certfile"] = str(settings.kafka_ssl_certfile)
        if settings.kafka_ssl_keyfile:
            cfg["ssl_keyfile"] = str(settings.kafka_ssl_keyfile)
    return cfg


def reach(settings: KafkaSettings, deadline_s: float = BROKER_DEADLINE_S) -> None:
    """Fail fast, in one line, when no bootstrap server accepts a connection (before a
    client library retries it for a minute, logging every try): :mod:`pipeline.io.reach`."""
    require_broker(
        settings.kafka_bootstrap,
        deadline_s=deadline_s,
        state_dir=getattr(settings, "state_dir", None),
    )


def make_producer(settings: KafkaSettings, **overrides: Any) -> KafkaProducer:
    """A producer that waits for the leader's ack; idempotence off on Tansu (docs/backends.md)."""
    cfg = client_config(settings) | {
        "acks": 1 if settings.is_tansu else "all",
        "linger_ms": 20,
        "batch_size": 256 * 1024,
        "max_request_size": 8 * 1024 * 1024,
        "enable_idempotence": not settings.is_tansu,
    }
    cfg.update(overrides)
    # a caller that bounds the bootstrap (the training side's sink) bounds the probe too
    reach(settings, min(BROKER_DEADLINE_S, cfg.get("bootstrap_timeout_ms", 5000) / 1000))
    # kafka-python builds its client before it bootstraps and drops it unclosed when
    # the bootstrap fails (a wrong password, a broker not up yet): close it here, or its
    # sockets live on until some later garbage collection
    clients: list[KafkaClient] = []

    def client(**kw: Any) -> KafkaClient:
        clients.append(KafkaClient(**kw))
        return clients[-1]

    try:
        return KafkaProducer(**cfg, kafka_client=client)
    except KafkaError as exc:
        for made in clients:
            made.close()
        raise BrokerError(f"cannot connect producer to {settings.kafka_bootstrap}: {exc}") from exc


def control_producer(settings: KafkaSettings) -> KafkaProducer:
    """A producer for low-volume topics that are read back to their end."""
    return make_producer(settings, batch_size=1, linger_ms=0)


def consumer_config(
    settings: KafkaSettings, group_id: str | None, **overrides: Any
) -> dict[str, Any]:
    """Options of every stepguard consumer: manual commits, from the earliest offset,
    large fetches, and short group timeouts on Tansu (its JoinGroup waits half the
    session timeout)."""
    cfg = client_config(settings) | {
        "group_id": group_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "max_partition_fetch_bytes": 8 * 1024 * 1024,
    }
    if settings.is_tansu:
        cfg |= {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}
    return cfg | overrides


def aiokafka_consumer_config(settings: KafkaSettings, group_id: str | None) -> dict[str, Any]:
    """:func:`consumer_config` spelled for aiokafka (the archiver's bulk consumer)."""
    cfg = consumer_config(settings, group_id)
    out: dict[str, Any] = {
        k: cfg[k]
        for k in (
            "bootstrap_servers", "security_protocol", "group_id", "enable_auto_commit",
            "auto_offset_reset", "max_partition_fetch_bytes", "session_timeout_ms",
            "heartbeat_interval_ms", "sasl_mechanism", "sasl_plain_username",
            "sasl_plain_password",
        )
        if k in cfg
    }  # fmt: skip
    # Large fetches, and a short broker-side wait: with the default 500 ms the fetch
    # issued after a batch drains the buffer was seen to wait the full 500 ms.
    out |= {
        "fetch_max_bytes": 64 * 1024 * 1024,
        "max_partition_fetch_bytes": 32 * 1024 * 1024,
        "fetch_max_wait_ms": 20,
    }
    if settings.kafka_security_protocol in ("SSL", "SASL_SSL"):
        from aiokafka.helpers import create_ssl_context

        out["ssl_context"] = create_ssl_context(
            cafile=cfg.get("ssl_cafile"),
            certfile=cfg.get("ssl_certfile"),
            keyfile=cfg.get("ssl_keyfile"),
        )
    return out


def make_consumer(
    settings: KafkaSettings, topics: Iterable[str], group_id: str | None, **overrides: Any
) -> KafkaConsumer:
    """A consumer with manual commits (commit after the work is done)."""
    cfg = consumer_config(settings, group_id, **overrides)
    reach(settings)
    try:
        consumer = KafkaConsumer(**cfg)
    except KafkaError as exc:
        raise BrokerError(f"cannot connect consumer to {settings.kafka_bootstrap}: {exc}") from exc
    consumer.subscribe(list(topics))
    return consumer


def create_topics(
    settings: KafkaSettings, logical: Iterable[str] | None = None, partitions: int | None = None
) -> dict[str, str]:
    """Create the registry's topics with explicit partition counts (idempotent)."""
    registry = registry_of(settings)
    names = list(logical) if logical is not None else list(TOPICS)
    reach(settings)
    admin = KafkaAdminClient(**client_config(settings))
    try:
        existing = set(admin.list_topics())
        new = [
            NewTopic(
                registry.name(n),
                num_partitions=partitions or TOPICS[n].partitions,
                replication_factor=1,
            )
            for n in names
            if registry.name(n) not in existing
        ]
        if new:
            _check_created(admin.create_topics(new, raise_errors=False))
    except KafkaError as exc:
        raise BrokerError(f"cannot create topics on {settings.kafka_bootstrap}: {exc}") from exc
    finally:
        admin.close()
    return {n: registry.name(n) for n in names}


def _check_created(response: dict[str, Any]) -> None:
    """Accept a CreateTopics answer where each topic was created, exists already, or
    is not ours to create: with ACLs (docs/kafka-acls.md) a service sees only the
    topics it may use, and the admin's ``stepguard topics`` creates every topic; a
    reader of a topic that is really missing then fails with the topic's name."""
    for topic in response.get("topics", []):
        code = topic.get("error_code", 0)
        if code in (0, TopicAlreadyExistsError.errno):
            continue
        if code == TopicAuthorizationFailedError.errno:
            log.info("not authorised to create topic %s: leaving it to the admin", topic["name"])
            continue
        error = for_code(code)
        raise error(f"cannot create topic {topic['name']}: {topic.get('error_message')}")


def publish(
    producer: KafkaProducer,
    registry: TopicRegistry,
    logical: str,
    msg: Message,
    prover: TelemetryProver | None = None,
) -> Any:
    """Send one message to its topic, keyed as the registry says; returns the future.

    With ``prover``, a steps, health or lifecycle record carries its writer's proof
    headers over its exact bytes (:mod:`pipeline.io.telemetry_auth`)."""
    spec = TOPICS[logical]
    if not isinstance(msg, spec.model):
        raise TypeError(
            f"topic {logical!r} carries {spec.model.__name__}, not {type(msg).__name__}"
        )
    value = encode(msg)
    key = key_of(msg, spec.key)
    if prover is not None:
        headers = prover.headers(logical, msg, value)
        if headers:
            return producer.send(registry.name(logical), key=key, value=value, headers=headers)
    return producer.send(registry.name(logical), key=key, value=value)


@dataclass(frozen=True, slots=True)
class Decoded:
    """A consumed record: the decoded message or its DeadLetter, with coordinates."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    message: Message


def consume_decoded(
    consumer: KafkaConsumer,
    registry: TopicRegistry,
    producer: KafkaProducer,
    timeout_ms: int = 500,
) -> Iterator[Decoded]:
    """Poll once and decode every record; bad ones go to the dead-letter topic.

    Yields good messages only; the dead letters are produced before this returns so a
    caller that commits afterwards never loses a bad record.
    """
    batches = consumer.poll(timeout_ms=timeout_ms)
    futures = []
    for tp, records in batches.items():
        logical = registry.logical_of(tp.topic)
        if logical is None:
            continue
        model = TOPICS[logical].model
        for rec in records:
            out = decode(
                model,
                rec.value,
                topic=tp.topic,
                partition=tp.partition,
                offset=rec.offset,
                key=rec.key,
            )
            if isinstance(out, Rejected):
                log.warning(
                    "dead letter from %s[%d]@%d: %s", tp.topic, tp.partition, rec.offset, out.error
                )
                if logical == "deadletter":
                    continue  # never loop: a broken dead letter is logged, not re-sent
                futures.append(publish(producer, registry, "deadletter", out.letter))
                continue
            yield Decoded(tp.topic, tp.partition, rec.offset, int(rec.timestamp), out)
    for fut in futures:
        fut.get(timeout=30)


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
    settings: KafkaSettings, topics: Iterable[str], group_id: str | None, **overrides: Any
) -> KafkaConsumer:
    """A consumer assigned every partition of ``topics`` (manual commits)."""
    cfg = consumer_config(settings, group_id, **overrides)
    reach(settings)
    try:
        consumer = KafkaConsumer(**cfg)
        consumer.assign(_partitions(consumer, topics))
    except KafkaError as exc:
        raise BrokerError(f"cannot connect consumer to {settings.kafka_bootstrap}: {exc}") from exc
    return consumer


def read_back(
    settings: KafkaSettings,
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
