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
Agent bodies stay thin; the logic lives in :class:`~pipeline.services.worker.state.WorkerDetection`.
The control topic is read outside the consumer group, by every worker, for the signed
detector settings ``stepguard calibrate --apply`` sends (:mod:`pipeline.services.worker.control`).

Every Faust setting is passed explicitly and Faust gets an empty environment, so
variables such as ``BROKER_URL`` never change the worker behind our back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import faust
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaConsumer
from kafka import KafkaAdminClient, KafkaConsumer
from kafka.admin import ConfigResource, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError
from mode.services import WaitResults

from detectors.job_guard import LifecycleLimits
from pipeline.io.detector_config import load_detector_config
from pipeline.io.errors import BrokerError
from pipeline.io.kafka import client_config, consumer_config, create_topics, registry_of
from pipeline.io.settings import Settings
from pipeline.io.telemetry_auth import telemetry_verifier
from pipeline.io.trust import public_keys, sign, signing_key
from pipeline.services.worker.bulk import AckLines, StepBatch, grouped
from pipeline.services.worker.control import ControlReader, DetectorControl
from pipeline.services.worker.current import make_current
from pipeline.services.worker.eager import eager_first
from pipeline.services.worker.metrics import REFUSED_WRITER_LABELS, BoundedLabels, WorkerMetrics
from pipeline.services.worker.records import CoreTopics, Forward, Handled
from pipeline.services.worker.seal import Seal, derive_key
from pipeline.services.worker.state import KIND_HEADER, WorkerDetection
from schemas import Alert, DeadLetter, Rejected, encode

__all__ = ["WorkerApp", "build_app", "prepare_topics"]

log = logging.getLogger(__name__)

