"""A kafka-python sink for exporters that never raises into the caller.

The producer is created lazily and re-created after failures, so an exporter starts
(and the training loop keeps running) while the broker is down; what cannot be sent
is dropped and counted, never queued without bound.

Before its producer, the sink creates the topics it writes (idempotent; with ACLs it
may not, and leaves them to the admin). An exporter started before the services would
otherwise have the broker auto-create them with its own partition count (1 on Kafka,
4 on Tansu, not the registry's 8 for steps), and the services then keep that count.
It also spares kafka-python 3.0.12's producer a busy loop: a producer whose metadata
covered every topic narrows it to the topic it auto-creates on a send, a topic it sent
to before drops out of it, and the empty batch queue kept for that topic's partition
counts as a partition with an unknown leader on every pass of its network thread, which
then runs at 100 % of a core (measured: the job's node aggregator and command listener
in one rank, on a fresh broker).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kafka.errors import KafkaError

from pipeline.io.embedded import probe_kafka
from pipeline.io.errors import BrokerError
from pipeline.io.kafka import create_topics, make_producer, publish, registry_of
from pipeline.io.settings import KafkaSettings, TelemetryAuthSettings
from pipeline.io.telemetry_auth import TelemetryProver, telemetry_prover
from schemas import Message

__all__ = ["CLIENT_TOPICS", "KafkaSink", "SinkStats"]

log = logging.getLogger(__name__)

#: what exporters and agents write: a node's steps, its health, the job's lifecycle
CLIENT_TOPICS = ("steps", "health", "lifecycle")


@dataclass
class SinkStats:
    sent: int = 0  #: messages the broker acknowledged
    dropped: int = 0  #: messages given up (broker unreachable, send failed)


class KafkaSink:
    """Publish stepguard messages; drop and count on failure.

    Parameters
    ----------
    settings
        Broker and topic prefix.
    retry_s
        Wait this long after a failed connection before trying again.
    max_block_ms
        Longest a send may block waiting for metadata or buffer space.
    topics
        The logical topics it writes, created before its producer.
    prover
        Signs what it sends (:mod:`pipeline.io.telemetry_auth`): by default the node
        keys (and job controller key) of ``settings``; with telemetry authentication on
        and neither a node key nor the cluster secret, a
        :class:`~pipeline.io.errors.ConfigError` naming STEPGUARD_TELEMETRY_NODE_KEYS.
        None: unsigned (telemetry authentication off).
    """

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        retry_s: float = 2.0,
        max_block_ms: int = 1000,
        topics: Sequence[str] = CLIENT_TOPICS,
        prover: TelemetryProver | Literal["settings"] | None = "settings",
    ):
        if retry_s <= 0:
            raise ValueError("retry_s must be positive")
        self.settings = settings
        if prover == "settings":
            prover = (
                telemetry_prover(settings, "the telemetry exporter")
                if isinstance(settings, TelemetryAuthSettings) else None
            )  # fmt: skip
        self.prover: TelemetryProver | None = prover
        self.topics = tuple(topics)
        self.registry = registry_of(settings)
        self.retry_s = retry_s
        self.max_block_ms = max_block_ms
        self.stats = SinkStats()
        self._producer: Any = None
        self._created = False
        self._next_try = 0.0
        self._lock = threading.Lock()

    def _get(self) -> Any:
        if self._producer is not None:
            return self._producer
        now = time.monotonic()
        if now < self._next_try:
            return None
        if not self._reachable():
            self._next_try = now + self.retry_s
            log.warning(
                "exporter: broker %s unreachable; dropping until it is back",
                self.settings.kafka_bootstrap,
            )
            return None
        if self.topics and not self._created:
            try:
                create_topics(self.settings, self.topics)
                self._created = True
            except (BrokerError, KafkaError) as exc:  # not ours to create: the admin's
                log.info("exporter: topics %s not created (%s)", ", ".join(self.topics), exc)
        try:
            self._producer = make_producer(
                self.settings, linger_ms=5, max_block_ms=self.max_block_ms,
                bootstrap_timeout_ms=self.max_block_ms,
                request_timeout_ms=10_000, delivery_timeout_ms=30_000,
            )  # fmt: skip
        except (BrokerError, KafkaError) as exc:
            self._next_try = now + self.retry_s
            log.warning("exporter: broker unreachable (%s); dropping until it is back", exc)
            return None
        return self._producer

    def _reachable(self) -> bool:
        """Cheap ApiVersions probe before building a producer (kafka-python leaks
        sockets when a producer cannot bootstrap, and takes seconds to give up)."""
        if self.settings.kafka_security_protocol not in ("PLAINTEXT", "SASL_PLAINTEXT"):
            return True  # TLS: let the client find out
        for part in self.settings.kafka_bootstrap.split(","):
            host, _, port = part.strip().rpartition(":")
            if probe_kafka(host.strip("[]"), int(port), timeout=0.5):
                return True
        return False

    def send(self, logical: str, msg: Message) -> bool:
        """Queue ``msg`` for its topic; False (and counted) when it was dropped."""
        producer = self._get()
        if producer is None:
            self._drop(1)
            return False
        try:
            fut = publish(producer, self.registry, logical, msg, self.prover)
        except KafkaError as exc:
            log.debug("exporter: send failed: %s", exc)
            self._drop(1)
            return False
        fut.add_callback(self._ok)
        fut.add_errback(self._failed)
        return True

    def _ok(self, _meta: Any) -> None:
        with self._lock:
            self.stats.sent += 1

    def _failed(self, exc: BaseException) -> None:
        log.debug("exporter: delivery failed: %s", exc)
        self._drop(1)

    def _drop(self, n: int) -> None:
        with self._lock:
            self.stats.dropped += n

    def flush(self, timeout: float | None = None) -> None:
        if self._producer is not None:
            try:
                self._producer.flush(timeout=timeout)
            except KafkaError as exc:
                log.warning("exporter: flush failed: %s", exc)

    def close(self, timeout: float = 5.0) -> None:
        if self._producer is not None:
            try:
                self._producer.close(timeout=timeout)
            except KafkaError as exc:  # pragma: no cover - best effort at exit
                log.warning("exporter: close failed: %s", exc)
            self._producer = None
