"""One frozen settings object, read from ``STEPGUARD_*`` environment variables.

This is the only module that reads the environment. Build it once with
:func:`load_settings` at the edge (CLI, service start) and pass it in.

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

import base64
import binascii
import contextlib
import ipaddress
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, TypeVar
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from pipeline.io.errors import ConfigError

__all__ = [
    "ENV_PREFIX",
    "ROLES",
    "ClientSettings",
    "KafkaSettings",
    "KeySettings",
    "Role",
    "Settings",
    "TelemetryAuthSettings",
    "load_client_settings",
    "load_settings",
    "parse_keys",
    "parse_node_keys",
]

ENV_PREFIX = "STEPGUARD_"
_HOSTPORT = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+:\d{1,5}$")
_KEY_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")  # schemas._base.KEY_ID_PATTERN
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
#: a Kubernetes label key: an optional DNS-subdomain prefix and a name of 63 at most
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)

#: Who signs: the actuator (commands, action records), workers (alerts), operators
#: (approvals, control), executors (command results), job controllers (the training
#: job's CommandListener: the results of its own job's commands; a job controller's key
#: is bound to one job by its key id, :func:`pipeline.io.trust.job_controller_key_id`).
Role = Literal["actuator", "worker", "operator", "executor", "job_controller"]
ROLES: tuple[Role, ...] = ("actuator", "worker", "operator", "executor", "job_controller")


def parse_keys(text: str) -> list[tuple[str, bytes]]:
    """``key_id:base64[,key_id:base64]`` to (key_id, 32 raw key bytes) pairs.

    >>> parse_keys("k1:" + "A" * 43 + "=")[0][0]
    'k1'
    >>> parse_keys("k1:secret")
    Traceback (most recent call last):
    ...
    ValueError: key 'k1': expected 32 bytes of standard base64 (44 characters)
    """
    pairs = []
    for part in text.split(","):
        key_id, sep, b64 = part.strip().partition(":")
        if not sep or not _KEY_ID.match(key_id):
            raise ValueError("expected key_id:base64[,key_id:base64] with key ids of "
                             "1-64 characters A-Z a-z 0-9 . _ -")  # fmt: skip
        try:
            raw = base64.b64decode(b64.strip(), validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != 32:
            raise ValueError(
                f"key {key_id!r}: expected 32 bytes of standard base64 (44 characters)"
            )
        pairs.append((key_id, raw))
    return pairs


def parse_node_keys(text: str) -> dict[str, bytes]:
    """``node=base64[,node=base64]`` to node -> 32-byte key.

    >>> parse_node_keys("n1=" + base64.b64encode(bytes(32)).decode())["n1"] == bytes(32)
    True
    >>> parse_node_keys("n1=xyz")
    Traceback (most recent call last):
    ...
    ValueError: node key of 'n1': expected 32 bytes of standard base64
    """
    out: dict[str, bytes] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        node, sep, b64 = part.strip().partition("=")
        if not sep or not node or ":" in node:
            raise ValueError("expected node=base64[,node=base64] (node names without ':')")
        try:
            raw = base64.b64decode(b64.strip(), validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != 32:
            raise ValueError(f"node key of {node[:64]!r}: expected 32 bytes of standard base64")
        out[node] = raw
    return out


class KafkaSettings(BaseSettings):
    """How to reach the broker: bootstrap, security, topic prefix (every floor needs it)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, frozen=True, extra="ignore", case_sensitive=False
    )

    kafka_bootstrap: str = ""
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_cafile: Path | None = None
    kafka_ssl_certfile: Path | None = None
    kafka_ssl_keyfile: Path | None = None
    broker_flavor: Literal["kafka", "tansu"] = "kafka"
    topic_prefix: str = Field(default="", pattern=r"^[A-Za-z0-9._\-]*$", max_length=100)

    @field_validator("kafka_ssl_cafile", "kafka_ssl_certfile", "kafka_ssl_keyfile")
    @classmethod
    def _check_tls_file(cls, value: Path | None) -> Path | None:
        # a typo'd CA path would otherwise surface as a TLS error at the first connect
        if value is not None and not value.is_file():
            raise ValueError(f"no such file: {value}")
        return value

    @field_validator("kafka_bootstrap")
    @classmethod
    def _check_bootstrap(cls, value: str) -> str:
        value = value.strip()
        if value and not all(_HOSTPORT.match(part.strip()) for part in value.split(",")):
            raise ValueError("expected host:port[,host:port...]")
        return value

    @model_validator(mode="after")
    def _check_security(self) -> KafkaSettings:
        if self.kafka_security_protocol.startswith("SASL"):
            if self.kafka_sasl_mechanism is None:
                raise ValueError(
                    "KAFKA_SASL_MECHANISM is required with "
                    f"KAFKA_SECURITY_PROTOCOL={self.kafka_security_protocol}"
                )
            if not self.kafka_sasl_username or self.kafka_sasl_password is None:
                raise ValueError("KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD are required")
        return self

    @property
    def is_tansu(self) -> bool:
        return self.broker_flavor == "tansu"