TABLE_NAME = "job-states"


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
    """A configured Faust app with the worker's agents, table and timer."""
    if not settings.kafka_bootstrap:
        raise BrokerError("STEPGUARD_KAFKA_BOOTSTRAP is not set")
    # every alert is signed (the actuator acts on nothing else); relaunch commands are
    # obeyed only when the actuator signed them
    alert_key = signing_key(settings, "worker", "the worker (it signs its alerts)")
    command_keys = public_keys(settings, "actuator", "the worker (it verifies commands)")
    # ... and a relaunch counts as carried out only when the job's own controller signed
    # its result (an executor's, a dry run's "would restart" included, never counts)
    result_keys = public_keys(settings, "job_controller")
    if not result_keys:
        log.warning("no STEPGUARD_JOB_CONTROLLER_PUBLIC_KEYS: command results are ignored "
                    "(a relaunch's grace runs its course)")  # fmt: skip
    # a record about node N counts only with N's proof; job-level lifecycle only with its
    # job controller's signature (pipeline.io.telemetry_auth)
    telemetry = telemetry_verifier(settings, result_keys, "the worker")
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
    metrics = metrics or WorkerMetrics()
    registry = registry_of(settings)
    # the per-writer count of refused telemetry, its labels bounded (the node is whatever
    # the refused record claims)
    refused_writers = BoundedLabels(REFUSED_WRITER_LABELS)

    def on_refused(topic: str, node: str) -> None:
        metrics.refused_telemetry.labels(topic, refused_writers.label(node)).inc()

    names = CoreTopics(
        steps=registry.name("steps"), health=registry.name("health"),
        jobs=jobs_topic_name(settings), commands=registry.name("commands"),
        lifecycle=registry.name("lifecycle"), results=registry.name("results"),
    )  # fmt: skip
    # Faust's consumer long-polls 1.5 s: a partition left out of the fetch in flight
    # (it still had buffered records when the fetch went out) waits that long for new
    # data, which was most of a step's latency at 16k ranks (p50 0.6 s, p99 1.5 s).
    # Ours waits 50 ms, and hands the steps topic to the job agent a fetch per
    # partition at a time (pipeline.services.worker.bulk)
    app.transport.Consumer = type(
        "_StepsConsumer", (_LowLatencyConsumer,), {"bulk_topic": names.steps}
    )
    core = WorkerDetection(
        names,
        n_partitions,
        snapshot_steps=settings.worker_snapshot_steps,
        snapshot_interval_s=settings.worker_snapshot_interval_s,
        snapshot_budget=settings.worker_snapshot_budget,
        event_rate=settings.worker_event_rate,
        max_message_bytes=settings.worker_max_message_bytes,
        max_snapshot_bytes=settings.worker_max_snapshot_bytes,
        max_jobs=settings.worker_max_jobs,
        job_idle_ttl_s=settings.job_idle_ttl_s,
        max_ranks_per_job=settings.max_ranks_per_job,
        max_nodes_per_job=settings.max_nodes_per_job,
        max_pending_jobs=settings.worker_max_pending_jobs,
        pending_ttl_s=settings.worker_pending_ttl_s,
        limits=LifecycleLimits(
            max_phase_s=settings.max_phase_s, end_confirm_s=settings.end_confirm_s
        ),
        max_clock_skew_s=settings.max_clock_skew_s,
        # a live pipeline delivers the worker's own ticks every interval
        blind_after_s=max(5 * settings.worker_tick_interval_s, 3.0),
        command_keys=command_keys,
        result_keys=result_keys,
        # what it writes for itself (jobs topic, changelog) opens only with its own key
        seal=Seal(derive_key(alert_key)),
        executor_keys=public_keys(settings, "executor"),
        telemetry=telemetry,
        on_refused=on_refused,
        # thresholds of new jobs: `stepguard calibrate --apply` writes this file
        detector_config=load_detector_config(settings.detector_config),
    )
    raw: dict[str, Any] = {"key_type": bytes, "value_type": bytes,
                           "key_serializer": "raw", "value_serializer": "raw"}  # fmt: skip
    # a steps event is a whole fetch of a partition (up to consumer_max_fetch_size):
    # a short queue bounds what waits in memory
    job_inputs = app.topic(names.steps, names.jobs, maxsize=JOB_QUEUE_EVENTS, **raw)
    health_in = app.topic(names.health, **raw)
    commands_in = app.topic(names.commands, **raw)
    lifecycle_in = app.topic(names.lifecycle, **raw)
    results_in = app.topic(names.results, **raw)
    jobs_out = app.topic(names.jobs, partitions=n_partitions, **raw)
    decisions = app.topic(registry.name("decisions"), **raw)
    deadletter = app.topic(registry.name("deadletter"), **raw)
    table = app.Table(
        TABLE_NAME, default=None, partitions=n_partitions, key_type=bytes, value_type=bytes,
    )  # fmt: skip
    # the job's state under its id (statecodec bytes, never pickle), both raw
    # (Faust would pick JSON here)
    table.key_serializer = table.value_serializer = "raw"

    last_read: dict[tuple[str, int], int] = {}
    acks = AckLines()  # the steps partitions' batches, acked in offset order

    def load(job_id: str) -> bytes | None:
        blob: bytes | None = table.get(job_id.encode())
        return blob

    async def publish(out: Handled) -> None:
        for alert in out.alerts:
            await send_alert(alert)
        for letter in out.dead_letters:
            await send_dead(letter)
        if out.rank_steps:
            metrics.rank_steps.inc(out.rank_steps)
            metrics.steps.inc(out.steps)
            wall = time.time()
            for ts in out.step_ts:
                metrics.step_latency.observe(max(0.0, wall - ts))

    async def send_alert(alert: Alert) -> None:
        signed = sign(alert, alert_key)
        await decisions.send(key=alert.job_id.encode(), value=encode(signed))
        metrics.alerts.labels(alert.grade.value, alert.state.value).inc()

    async def send_dead(letter: DeadLetter) -> None:
        log.warning(
            "dead letter from %s[%d]@%d: %s",
            letter.source_topic, letter.partition, letter.offset, letter.error,
        )  # fmt: skip
        await deadletter.send(key=letter.source_topic.encode(), value=encode(letter))
        metrics.dead_letters.labels(letter.stage).inc()

    records_children: dict[str, Any] = {}

    def records_of(topic: str) -> Any:
        """The per-topic child of the records counter (labels() costs a lock per call)."""
        child = records_children.get(topic)
        if child is None:
            child = records_children[topic] = metrics.records.labels(topic)
        return child

    async def forward(routed: Forward, kind: bytes) -> None:
        """Re-key a health report or command to its job's partition of the jobs topic."""
        await jobs_out.send(
            key=routed.job_id.encode(), value=routed.value, partition=routed.partition,
            headers=[(KIND_HEADER, kind)],
        )  # fmt: skip

    async def settle(out: Handled) -> None:
        """Act on what the core made of one record: send its alerts and dead letters,
        write or delete the job's snapshot, ack the records the snapshot covers."""
        if out.alerts or out.dead_letters or out.rank_steps:
            await publish(out)
        if out.snapshot is not None and out.job_id is not None:
            table[out.job_id.encode()] = out.snapshot  # or, ended, the mark of its end
            if not out.tombstone:
                metrics.snapshots.inc()
        elif out.tombstone and out.job_id is not None:
            # an end mark expired: a tombstone in the compacted changelog
            with contextlib.suppress(KeyError):
                del table[out.job_id.encode()]
        for held in out.release:
            held.ack()

    async def handle(event: Any) -> None:
        """One record of the jobs topic (or of the steps topic, when not in a batch);
        never raises (Faust would ack it)."""
        msg = event.message
        started = time.perf_counter()
        make_current(event)  # the changelog partition of a table write (current.py)
        try:
            if msg.topic == names.steps:  # a consumer that does not group steps
                out = core.handle_step(msg.partition, msg.offset, msg.key, msg.value, event, load)
            else:
                kind = _header(msg.headers, KIND_HEADER)
                out = core.handle_job_record(
                    msg.partition, msg.offset, msg.key, msg.value, kind, event, load
                )
            await settle(out)
        except Exception:  # never let one record kill the agent (Faust acks it)
            log.exception("worker failed on %s[%d]@%d", msg.topic, msg.partition, msg.offset)
            event.ack()
        records_of(msg.topic).inc()
        last_read[(msg.topic, msg.partition)] = msg.offset
        metrics.process_seconds.observe(time.perf_counter() - started)

    async def handle_steps(event: Any) -> None:
        """A fetch's records of one steps partition (:class:`StepBatch`) through the
        core at once (:meth:`WorkerDetection.handle_steps`: one outcome per job, and
        per record that went no further); the batch is acked once a snapshot covers
        each of them and every earlier batch of the partition is acked (:mod:`.bulk`)."""
        batch: StepBatch = event.message
        partition, records = batch.partition, batch.records
        make_current(event)
        ticket = acks.line(partition).open(event.ack, len(records))
        started = time.perf_counter()
        try:
            outs = core.handle_steps(
                partition,
                [(r.offset, r.key, r.value, r.headers) for r in records],
                ticket,
                load,
            )
            for out in outs:
                if out.acts():
                    await settle(out)
        except Exception:  # never let one batch kill the agent (Faust would ack it)
            log.exception("worker failed on %s[%d]@%d-%d", batch.topic, partition,
                          records[0].offset if records else -1, batch.offset)  # fmt: skip
            for _ in range(ticket.pending):
                ticket.ack()
        if records:  # a batch's records: their mean (one observation per record costs
            # a lock and a bucket search each, a tenth of what the core spends on one)
            mean = (time.perf_counter() - started) / len(records)
            metrics.process_seconds.observe(mean)
        records_of(batch.topic).inc(len(records))
        last_read[(batch.topic, partition)] = batch.offset
        # the ticket keeps the event until the batch is acked, which a job whose
        # snapshots are refused delays for good: not its records, which are read
        batch.records = []

    @app.agent(job_inputs, name="stepguard.worker.jobs")
    async def jobs_agent(stream: Any) -> None:
        # many records per call: noack_take hands over what the consumer has buffered
        # (up to worker_batch_max, waiting worker_batch_within_s at most) and acks
        # nothing, so a record is still acked only once a snapshot covers it; the
        # gauges are set once per batch instead of once per record
        async for events in stream.noack_take(
            settings.worker_batch_max, within=settings.worker_batch_within_s
        ):
            for event in events:
                if isinstance(event.message, StepBatch):
                    await handle_steps(event)
                else:
                    await handle(event)
            metrics.jobs.set(len(core.jobs))
            for name, value in core.job_states().items():
                metrics.job_states.labels(name).set(value)
            for name, value in core.counts().items():
                metrics.state_events.labels(name).set(value)

    def router(
        topic: Any, what: str, route: Callable[..., Forward | Rejected | None],
        on_none: Callable[[], None] = lambda: None,
    ) -> None:  # fmt: skip
        """An agent that re-keys one topic's records to their job's partition of the
        jobs topic (header ``what``); bad records are dead letters, per record."""

        async def agent(stream: Any) -> None:
            async for event in stream.events():
                msg = event.message
                try:
                    routed = route(msg.partition, msg.offset, msg.key, msg.value, msg.headers)
                    if isinstance(routed, Rejected):
                        await send_dead(routed.letter)
                    elif routed is None:
                        on_none()
                    else:
                        await forward(routed, what.encode())
                except Exception:
                    log.exception("%s routing failed on %s[%d]@%d", what, msg.topic,
                                  msg.partition, msg.offset)  # fmt: skip
                records_of(msg.topic).inc()
                last_read[(msg.topic, msg.partition)] = msg.offset

        app.agent(topic, name=f"stepguard.worker.{what}")(agent)

    router(health_in, "health", core.route_health, metrics.unrouted_health.inc)
    router(commands_in, "command", core.route_command)
    router(results_in, "result", core.route_result)
    router(lifecycle_in, "lifecycle", core.route_lifecycle)

    watchdog = RecoveryWatchdog(settings.worker_recovery_timeout_s)

    @app.timer(interval=settings.worker_tick_interval_s, name="stepguard.worker.tick")
    async def tick_jobs() -> None:
        busy = app.rebalancing or not app.tables.recovery.completed.is_set()
        stalled = watchdog.check(busy)
        if stalled is not None:
            # Faust's changelog recovery can wait forever for records after a
            # rebalance ("No event received for active tp"); a fresh process recovers
            log.critical(
                "table recovery has not completed for %.0fs "
                "(STEPGUARD_WORKER_RECOVERY_TIMEOUT_S): exiting for a restart", stalled,
            )  # fmt: skip
            logging.shutdown()
            os._exit(RECOVERY_STALLED_EXIT)
        if busy:
            return
        owned = _owned(app, names.steps)
        left: list[tuple[str, bytes]] = []  # not adopted: ended jobs' marks among them
        for key, blob in list(table.items()):
            if blob is not None:
                with contextlib.suppress(Exception):
                    if not core.adopt(key.decode(), blob, owned):
                        left.append((key.decode(), blob))
        for job_id, partition, value in core.expiry_ticks(left, owned):
            await jobs_out.send(key=job_id.encode(), value=value, partition=partition,
                                headers=[(KIND_HEADER, b"expire")])  # fmt: skip
        # a partition with unread steps is *our* backlog, not a silent job: no tick
        behind = _lagging(app, names.steps, last_read)
        for job_id in list(core.jobs):
            rec = core.tick_record(job_id)
            if rec is None or rec[0] not in owned or rec[0] in behind:
                continue
            partition, value = rec
            await jobs_out.send(
                key=job_id.encode(), value=value, partition=partition,
                headers=[(KIND_HEADER, b"tick")],
            )  # fmt: skip
        _update_lag(app, metrics, last_read, skip=changelog_topic_name(settings))

    @app.on_partitions_revoked.connect
    async def on_revoked(app: faust.App, revoked: set[Any], **kwargs: Any) -> None:
        dropped = core.drop_partitions({tp.partition for tp in revoked if tp.topic in
                                        (names.steps, names.jobs)})  # fmt: skip
        acks.revoke(tp.partition for tp in revoked if tp.topic == names.steps)
        if dropped:
            log.info("rebalance: dropped %d cached jobs", dropped)

    @app.on_partitions_assigned.connect
    async def on_assigned(app: faust.App, assigned: set[Any], **kwargs: Any) -> None:
        mine = [tp for tp in assigned if tp.topic in (names.steps, names.jobs)]
        metrics.assigned.set(len(mine))
        metrics.readiness.polled()  # consuming: /readyz answers 200
        log.info("rebalance: own %d partitions of %s and %s", len(mine), names.steps,
                 names.jobs)  # fmt: skip

    del jobs_agent, tick_jobs, on_revoked, on_assigned
    return WorkerApp(app, core, metrics, settings, n_partitions,
                     control=_control_reader(settings, core, metrics))  # fmt: skip


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


