"""Frozen settings, read from ``STEPGUARD_*`` environment variables: one small class per
role, and :class:`Settings`, all of them together.

This is the only package that reads the environment. Build settings once at the edge
(CLI, service start) and pass them in: :func:`load_settings` for the whole
:class:`Settings` (the CLI's), :func:`load_role` for one role's class (only its
variables are read). A :class:`Settings` is an instance of every role's class, so a
service may hand its settings to code that takes one role's only: the actuator's pure
policy (:mod:`pipeline.policy`) takes :class:`ActuatorSettings`.

=============================  ===========================================================
class (module)                 what it holds, who takes it
=============================  ===========================================================
:class:`KafkaSettings`         the broker and topics (``broker``): every floor
:class:`KeySettings`           signing keys per role (``keys``): whoever signs or verifies
:class:`TelemetryAuthSettings` the telemetry secret and node keys (``keys``)
:class:`ClientSettings`        the three above and the client's own (``client``): training
                               code, and the base of :class:`Settings`
:class:`WorkerSettings`        ``stepguard worker`` (``worker``): table, pace, limits
:class:`ActuatorSettings`      ``stepguard actuator`` and its policy (``actuator``): mode,
                               confirmation, guardrails, spares, holds
:class:`ExecutorSettings`      ``stepguard executor`` (``executors``): webhooks, Slurm,
                               Kubernetes
:class:`AlertmanagerSettings`  ``stepguard alertmanager`` (``alertmanager``)
:class:`ArchiveSettings`       ``stepguard archive`` (``archive``): ClickHouse or chDB
:class:`Settings`              all of them, the consumer group and the state directory:
                               the CLI's, and the services'
=============================  ===========================================================

Every variable, whichever class reads it:

============================  ==========================================================
Variable                      Meaning
============================  ==========================================================
STEPGUARD_KAFKA_BOOTSTRAP     ``host:port[,host:port]``; empty means "start the embedded
                              Tansu broker" (demo) or "not configured" (services)
STEPGUARD_KAFKA_SECURITY_PROTOCOL  PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
STEPGUARD_KAFKA_SASL_MECHANISM     PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512
STEPGUARD_KAFKA_SASL_USERNAME / _PASSWORD  SASL credentials (password is secret)
STEPGUARD_KAFKA_SSL_CAFILE / _CERTFILE / _KEYFILE  TLS files
STEPGUARD_BROKER_FLAVOR       kafka | tansu: ``tansu`` applies the Tansu workarounds
                              (pre-created topics, short session timeouts, batch size 1)
STEPGUARD_TOPIC_PREFIX        prefix for every topic name (tenant or test isolation)
STEPGUARD_CLICKHOUSE_DSN      ``clickhouse://user:pass@host:9000/db``: server backend
STEPGUARD_CHDB_PATH           data directory of the embedded chDB archive (used when no
                              DSN is set)
STEPGUARD_STATE_DIR           where embedded services keep logs and data
STEPGUARD_CONSUMER_GROUP      base consumer group id
STEPGUARD_WORKER_METRICS_PORT Prometheus port of ``stepguard worker`` (0: off)
STEPGUARD_ACTUATOR_METRICS_PORT / EXECUTOR_ / ARCHIVER_  the same for the actuator
                              (9109), an executor (9110) and the archiver (9111); two
                              of a kind on one host need distinct ports
STEPGUARD_LISTENER_METRICS_PORT  the CommandListener's, in training code (default 0: off)
STEPGUARD_METRICS_BIND_ADDRESS  address every metrics endpoint listens on (default
                              127.0.0.1, loopback; ``0.0.0.0`` in a container, as the
                              image and docker-compose set it, or for a remote scraper)
STEPGUARD_WORKER_STORE        Faust table store URL (``memory://`` or ``rocksdb://``)
STEPGUARD_WORKER_SNAPSHOT_STEPS / _SNAPSHOT_INTERVAL_S  how often a job's detector
                              state is written to the table (steps / wall seconds)
STEPGUARD_WORKER_TICK_INTERVAL_S  hang timer period of ``stepguard worker``
STEPGUARD_WORKER_MAX_MESSAGE_BYTES  larger input goes to the dead-letter topic
STEPGUARD_WORKER_MAX_SNAPSHOT_BYTES  largest compressed job snapshot (changelog limit)
STEPGUARD_WORKER_SESSION_TIMEOUT_S  worker consumer-group session timeout
STEPGUARD_WORKER_RECOVERY_TIMEOUT_S  exit (75) when table recovery stalls this long
STEPGUARD_WORKER_MAX_JOBS     jobs one worker holds; records of more are dead-lettered
STEPGUARD_JOB_IDLE_TTL_S      a job silent this long (no step, command or lifecycle
                              record, no end) is dropped with one INFO alert
STEPGUARD_MAX_RANKS_PER_JOB   distinct ranks per job; further ranks are dead-lettered
STEPGUARD_MAX_CLOCK_SKEW_S    records dated further beyond the wall clock are refused
STEPGUARD_DETECTOR_CONFIG     JSON file of detector thresholds for new jobs (written by
                              ``stepguard calibrate --apply``; unset: the defaults)
STEPGUARD_ACTUATOR_MODE       observe | approve | auto
STEPGUARD_ACTUATOR_ACTION_MODES  per action kind, a mode overriding it:
                              ``replace_at_checkpoint=auto,restart=approve``
STEPGUARD_ACTUATOR_PRIVATE_KEY  ``key_id:base64`` Ed25519 key that signs commands
                              (secret; ``stepguard keys generate`` makes one)
STEPGUARD_ACTUATOR_PUBLIC_KEYS  ``key_id:base64[,key_id:base64]``: keys whose commands
                              executors, listeners and workers obey (rotation: list both)
STEPGUARD_WORKER_PRIVATE_KEY / _PUBLIC_KEYS  the same for alerts (workers sign, the
                              actuator verifies)
STEPGUARD_OPERATOR_PRIVATE_KEY / _PUBLIC_KEYS  the same for approvals and control
                              messages (operators sign, the actuator verifies)
STEPGUARD_EXECUTOR_PRIVATE_KEY / _PUBLIC_KEYS  the same for executors' command results
                              (executors sign; their start-up read-back verifies)
STEPGUARD_JOB_CONTROLLER_PRIVATE_KEY / _PUBLIC_KEYS  the same for the training job's
                              CommandListener (its results; workers act on a relaunch
                              only when its own job's controller key signed it); the key
                              id binds the key to one job (``stepguard keys generate
                              --role job_controller --job J``; ``up`` writes it to
                              ``<state dir>/job-controller.env``, mode 0600)
STEPGUARD_TELEMETRY_AUTH      on (default) | off: every steps, health and lifecycle
                              record carries its writer's proof (a header), and the
                              worker refuses the rest; ``off`` is logged as a warning
STEPGUARD_TELEMETRY_SECRET    the cluster telemetry secret (base64, secret; ``stepguard
                              keys telemetry``): the worker's; every node's key is
                              derived from it (``up`` makes an ephemeral one)
STEPGUARD_TELEMETRY_NODE_KEYS ``node=base64[,...]``: the keys of the nodes a producer
                              speaks for (secret; ``stepguard keys node --node N``)
STEPGUARD_RESULT_MAX_AGE_S    a result older than this is not acted on
STEPGUARD_CONTROL_MAX_AGE_S   an approval or control change older than this is refused
STEPGUARD_COMMAND_TTL_S       seconds a command stays valid after issue
STEPGUARD_GUARD_*             actuator guardrails (see the field docs below)
STEPGUARD_SPARE_NODES         comma-separated spare pool
STEPGUARD_WEBHOOK_URLS        comma-separated Alertmanager-compatible webhook URLs
                              (secret: never printed, logged only as scheme://host)
STEPGUARD_WEBHOOK_TIMEOUT_S / _RETRIES  per-POST timeout and retries of the webhook
STEPGUARD_WARNING_CONFIRM_S   seconds a WARNING must persist (or WARNING_CONFIRM_STEPS)
STEPGUARD_GUARD_JOB_NODES     job size for the percentage guardrail (0: unknown)
STEPGUARD_GUARD_MAX_ISOLATIONS_GLOBAL  isolations per guard window across all jobs
                              (beside the per-job breaker; default 10)
STEPGUARD_SLURM_SCONTROL      path of ``scontrol`` for the Slurm executor (``squeue``
                              is taken from the same folder)
STEPGUARD_SLURM_JOBS          stepguard jobs that are Slurm jobs: ``job=slurm_id[,...]``
                              (the Slurm executor requeues them on RESTART)
STEPGUARD_SLURM_JOB_PREFIX    ... and every job id ``<prefix><slurm_id>``, e.g.
                              ``slurm-`` for ``slurm-1234`` (empty: none)
STEPGUARD_KUBE_CONFIG         kubeconfig of the Kubernetes executor (unset: in-cluster
                              config in a pod, else ~/.kube/config); ``_CONTEXT`` picks one
STEPGUARD_KUBE_TAINT_EFFECT   NoSchedule | NoExecute: the effect of stepguard's taint
STEPGUARD_KUBE_NODE_CONDITION  write the StepguardHealthy condition (nodes/status)
STEPGUARD_KUBE_JOB_LABELS     pod labels whose value is a job's id (its pods to evict)
STEPGUARD_KUBE_NAMESPACES     namespaces whose pods may be evicted (empty: all)
STEPGUARD_KUBE_TIMEOUT_S      per-request timeout of the Kubernetes executor
STEPGUARD_KUBE_DEVICE_TAINTS  taint the one faulty GPU (DRA DeviceTaintRule) instead of
                              the node; ``_DRA_DRIVER`` / ``_DRA_DEVICE`` name it
STEPGUARD_HOLD_TTL_S          a held action (approve mode) undecided this long expires
STEPGUARD_ACTUATOR_MAX_TRACKED  hard cap of every actuator memory map (episodes,
                              commands, actions, cooldowns, repair marks, job sizes)
STEPGUARD_ALERTMANAGER_URL    Alertmanager's base URL for ``stepguard alertmanager``
                              (secret like the webhook URLs; empty: no bridge)
STEPGUARD_ALERTMANAGER_*      the bridge: ``CLUSTER`` label, ``RUNBOOK_URL`` base (+ the
                              alert kind), ``RESOLVE_TIMEOUT_S`` (endsAt while firing),
                              ``RESEND_S`` (shorter), ``EPISODE_TTL_S``, ``MAX_EPISODES``,
                              ``TIMEOUT_S``, ``RETRIES``, ``METRICS_PORT`` (9112)
============================  ==========================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pydantic import Field

from pipeline.io.settings._base import ENV_PREFIX, MODEL_CONFIG, load_role
from pipeline.io.settings.actuator import ActuatorSettings
from pipeline.io.settings.alertmanager import AlertmanagerSettings
from pipeline.io.settings.archive import ArchiveSettings
from pipeline.io.settings.broker import KafkaSettings
from pipeline.io.settings.client import ClientSettings
from pipeline.io.settings.executors import ExecutorSettings
from pipeline.io.settings.keys import (
    ROLES,
    KeySettings,
    Role,
    TelemetryAuthSettings,
    parse_keys,
    parse_node_keys,
)
from pipeline.io.settings.worker import WorkerSettings

__all__ = [
    "ENV_PREFIX",
    "ROLES",
    "ActuatorSettings",
    "AlertmanagerSettings",
    "ArchiveSettings",
    "ClientSettings",
    "ExecutorSettings",
    "KafkaSettings",
    "KeySettings",
    "Role",
    "Settings",
    "TelemetryAuthSettings",
    "WorkerSettings",
    "load_client_settings",
    "load_role",
    "load_settings",
    "parse_keys",
    "parse_node_keys",
]


class Settings(  # pydantic lists the last base's fields first: the client's lead
    ArchiveSettings,
    AlertmanagerSettings,
    ExecutorSettings,
    ActuatorSettings,
    WorkerSettings,
    ClientSettings,
):
    """Every knob of stepguard: the client's, then each role's (worker, actuator,
    executors, Alertmanager bridge, archive). Frozen: derive a changed copy with
    ``model_copy``.

    >>> s = load_settings({"STEPGUARD_ACTUATOR_MODE": "auto"})
    >>> isinstance(s, ActuatorSettings), s.actuator_mode, s.worker_max_jobs
    (True, 'auto', 10000)
    """

    model_config = MODEL_CONFIG

    consumer_group: str = Field(default="stepguard", min_length=1)
    state_dir: Path = Path(".stepguard")


def load_settings(env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
    """Read settings from ``env`` (default: the process environment) plus overrides.

    Raises :class:`ConfigError` naming the ``STEPGUARD_*`` variable that is wrong.
    """
    return load_role(Settings, env, **overrides)


def load_client_settings(
    env: Mapping[str, str] | None = None, **overrides: object
) -> ClientSettings:
    """:func:`load_settings` for training code: only the client's variables are read.

    >>> load_client_settings({"STEPGUARD_KAFKA_BOOTSTRAP": "k1:9092"}).kafka_bootstrap
    'k1:9092'
    >>> "worker_max_jobs" in ClientSettings.model_fields
    False
    """
    return load_role(ClientSettings, env, **overrides)
