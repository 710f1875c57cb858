"""The Faust app of ``stepguard worker``, built from Settings.

Topology (``P`` = partitions of the steps topic)::

    steps  (key job)  ───────────────────────────────┐
    health (key node) ─► route_health ───┐            │
    commands, results ─► route_command/_result ─► jobs (internal, key job, P partitions)
    lifecycle (key job) ─► route_lifecycle ┘           │
    timer (every tick interval) ─► tick records ─────┘        │
                                                              ▼
                                 job agent: WorkerDetection ─► decisions, deadletter
                                       │
                                       └─► table "job-states" (changelog, P partitions)
    control (no group, from the start) ─► ControlReader thread ─► new jobs' thresholds

The job agent reads the steps topic and the internal jobs topic together, so Faust
assigns partition ``p`` of both, and of the table's changelog, to the same worker: a
job's steps, its health and its ticks all meet the one process holding its state.
Agent bodies stay thin (:mod:`pipeline.services.worker.streams`: the agents, timer and
rebalance handlers as named methods; :mod:`pipeline.services.worker.consumer`: the
consumer); the logic lives in :class:`~pipeline.services.worker.state.WorkerDetection`.
The control topic is read outside the consumer group, by every worker, for the signed
detector settings ``stepguard calibrate --apply`` sends (:mod:`pipeline.services.worker.control`).

Every Faust setting is passed explicitly and Faust gets an empty environment, so
variables such as ``BROKER_URL`` never change the worker behind our back.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import time
from dataclasses import dataclass
from typing import Any

import faust
from kafka import KafkaAdminClient, KafkaConsumer
from kafka.admin import ConfigResource, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from detectors.job_guard import LifecycleLimits
from pipeline.io.detector_config import load_detector_config
from pipeline.io.errors import BrokerError
from pipeline.io.kafka import client_config, consumer_config, create_topics, registry_of
from pipeline.io.settings import Settings
from pipeline.io.telemetry_auth import telemetry_verifier
from pipeline.io.trust import SigningKey, public_keys, signing_key
from pipeline.services.worker.consumer import LowLatencyConsumer
from pipeline.services.worker.control import ControlReader, DetectorControl
from pipeline.services.worker.metrics import REFUSED_WRITER_LABELS, BoundedLabels, WorkerMetrics
from pipeline.services.worker.options import Capacity, SnapshotPolicy, Timing, WorkerTrust
from pipeline.services.worker.records import CoreTopics
from pipeline.services.worker.seal import Seal, derive_key
from pipeline.services.worker.state import WorkerDetection
from pipeline.services.worker.streams import TABLE_NAME, WorkerStreams

__all__ = ["WorkerApp", "build_app", "prepare_topics"]

log = logging.getLogger(__name__)


def _app_id(settings: Settings) -> str:
    return f"{settings.consumer_group}.worker"


def jobs_topic_name(settings: Settings) -> str:
    """The internal topic carrying health re-keyed by job and timer ticks."""
    return f"{registry_of(settings).name('steps')}.worker-jobs.{settings.consumer_group}"


def changelog_topic_name(settings: Settings) -> str:
    return f"{_app_id(settings)}-{TABLE_NAME}-changelog"


def prepare_topics(settings: Settings) -> int:
    """Create the registry's topics and the worker's internal ones; return ``P``.

    Internal topics get exactly the steps topic's partition count (co-partitioning),
    created here with kafka-python rather than left to Faust or auto-creation.
    """
    create_topics(settings)
    steps = registry_of(settings).name("steps")
    consumer = KafkaConsumer(**client_config(settings))
    try:
        parts = None
        for _ in range(50):
            parts = consumer.partitions_for_topic(steps)
            if parts:
                break
            time.sleep(0.1)
    finally:
        consumer.close()
    if not parts:
        raise BrokerError(f"topic {steps} has no partitions")
    n = len(parts)
    admin = KafkaAdminClient(**client_config(settings))
    try:
        existing = set(admin.list_topics())
        new = [
            NewTopic(name, num_partitions=n, replication_factor=1, topic_configs=cfg)
            for name, cfg in (
                (jobs_topic_name(settings), {}),
                (changelog_topic_name(settings), _changelog_config(settings)),
            )
            if name not in existing
        ]
        if new:
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(new)
        changelog = changelog_topic_name(settings)
        if changelog in existing:  # maybe created with the broker's ~1 MB message limit
            try:
                admin.alter_configs(
                    [ConfigResource("TOPIC", changelog, configs=_changelog_config(settings))]
                )
            except KafkaError as exc:
                log.warning("could not raise max.message.bytes of %s: %s", changelog, exc)
    except KafkaError as exc:
        raise BrokerError(f"cannot create worker topics: {exc}") from exc
    finally:
        admin.close()
    return n


def _changelog_config(settings: Settings) -> dict[str, str]:
    """Compacted, and taking a whole job's snapshot (brokers default to ~1 MB, which a
    job of ~7k ranks already exceeds)."""
    return {
        "cleanup.policy": "compact",
        "max.message.bytes": str(settings.worker_max_snapshot_bytes),
    }


def _credentials(settings: Settings) -> Any:
    proto = settings.kafka_security_protocol
    context = None
    if proto in ("SSL", "SASL_SSL"):
        context = ssl.create_default_context(
            cafile=str(settings.kafka_ssl_cafile) if settings.kafka_ssl_cafile else None
        )
        if settings.kafka_ssl_certfile:
            context.load_cert_chain(
                str(settings.kafka_ssl_certfile),
                str(settings.kafka_ssl_keyfile) if settings.kafka_ssl_keyfile else None,
            )
    if proto.startswith("SASL"):
        password = settings.kafka_sasl_password
        return faust.SASLCredentials(
            username=settings.kafka_sasl_username,
            password=password.get_secret_value() if password else None,
            mechanism=settings.kafka_sasl_mechanism,
            ssl_context=context,
        )
    if context is not None:
        return faust.SSLCredentials(context)
    return None


@dataclass
class WorkerApp:
    """The Faust app plus the objects its agents share."""

    app: faust.App
    core: WorkerDetection
    metrics: WorkerMetrics
    settings: Settings
    n_partitions: int
    #: reads the signed detector settings on the control topic (start it with the app)
    control: ControlReader | None = None


def build_app(
    settings: Settings, n_partitions: int, metrics: WorkerMetrics | None = None
) -> WorkerApp:
    """A configured Faust app with the worker's agents, table and timer
    (:class:`~pipeline.services.worker.streams.WorkerStreams`) over its core."""
    if not settings.kafka_bootstrap:
        raise BrokerError("STEPGUARD_KAFKA_BOOTSTRAP is not set")
    # every alert is signed (the actuator acts on nothing else)
    alert_key = signing_key(settings, "worker", "the worker (it signs its alerts)")
    metrics = metrics or WorkerMetrics()
    trust = _trust(settings, alert_key, metrics)
    registry = registry_of(settings)
    names = CoreTopics(
        steps=registry.name("steps"), health=registry.name("health"),
        jobs=jobs_topic_name(settings), commands=registry.name("commands"),
        lifecycle=registry.name("lifecycle"), results=registry.name("results"),
    )  # fmt: skip
    app = _faust_app(settings, n_partitions)
    # Faust's consumer long-polls 1.5 s: a partition left out of the fetch in flight
    # (it still had buffered records when the fetch went out) waits that long for new
    # data, which was most of a step's latency at 16k ranks (p50 0.6 s, p99 1.5 s).
    # Ours waits 50 ms, and hands the steps topic to the job agent a fetch per
    # partition at a time (pipeline.services.worker.bulk)
    app.transport.Consumer = type(
        "_StepsConsumer", (LowLatencyConsumer,), {"bulk_topic": names.steps}
    )
    core = _core(settings, names, n_partitions, trust)
    out_topics = (registry.name("decisions"), registry.name("deadletter"),
                  changelog_topic_name(settings))  # fmt: skip
    WorkerStreams(app, core, metrics, settings, alert_key, out_topics).register()
    return WorkerApp(app, core, metrics, settings, n_partitions,
                     control=_control_reader(settings, core, metrics))  # fmt: skip


def _core(
    settings: Settings, names: CoreTopics, n_partitions: int, trust: WorkerTrust
) -> WorkerDetection:
    """The worker's broker-free core, configured from Settings."""
    return WorkerDetection(
        names,
        n_partitions,
        snapshots=SnapshotPolicy(
            snapshot_steps=settings.worker_snapshot_steps,
            snapshot_interval_s=settings.worker_snapshot_interval_s,
            snapshot_budget=settings.worker_snapshot_budget,
            max_snapshot_bytes=settings.worker_max_snapshot_bytes,
        ),
        capacity=Capacity(
            max_message_bytes=settings.worker_max_message_bytes,
            max_jobs=settings.worker_max_jobs,
            job_idle_ttl_s=settings.job_idle_ttl_s,
            max_ranks_per_job=settings.max_ranks_per_job,
            max_nodes_per_job=settings.max_nodes_per_job,
            max_pending_jobs=settings.worker_max_pending_jobs,
            pending_ttl_s=settings.worker_pending_ttl_s,
        ),
        timing=Timing(
            event_rate=settings.worker_event_rate,
            # a live pipeline delivers the worker's own ticks every interval
            blind_after_s=max(5 * settings.worker_tick_interval_s, 3.0),
            max_clock_skew_s=settings.max_clock_skew_s,
        ),
        trust=trust,
        limits=LifecycleLimits(
            max_phase_s=settings.max_phase_s, end_confirm_s=settings.end_confirm_s
        ),
        # thresholds of new jobs: `stepguard calibrate --apply` writes this file
        detector_config=load_detector_config(settings.detector_config),
    )


