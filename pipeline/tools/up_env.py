"""The environment of ``stepguard up``'s children: which signing keys each kind gets
(:data:`_KEY_NEEDS`: a private key only to the role that signs), the inherited
environment less every private key, and the variables of a job, scenario or Alertmanager."""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from pathlib import Path

from pipeline.io.errors import ConfigError
from pipeline.io.settings import ENV_PREFIX, Role, Settings

TELEMETRY_SECRET = f"{ENV_PREFIX}TELEMETRY_SECRET"
TELEMETRY_NODE_KEYS = f"{ENV_PREFIX}TELEMETRY_NODE_KEYS"

#: which keys each kind of child needs: the private key it signs with (if any), and
#: the roles whose public keys it verifies with
_KEY_NEEDS: dict[str, tuple[Role | None, tuple[Role, ...]]] = {
    "actuator": ("actuator", ("actuator", "worker", "operator")),
    # acts on its job's controller's results; applies operator-signed detector settings
    "worker": ("worker", ("actuator", "job_controller", "executor", "operator")),
    "executor": ("executor", ("actuator", "executor")),  # signs results, reads its own
    # the job's CommandListener: signs its results with its job's controller key (a
    # training process never holds the executors' key)
    "simulate": ("job_controller", ("actuator", "job_controller")),
    # verifies what it archives as signed (pipeline.services.archive.trust): alerts, commands,
    # action records, approvals, control changes and command results
    "archiver": (None, ("actuator", "worker", "operator", "executor", "job_controller")),
    # the Alertmanager bridge: worker-signed alerts, the actuator's guardrails and holds
    "alertmanager": (None, ("actuator", "worker")),
}


def signing_env(
    settings: Settings, run_id: str, job: str | None = None
) -> tuple[dict[str, dict[str, str]], list[str]]:
    """The signing-key variables of each kind of child, and notes for the person.

    Every role that has no private key configured (actuator: commands, worker: alerts)
    gets a fresh Ed25519 key pair for this run; a configured private key adds its own
    public key to its role's list, so children that only verify need nothing more.
    The job controller's key is bound to ``job`` (its key id,
    :func:`~pipeline.io.trust.job_controller_key_id`); without a job none is
    made. A child gets only the private key it signs with (:data:`_KEY_NEEDS`); kind
    ``job`` holds what the training job needs (its controller's private key, written
    to a file only the user can read). The one place that knows how keys are configured.
    """
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from pipeline.io.settings import ROLES
    from pipeline.io.trust import SigningKey, job_controller_key_id

    private: dict[Role, str] = {}
    public: dict[Role, str] = {}
    made = []
    for role in ROLES:
        pair = settings.private_key(role)
        own: SigningKey | None = None
        if pair is not None:
            own = SigningKey(pair[0], Ed25519PrivateKey.from_private_bytes(pair[1]))
        elif role == "job_controller":
            if job is not None:  # bound to its job
                own = SigningKey.generate(job_controller_key_id(job, f"up-{run_id}"[:30]))
                made.append("job controller")
        elif role != "operator":  # operators sign in their own shell, with their own key
            own = SigningKey.generate(f"up-{run_id}-{role}")
            made.append(role)
        listed = getattr(settings, f"{role}_public_keys")
        if own is not None:
            private[role] = own.private_text()
            listed = ",".join(x for x in (own.public_text(), listed) if x)
        public[role] = listed
    by_kind: dict[str, dict[str, str]] = {}
    for kind, (signs, verifies) in _KEY_NEEDS.items():
        env = {f"{ENV_PREFIX}{r.upper()}_PUBLIC_KEYS": public[r] for r in verifies if public[r]}
        if signs is not None and signs in private:
            env[f"{ENV_PREFIX}{signs.upper()}_PRIVATE_KEY"] = private[signs]
        by_kind[kind] = env
    by_kind["job"] = dict(by_kind["simulate"])  # what a real training job of ``job`` needs
    # telemetry proofs: the worker derives every node's key from the cluster secret; the
    # simulator and a job watched on this host speak for all their nodes, so they hold it
    # too (a real cluster gives each node its own key: `stepguard keys node`)
    if settings.telemetry_auth == "on":
        configured = settings.telemetry_secret
        secret = configured.get_secret_value() if configured is not None else None
        if secret is None:
            secret = base64.b64encode(os.urandom(32)).decode("ascii")
            made.append("telemetry")
        for kind in ("worker", "simulate", "job"):
            by_kind[kind][TELEMETRY_SECRET] = secret
    notes = []
    if made:
        notes.append(f"ephemeral {' and '.join(made)} signing keys for this run")
    if not public["operator"]:
        notes.append(
            "no STEPGUARD_OPERATOR_PUBLIC_KEYS: approve/reject/control are refused "
            "(`stepguard keys generate --role operator`, then restart up)"
        )
    return by_kind, notes