class KeySettings(BaseSettings):
    """Signing keys per role: a role's private key signs, the others' public keys verify."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, frozen=True, extra="ignore", case_sensitive=False
    )

    #: Ed25519 keys, ``key_id:base64`` (``stepguard keys generate``): a role's private
    #: key signs what it publishes, its public keys verify (all listed: rotation)
    actuator_private_key: SecretStr | None = None
    actuator_public_keys: str = ""
    worker_private_key: SecretStr | None = None
    worker_public_keys: str = ""
    operator_private_key: SecretStr | None = None
    operator_public_keys: str = ""
    executor_private_key: SecretStr | None = None
    executor_public_keys: str = ""
    job_controller_private_key: SecretStr | None = None
    job_controller_public_keys: str = ""

    @field_validator(
        "actuator_private_key", "worker_private_key", "operator_private_key",
        "executor_private_key", "job_controller_private_key",
    )  # fmt: skip
    @classmethod
    def _check_private_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        try:
            pairs = parse_keys(value.get_secret_value())
        except ValueError:  # the message could quote the secret
            raise ValueError(
                "expected key_id:base64 (32 bytes; see `stepguard keys generate`)"
            ) from None
        if len(pairs) != 1:
            raise ValueError("expected exactly one key_id:base64 (the key that signs)")
        return value

    @field_validator(
        "actuator_public_keys", "worker_public_keys", "operator_public_keys",
        "executor_public_keys", "job_controller_public_keys",
    )  # fmt: skip
    @classmethod
    def _check_public_keys(cls, value: str) -> str:
        value = value.strip()
        if value:
            parse_keys(value)
        return value

    def private_key(self, role: Role) -> tuple[str, bytes] | None:
        """(key_id, raw Ed25519 private key) of ``role``, or ``None`` when not set."""
        secret: SecretStr | None = getattr(self, f"{role}_private_key")
        return None if secret is None else parse_keys(secret.get_secret_value())[0]

    def public_keys(self, role: Role) -> list[tuple[str, bytes]]:
        """(key_id, raw Ed25519 public key) pairs that verify what ``role`` signed."""
        text: str = getattr(self, f"{role}_public_keys")
        return parse_keys(text) if text else []


class TelemetryAuthSettings(BaseSettings):
    """How telemetry proves its writer (:mod:`pipeline.io.telemetry_auth`)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, frozen=True, extra="ignore", case_sensitive=False
    )

    #: ``on``: every steps, health and lifecycle record carries its writer's proof and
    #: the worker refuses the rest; ``off``: an explicit opt-out, logged as a warning
    telemetry_auth: Literal["on", "off"] = "on"
    #: the cluster telemetry secret (base64, >= 32 bytes; ``stepguard keys telemetry``):
    #: the worker's, from which every node's key is derived (HKDF-SHA256)
    telemetry_secret: SecretStr | None = None
    #: ``node=base64[,node=base64]``: the keys of the nodes this process speaks for (a
    #: node's agent and training processes: its own; a rack aggregator: its nodes';
    #: ``stepguard keys node --node N``)
    telemetry_node_keys: SecretStr | None = None

    @field_validator("telemetry_secret")
    @classmethod
    def _check_telemetry_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        raw = b""
        with _suppress_decode():
            raw = base64.b64decode(value.get_secret_value().strip(), validate=True)
        if len(raw) < 32:  # never quote the secret
            raise ValueError("expected at least 32 bytes of standard base64 "
                             "(`stepguard keys telemetry` makes one)")  # fmt: skip
        return value

    @field_validator("telemetry_node_keys")
    @classmethod
    def _check_node_keys(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        try:
            parse_node_keys(value.get_secret_value())
        except ValueError as exc:
            raise ValueError(str(exc)) from None
        return value


def _suppress_decode() -> contextlib.AbstractContextManager[None]:
    return contextlib.suppress(binascii.Error, ValueError)


class ClientSettings(KafkaSettings, KeySettings, TelemetryAuthSettings):
    """What training code needs (:mod:`pipeline.client`): the broker, the keys, the clock
    skew allowed and the listener's metrics port. Build it with :func:`load_client_settings`;
    a full :class:`Settings` is one too, so services can hand theirs down."""

    #: a record dated more than this beyond the wall clock is dead-lettered
    max_clock_skew_s: float = Field(default=300.0, gt=0)
    #: steps sent as version 3 (columns): "rack" messages, "all", or "off" (docs/configuration.md)
    steps_columnar: Literal["rack", "all", "off"] = "rack"
    #: the CommandListener's, inside training code (0: off; one per process on a host)
    listener_metrics_port: int = Field(default=0, ge=0, le=65535)
    #: the address every metrics endpoint binds (the listener's and each service's):
    #: loopback unless asked (an exposition names jobs and nodes; the image and
    #: docker-compose set ``0.0.0.0``)
    metrics_bind_address: str = "127.0.0.1"

    @field_validator("metrics_bind_address")
    @classmethod
    def _check_bind_address(cls, value: str) -> str:
        value = value.strip()
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(
                "expected an IP address to listen on (127.0.0.1, 0.0.0.0, ::1, ::)"
            ) from None
        return value


class Settings(ClientSettings):
    """Every knob of stepguard: the client's, then one section per role (worker, actuator,
    executors, archive). Frozen: derive a changed copy with ``model_copy``."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, frozen=True, extra="ignore", case_sensitive=False
    )

    consumer_group: str = Field(default="stepguard", min_length=1)

    # -- worker -------------------------------------------------------------------------
    worker_metrics_port: int = Field(default=9108, ge=0, le=65535)
    #: Prometheus ports of the other services (0: off; pipeline/io/metrics.py)
    actuator_metrics_port: int = Field(default=9109, ge=0, le=65535)
    executor_metrics_port: int = Field(default=9110, ge=0, le=65535)
    archiver_metrics_port: int = Field(default=9111, ge=0, le=65535)
    worker_store: str = Field(default="memory://", pattern=r"^(memory|rocksdb)://.*$")
    worker_data_dir: Path = Path(".stepguard/worker")
    #: snapshot a job's detector state to the table after this many completed steps ...
    worker_snapshot_steps: int = Field(default=10, ge=1)
    #: ... or when this much wall time passed since the last snapshot of a changed job
    worker_snapshot_interval_s: float = Field(default=2.0, gt=0)
    #: ... and never so often that snapshots take more than this share of the worker's
    #: time: a job whose last snapshot took c seconds waits c / budget before the next
    #: (a 131k-rank state takes a good part of a second to encode on the agent's task)
    worker_snapshot_budget: float = Field(default=0.05, gt=0, le=1)
    #: event seconds a silent job's clock moves per wall second (the hang and presence
    #: clocks between steps): 1 in production; a job replayed at SPEED x real time
    #: (``stepguard simulate --speed``, the real-time benchmark) sets SPEED
    worker_event_rate: float = Field(default=1.0, gt=0, le=1000)
    #: how often the hang timer ticks every owned job (wall seconds)
    worker_tick_interval_s: float = Field(default=1.0, gt=0)
    #: the job agent reads up to this many events per call (Faust's noack_take; a steps
    #: event is a whole fetch of one partition, a jobs-topic event one record) ...
    worker_batch_max: int = Field(default=1000, ge=1, le=100_000)
    #: ... waiting at most this long for a batch to fill (adds to a step's latency)
    worker_batch_within_s: float = Field(default=0.005, gt=0, le=1.0)
    #: larger input messages go to the dead-letter topic
    worker_max_message_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    #: largest compressed detector snapshot of one job (~140 B per rank before zlib):
    #: the changelog topic's max.message.bytes and the worker's request and fetch sizes
    worker_max_snapshot_bytes: int = Field(default=64 * 1024 * 1024, ge=1024 * 1024)
    #: consumer-group session timeout of the worker (Tansu: 3-6 s, see docs/backends.md)
    worker_session_timeout_s: float = Field(default=10.0, ge=1.0, le=300.0)
    #: a worker whose table recovery has not completed for this long exits (code 75)
    #: for its supervisor to restart it (Faust's recovery can stall after a rebalance)
    worker_recovery_timeout_s: float = Field(default=120.0, gt=0)
    #: jobs one worker holds at most; records of more jobs are dead-lettered
    worker_max_jobs: int = Field(default=10_000, ge=1)
    #: a job with no step, command or lifecycle record for this long (wall seconds) is
    #: abandoned: its state is dropped with one INFO alert
    job_idle_ttl_s: float = Field(default=3600.0, gt=0)
    #: distinct ranks one job may have; records of further ranks are dead-lettered
    max_ranks_per_job: int = Field(default=262_144, ge=1, le=1_048_576)
    #: distinct nodes one job may have; records of further nodes are dead-lettered
    max_nodes_per_job: int = Field(default=65_536, ge=1, le=65_536)
    #: jobs named only by health reports or start events (no step yet) one worker holds,
    #: and for how many wall seconds: they never count against worker_max_jobs
    worker_max_pending_jobs: int = Field(default=1024, ge=1)
    worker_pending_ttl_s: float = Field(default=300.0, gt=0)
    #: the longest allowance an announced phase (checkpoint, eval) gets, seconds; a
    #: longer one is cut to it (a lifecycle anomaly)
    max_phase_s: float = Field(default=3600.0, gt=0, le=86_400.0)
    #: event time an end stays pending (refused by any later step) before it ends the job
    end_confirm_s: float = Field(default=60.0, gt=0, le=3600.0)
    #: detector thresholds of new jobs (pipeline/io/detector_config.py); None: defaults
    detector_config: Path | None = None

    # -- actuator -----------------------------------------------------------------------
    actuator_mode: Literal["observe", "approve", "auto"] = "observe"
    #: per action kind, a mode overriding actuator_mode: ``kind=mode,...`` (e.g.
    #: ``replace_at_checkpoint=auto,restart=approve``); control --mode-for changes it
    actuator_action_modes: str = ""
    command_ttl_s: float = Field(default=300.0, gt=0)
    #: a command result older than this (its ``ts`` behind the job's event time) is not
    #: acted on; one dated beyond the clock + max_clock_skew_s neither
    result_max_age_s: float = Field(default=600.0, gt=0)
    #: an approval or control change dated longer ago than this is refused (even when
    #: no newer one is left on the topic); judged against when it reached the topic
    control_max_age_s: float = Field(default=3600.0, gt=0)
    #: a WARNING episode must persist this many steps before it confirms
    warning_confirm_steps: int = Field(default=20, ge=1)
    #: alerts older than this (event time vs newest seen) are ignored
    stale_alert_s: float = Field(default=600.0, gt=0)
    #: circuit breaker: at most this many nodes isolated per window ...
    guard_max_isolations: int = Field(default=3, ge=0)
    #: ... and at most this percentage of a job's nodes
    guard_max_isolation_pct: float = Field(default=5.0, ge=0, le=100)
    #: ... and at most this many across all jobs (invented job ids cannot bypass it)
    guard_max_isolations_global: int = Field(default=10, ge=0)
    guard_window_s: float = Field(default=3600.0, gt=0)
    guard_node_cooldown_s: float = Field(default=1800.0, ge=0)
    #: at most one RESTART/ROLLBACK per job per this many seconds (no restart loops)
    guard_relaunch_cooldown_s: float = Field(default=300.0, ge=0)
    spare_nodes: str = ""
    #: without a spare: checkpoint and keep running degraded, or alert only
    no_spare_policy: Literal["checkpoint", "alert"] = "checkpoint"
    #: comma-separated receiver URLs; secret (they often carry a token), so a repr or
    #: a dump of the settings never shows them: read them through :attr:`webhooks`
    webhook_urls: SecretStr = SecretStr("")
    #: ... or this many seconds of event time (whichever comes first)
    warning_confirm_s: float = Field(default=300.0, gt=0)
    #: node count of a job for the percentage guardrail until a control message says
    #: otherwise (0: unknown, only guard_max_isolations applies)
    guard_job_nodes: int = Field(default=0, ge=0)
    webhook_timeout_s: float = Field(default=5.0, gt=0)
    webhook_retries: int = Field(default=3, ge=0)
    #: the ``scontrol`` executable used by the Slurm executor
    slurm_scontrol: str = "scontrol"
    #: stepguard job ids that are Slurm jobs, ``job=slurm_job_id[,...]``: RESTART of them
    #: is a requeue (:class:`pipeline.services.actuator.slurm.SlurmJobs`)
    slurm_jobs: str = ""
    #: ... and job ids made of this prefix and a Slurm job id (empty: none)
    slurm_job_prefix: str = Field(default="", max_length=64)
    #: the Kubernetes executor (pipeline/services/actuator/kubernetes.py): its
    #: kubeconfig (None: in-cluster config in a pod, else ~/.kube/config) and context
    kube_config: Path | None = None
    kube_context: str = Field(default="", max_length=253)
    #: the effect of stepguard's taint: NoSchedule (new pods stay off) or NoExecute
    #: (pods without a toleration are evicted by Kubernetes too)
    kube_taint_effect: Literal["NoSchedule", "NoExecute"] = "NoSchedule"
    #: write the condition StepguardHealthy=False (needs nodes/status patch)
    kube_node_condition: bool = True
    #: pod labels whose value is the stepguard job id (the pods a RESTART evicts)
    kube_job_labels: str = (
        "jobset.sigs.k8s.io/jobset-name,training.kubeflow.org/job-name,batch.kubernetes.io/job-name"
    )
    #: namespaces whose pods may be evicted, comma-separated (empty: every namespace)
    kube_namespaces: str = ""
    kube_timeout_s: float = Field(default=30.0, gt=0, le=600)
    #: a fault on one named GPU taints that device (a DRA DeviceTaintRule) instead of
    #: cordoning the node, where the node publishes it (a ResourceSlice of the driver)
    kube_device_taints: bool = False
    kube_dra_driver: str = Field(
        default="gpu.nvidia.com", pattern=r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$"
    )
    #: the device's name in the driver's ResourceSlice, from the GPU index
    kube_dra_device: str = Field(default="gpu-{index}", pattern=r"^[a-z0-9-]*\{index\}[a-z0-9-]*$")
    #: a held action nobody approved or rejected for this long expires (archived)
    hold_ttl_s: float = Field(default=1800.0, gt=0)
    #: hard cap of each of the actuator's memory maps (oldest dropped first); the
    #: normal bound is time (the guard window, cooldowns, stale and hold horizons)
    actuator_max_tracked: int = Field(default=10_000, ge=100)

    # -- Alertmanager bridge (``stepguard alertmanager``) -------------------------------
    #: Alertmanager's base URL (``http://host:9093``); secret (it may carry credentials):
    #: read it through :attr:`alertmanager`; empty: no bridge
    alertmanager_url: SecretStr = SecretStr("")
    #: the ``cluster`` label of every alert pushed
    alertmanager_cluster: str = Field(default="stepguard", min_length=1, max_length=128)
    #: base of each alert's ``runbook_url`` annotation (the alert kind is appended)
    alertmanager_runbook_url: str = Field(default="", pattern=r"^(https?://\S*)?$")
    #: a firing alert is sent with endsAt = now + this: Alertmanager ends it unless it
    #: is sent again in time (like its own resolve_timeout, which needs no endsAt)
    alertmanager_resolve_timeout_s: float = Field(default=300.0, gt=0)
    #: how often a firing episode is sent again (shorter than the resolve timeout)
    alertmanager_resend_s: float = Field(default=60.0, gt=0)
    #: a firing episode with no update for this long is no longer re-sent
    alertmanager_episode_ttl_s: float = Field(default=6 * 3600.0, gt=0)
    #: firing episodes the bridge keeps at most (oldest dropped first)
    alertmanager_max_episodes: int = Field(default=10_000, ge=1)
    alertmanager_timeout_s: float = Field(default=5.0, gt=0)
    alertmanager_retries: int = Field(default=3, ge=0)
    alertmanager_metrics_port: int = Field(default=9112, ge=0, le=65535)

    clickhouse_dsn: SecretStr | None = None
    chdb_path: Path = Path(".stepguard/archive")
    state_dir: Path = Path(".stepguard")

    @field_validator("clickhouse_dsn")
    @classmethod
    def _check_dsn(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value():
            return None
        parts = urlsplit(value.get_secret_value())
        if parts.scheme not in ("clickhouse", "clickhouses") or not parts.hostname:
            raise ValueError("expected clickhouse://[user[:password]@]host[:port][/database]")
        return value

    @field_validator("alertmanager_url")
    @classmethod
    def _check_alertmanager_url(cls, value: SecretStr) -> SecretStr:
        url = value.get_secret_value().strip()
        if url and not (url.startswith(("http://", "https://")) and urlsplit(url).hostname):
            raise ValueError("expected http(s)://host[:port][/path]")  # never quote it
        return SecretStr(url)

    @model_validator(mode="after")
    def _check_resend(self) -> Settings:
        if self.alertmanager_resend_s >= self.alertmanager_resolve_timeout_s:
            raise ValueError(
                "ALERTMANAGER_RESEND_S must be shorter than ALERTMANAGER_RESOLVE_TIMEOUT_S "
                "(or Alertmanager ends firing alerts between two sends)"
            )
        return self

    @field_validator("kube_config")
    @classmethod
    def _check_kube_config(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"no such file: {value}")
        return value

    @field_validator("kube_job_labels")
    @classmethod
    def _check_kube_job_labels(cls, value: str) -> str:
        labels = [x.strip() for x in value.split(",") if x.strip()]
        if not labels:
            raise ValueError("expected at least one pod label key")
        for label in labels:
            if not _LABEL_KEY.fullmatch(label):
                raise ValueError(f"{label!r} is not a label key (prefix/name)")
        return ",".join(labels)

    @field_validator("kube_namespaces")
    @classmethod
    def _check_kube_namespaces(cls, value: str) -> str:
        names = [x.strip() for x in value.split(",") if x.strip()]
        for name in names:
            if not _DNS_LABEL.fullmatch(name):
                raise ValueError(f"{name!r} is not a namespace name")
        return ",".join(names)

    @field_validator("actuator_action_modes")
    @classmethod
    def _check_action_modes(cls, value: str) -> str:
        _action_mode_pairs(value)
        return value.strip()

    @property
    def action_modes(self) -> list[tuple[str, str]]:
        """(recommended action, mode) pairs of ``actuator_action_modes``."""
        return _action_mode_pairs(self.actuator_action_modes)

    @property
    def kube_job_label_keys(self) -> list[str]:
        return [x for x in self.kube_job_labels.split(",") if x]

    @property
    def kube_namespace_list(self) -> list[str]:
        return [x for x in self.kube_namespaces.split(",") if x]

    @property
    def spare_pool(self) -> list[str]:
        return [n.strip() for n in self.spare_nodes.split(",") if n.strip()]

    @property
    def webhooks(self) -> list[str]:
        """The webhook URLs (secrets: log :func:`pipeline.io.redact.url_origin` of them)."""
        urls = self.webhook_urls.get_secret_value()
        return [u.strip() for u in urls.split(",") if u.strip()]

    @property
    def alertmanager(self) -> str:
        """Alertmanager's base URL without a trailing slash, or "" (a secret: log
        :func:`pipeline.io.redact.url_origin` of it)."""
        return self.alertmanager_url.get_secret_value().rstrip("/")

    @property
    def archive_backend(self) -> Literal["server", "chdb"]:
        return "server" if self.clickhouse_dsn is not None else "chdb"


def load_settings(env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
    """Read settings from ``env`` (default: the process environment) plus overrides.

    Raises :class:`ConfigError` naming the ``STEPGUARD_*`` variable that is wrong.
    """
    return _load(Settings, env, overrides)


def load_client_settings(
    env: Mapping[str, str] | None = None, **overrides: object
) -> ClientSettings:
    """:func:`load_settings` for training code: only the client's variables are read.

    >>> load_client_settings({"STEPGUARD_KAFKA_BOOTSTRAP": "k1:9092"}).kafka_bootstrap
    'k1:9092'
    >>> "worker_max_jobs" in ClientSettings.model_fields
    False
    """
    return _load(ClientSettings, env, overrides)


_S = TypeVar("_S", bound=BaseSettings)


def _load(cls: type[_S], env: Mapping[str, str] | None, overrides: dict[str, object]) -> _S:
    try:
        if env is None:
            return cls(**overrides)  # type: ignore[arg-type]
        values: dict[str, object] = {
            k[len(ENV_PREFIX) :].lower(): v for k, v in env.items() if k.startswith(ENV_PREFIX)
        }
        values.update(overrides)
        return cls.model_validate(values)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            field = ".".join(str(p) for p in err["loc"])
            name = f"{ENV_PREFIX}{field.upper()}" if field else "settings"
            problems.append(f"{name}: {err['msg']}")
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from exc


def _action_mode_pairs(text: str) -> list[tuple[str, str]]:
    """``kind=mode,...`` as pairs; an unknown kind or mode, or a kind twice, is refused."""
    kinds = ("none", "investigate", "isolate", "replace_at_checkpoint", "restart", "rollback")
    modes = ("observe", "approve", "auto")
    pairs: list[tuple[str, str]] = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        kind, sep, mode = (v.strip() for v in item.partition("="))
        if not sep or kind not in kinds or mode not in modes:
            raise ValueError(
                f"{item!r}: expected kind=mode, kind one of {', '.join(kinds)}, mode one of "
                f"{', '.join(modes)}"
            )
        if kind in dict(pairs):
            raise ValueError(f"{kind} is given twice")
        pairs.append((kind, mode))
    return pairs
