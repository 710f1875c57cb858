"""``stepguard up``: the production services as supervised child processes.

docker-compose without Docker, for a laptop or a single head node. One process per
service, each the same ``stepguard <service>`` command docker-compose runs:

==================  ==========================================================  ==========
service             command                                                     stop tier
==================  ==========================================================  ==========
broker              ``stepguard broker --port P`` (embedded Tansu, in memory)   last
topics              ``stepguard topics`` (one-shot; again after a broker restart)
worker-1..N         ``stepguard worker``: own metrics port and data directory    2
actuator            ``stepguard actuator``                                      3
executor-dry-run    ``stepguard executor dry-run``                              3
archiver            ``stepguard archiver`` (chDB under the state dir, or the DSN) 4
alertmanager        ``stepguard alertmanager`` (when an Alertmanager URL is set,  3
                    or with ``--durable``)
simulate            ``stepguard simulate --scenario S --control``               first
==================  ==========================================================  ==========

With ``STEPGUARD_KAFKA_BOOTSTRAP`` set, no broker is started; with ``--durable``
Apache Kafka runs through ``scripts/kafka.sh start --keep-data`` (data kept across
runs), and, unless ``STEPGUARD_ALERTMANAGER_URL`` names one, Alertmanager through
``scripts/alertmanager.sh start --keep-data`` (silences kept; its state under
``<state dir>/alertmanager``, its receiver ``ALERTMANAGER_WEBHOOK_URL``). Each service
logs to ``<state dir>/logs/<service>.log``; ``<state dir>/up.json`` holds each
service's state, pid and restarts (rewritten every second), and
``<state dir>/up.env`` the variables another shell needs to reach this stack;
``<state dir>/job-controller.env`` (mode 0600) the job controller's private key of the
job (the training job's CommandListener signs its results with it).

The decisions live in :mod:`pipeline.tools.supervisor`; this module builds the plan, spawns
processes, probes readiness, scrapes the Prometheus endpoints and draws the table.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rich.console import Console
from rich.live import Live

from pipeline.io.embedded import free_port, probe_kafka
from pipeline.io.errors import ConfigError
from pipeline.io.settings import ENV_PREFIX, Settings
from pipeline.tools.prometheus import prometheus_for_up
from pipeline.tools.supervisor import ProcessGroup, ServiceSpec, ServiceState, Supervisor
from pipeline.tools.up_board import (
    MetricsBoard,
    status_table,
)
from pipeline.tools.up_durable import (
    _start_durable_alertmanager,
    _start_durable_kafka,
    _stop_durable_alertmanager,
    _stop_durable_kafka,
)
from pipeline.tools.up_env import (
    _alertmanager_target,
    _node_list,
    _scenario_env,
    _write_atomic,
    child_env,
    is_secret_variable,
    signing_env,
    write_job_env,
)

if TYPE_CHECKING:
    pass

__all__ = [
    "JOB_ENV_FILE",
    "STATUS_FILE",
    "Plan",
    "PopenSpawner",
    "UpOptions",
    "build_plan",
    "child_env",
    "run_up",
    "signing_env",
    "start_group",
    "write_job_env",
]

STATUS_FILE = "up.json"
ENV_FILE = "up.env"
#: next to up.env, mode 0600: the training job's own signing key (its controller's)
JOB_ENV_FILE = "job-controller.env"
MEMORY_ONLY = (
    "the embedded Tansu broker keeps topics in memory only: stopping `up` (or a broker "
    "restart) loses every topic, offset and consumer group; use --durable (Apache Kafka "
    "through scripts/kafka.sh, data kept) or STEPGUARD_KAFKA_BOOTSTRAP for a real broker"
)


@dataclass(frozen=True, kw_only=True)
class UpOptions:
    """``stepguard up`` arguments."""

    scenario: str | None = None
    workers: int = 2
    speed: float = 1.0
    durable: bool = False
    base_port: int | None = None
    grace_s: float = 10.0
    #: a real job to watch (``--job``), its nodes (a count or names), its spares (a
    #: count or names) and the actuator's mode for it
    job: str | None = None
    nodes: str | None = None
    spares: str | None = None
    mode: Literal["observe", "approve", "auto"] | None = None
    #: run Prometheus with the shipped rules (pipeline/tools/prometheus); None: with
    #: ``durable`` when a ``prometheus`` binary is on PATH
    prometheus: bool | None = None

    def __post_init__(self) -> None:
        if self.job is not None and self.scenario is not None:
            raise ValueError("--job and --scenario are two jobs: give one")
        if self.job is None and (self.nodes or self.spares):
            raise ValueError("--nodes and --spares describe a --job")
        if self.workers < 1:
            raise ValueError("workers must be >= 1")
        if self.speed <= 0:
            raise ValueError("speed must be positive")
        if self.base_port is not None and not 1024 <= self.base_port <= 65535 - 32:
            raise ValueError("base_port must be in 1024..65503")


@dataclass
class Plan:
    """Everything ``up`` will run, decided before anything starts."""

    specs: list[ServiceSpec]
    bootstrap: str
    broker_flavor: str
    state_dir: Path
    job_id: str | None = None
    notes: list[str] = field(default_factory=list)
    #: variables another shell needs to reach this stack (no secrets)
    shell_env: dict[str, str] = field(default_factory=dict)
    #: the job controller's private key of ``job_id`` (a secret: written to
    #: :data:`JOB_ENV_FILE`, readable by the user only)
    job_env: dict[str, str] = field(default_factory=dict)


# -- environment of the children --------------------------------------------------------


# -- plan -------------------------------------------------------------------------------


def _port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Nothing listens on ``port``. SO_REUSEADDR as the servers themselves bind: a port
    whose last connections linger in TIME_WAIT (a scraper's, after a stop) is free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class _Ports:
    """Ports for the broker and the metrics endpoints: free ones, or consecutive ones
    from ``base`` (stable for a Prometheus scrape config), each checked free now."""

    def __init__(self, base: int | None) -> None:
        self.next = base

    def take(self, what: str) -> int:
        if self.next is None:
            return free_port()
        port, self.next = self.next, self.next + 1
        if not _port_free(port):
            raise ConfigError(
                f"port {port} ({what}) is in use; stop what holds it or choose another --base-port"
            )
        return port


def _metrics_ready(port: int) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=0.5):
                return True
        except OSError:
            return False

    return probe


def _skew_for_scenario(
    settings: Settings, options: UpOptions, base_env: Mapping[str, str], notes: list[str]
) -> dict[str, str]:
    """The clock-skew allowance of a stack ``up`` starts itself (embedded broker) for a
    played scenario: the default plus the job's lead at ``--speed``
    (:func:`~pipeline.tools.simulator.lead_s`), as the demo allows, so the job is never
    held back to real time. Nothing when the operator set ``STEPGUARD_MAX_CLOCK_SKEW_S``
    (theirs wins; the simulator then holds events to 80 % of it)."""
    from pipeline.tools.simulator import find_scenario, lead_s

    var = f"{ENV_PREFIX}MAX_CLOCK_SKEW_S"
    if options.scenario is None or any(k.upper() == var for k in base_env):
        return {}
    lead = lead_s(find_scenario(options.scenario), options.speed)
    if lead <= 0:
        return {}
    skew = settings.max_clock_skew_s + lead
    speed = f"--speed {options.speed:g}"
    notes.append(f"clock-skew allowance {skew:.0f} s: the job's lead at {speed} ({var})")
    return {var: f"{skew:.0f}"}


def _broker_ready(port: int) -> Callable[[], bool]:
    return lambda: probe_kafka("127.0.0.1", port, timeout=0.5)


def build_plan(
    settings: Settings,
    options: UpOptions,
    base_env: Mapping[str, str],
    *,
    bootstrap: str | None = None,
    python: str = sys.executable,
    run_id: str | None = None,
    alertmanager_url: str | None = None,
    job: str | None = None,
) -> Plan:
    """The services to run; ``bootstrap`` is an already running broker and
    ``alertmanager_url`` an already running Alertmanager (``--durable``); ``job`` the
    job a caller plays itself (the demo), whose controller key the plan then makes."""
    run_id = run_id or secrets.token_hex(4)
    state = settings.state_dir
    logs = state / "logs"
    ports = _Ports(options.base_port)
    cmd = (python, "-m", "pipeline")
    notes: list[str] = []
    common: dict[str, str] = {f"{ENV_PREFIX}STATE_DIR": str(state)}
    if f"{ENV_PREFIX}CHDB_PATH" not in base_env and settings.clickhouse_dsn is None:
        common[f"{ENV_PREFIX}CHDB_PATH"] = str(state / "archive")
    job_id = options.job or job  # a watched job's controller key is bound to it
    if options.scenario is not None:
        job_id, scenario_env, scenario_notes = _scenario_env(
            options.scenario, base_env, run_id, options.mode
        )
    keys, key_notes = signing_env(settings, run_id, job_id)
    notes += key_notes

    specs: list[ServiceSpec] = []
    after_broker: tuple[str, ...] = ()
    if bootstrap is None and settings.kafka_bootstrap:
        bootstrap, flavor = settings.kafka_bootstrap, settings.broker_flavor
        notes.append(f"broker: {bootstrap} (STEPGUARD_KAFKA_BOOTSTRAP, {flavor})")
    elif bootstrap is not None:
        flavor = "kafka"
        notes.append(f"broker: Apache Kafka on {bootstrap} (durable, scripts/kafka.sh)")
    else:
        port = ports.take("broker")
        bootstrap, flavor = f"127.0.0.1:{port}", "tansu"
        argv = (*cmd, "broker", "--port", str(port))
        specs.append(ServiceSpec("broker", argv, stop_tier=9, ready=_broker_ready(port)))
        after_broker = ("broker",)
        notes.append(MEMORY_ONLY)
        if options.scenario is not None:
            common |= _skew_for_scenario(settings, options, base_env, notes)
    common |= {f"{ENV_PREFIX}KAFKA_BOOTSTRAP": bootstrap, f"{ENV_PREFIX}BROKER_FLAVOR": flavor}
    topics = ServiceSpec("topics", (*cmd, "topics"), one_shot=True, restart="on-failure")
    specs.append(replace(topics, after=after_broker))
    after_topics = ("topics",)

    extra: dict[str, dict[str, str]] = {
        "actuator": keys["actuator"],
        "executor-dry-run": keys["executor"],
        "simulate": keys["simulate"],
        "archiver": keys["archiver"],
    }
    if options.scenario is not None:
        extra["actuator"] = extra["actuator"] | scenario_env
        notes += scenario_notes
    job_shell: dict[str, str] = {}
    if options.job is not None:
        actuator_env, job_shell, job_notes = _job_env(options, base_env)
        extra["actuator"] = extra["actuator"] | actuator_env
        notes += job_notes

    workers = []
    for i in range(1, options.workers + 1):
        name = f"worker-{i}"
        port = ports.take(f"{name} metrics")
        env = {
            f"{ENV_PREFIX}WORKER_METRICS_PORT": str(port),
            f"{ENV_PREFIX}WORKER_DATA_DIR": str(state / name),
        }
        extra[name] = env | keys["worker"]
        ready = _metrics_ready(port)
        worker = ServiceSpec(name, (*cmd, "worker"), after=after_topics, stop_tier=2)
        specs.append(replace(worker, metrics_port=port, ready=ready))
        workers.append(name)
    # every service its own metrics port (two of a kind on one host never collide)
    services = (
        ("actuator", (*cmd, "actuator"), "ACTUATOR", 3),
        ("executor-dry-run", (*cmd, "executor", "dry-run"), "EXECUTOR", 3),
        ("archiver", (*cmd, "archiver", "--progress-s", "10"), "ARCHIVER", 4),
    )
    for name, argv, var, tier in services:
        port = ports.take(f"{name} metrics")
        extra[name] = extra[name] | {f"{ENV_PREFIX}{var}_METRICS_PORT": str(port)}
        specs.append(ServiceSpec(name, argv, after=after_topics, stop_tier=tier, metrics_port=port))
    am_url = alertmanager_url or settings.alertmanager
    if am_url:
        from pipeline.io.redact import url_origin

        port = ports.take("alertmanager metrics")
        extra["alertmanager"] = keys["alertmanager"] | {
            f"{ENV_PREFIX}ALERTMANAGER_URL": am_url,
            f"{ENV_PREFIX}ALERTMANAGER_METRICS_PORT": str(port),
        }
        bridge = ServiceSpec("alertmanager", (*cmd, "alertmanager"), after=after_topics,
                             stop_tier=3, metrics_port=port)  # fmt: skip
        specs.append(bridge)
        notes.append(f"alert episodes go to Alertmanager at {url_origin(am_url)}")
    if options.scenario is not None:
        argv = (*cmd, "simulate", "--scenario", options.scenario, "--speed",
                str(options.speed), "--job", str(job_id), "--from-now", "--control")  # fmt: skip
        after = (*workers, "actuator", "executor-dry-run")
        port = ports.take("simulate (job controller) metrics")
        extra["simulate"] = extra["simulate"] | {f"{ENV_PREFIX}LISTENER_METRICS_PORT": str(port)}
        simulate = ServiceSpec("simulate", argv, one_shot=True, restart="never", after=after)
        specs.append(replace(simulate, metrics_port=port))

    prometheus = prometheus_for_up(
        options.prometheus, durable=options.durable, folder=state / "prometheus",
        take_port=ports.take, ports={s.name: s.metrics_port for s in specs if s.metrics_port},
        notes=notes, alertmanagers=_alertmanager_target(am_url),
    )  # fmt: skip
    if prometheus is not None:
        specs.append(prometheus[0])
    final = [
        replace(
            spec,
            env=child_env(base_env, common | extra.get(spec.name, {})),
            log_path=str(logs / f"{spec.name}.log"),
        )
        for spec in specs
    ]
    shell = {
        f"{ENV_PREFIX}KAFKA_BOOTSTRAP": bootstrap,
        f"{ENV_PREFIX}BROKER_FLAVOR": flavor,
        f"{ENV_PREFIX}STATE_DIR": str(state),
    }
    for var in ("TOPIC_PREFIX", "CONSUMER_GROUP", "CHDB_PATH"):
        value = common.get(ENV_PREFIX + var, base_env.get(ENV_PREFIX + var))
        if value:
            shell[ENV_PREFIX + var] = value
    # public keys are not secrets: `stepguard alerts` in another shell verifies with them
    for env in keys.values():
        shell |= {k: v for k, v in env.items() if k.endswith("_PUBLIC_KEYS")}
    if prometheus is not None:
        shell["PROMETHEUS_URL"] = prometheus[1]
    job_env = {k: v for k, v in keys["job"].items() if is_secret_variable(k)}
    return Plan(final, bootstrap, flavor, state, job_id, notes, shell | job_shell, job_env)


def _job_keys(plan: Plan) -> str:
    """What job-controller.env holds, in words."""
    what = [f"job {plan.job_id}'s controller key"] if plan.job_id else []
    if any(k.endswith("TELEMETRY_SECRET") for k in plan.job_env):
        what.append("the telemetry secret")
    return " and ".join(what)


def _job_env(
    options: UpOptions, base_env: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """The actuator settings of a watched job, the variables the job reads (up.env),
    and notes."""
    n_nodes, nodes = _node_list(options.nodes, "")
    _, spares = _node_list(options.spares, "spare-")
    actuator: dict[str, str] = {}
    shell = {f"{ENV_PREFIX}JOB_ID": str(options.job)}
    if n_nodes:
        actuator[f"{ENV_PREFIX}GUARD_JOB_NODES"] = str(n_nodes)
    if nodes:
        shell[f"{ENV_PREFIX}NODES"] = ",".join(nodes)
    if spares:
        actuator[f"{ENV_PREFIX}SPARE_NODES"] = shell[f"{ENV_PREFIX}SPARES"] = ",".join(spares)
    mode = options.mode or base_env.get(f"{ENV_PREFIX}ACTUATOR_MODE", "observe")
    actuator[f"{ENV_PREFIX}ACTUATOR_MODE"] = mode
    notes = [
        f"job {options.job}: {n_nodes or 'unknown'} nodes"
        + (f" ({', '.join(nodes)})" if nodes else "")
        + f", spares {', '.join(spares) or 'none'}, actuator in {mode} mode"
    ]
    return actuator, shell, notes


# -- processes --------------------------------------------------------------------------


def _parent_death_signal() -> Callable[[], None] | None:
    """Linux: children get SIGTERM if ``up`` itself dies (SIGKILL), so none is orphaned."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, signal.SIGTERM)

    return preexec


