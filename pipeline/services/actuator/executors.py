"""Executors: what turns a signed command into an effect, and the loop that feeds them.

==================  ======================================================================
Executor            Effect
==================  ======================================================================
``DryRunExecutor``  logs what it would do; every command kind
``SlurmExecutor``   ISOLATE: reads the node, drains it (``scontrol update ... State=DRAIN``)
                    with the reason ``stepguard: <cause> (incident <key>)`` unless it is
                    already drained/down/failed (that node and its reason are left alone,
                    the result says who isolated it); RESTART of jobs configured as Slurm
                    jobs: requeue excluding the targets; ``resume-node`` only of its own
                    drains (``--force`` overrides). Argument lists only (no shell); node
                    names must match :data:`NODE_NAME` or nothing runs. It lives in
                    :mod:`pipeline.services.actuator.slurm`, the base class and
                    errors every executor shares in :mod:`~pipeline.services.actuator.base`
``WebhookExecutor`` POSTs an Alertmanager webhook payload (version 4) per command to every
                    URL, with a timeout and retries; every command kind: ``firing`` when
                    it runs, ``resolved`` once the command has expired (for receivers
                    without Alertmanager; ``stepguard alertmanager`` sends episodes)
Kubernetes          ISOLATE: cordon + a ``stepguard.io/unhealthy`` taint + provenance
                    annotations + a ``StepguardHealthy=False`` condition, on nodes nobody
                    else isolated; RESTART: evicts the job's pods on its targets (Eviction
                    API). In :mod:`pipeline.services.actuator.kubernetes`
job controller      the training job itself, via :class:`pipeline.client.listener.CommandListener`
==================  ======================================================================

Every executor refuses unsigned, wrongly signed, expired and observe-mode commands
(:func:`~pipeline.io.trust.check_command`, with the actuator's public keys
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
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from pipeline.io.clockskew import future_dated
from pipeline.io.kafka import (
    assigned_consumer,
    consume_decoded,
    control_producer,
    create_topics,
    publish,
    read_back,
    registry_of,
)
from pipeline.io.metrics import ExecutorMetrics
from pipeline.io.redact import redact, url_origin, url_secrets
from pipeline.io.settings import ExecutorSettings, Settings
from pipeline.io.trust import (
    FinishedCommands,
    PublicKeys,
    check_command,
    public_keys,
    sign,
    signature_problem,
    signing_key,
)
from pipeline.services.actuator.base import (
    NODE_NAME,
    ExecutionError,
    Executor,
    InvalidNodeName,
    validate_node_name,
)
from pipeline.services.actuator.kinds import EXECUTOR_KINDS, executor_kind
from pipeline.services.actuator.slurm import SlurmExecutor, SlurmJobs
from schemas import Command, CommandKind, CommandResult, CommandStatus

__all__ = [
    "EXECUTORS",
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

_FINAL = (CommandStatus.SUCCEEDED, CommandStatus.FAILED)


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


_NO_END = "0001-01-01T00:00:00Z"  # Alertmanager's "no end yet" time


def alertmanager_payload(
    cmd: Command, receiver: str = "stepguard", *, resolved_at: datetime | None = None
) -> dict[str, Any]:
    """An Alertmanager webhook body (version 4) for one command: one alert per target
    node (labels ``job`` and ``node``), ``severity`` from the alert's grade; ``firing``
    with no end, or ``resolved`` at ``resolved_at``. A command without a grade (from an
    older actuator): ``info`` for a NOTIFY, ``critical`` for anything else."""
    if cmd.grade is not None:
        severity = cmd.grade.value
    else:
        severity = "info" if cmd.kind is CommandKind.NOTIFY else "critical"
    status = "firing" if resolved_at is None else "resolved"
    common = {
        "alertname": f"stepguard_{cmd.kind.value}", "job": cmd.job_id,
        "command_id": cmd.command_id, "mode": cmd.mode.value, "severity": severity,
    }  # fmt: skip
    annotations = {
        "summary": cmd.summary or f"stepguard {cmd.kind.value} for {cmd.job_id}",
        "replacements": ",".join(cmd.replacements),
        "fingerprints": ",".join(cmd.reason),
    }
    alerts = [
        {
            "status": status,
            "labels": common | ({"node": node} if node else {}),
            "annotations": annotations,
            "startsAt": cmd.issued_at.isoformat(),
            "endsAt": _NO_END if resolved_at is None else resolved_at.isoformat(),
            "generatorURL": "",
            "fingerprint": f"{cmd.command_id}/{node}" if node else cmd.command_id,
        }
        for node in (cmd.targets or ("",))
    ]
    return {
        "version": "4",
        "groupKey": f"stepguard/{cmd.job_id}",
        "truncatedAlerts": 0,
        "status": status,
        "receiver": receiver,
        "groupLabels": {"job": cmd.job_id},
        "commonLabels": alerts[0]["labels"] if len(alerts) == 1 else common,
        "commonAnnotations": annotations,
        "externalURL": "",
        "alerts": alerts,
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
        #: commands posted firing, until their resolved message (oldest first; bounded)
        self.open: OrderedDict[str, Command] = OrderedDict()
        self.max_open = 10_000

    def handles(self, cmd: Command) -> bool:
        return True

    def execute(self, cmd: Command) -> str:
        failed = self._send(alertmanager_payload(cmd))
        if cmd.expires_at is not None and not failed:  # resolved once it expires (tick)
            self.open[cmd.command_id] = cmd
            while len(self.open) > self.max_open:
                self.open.popitem(last=False)
        if failed:
            raise ExecutionError(failed)
        return f"posted to {len(self.urls)} webhook(s)"

    def tick(self, now: datetime) -> None:
        """Send the resolved message of every posted command that has expired."""
        for cid, cmd in list(self.open.items()):
            assert cmd.expires_at is not None
            if cmd.expires_at <= now:
                del self.open[cid]
                failed = self._send(alertmanager_payload(cmd, resolved_at=cmd.expires_at))
                if failed:
                    log.warning("webhook: resolved message of %s not delivered: %s", cid, failed)

    def _send(self, payload: dict[str, Any]) -> str:
        body = json.dumps(payload).encode()
        # a webhook URL often carries a token: results and logs name only its origin
        return "; ".join(
            f"{url_origin(u)}: {err}" for u in self.urls if (err := self._post(u, body))
        )

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
                try:  # the receiver's reason (Alertmanager: a Go unmarshal error)
                    text = exc.read(500).decode("utf-8", errors="replace").strip()
                except OSError:
                    text = ""
                text = redact(text, url_secrets(url))
                error = f"HTTP {exc.code}: {text}" if text else f"HTTP {exc.code}"
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


def _slurm(settings: ExecutorSettings) -> Executor:
    jobs = SlurmJobs.parse(settings.slurm_jobs, settings.slurm_job_prefix)
    return SlurmExecutor(settings.slurm_scontrol, jobs=jobs)


def _webhook(settings: ExecutorSettings) -> Executor:
    return WebhookExecutor(
        settings.webhooks, timeout_s=settings.webhook_timeout_s,
        retries=settings.webhook_retries,
    )  # fmt: skip


def _kubernetes(settings: ExecutorSettings) -> Executor:
    # imported here: the kubernetes client is an optional extra
    from pipeline.services.actuator.kubernetes import KubernetesExecutor, load_api_client

    return KubernetesExecutor(
        load_api_client(settings.kube_config, settings.kube_context),
        taint_effect=settings.kube_taint_effect, node_condition=settings.kube_node_condition,
        job_labels=settings.kube_job_label_keys, namespaces=settings.kube_namespace_list,
        device_taints=settings.kube_device_taints, dra_driver=settings.kube_dra_driver,
        dra_device=settings.kube_dra_device, timeout_s=settings.kube_timeout_s,
    )  # fmt: skip


_BUILDERS: dict[str, Callable[[ExecutorSettings], Executor]] = {
    "dry-run": lambda _settings: DryRunExecutor(),
    "slurm": _slurm,
    "webhook": _webhook,
    "kubernetes": _kubernetes,
}
#: how ``stepguard executor KIND`` builds each kind of
#: :data:`~pipeline.services.actuator.kinds.EXECUTOR_KINDS` (the one list of kinds; a
#: kind without a builder fails here, at import)
EXECUTORS: dict[str, Callable[[ExecutorSettings], Executor]] = {
    k: _BUILDERS[k] for k in EXECUTOR_KINDS
}


def make_executor(kind: str, settings: ExecutorSettings) -> Executor:
    """The executor of ``kind`` (one of :data:`EXECUTORS`) built from ``settings``."""
    return EXECUTORS[executor_kind(kind).name](settings)


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
    detail) and counts in ``metrics`` (:class:`~pipeline.io.metrics.ExecutorMetrics`).
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
        self.executor.tick(self._clock())
        self.metrics.consumed.labels(self.executor.name).inc(n)
        self.metrics.readiness.polled()
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
