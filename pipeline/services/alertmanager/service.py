"""``stepguard alertmanager``: the Kafka loop around the :class:`EpisodeTable`.

It reads the decisions topic in its own consumer group (``<group>.alertmanager``) and
trusts an alert exactly as the actuator does: signed by a worker key, or a GUARDRAIL
alert (circuit breakers, hold notices) signed by an actuator key. Anything else is a
dead letter (stage ``signature``, the message as decoded), as is an alert dated beyond
the clock + ``STEPGUARD_MAX_CLOCK_SKEW_S`` (stage ``clock``); undecodable bytes are
dead-lettered by the decoder. None of them stops the loop.

Start-up reads the decisions topic back (to its end at start) into the table without
sending anything, so the episodes still firing are sent again at once: an alert keeps
firing across a restart of the bridge. Each poll: observe the updates, send what is
due (:meth:`EpisodeTable.due`), post, wait for the dead letters' acks, commit. A post
that fails after every retry raises before the commit (the supervisor restarts the
service and the poll is read again); a batch Alertmanager refuses (4xx) is logged with
its body and counted, never retried.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kafka import KafkaProducer
from prometheus_client import CollectorRegistry, Counter, Gauge

from pipeline.io.clockskew import future_dated
from pipeline.io.errors import ConfigError
from pipeline.io.kafka import (
    Decoded,
    assigned_consumer,
    consume_decoded,
    control_producer,
    create_topics,
    publish,
    read_back,
    registry_of,
)
from pipeline.io.metrics import service_registry
from pipeline.io.settings import Settings
from pipeline.io.trust import public_keys, signature_problem
from pipeline.services.alertmanager.client import AlertmanagerClient, AlertSink
from pipeline.services.alertmanager.episodes import BridgeParams, EpisodeTable, PostableAlert
from schemas import Alert, AlertKind, AlertState, DeadLetter, encode

__all__ = ["AlertmanagerBridge", "BridgeMetrics", "BridgeStats"]

log = logging.getLogger(__name__)


def _utcnow() -> datetime:
    return datetime.now(UTC)


def state_of(alert: PostableAlert, now: datetime) -> AlertState:
    """How Alertmanager will show an alert sent at ``now``: ended or firing."""
    return AlertState.RESOLVED if alert.ends_at <= now else AlertState.FIRING


class BridgeMetrics:
    """``stepguard_alertmanager_`` metrics.

    ======================================  ===========================================
    inputs_total{result}                    decisions read: ``observed``, ``duplicate``,
                                            ``dead_letter``
    alerts_sent_total{state}                alerts posted (refused ones too): ``firing``,
                                            ``resolved``
    alerts_rejected_total                   alerts Alertmanager refused (4xx)
    firing_episodes                         firing episodes held now
    episodes_dropped_total{why}             ``evicted`` (cap), ``expired`` (TTL)
    ======================================  ===========================================
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = reg = service_registry(registry)
        p = "stepguard_alertmanager_"
        self.inputs = Counter(p + "inputs", "Decisions read, by result.", ["result"], registry=reg)
        self.sent = Counter(p + "alerts_sent", "Alerts posted.", ["state"], registry=reg)
        self.rejected = Counter(p + "alerts_rejected", "Alerts refused (4xx).", registry=reg)
        self.firing = Gauge(p + "firing_episodes", "Firing episodes held.", registry=reg)
        self.dropped = Counter(
            p + "episodes_dropped", "Episodes no longer sent.", ["why"], registry=reg
        )


@dataclass
class BridgeStats:
    consumed: int = 0
    sent: int = 0
    rejected: int = 0
    dead_letters: int = 0
    #: records read back at start
    rebuilt: int = 0