class PopenSpawner:
    """Starts a service as a child process in its own session (Ctrl-C reaches only
    ``up``, which stops the children in order), its output appended to its log."""

    def __init__(self, cwd: Path | None = None) -> None:
        self.cwd = cwd
        self._preexec = _parent_death_signal()

    def spawn(self, spec: ServiceSpec) -> subprocess.Popen[bytes]:
        log_path = Path(spec.log_path or os.devnull)
        if spec.log_path:
            log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            stamp = datetime.now(UTC).isoformat(timespec="seconds")
            log.write(f"--- {stamp} stepguard up: {' '.join(spec.argv[2:])}\n".encode())
            log.flush()
            return subprocess.Popen(
                list(spec.argv), env=dict(spec.env), cwd=self.cwd, stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=self._preexec,  # noqa: PLW1509 - a single prctl call
            )  # fmt: skip


# -- metrics ----------------------------------------------------------------------------


# -- status -----------------------------------------------------------------------------


def status_document(plan: Plan, sup: Supervisor, now: float, started: datetime) -> dict[str, Any]:
    """What ``up.json`` holds: enough for a script (or a test) to find every child."""
    return {
        "pid": os.getpid(),
        "started": started.isoformat(timespec="seconds"),
        "bootstrap": plan.bootstrap,
        "broker_flavor": plan.broker_flavor,
        "job_id": plan.job_id,
        "stopping": sup.stopping,
        "services": {
            name: {
                "state": s.state.value,
                "pid": s.pid,
                "restarts": s.restarts,
                "uptime_s": round(s.uptime(now), 1),
                "last_exit": s.last_exit,
                "metrics_port": s.spec.metrics_port,
                "log": s.spec.log_path,
            }
            for name, s in sup.services.items()
        },
    }


