"""Supervision of child processes: when to start, restart and stop each service.

:class:`Supervisor` holds every decision and nothing else: what to start now, what an
exit means (restart after a backoff, done, failed) and in which order to stop. It is a
pure function of the exit codes and clock readings it is given, so it is tested in
milliseconds. :class:`ProcessGroup` drives it: it spawns children through a
:class:`Spawner`, polls them, and stops them tier by tier (SIGTERM, then SIGKILL after
a grace period). ``stepguard up`` (:mod:`pipeline.tools.up`) gives it real processes.

Restart policy, as in systemd and docker-compose's ``restart: unless-stopped``:

- a long-running service that exits, with any code (a worker's exit 75 when its table
  recovery stalls included), is restarted after a backoff: 1 s, doubling up to 30 s;
- a service that stayed up for 60 s starts again from the shortest backoff;
- a one-shot service (topic creation, the scenario player) is done when it exits 0;
  ``on-failure`` restarts it on any other code, ``never`` marks it failed.

A service starts once each service it waits for (``after``) is ready (long-running:
a probe passed, or started when it has no probe) or done (one-shot). When a service is
started again, the one-shot services that wait for it run again (topics are created
again on a restarted in-memory broker).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, Protocol

__all__ = [
    "Backoff",
    "Process",
    "ProcessGroup",
    "ServiceSpec",
    "ServiceState",
    "ServiceStatus",
    "Spawner",
    "Supervisor",
]

Restart = Literal["always", "on-failure", "never"]


@dataclass(frozen=True)
class Backoff:
    """Delay before restart number ``failures`` in a row: ``initial_s`` doubling
    (``factor``) up to ``max_s``; ``reset_after_s`` of uptime forgets past failures.

    >>> [Backoff().delay(n) for n in (1, 2, 3, 5, 6, 9)]
    [1.0, 2.0, 4.0, 16.0, 30.0, 30.0]
    """

    initial_s: float = 1.0
    factor: float = 2.0
    max_s: float = 30.0
    reset_after_s: float = 60.0

    def __post_init__(self) -> None:
        if self.initial_s <= 0:
            raise ValueError("initial_s must be positive")
        if self.factor < 1:
            raise ValueError("factor must be >= 1")
        if self.max_s < self.initial_s:
            raise ValueError("max_s must be >= initial_s")
        if self.reset_after_s <= 0:
            raise ValueError("reset_after_s must be positive")

    def delay(self, failures: int) -> float:
        if failures < 1:
            raise ValueError("failures must be >= 1")
        return float(min(self.initial_s * self.factor ** min(failures - 1, 64), self.max_s))


@dataclass(frozen=True)
class ServiceSpec:
    """One child process: its command line, environment, log file and policy.

    ``stop_tier``: services stop in increasing tiers (sources first, the broker last).
    ``ready``: a probe (e.g. the broker answers, the metrics port serves) called by
    :class:`ProcessGroup` until it passes; ``None`` means ready once started.
    """

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    log_path: str | None = None
    one_shot: bool = False
    restart: Restart = "always"
    after: tuple[str, ...] = ()
    stop_tier: int = 0
    metrics_port: int | None = None
    ready: Callable[[], bool] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name must not be empty")
        if not self.argv:
            raise ValueError("argv must not be empty")
        if self.one_shot and self.restart == "always":
            raise ValueError(f"{self.name}: a one-shot service restarts on-failure or never")


class ServiceState(StrEnum):
    WAITING = "waiting"  # for the services in ``after``
    STARTING = "starting"  # running, not ready yet
    RUNNING = "running"
    BACKOFF = "backoff"  # exited, restart scheduled
    DONE = "done"  # one-shot, exited 0
    FAILED = "failed"  # exited, not restarted
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass
class ServiceStatus:
    """What the supervisor knows of one service (shown in the table and up.json)."""

    spec: ServiceSpec
    state: ServiceState = ServiceState.WAITING
    pid: int | None = None
    restarts: int = 0
    failures: int = 0  # consecutive, for the backoff
    started_at: float | None = None
    restart_at: float | None = None
    last_exit: int | None = None

    def uptime(self, now: float) -> float:
        live = (ServiceState.STARTING, ServiceState.RUNNING, ServiceState.STOPPING)
        if self.started_at is None or self.state not in live:
            return 0.0
        return max(0.0, now - self.started_at)


class Supervisor:
    """Start/restart/stop decisions for a set of services; no I/O, no clock of its own.

    >>> sup = Supervisor([ServiceSpec("w", ("worker",))])
    >>> sup.due(now=0.0)
    ['w']
    >>> sup.started("w", pid=10, now=0.0)
    >>> sup.exited("w", 75, now=5.0)  # restart in 1 s
    6.0
    >>> sup.due(now=5.5), sup.due(now=6.0)
    ([], ['w'])
    """

    def __init__(self, specs: Iterable[ServiceSpec], backoff: Backoff | None = None) -> None:
        self.backoff = backoff or Backoff()
        self.services: dict[str, ServiceStatus] = {}
        for spec in specs:
            if spec.name in self.services:
                raise ValueError(f"duplicate service {spec.name!r}")
            self.services[spec.name] = ServiceStatus(spec)
        for status in self.services.values():
            unknown = [d for d in status.spec.after if d not in self.services]
            if unknown:
                raise ValueError(f"{status.spec.name}: waits for unknown services {unknown}")
        self.stopping = False

    def _deps_met(self, spec: ServiceSpec) -> bool:
        def met(dep: ServiceStatus) -> bool:
            if dep.spec.one_shot:
                return dep.state is ServiceState.DONE
            return dep.state is ServiceState.RUNNING

        return all(met(self.services[d]) for d in spec.after)

    def due(self, now: float) -> list[str]:
        """Services to start now, in declaration order."""
        if self.stopping:
            return []
        out = []
        for name, s in self.services.items():
            if (s.state is ServiceState.WAITING and self._deps_met(s.spec)) or (
                s.state is ServiceState.BACKOFF
                and s.restart_at is not None
                and now >= s.restart_at
                and self._deps_met(s.spec)
            ):
                out.append(name)
        return out

    def started(self, name: str, pid: int, now: float) -> None:
        s = self.services[name]
        if s.started_at is not None:
            s.restarts += 1
        s.state = ServiceState.STARTING if s.spec.ready is not None else ServiceState.RUNNING
        s.pid, s.started_at, s.restart_at = pid, now, None
        if s.restarts:
            # a restarted service: what was set up on it (topics on a broker) runs again
            for other in self.services.values():
                if (
                    name in other.spec.after
                    and other.spec.one_shot
                    and other.spec.restart != "never"
                    and other.state is ServiceState.DONE
                ):
                    other.state = ServiceState.WAITING

    def ready(self, name: str) -> None:
        s = self.services[name]
        if s.state is ServiceState.STARTING:
            s.state = ServiceState.RUNNING

    def spawn_failed(self, name: str, now: float) -> float:
        """Starting the process itself failed (e.g. no executable): back off."""
        s = self.services[name]
        s.failures += 1
        s.state = ServiceState.BACKOFF
        s.restart_at = now + self.backoff.delay(s.failures)
        return s.restart_at

    def exited(self, name: str, code: int, now: float) -> float | None:
        """Record an exit; the time of the restart, or None when there is none."""
        s = self.services[name]
        uptime = now - s.started_at if s.started_at is not None else 0.0
        s.pid, s.last_exit = None, code
        if self.stopping or s.state is ServiceState.STOPPING:
            s.state = ServiceState.STOPPED
            return None
        if s.spec.one_shot and code == 0:
            s.state, s.failures = ServiceState.DONE, 0
            return None
        if s.spec.restart == "never" or (s.spec.restart == "on-failure" and code == 0):
            s.state = ServiceState.FAILED if code else ServiceState.STOPPED
            return None
        if uptime >= self.backoff.reset_after_s:
            s.failures = 0
        s.failures += 1
        s.state = ServiceState.BACKOFF
        s.restart_at = now + self.backoff.delay(s.failures)
        return s.restart_at

    def begin_stop(self) -> list[list[str]]:
        """Stop everything: no more starts; the live services in stop tiers, first
        tier first (the broker, in the highest tier, last)."""
        self.stopping = True
        tiers: dict[int, list[str]] = {}
        for name, s in self.services.items():
            if s.pid is not None:
                tiers.setdefault(s.spec.stop_tier, []).append(name)
            elif s.state is ServiceState.BACKOFF or s.state is ServiceState.WAITING:
                s.state = ServiceState.STOPPED
        return [tiers[t] for t in sorted(tiers)]

    def stopping_now(self, name: str) -> None:
        self.services[name].state = ServiceState.STOPPING


class Process(Protocol):
    """What :class:`ProcessGroup` needs of a child (``subprocess.Popen`` has it)."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