def _trust(settings: Settings, alert_key: SigningKey, metrics: WorkerMetrics) -> WorkerTrust:
    """Whose word the worker takes, and its own seal."""
    # relaunch commands are obeyed only when the actuator signed them ...
    command_keys = public_keys(settings, "actuator", "the worker (it verifies commands)")
    # ... and a relaunch counts as carried out only when the job's own controller signed
    # its result (an executor's, a dry run's "would restart" included, never counts)
    result_keys = public_keys(settings, "job_controller")
    if not result_keys:
        log.warning("no STEPGUARD_JOB_CONTROLLER_PUBLIC_KEYS: command results are ignored "
                    "(a relaunch's grace runs its course)")  # fmt: skip
    # the per-writer count of refused telemetry, its labels bounded (the node is whatever
    # the refused record claims)
    refused_writers = BoundedLabels(REFUSED_WRITER_LABELS)

    def on_refused(topic: str, node: str) -> None:
        metrics.refused_telemetry.labels(topic, refused_writers.label(node)).inc()

    return WorkerTrust(
        command_keys=command_keys or {},
        result_keys=result_keys or {},
        executor_keys=public_keys(settings, "executor") or {},
        # what it writes for itself (jobs topic, changelog) opens only with its own key
        seal=Seal(derive_key(alert_key)),
        # a record about node N counts only with N's proof; job-level lifecycle only
        # with its job controller's signature (pipeline.io.telemetry_auth)
        telemetry=telemetry_verifier(settings, result_keys, "the worker"),
        on_refused=on_refused,
    )