# -- run --------------------------------------------------------------------------------


def run_up(
    settings: Settings,
    options: UpOptions,
    base_env: Mapping[str, str],
    console: Console,
    stop: threading.Event,
) -> int:
    """Start the plan, supervise until ``stop`` is set, then stop everything in order.

    Returns the exit code of ``stepguard up`` (0 after a clean stop).
    """
    state = settings.state_dir
    logs = state / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        durable_bootstrap = None
        if options.durable and not settings.kafka_bootstrap:
            durable_bootstrap = _start_durable_kafka(logs / "kafka.log", console)
            stack.callback(_stop_durable_kafka, logs / "kafka.log")
        durable_am = None
        if options.durable and not settings.alertmanager:
            am_log, am_state = logs / "alertmanager-server.log", state / "alertmanager"
            durable_am = _start_durable_alertmanager(am_state, am_log, console)
            stack.callback(_stop_durable_alertmanager, am_state, am_log)
        plan = build_plan(settings, options, base_env, bootstrap=durable_bootstrap,
                          alertmanager_url=durable_am)  # fmt: skip
        for note in plan.notes:
            console.print(f"[bold]up[/]: {note}")
        _write_atomic(state / ENV_FILE, "".join(f"{k}={v}\n" for k, v in plan.shell_env.items()))
        if plan.job_env:
            write_job_env(state / JOB_ENV_FILE, plan.job_env)
            console.print(f"[bold]up[/]: {_job_keys(plan)} in {state / JOB_ENV_FILE} "
                          "(mode 0600)")  # fmt: skip
        hint = shell_hint(state, watched_job=bool(plan.job_env))
        console.print(f"[bold]up[/]: logs in {logs}/; another shell: {hint}")
        return _supervise(plan, options, console, stop)
    return 0  # pragma: no cover - the with block returns