class Spawner(Protocol):
    def spawn(self, spec: ServiceSpec) -> Process: ...


Event = Callable[[str, str], None]


class ProcessGroup:
    """Runs a :class:`Supervisor`'s decisions on real (or fake) processes.

    Call :meth:`tick` in a loop; :meth:`stop` at the end. ``clock`` and ``sleep`` are
    injectable so the stop sequence is tested without waiting.
    """

    def __init__(
        self,
        supervisor: Supervisor,
        spawner: Spawner,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        on_event: Event | None = None,
    ) -> None:
        self.supervisor = supervisor
        self.spawner = spawner
        self.clock = clock
        self.sleep = sleep
        self.procs: dict[str, Process] = {}
        self.on_event = on_event or (lambda name, text: None)

    def tick(self) -> None:
        """Reap exits, probe readiness, start what is due."""
        sup = self.supervisor
        for name, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None:
                continue
            del self.procs[name]
            when = sup.exited(name, code, self.clock())
            if when is not None:
                delay = when - self.clock()
                self.on_event(name, f"exited with code {code}; restart in {delay:.0f} s")
            else:
                self.on_event(name, f"exited with code {code} ({sup.services[name].state})")
        for name, s in sup.services.items():
            if s.state is ServiceState.STARTING and s.spec.ready is not None and s.spec.ready():
                sup.ready(name)
                self.on_event(name, "ready")
        for name in sup.due(self.clock()):
            spec = sup.services[name].spec
            try:
                proc = self.spawner.spawn(spec)
            except OSError as exc:
                sup.spawn_failed(name, self.clock())
                self.on_event(name, f"cannot start: {exc}")
                continue
            self.procs[name] = proc
            sup.started(name, proc.pid, self.clock())
            self.on_event(name, f"started, pid {proc.pid}")

    def stop(self, grace_s: float = 10.0, poll_s: float = 0.05) -> dict[str, int | None]:
        """Terminate tier by tier; kill what is still alive after ``grace_s``.

        Returns each stopped service's exit code.
        """
        codes: dict[str, int | None] = {}
        for tier in self.supervisor.begin_stop():
            live = {n: self.procs[n] for n in tier if n in self.procs}
            for name, proc in live.items():
                self.supervisor.stopping_now(name)
                proc.terminate()
            deadline = self.clock() + grace_s
            while live and self.clock() < deadline:
                self._reap(live, codes)
                if live:
                    self.sleep(poll_s)
            for name, proc in list(live.items()):
                self.on_event(name, f"still running after {grace_s:.0f} s: killed")
                proc.kill()
            deadline = self.clock() + grace_s
            while live and self.clock() < deadline:
                self._reap(live, codes)
                if live:
                    self.sleep(poll_s)
            for name in live:  # unkillable (uninterruptible sleep): reported, not awaited
                self.on_event(name, "did not exit after SIGKILL")
                codes[name] = None
        return codes

    def stop_one(self, name: str, grace_s: float = 10.0, poll_s: float = 0.05) -> int | None:
        """Stop one service for good (it is not restarted), the others running on:
        SIGTERM, SIGKILL after ``grace_s``. Returns its exit code (None: it was not
        running, or did not exit)."""
        proc = self.procs.get(name)
        if proc is None:
            return None
        self.supervisor.stopping_now(name)
        live, codes = {name: proc}, dict[str, int | None]()
        for send in (proc.terminate, proc.kill):
            send()
            deadline = self.clock() + grace_s
            while live and self.clock() < deadline:
                self._reap(live, codes)
                if live:
                    self.sleep(poll_s)
            if not live:
                return codes[name]
            self.on_event(name, f"still running {grace_s:.0f} s after {send.__name__}")
        return None

    def _reap(self, live: dict[str, Process], codes: dict[str, int | None]) -> None:
        for name, proc in list(live.items()):
            code = proc.poll()
            if code is not None:
                del live[name]
                self.procs.pop(name, None)
                codes[name] = code
                self.supervisor.exited(name, code, self.clock())

    def pids(self) -> Sequence[int]:
        return [p.pid for p in self.procs.values()]