#: Exit status of a worker whose table recovery stalled (EX_TEMPFAIL: restart it).
RECOVERY_STALLED_EXIT = 75


class RecoveryWatchdog:
    """How long the worker has been rebalancing or recovering without a break.

    >>> t = [0.0]
    >>> w = RecoveryWatchdog(10.0, clock=lambda: t[0])
    >>> w.check(True), t.__setitem__(0, 9.0), w.check(True)
    (None, None, None)
    >>> t[0] = 10.5; w.check(True)
    10.5
    >>> w.check(False), w.check(True)  # recovered: the clock starts again
    (None, None)
    """

    def __init__(self, timeout_s: float, clock: Any = time.monotonic) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.timeout_s = timeout_s
        self.clock = clock
        self._since: float | None = None

    def check(self, recovering: bool) -> float | None:
        """Seconds stalled when over the timeout, else None."""
        if not recovering:
            self._since = None
            return None
        now = self.clock()
        if self._since is None:
            self._since = now
        stalled = now - self._since
        return stalled if stalled > self.timeout_s else None


#: Broker-side wait of the worker's fetches (Faust hard-codes 1,500 ms).
FETCH_MAX_WAIT_MS = 50


class _LowLatencyConsumerThread(AIOKafkaConsumerThread):
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


class _LowLatencyConsumer(AIOKafkaConsumer):
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
        return _LowLatencyConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def wait_first(self, *coros: Any, timeout: Any = None) -> WaitResults:
        # eager_first yields to the loop once: the streams run between records
        won = await eager_first(super().wait_first, self._won, *coros, timeout=timeout)
        return cast(WaitResults, won)

    def _won(self, coro: Any, value: Any) -> WaitResults:
        if self._stopped.is_set() or self._crashed.is_set():
            return WaitResults([], [], True)  # as mode answers once stopped
        return WaitResults([coro], [value], False)


def _header(headers: Any, name: str) -> str:
    if not headers:
        return ""
    items = headers.items() if isinstance(headers, dict) else headers
    for k, v in items:
        if k == name:
            return v.decode() if isinstance(v, bytes) else str(v)
    return ""


def _owned(app: faust.App, steps_topic: str) -> set[int]:
    try:
        return {tp.partition for tp in app.consumer.assignment() if tp.topic == steps_topic}
    except Exception:  # consumer not started yet
        return set()


def _lagging(app: faust.App, topic: str, read: dict[Any, int]) -> set[int]:
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


def _update_lag(
    app: faust.App, metrics: WorkerMetrics, read: dict[Any, int], skip: str = ""
) -> None:
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