def child_env(base: Mapping[str, str], overrides: Mapping[str, str]) -> dict[str, str]:
    """The environment of one child: the inherited one (PATH, HOME, the configured
    ``STEPGUARD_*``) less every private key and telemetry secret, unbuffered output,
    then ``overrides`` (a child gets back only the private key it signs with, and the
    telemetry secret when it needs it)."""
    env = {k: v for k, v in base.items() if not is_secret_variable(k)}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(overrides)
    return env


def is_secret_variable(name: str) -> bool:
    """Whether ``name`` holds a key a child gets only when it needs it.

    >>> is_secret_variable("STEPGUARD_WORKER_PRIVATE_KEY"), is_secret_variable(TELEMETRY_SECRET)
    (True, True)
    >>> is_secret_variable("STEPGUARD_WORKER_PUBLIC_KEYS")
    False
    """
    return name.endswith("_PRIVATE_KEY") or name in (TELEMETRY_SECRET, TELEMETRY_NODE_KEYS)


def _node_list(text: str | None, prefix: str) -> tuple[int, list[str]]:
    """``--nodes``/``--spares``: a count (names made from ``prefix`` for spares) or
    comma-separated names.

    >>> _node_list("2", ""), _node_list("spare-a,spare-b", "spare-")
    ((2, []), (2, ['spare-a', 'spare-b']))
    >>> _node_list("1", "spare-")
    (1, ['spare-0'])
    """
    if not text:
        return 0, []
    if text.strip().isdigit():
        n = int(text)
        return n, [f"{prefix}{i}" for i in range(n)] if prefix else []
    names = [x.strip() for x in text.split(",") if x.strip()]
    if len(set(names)) != len(names):
        raise ConfigError(f"a node is named twice in {text!r}")
    return len(names), names


def _alertmanager_target(url: str | None) -> tuple[str, ...]:
    """``host:port`` of an Alertmanager URL, for Prometheus's ``alertmanagers`` (its own
    health alerts go where the episodes go).

    >>> _alertmanager_target("http://127.0.0.1:19094"), _alertmanager_target(None)
    (('127.0.0.1:19094',), ())
    """
    if not url:
        return ()
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return (f"{parts.hostname}:{port}",)


def _scenario_env(
    name: str, base_env: Mapping[str, str], run_id: str, mode: str | None = None
) -> tuple[str, dict[str, str], list[str]]:
    """The job id of the played scenario, and the actuator settings it needs (``mode``:
    ``--mode``, which wins over STEPGUARD_ACTUATOR_MODE and the scenario's auto)."""
    from pipeline.tools.simulator import SimulatedJob, find_scenario

    sc = find_scenario(name)
    job_id = f"{sc.job}-{run_id}"
    env: dict[str, str] = {f"{ENV_PREFIX}GUARD_JOB_NODES": str(sc.nodes)}
    notes = [f"scenario {sc.name}: job {job_id}, {sc.nodes} nodes, {sc.steps} steps"]
    if mode is not None:
        env[f"{ENV_PREFIX}ACTUATOR_MODE"] = mode
        notes.append(f"actuator in {mode} mode for the simulated job (--mode)")
    elif f"{ENV_PREFIX}ACTUATOR_MODE" not in base_env:
        env[f"{ENV_PREFIX}ACTUATOR_MODE"] = "auto"
        notes.append("actuator in auto mode for the simulated job (STEPGUARD_ACTUATOR_MODE)")
    if f"{ENV_PREFIX}SPARE_NODES" not in base_env:
        env[f"{ENV_PREFIX}SPARE_NODES"] = ",".join(SimulatedJob(sc).spare_pool)
    return job_id, env, notes


def write_job_env(path: Path, env: Mapping[str, str]) -> None:
    """Write the job's secret variables to ``path``, readable by the user only (the
    file is created 0600 before anything is written to it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("".join(f"{k}={v}\n" for k, v in env.items()))
    tmp.replace(path)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
