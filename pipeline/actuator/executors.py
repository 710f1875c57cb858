"""Executors: what turns a signed command into an effect, and the loop that feeds them.

==================  ======================================================================
Executor            Effect
==================  ======================================================================
``DryRunExecutor``  logs what it would do; every command kind
``SlurmExecutor``   ISOLATE: ``scontrol update NodeName=X State=DRAIN Reason=...``;
                    :meth:`SlurmExecutor.resume` puts a node back (``State=RESUME``).
                    Argument lists only (no shell); node names must match
                    :data:`NODE_NAME` or nothing runs.
``WebhookExecutor`` POSTs an Alertmanager webhook payload (version 4) per command to every
                    URL, with a timeout and retries; every command kind
job controller      the training job itself, via :class:`pipeline.listener.CommandListener`
==================  ======================================================================

Every executor refuses unsigned, wrongly signed, expired and observe-mode commands
(:func:`~pipeline.actuator.signing.check_command`, with the actuator's public keys
``STEPGUARD_ACTUATOR_PUBLIC_KEYS``), and commands issued more than
``STEPGUARD_MAX_CLOCK_SKEW_S`` beyond its clock, and says so with a REFUSED result; a
command whose signature is not even well-formed does not decode and goes to the
dead-letter topic.
When the command carries the job's known nodes (``job_nodes``, signed with it: the nodes
the actuator saw named in worker-signed alerts of that job), a target outside them is
refused too.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import time
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from pipeline.actuator.signing import (
    FinishedCommands,
    PublicKeys,
    check_command,
    public_keys,
    sign,
    signature_problem,
    signing_key,
)
from pipeline.clockskew import future_dated
from pipeline.errors import StepguardError
from pipeline.kafka import (
    assigned_consumer,
    consume_decoded,
    control_producer,
    create_topics,
    publish,
    read_back,
    registry_of,
)
from pipeline.metrics import ExecutorMetrics
from pipeline.redact import redact, url_origin, url_secrets
from pipeline.settings import Settings
from schemas import Command, CommandKind, CommandResult, CommandStatus

__all__ = [
    "NODE_NAME",
    "DryRunExecutor",
    "ExecutionError",
    "Executor",
    "ExecutorRunner",
    "InvalidNodeName",
    "SlurmExecutor",
    "WebhookExecutor",
    "alertmanager_payload",
    "make_executor",
    "validate_node_name",
]

log = logging.getLogger(__name__)

#: What a node name may look like before it goes anywhere near ``scontrol``.
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_REASON_UNSAFE = re.compile(r"[^A-Za-z0-9 ._:/,=+-]")
_FINAL = (CommandStatus.SUCCEEDED, CommandStatus.FAILED)


class ExecutionError(StepguardError):
    """An executor could not carry out a command."""


class InvalidNodeName(ExecutionError, ValueError):
    """A node name failed validation; nothing was run."""


def validate_node_name(name: str) -> str:
    """Return ``name`` if it is a plain host name, else raise :class:`InvalidNodeName`.

    >>> validate_node_name("gpu-node-017")
    'gpu-node-017'
    >>> validate_node_name("node1; rm -rf /")
    Traceback (most recent call last):
    ...
    pipeline.actuator.executors.InvalidNodeName: invalid node name 'node1; rm -rf /'
    """
    if not NODE_NAME.fullmatch(name):
        raise InvalidNodeName(f"invalid node name {name!r}")
    return name


class Executor(ABC):
    """Carries out the command kinds it handles; ``execute`` returns a detail string."""

    name: str = "executor"

    @abstractmethod
    def handles(self, cmd: Command) -> bool: ...

    @abstractmethod
    def execute(self, cmd: Command) -> str:
        """Do it; raise :class:`ExecutionError` on failure."""


class DryRunExecutor(Executor):
    name = "dry-run"

    def handles(self, cmd: Command) -> bool:
        return True

    def execute(self, cmd: Command) -> str:
        detail = (
            f"dry-run: would {cmd.kind.value} job={cmd.job_id} targets={list(cmd.targets)} "
            f"replacements={list(cmd.replacements)} checkpoint_step={cmd.checkpoint_step}"
        )
        log.debug("%s (%s)", detail, cmd.command_id)  # the runner logs the result
        return detail


class SlurmExecutor(Executor):
    """Drain isolated nodes with ``scontrol`` (an argument list; never a shell)."""

    name = "slurm"

    def __init__(self, scontrol: str = "scontrol", timeout_s: float = 30.0) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.scontrol = scontrol
        self.timeout_s = timeout_s

    def handles(self, cmd: Command) -> bool:
        return cmd.kind is CommandKind.ISOLATE

    def execute(self, cmd: Command) -> str:
        nodes = [validate_node_name(n) for n in cmd.targets]  # all or nothing
        if not nodes:
            raise ExecutionError("ISOLATE without targets")
        reason = _REASON_UNSAFE.sub("_", f"stepguard {cmd.command_id}: {cmd.summary}")[:200]
        for node in nodes:
            self._scontrol(node, "DRAIN", reason)
        return f"drained {','.join(nodes)}"

    def resume(self, node: str) -> str:
        self._scontrol(validate_node_name(node), "RESUME", None)
        return f"resumed {node}"

    def _scontrol(self, node: str, state: str, reason: str | None) -> None:
        argv = [self.scontrol, "update", f"NodeName={node}", f"State={state}"]
        if reason is not None:
            argv.append(f"Reason={reason}")
        try:
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ExecutionError(f"{argv[0]} failed: {exc}") from exc
        if proc.returncode != 0:
            raise ExecutionError(
                f"scontrol {state} {node} exited {proc.returncode}: {proc.stderr.strip()[:300]}"
            )


def alertmanager_payload(cmd: Command, receiver: str = "stepguard") -> dict[str, Any]:
    """An Alertmanager webhook body (version 4) describing one command."""
    labels = {
        "alertname": f"stepguard_{cmd.kind.value}",
        "job_id": cmd.job_id,
        "command_id": cmd.command_id,
        "mode": cmd.mode.value,
        "severity": "info" if cmd.kind is CommandKind.NOTIFY else "critical",
    }
    if cmd.targets:
        labels["nodes"] = ",".join(cmd.targets)
    alert = {
        "status": "firing",
        "labels": labels,
        "annotations": {
            "summary": cmd.summary or f"stepguard {cmd.kind.value} for {cmd.job_id}",
            "replacements": ",".join(cmd.replacements),
            "fingerprints": ",".join(cmd.reason),
        },
        "startsAt": cmd.issued_at.isoformat(),
        "endsAt": cmd.expires_at.isoformat() if cmd.expires_at else "0001-01-01T00:00:00Z",
        "generatorURL": "",
        "fingerprint": cmd.command_id,
    }
    return {
        "version": "4",
        "groupKey": f"stepguard/{cmd.job_id}",
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": receiver,
        "groupLabels": {"job_id": cmd.job_id},
        "commonLabels": labels,
        "commonAnnotations": alert["annotations"],
        "externalURL": "",
        "alerts": [alert],
    }


class WebhookExecutor(Executor):
    """POST every command to Alertmanager-compatible webhooks (urllib, no new deps)."""

    name = "webhook"

    def __init__(
        self,
        urls: Sequence[str],
        *,
        timeout_s: float = 5.0,
        retries: int = 3,
        backoff_s: float = 0.2,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not urls:
            raise ValueError("urls must not be empty")
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"urls: {url_origin(url)} is not http(s)")
        if timeout_s <= 0 or retries < 0:
            raise ValueError("timeout_s must be positive and retries >= 0")
        self.urls = list(urls)
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self._sleep = sleep

    def handles(self, cmd: Command) -> bool:
        return True

    def execute(self, cmd: Command) -> str:
        body = json.dumps(alertmanager_payload(cmd)).encode()
        # a webhook URL often carries a token: results and logs name only its origin
        failed = [f"{url_origin(u)}: {err}" for u in self.urls if (err := self._post(u, body))]
        if failed:
            raise ExecutionError("; ".join(failed))
        return f"posted to {len(self.urls)} webhook(s)"

    def _post(self, url: str, body: bytes) -> str | None:
        error = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self._sleep(self.backoff_s * 2 ** (attempt - 1))
            req = urllib.request.Request(  # noqa: S310 - scheme checked in __init__
                url, data=body, method="POST", headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
                    if 200 <= resp.status < 300:
                        return None
                    error = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                error = f"HTTP {exc.code}"
                if 400 <= exc.code < 500 and exc.code not in (408, 429):
                    return error  # the receiver will not change its mind
            except (urllib.error.URLError, OSError, ValueError) as exc:  # ValueError: InvalidURL
                error = redact(str(getattr(exc, "reason", exc)), url_secrets(url))
            except Exception as exc:
                # makes the HTTP client raise: a failed post, never a dead executor
                detail = f"{type(exc).__name__}: {exc}"[:300]
                error = redact(detail, url_secrets(url))
            log.warning("webhook %s attempt %d failed: %s", url_origin(url), attempt + 1, error)
        return error


def make_executor(kind: str, settings: Settings) -> Executor:
    if kind == "dry-run":
        return DryRunExecutor()
    if kind == "slurm":
        return SlurmExecutor(settings.slurm_scontrol)
    if kind == "webhook":
        return WebhookExecutor(
            settings.webhooks, timeout_s=settings.webhook_timeout_s,
            retries=settings.webhook_retries,
        )  # fmt: skip
    raise ValueError(f"unknown executor {kind!r}; expected dry-run, slurm or webhook")


class ExecutorRunner:
    """Feed one executor from the commands topic; publish a result per command.

    Commands already answered by this executor (read back from the results topic at
    start) are skipped, so a restart never runs a command twice; each is forgotten once
    its command has expired (it is refused then anyway), and at most ``max_done`` are
    kept. Whatever an executor raises is a FAILED result with the error: the consumer
    goes on. Results are signed
    with the executor key (``STEPGUARD_EXECUTOR_PRIVATE_KEY``) and only results an
    executor key signed count when read back: a forged "succeeded" cannot pre-empt a
    real command (those are counted in :attr:`unsigned_results` and logged).

    Every command it answers is one INFO line (id, kind, job, targets, result and its
    detail) and counts in ``metrics`` (:class:`~pipeline.metrics.ExecutorMetrics`).
    """

    def __init__(
        self,
        settings: Settings,
        executor: Executor,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        metrics: ExecutorMetrics | None = None,
        max_done: int = 65_536,
    ) -> None:
        self.settings = settings
        self.executor = executor
        self.metrics = metrics or ExecutorMetrics()
        self.registry = registry_of(settings)
        self._keys: PublicKeys = public_keys(settings, "actuator", "executors")
        self._key = signing_key(settings, "executor", "executors (results are signed)")
        executor_keys = public_keys(settings, "executor")
        self._clock = clock
        create_topics(settings, ["commands", "results", "deadletter"])
        self._producer = control_producer(settings)
        #: commands this executor answered, until they expire (bounded)
        self.done = FinishedCommands(max_done)
        #: results read back that no executor key signed (ignored)
        self.unsigned_results = 0
        ttl = max(settings.command_ttl_s, settings.hold_ttl_s) + settings.max_clock_skew_s
        for rec in read_back(settings, "results"):
            res = rec.message
            assert isinstance(res, CommandResult)
            if res.executor != executor.name or res.status not in _FINAL:
                continue
            problem = signature_problem(res, executor_keys)
            if problem is not None:
                self.unsigned_results += 1
                log.warning("ignoring result of %s at %s[%d]@%d: %s", res.command_id,
                            rec.topic, rec.partition, rec.offset, problem)  # fmt: skip
                continue
            written = min(clock().timestamp(), (rec.timestamp_ms or 1e15) / 1000)
            self.done.add(res.command_id, datetime.fromtimestamp(written + ttl, UTC))
        self._consumer = assigned_consumer(
            settings,
            [self.registry.name("commands")],
            f"{settings.consumer_group}.executor.{executor.name}",
        )

    def result_for(self, cmd: Command) -> CommandResult | None:
        """Check, execute and describe one command (``None``: not ours, or done)."""
        if cmd.command_id in self.done:
            return None
        now = self._clock()
        problem = check_command(cmd, self._keys, now) or future_dated(
            cmd.issued_at, self.settings.max_clock_skew_s, now=now, field="issued_at"
        )
        if problem is None and not self.executor.handles(cmd):
            return None
        if problem is not None:  # not remembered: a forgery must not pre-empt a real id
            status, detail = CommandStatus.REFUSED, problem
            log.warning("%s refused %s: %s", self.executor.name, cmd.command_id, problem)
        else:
            self.done.add_command(cmd, self.settings.max_clock_skew_s, now)
            try:
                status, detail = CommandStatus.SUCCEEDED, self.executor.execute(cmd)
            except InvalidNodeName as exc:
                status, detail = CommandStatus.REFUSED, str(exc)
            except ExecutionError as exc:
                status, detail = CommandStatus.FAILED, str(exc)
            except Exception as exc:  # an executor's bug is a FAILED result, not a crash
                log.exception("%s failed on %s", self.executor.name, cmd.command_id)
                status, detail = CommandStatus.FAILED, f"{type(exc).__name__}: {exc}"
        return CommandResult(
            command_id=cmd.command_id, job_id=cmd.job_id, executor=self.executor.name,
            status=status, detail=detail[:2000], ts=self._clock(),
        )  # fmt: skip

    def poll_once(self, timeout_ms: int = 500) -> int:
        futures = []
        n = 0
        for rec in consume_decoded(self._consumer, self.registry, self._producer, timeout_ms):
            n += 1
            result = self.result_for(rec.message)  # type: ignore[arg-type]
            if result is not None:
                self._account(rec.message, result)  # type: ignore[arg-type]
                signed = sign(result, self._key)
                futures.append(publish(self._producer, self.registry, "results", signed))
        for fut in futures:
            fut.get(timeout=30)
        self._consumer.commit()
        self.done.expire(self._clock())
        self.metrics.consumed.labels(self.executor.name).inc(n)
        return n

    def _account(self, cmd: Command, result: CommandResult) -> None:
        """One INFO line and the metrics of one answered command."""
        name = self.executor.name
        status = result.status.value
        self.metrics.commands.labels(name, cmd.kind.value, status).inc()
        if result.status is CommandStatus.REFUSED:
            self.metrics.refused.labels(name).inc()
        log.info("%s: command %s %s job=%s targets=%s -> %s: %s", name, cmd.command_id,
                 cmd.kind.value, cmd.job_id, ",".join(cmd.targets) or "-", status,
                 result.detail)  # fmt: skip

    def run(self, stop: Callable[[], bool]) -> None:
        while not stop():
            self.poll_once()

    def close(self) -> None:
        self._consumer.close()
        self._producer.flush()
        self._producer.close()