class AlertmanagerBridge:
    """Decisions in, Alertmanager alerts out (see the module docstring).

    Parameters
    ----------
    settings
        Needs ``alertmanager_url`` and ``worker_public_keys`` (actuator keys are
        optional: without them guardrail alerts and hold notices are refused).
    client
        Where alerts go (default: an :class:`AlertmanagerClient` on the settings' URL).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        client: AlertSink | None = None,
        group_id: str | None = None,
        clock: Callable[[], datetime] = _utcnow,
        metrics: BridgeMetrics | None = None,
    ) -> None:
        if client is None:
            if not settings.alertmanager:
                raise ConfigError("STEPGUARD_ALERTMANAGER_URL is required by the bridge")
            client = AlertmanagerClient(
                settings.alertmanager, timeout_s=settings.alertmanager_timeout_s,
                retries=settings.alertmanager_retries,
            )  # fmt: skip
        self.client: AlertSink = client
        self.settings = settings
        self.metrics = metrics or BridgeMetrics()
        self.registry = registry_of(settings)
        self._worker_keys = public_keys(settings, "worker", "the Alertmanager bridge (alerts)")
        self._actuator_keys = public_keys(settings, "actuator")
        self.table = EpisodeTable(BridgeParams.from_settings(settings))
        self.stats = BridgeStats()
        self._clock = clock
        self._dropped = (0, 0)
        create_topics(settings, ["decisions", "deadletter"])
        self._producer: KafkaProducer = control_producer(settings)
        self._rebuild()
        self._consumer = assigned_consumer(
            settings, [self.registry.name("decisions")],
            group_id or f"{settings.consumer_group}.alertmanager",
        )  # fmt: skip

    def _rebuild(self) -> None:
        now = self._clock()
        for rec in read_back(self.settings, "decisions"):
            self.stats.rebuilt += 1
            if isinstance(rec.message, Alert) and self.problem(rec.message, now) is None:
                self.table.observe(rec.message, self._seen_at(rec, now), now, replay=True)
        self.table.duplicates = 0
        log.info("alertmanager bridge: %d decisions read back, %d episodes firing",
                 self.stats.rebuilt, len(self.table))  # fmt: skip

    @staticmethod
    def _seen_at(rec: Decoded, now: datetime) -> datetime:
        if rec.timestamp_ms <= 0:
            return now
        return min(now, datetime.fromtimestamp(rec.timestamp_ms / 1000, UTC))

    def problem(self, alert: Alert, now: datetime) -> tuple[str, str] | None:
        """(stage, why) an alert must not reach Alertmanager, or None: the actuator's
        rule (a worker's signature; an actuator's on a guardrail alert), and no date
        beyond the clock + the allowed skew."""
        problem = signature_problem(alert, self._worker_keys)
        own = alert.kind is AlertKind.GUARDRAIL and problem is not None
        if own and signature_problem(alert, self._actuator_keys) is None:
            problem = None  # the actuator's circuit breakers and hold notices
        if problem is not None:
            return "signature", problem
        late = future_dated(alert.ts, self.settings.max_clock_skew_s, now=now,
                            whose="the bridge's")  # fmt: skip
        return None if late is None else ("clock", late)

    def _letter(self, rec: Decoded, stage: str, why: str, now: datetime) -> Any:
        self.stats.dead_letters += 1
        self.metrics.inputs.labels("dead_letter").inc()
        msg = rec.message
        what = f"{msg.fingerprint}#{msg.seq}" if isinstance(msg, Alert) else type(msg).__name__
        log.warning("dead letter from %s[%d]@%d: alert %s: %s", rec.topic, rec.partition,
                    rec.offset, what, why)  # fmt: skip
        letter = DeadLetter(
            source_topic=rec.topic, partition=rec.partition, offset=rec.offset,
            raw=encode(msg), error=why[:2000], stage=stage, ts=now,
        )  # fmt: skip
        return publish(self._producer, self.registry, "deadletter", letter)

    def poll_once(self, timeout_ms: int = 500) -> int:
        """One poll: observe, post what is due, wait for acks, commit. Returns records."""
        futures: list[Any] = []
        out: list[PostableAlert] = []
        n = 0
        for rec in consume_decoded(self._consumer, self.registry, self._producer, timeout_ms):
            n += 1
            now = self._clock()
            msg = rec.message
            if not isinstance(msg, Alert):
                futures.append(self._letter(rec, "validate", "not an alert", now))
                continue
            problem = self.problem(msg, now)
            if problem is not None:
                futures.append(self._letter(rec, *problem, now))
                continue
            before = self.table.duplicates
            out += self.table.observe(msg, self._seen_at(rec, now), now)
            dup = self.table.duplicates > before
            self.metrics.inputs.labels("duplicate" if dup else "observed").inc()
        out += self.table.due(self._clock())
        if out:
            self._post(out)
        for fut in futures:
            fut.get(timeout=30)
        self._consumer.commit()
        self.stats.consumed += n
        self._account()
        return n

    def _post(self, alerts: list[PostableAlert]) -> None:
        result = self.client.post(alerts)  # raises when Alertmanager stays unavailable
        self.stats.sent += result.sent
        self.stats.rejected += result.rejected
        self.metrics.rejected.inc(result.rejected)
        now = self._clock()
        for a in alerts:
            self.metrics.sent.labels(state_of(a, now).value).inc()
        log.info("posted %d alert(s) to Alertmanager (%d refused)", result.sent,
                 result.rejected)  # fmt: skip

    def _account(self) -> None:
        t = self.table
        self.metrics.firing.set(len(t))
        evicted, expired = self._dropped
        if t.evicted > evicted:
            log.warning("alertmanager bridge at its cap (%d episodes): %d dropped",
                        t.params.max_episodes, t.evicted - evicted)  # fmt: skip
            self.metrics.dropped.labels("evicted").inc(t.evicted - evicted)
        if t.expired > expired:
            self.metrics.dropped.labels("expired").inc(t.expired - expired)
        self._dropped = (t.evicted, t.expired)

    def run(self, stop: Callable[[], bool]) -> BridgeStats:
        while not stop():
            self.poll_once()
        return self.stats

    def close(self) -> None:
        self._consumer.close()
        self._producer.flush()
        self._producer.close()
