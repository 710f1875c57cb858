"""The job-controller side of the actuator: training code listens for commands.

A background thread consumes the commands topic, keeps the commands for this job,
refuses unsigned, wrongly signed, expired or observe-mode ones and those issued more
than ``STEPGUARD_MAX_CLOCK_SKEW_S`` beyond its wall clock (a REFUSED result; the actuator's
public keys ``STEPGUARD_ACTUATOR_PUBLIC_KEYS`` verify) and queues the rest; a
record that does not decode (a malformed signature, say) is logged and skipped. The
results it publishes are signed with the job controller's key
(``STEPGUARD_JOB_CONTROLLER_PRIVATE_KEY``, bound to this job by its key id; never the
executors' key): the worker acts on a SUCCEEDED relaunch only when the controller key of
the command's own job signed it. The background thread sends its ACCEPTED and REFUSED
results without waiting for the broker, and a Kafka error there is logged and counted
(:attr:`CommandListener.send_failures`), never raised inside the training loop. The
training loop applies the commands at its next step boundary::

    listener = CommandListener(settings, job_id="llm-7")
    listener.start()
    for step in range(start, total):
        train_one_step()
        for cmd in listener.poll_step_boundary(step):
            if cmd.kind is CommandKind.CHECKPOINT:
                save(step)
                listener.report(cmd, CommandStatus.SUCCEEDED, f"saved step {step}")

or with callbacks (``on_checkpoint``, ``on_restart``, ``on_rollback``, ``on_stop``,
``on_isolate``): each gets ``(command, step)`` and returns a detail string; the listener
reports SUCCEEDED, or FAILED when the callback raises.

Commands this listener already carried out (a SUCCEEDED or FAILED result read back
from the results topic at start, signed by this job's controller key) are skipped, so a
restarted training process does not restart itself again; a result no such key
signed is ignored (counted in ``unsigned_results``), so a forgery cannot pre-empt a
command. What it remembers is bounded (``max_done``) and forgotten once the command
has expired (it would be refused then anyway).

Lifecycle: before it calls ``on_checkpoint`` the listener announces a checkpoint phase
(the save that follows is not a hang); a STOP carried out announces the job's end
(cancelled); leaving ``with CommandListener(...)`` announces the end too (completed,
or failed when the block raised). ``close(reason=...)`` does the same by hand.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipeline.io.clockskew import future_dated
from pipeline.io.errors import ConfigError
from pipeline.io.kafka import (
    assigned_consumer,
    control_producer,
    create_topics,
    publish,
    read_back,
    registry_of,
)
from pipeline.io.metrics import ExecutorMetrics, serve_metrics
from pipeline.io.settings import ClientSettings
from pipeline.io.telemetry_auth import TelemetryProver
from pipeline.io.trust import (
    FinishedCommands,
    check_command,
    job_controller_key_id,
    public_keys,
    result_problem,
    sign,
    signing_key,
)
from schemas import (
    Command,
    CommandKind,
    CommandResult,
    CommandStatus,
    EndReason,
    JobEvent,
    JobEventKind,
    Phase,
    Rejected,
    decode,
)

__all__ = ["Callback", "CommandListener"]

log = logging.getLogger(__name__)

#: Results after which a command is never applied again (ACCEPTED is not final: a
#: process that died before the step boundary applies it after its restart).
_FINAL = (CommandStatus.SUCCEEDED, CommandStatus.FAILED)

#: ``callback(command, step) -> detail``
Callback = Callable[[Command, int], str]


class CommandListener:
    """Background consumer of one job's commands, applied at step boundaries.

    Parameters
    ----------
    settings
        Broker, topic prefix, ``actuator_public_keys`` (to verify commands) and
        ``job_controller_private_key`` (to sign results; its key id must be this job's,
        :func:`~pipeline.io.trust.job_controller_key_id`;
        :class:`~pipeline.io.errors.ConfigError` naming the variable otherwise).
    job_id
        Only commands for this job are considered.
    name
        Executor name on the results this listener publishes.
    clock
        Dates what the listener publishes (results, lifecycle events): a simulated
        job passes its own event time, so its announcements agree with its steps.
    wall_clock
        Judges the commands it reads (expiry, issued beyond it +
        ``STEPGUARD_MAX_CLOCK_SKEW_S``): the actuator dates them by its wall clock, so
        this is the wall clock even when ``clock`` is a job's back-dated event time.
    """

    def __init__(
        self,
        settings: ClientSettings,
        job_id: str,
        *,
        name: str = "job-controller",
        on_checkpoint: Callback | None = None,
        on_restart: Callback | None = None,
        on_rollback: Callback | None = None,
        on_stop: Callback | None = None,
        on_isolate: Callback | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        metrics: ExecutorMetrics | None = None,
        max_done: int = 65_536,
    ) -> None:
        #: results by kind and status, as an executor counts them (executor label:
        #: ``name``); served on STEPGUARD_LISTENER_METRICS_PORT when that is set
        self.metrics = metrics or ExecutorMetrics()
        if not job_id:
            raise ValueError("job_id must not be empty")
        self.settings = settings
        self.job_id = job_id
        self.name = name
        self._callbacks: dict[CommandKind, Callback | None] = {
            CommandKind.CHECKPOINT: on_checkpoint,
            CommandKind.RESTART: on_restart,
            CommandKind.ROLLBACK: on_rollback,
            CommandKind.STOP: on_stop,
            CommandKind.ISOLATE: on_isolate,
        }
        self._clock = clock
        self._wall_clock = wall_clock
        self._keys = public_keys(settings, "actuator", "the command listener")
        if settings.private_key("job_controller") is None:
            # a key from `stepguard keys generate` would not be one the running actuator
            # trusts: the right one is the key `up --job` made for this job
            env = Path(getattr(settings, "state_dir", ".stepguard")) / "job-controller.env"
            raise ConfigError(
                "STEPGUARD_JOB_CONTROLLER_PRIVATE_KEY is not set: the command listener signs "
                f"its results with job {job_id!r}'s controller key, which `stepguard up --job "
                f"{job_id}` wrote to {env} (the running services trust it): "
                f"set -a; . {env.parent / 'up.env'}; . {env}; set +a"
            )
        self._key = signing_key(
            settings, "job_controller", "the command listener (it signs results)"
        )
        if self._key.key_id.split(".", 1)[0] != job_controller_key_id(job_id):
            raise ConfigError(
                f"STEPGUARD_JOB_CONTROLLER_PRIVATE_KEY (key {self._key.key_id}) is not job "
                f"{job_id!r}'s controller key: `stepguard keys generate --role job_controller "
                f"--job {job_id}` makes one (key id {job_controller_key_id(job_id)})"
            )
        self._result_keys = public_keys(settings, "job_controller")
        #: results that could not be sent (a Kafka error: logged, never raised)
        self.send_failures = 0
        #: results read back at start that no executor key signed (ignored)
        self.unsigned_results = 0
        self.registry = registry_of(settings)
        self._queue: queue.Queue[Command] = queue.Queue()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._done = FinishedCommands(max_done)
        self._producer = control_producer(settings)
        self._prover = TelemetryProver(None, self._key)

    # -- lifecycle ---------------------------------------------------------------------
    def start(self, timeout_s: float = 30.0) -> CommandListener:
        """Read back past results, start the consumer thread, wait until it is assigned."""
        if self._thread is None:
            serve_metrics(self.metrics.registry, self.settings, "listener_metrics_port")
        create_topics(self.settings, ["commands", "results", "lifecycle"])
        for rec in read_back(self.settings, "results"):
            res = rec.message
            if (
                not isinstance(res, CommandResult)
                or res.executor != self.name
                or res.status not in _FINAL
            ):
                continue
            problem = result_problem(res, self._result_keys, "job_controller")
            if problem is not None:  # a forged "succeeded" must not pre-empt a command
                self.unsigned_results += 1
                log.warning("ignoring result of %s at %s[%d]@%d: %s", res.command_id,
                            rec.topic, rec.partition, rec.offset, problem)  # fmt: skip
                continue
            # remembered while its command could still be obeyed
            self._done.add(res.command_id, self._forget_at(rec.timestamp_ms))
        self._thread = threading.Thread(target=self._run, name="stepguard-listener", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError("command listener did not start")
        self._raise_if_failed()
        return self

    def close(self, reason: EndReason | str | None = None) -> None:
        """Stop listening; with a ``reason`` (completed, failed, cancelled), announce
        the job's end first."""
        if reason is not None:
            self.announce(JobEventKind.END, reason=EndReason(reason))
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._producer.flush()
        self._producer.close()

    def __enter__(self) -> CommandListener:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self.close(EndReason.COMPLETED if exc_type is None else EndReason.FAILED)

    def announce(self, kind: JobEventKind, step: int | None = None, **fields: Any) -> None:
        """Publish a lifecycle event of the job (does not wait for the broker)."""
        event = JobEvent(
            job_id=self.job_id, kind=kind, ts=self._clock(), step=step, source=self.name,
            **fields,
        )  # fmt: skip
        # its job's controller: the proof of a job-level event (pipeline.io.telemetry_auth)
        publish(self._producer, self.registry, "lifecycle", event, self._prover)

    # -- training-loop API -----------------------------------------------------------------
    def poll_step_boundary(self, step: int, wait_s: float = 0.0) -> list[Command]:
        """Commands to apply now. Kinds with a callback are applied and reported here.

        ``wait_s`` blocks up to that long for the first command (an idle job, a test).
        """
        self._raise_if_failed()
        out: list[Command] = []
        while True:
            try:
                if wait_s > 0 and not out:
                    cmd = self._queue.get(timeout=wait_s)
                    wait_s = 0.0
                else:
                    cmd = self._queue.get_nowait()
            except queue.Empty:
                return out
            callback = self._callbacks.get(cmd.kind)
            if callback is None:
                out.append(cmd)
                continue
            if cmd.kind is CommandKind.CHECKPOINT:  # the save is long: not a hang
                self.announce(JobEventKind.PHASE, step, phase=Phase.CHECKPOINT)
            try:
                detail = callback(cmd, step)
            except Exception as exc:  # the training code's failure, reported not raised
                log.exception("%s for %s failed", cmd.kind.value, cmd.command_id)
                self.report(cmd, CommandStatus.FAILED, f"{type(exc).__name__}: {exc}")
                continue
            self.report(cmd, CommandStatus.SUCCEEDED, detail)
            if cmd.kind is CommandKind.STOP:
                self.announce(JobEventKind.END, step, reason=EndReason.CANCELLED)
            out.append(cmd)

    def report(self, cmd: Command, status: CommandStatus, detail: str = "") -> None:
        """Publish the result of a command and wait (up to 30 s) for the broker's ack; a
        Kafka error is logged and counted in :attr:`send_failures`, never raised."""
        self._send(cmd, status, detail, wait=True)

    # -- internals ---------------------------------------------------------------------
    def _forget_at(self, timestamp_ms: int) -> datetime:
        """When a command answered at ``timestamp_ms`` (broker time; 0: now) has expired
        for certain: the longest a command lives (a hold's notice lives hold_ttl_s),
        plus the clock skew."""
        s = self.settings
        at = self._wall_clock().timestamp()
        if timestamp_ms > 0:
            at = min(at, timestamp_ms / 1000)
        # the client's settings hold no TTLs: the services' defaults (a command lives
        # command_ttl_s = 300 s, a hold's notice hold_ttl_s = 1800 s)
        ttl = max(getattr(s, "command_ttl_s", 300.0), getattr(s, "hold_ttl_s", 1800.0))
        ttl += s.max_clock_skew_s
        return datetime.fromtimestamp(at + ttl, UTC)

    def _send(self, cmd: Command, status: CommandStatus, detail: str, *, wait: bool) -> None:
        result = CommandResult(
            command_id=cmd.command_id, job_id=cmd.job_id, executor=self.name, status=status,
            detail=detail[:2000], ts=self._clock(),
        )  # fmt: skip
        signed = sign(result, self._key)
        try:
            future = publish(self._producer, self.registry, "results", signed)
            if wait:
                future.get(timeout=30)
            else:
                future.add_errback(self._send_failed, cmd.command_id, status)
        except Exception as exc:
            self._send_failed(cmd.command_id, status, exc)
        self.metrics.commands.labels(self.name, cmd.kind.value, status.value).inc()
        if status is CommandStatus.REFUSED:
            self.metrics.refused.labels(self.name).inc()
        # one line per command carried out (or refused); the queueing is a detail
        level = logging.DEBUG if status is CommandStatus.ACCEPTED else logging.INFO
        log.log(level, "%s: command %s %s job=%s targets=%s -> %s: %s", self.name,
                cmd.command_id, cmd.kind.value, cmd.job_id, ",".join(cmd.targets) or "-",
                status.value, result.detail)  # fmt: skip

    def _send_failed(self, command_id: str, status: CommandStatus, exc: BaseException) -> None:
        self.send_failures += 1
        log.error("could not send the %s result of %s: %r", status.value, command_id, exc)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError("command listener thread failed") from self._error

    def _run(self) -> None:
        try:
            consumer = assigned_consumer(self.settings, [self.registry.name("commands")], None)
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        try:
            consumer.seek_to_beginning(*consumer.assignment())
            self._ready.set()
            while not self._stop.is_set():
                for tp, records in consumer.poll(timeout_ms=200).items():
                    for rec in records:
                        cmd = decode(Command, rec.value, topic=tp.topic, partition=tp.partition,
                                     offset=rec.offset)  # fmt: skip
                        if isinstance(cmd, Rejected):
                            log.warning("undecodable command at %s[%d]@%d: %s", tp.topic,
                                        tp.partition, rec.offset, cmd.error)  # fmt: skip
                            continue
                        try:
                            self._offer(cmd)
                        except Exception:  # one command never stops the listener
                            log.exception("command at %s[%d]@%d not handled", tp.topic,
                                          tp.partition, rec.offset)  # fmt: skip
                self._done.expire(self._wall_clock())
        except BaseException as exc:
            self._error = exc
            log.exception("command listener stopped")
        finally:
            consumer.close()

    def _offer(self, cmd: Command) -> None:
        if cmd.job_id != self.job_id or cmd.command_id in self._done:
            return
        now = self._wall_clock()  # the actuator's commands are dated by its wall clock
        problem = check_command(cmd, self._keys, now) or future_dated(
            cmd.issued_at, self.settings.max_clock_skew_s, now=now, field="issued_at"
        )
        if problem is not None:
            # not remembered: a forgery must not pre-empt the genuine command's id
            log.warning("refusing %s %s: %s", cmd.kind.value, cmd.command_id, problem)
            self._send(cmd, CommandStatus.REFUSED, problem, wait=False)
            return
        self._done.add_command(cmd, self.settings.max_clock_skew_s, now)
        if cmd.kind is CommandKind.NOTIFY:
            return  # for people, not for the training loop
        self._send(cmd, CommandStatus.ACCEPTED, "queued for the next step boundary", wait=False)
        self._queue.put(cmd)