def _faust_app(settings: Settings, n_partitions: int) -> faust.App:
    """The Faust app, every setting explicit (Faust gets an empty environment)."""
    tansu = settings.is_tansu
    timeout = settings.worker_session_timeout_s
    session = min(timeout, 6.0) if tansu else timeout
    extra: dict[str, Any] = {}
    if tansu:
        # ListOffsets is exact only with one record per batch (docs/backends.md): without it
        # changelog recovery stops early and the table loses updates.
        extra["producer_max_batch_size"] = 1
    creds = _credentials(settings)
    if creds is not None:
        extra["broker_credentials"] = creds
    app = faust.App(
        _app_id(settings),
        env={},
        broker=[f"kafka://{h.strip()}" for h in settings.kafka_bootstrap.split(",")],
        store=settings.worker_store,
        datadir=str(settings.worker_data_dir),
        autodiscover=False,
        web_enabled=False,
        topic_partitions=n_partitions,
        topic_replication_factor=1,
        topic_allow_declare=True,
        table_standby_replicas=0,
        key_serializer="raw",
        value_serializer="raw",
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=session,
        broker_heartbeat_interval=max(0.5, session / 6),
        broker_rebalance_timeout=max(2 * session, 20.0),
        broker_commit_interval=1.0,
        stream_wait_empty=False,  # records held for the next snapshot stay unacked
        processing_guarantee="at_least_once",
        producer_acks=1 if tansu else -1,
        producer_max_request_size=max(8 * 1024 * 1024, settings.worker_max_snapshot_bytes),
        consumer_max_fetch_size=max(8 * 1024 * 1024, settings.worker_max_snapshot_bytes),
        **extra,
    )
    return app


def _control_reader(
    settings: Settings, core: WorkerDetection, metrics: WorkerMetrics
) -> ControlReader:
    """The reader of signed detector settings: every worker reads the whole control
    topic (no consumer group) and builds new jobs' detectors from the latest change."""
    keys = public_keys(settings, "operator")
    if not keys:
        log.warning("no STEPGUARD_OPERATOR_PUBLIC_KEYS: detector settings sent on the "
                    "control topic (stepguard calibrate --apply) are refused")  # fmt: skip
    control = DetectorControl(
        keys, core.detector_config or load_detector_config(None),
        max_clock_skew_s=settings.max_clock_skew_s, max_age_s=settings.control_max_age_s,
    )  # fmt: skip

    def on_change(config: Any) -> None:
        core.detector_config = config  # read when a new job's detectors are built

    def on_record() -> None:
        for name, value in control.counts().items():
            metrics.state_events.labels(name).set(value)

    return ControlReader(
        control, lambda: KafkaConsumer(**consumer_config(settings, None)),
        registry_of(settings).name("control"), on_change=on_change, on_record=on_record,
    )  # fmt: skip