def shell_hint(state: Path, *, watched_job: bool) -> str:
    """What another shell sources to reach the stack; a watched job's ranks need its
    controller key too (docs/pytorch.md, step 4), or every rank stops at start.

    >>> shell_hint(Path(".stepguard"), watched_job=True)
    'set -a; . .stepguard/up.env; . .stepguard/job-controller.env; set +a'
    """
    files = [state / ENV_FILE, *([state / JOB_ENV_FILE] if watched_job else [])]
    return "set -a; " + "; ".join(f". {f}" for f in files) + "; set +a"


def start_group(
    plan: Plan, on_event: Callable[[str, str], None]
) -> tuple[Supervisor, ProcessGroup, MetricsBoard]:
    """The supervisor, the process group that runs it, and the metrics board of a
    plan: what ``up`` and ``stepguard demo`` drive (call ``group.tick()`` in a loop,
    ``group.stop()`` and ``board.close()`` at the end). Nothing is spawned yet."""
    sup = Supervisor(plan.specs)
    group = ProcessGroup(sup, PopenSpawner(), on_event=on_event)
    ports = {s.name: s.metrics_port for s in plan.specs if s.metrics_port}
    return sup, group, MetricsBoard(ports).start()


def _supervise(plan: Plan, options: UpOptions, console: Console, stop: threading.Event) -> int:
    live: Live | None = None

    def event(name: str, text: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {name}: {text}"
        (live.console if live is not None else console).print(line, highlight=False)

    sup, group, board = start_group(plan, event)
    started = datetime.now(UTC)
    status_path = plan.state_dir / STATUS_FILE
    title = f"stepguard up: {plan.bootstrap} ({plan.broker_flavor})"
    if plan.job_id:
        title += f", job {plan.job_id}"
    title += "; Ctrl-C stops"
    if console.is_terminal:
        live = Live(console=console, auto_refresh=False, transient=False)
        live.start()
    try:
        while not stop.is_set():
            group.tick()
            now = time.monotonic()
            _write_atomic(status_path, json.dumps(status_document(plan, sup, now, started)))
            if live is not None:
                live.update(status_table(sup, board, now, title), refresh=True)
            stop.wait(0.25)
        event("up", "stopping (children first, the broker last)")
        group.stop(grace_s=options.grace_s)
    finally:
        if group.procs:  # an error above: never leave children behind
            group.stop(grace_s=options.grace_s)
        board.close()
        now = time.monotonic()
        _write_atomic(status_path, json.dumps(status_document(plan, sup, now, started)))
        if live is not None:
            live.update(status_table(sup, board, now, title), refresh=True)
            live.stop()
    failed = [n for n, s in sup.services.items() if s.state is ServiceState.FAILED]
    console.print(
        "[bold]up[/]: stopped; restarts: "
        + ", ".join(f"{n} {s.restarts}" for n, s in sup.services.items() if s.restarts)
        if any(s.restarts for s in sup.services.values())
        else "[bold]up[/]: stopped; no restarts"
    )
    if failed:
        console.print(f"[bold]up[/]: failed: {', '.join(failed)} (see their logs)")
    return 0
