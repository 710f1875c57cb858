"""Chaos soak: the production services under kills, a broker restart and many jobs.

On Apache Kafka (``scripts/kafka.sh``, durable storage) and a ClickHouse server
(``scripts/clickhouse.sh``), both started here unless ``--bootstrap`` / ``--clickhouse``
name running ones, the soak runs the services as separate processes, exactly as a
deployment does (``stepguard <service>`` configured by ``STEPGUARD_*`` variables):

- two ``stepguard worker`` in one consumer group;
- ``stepguard actuator`` in auto mode (a signing key, a pool of spare nodes);
- ``stepguard executor dry-run`` (carries out every command kind, publishes results);
- ``stepguard archiver`` into the ClickHouse server.

A driver plays simulated jobs (``pipeline.client.play``: truth, START, steps, health,
announced checkpoints, END) in real time, several at once in threads: stragglers,
hangs and crashes injected, checkpoints every few steps. Meanwhile every
``--kill-every`` seconds one of {a worker, the actuator, the archiver, the executor}
is SIGKILLed (in a shuffled round, so each kind is hit) and restarted as a supervisor
would; once, the broker is stopped and started again with its data kept. At the end
the soak waits for the consumer groups to drain, then measures:

- ``lost_records`` / ``duplicate_rows``: every (job, step, node) the driver sent is in
  ``steps FINAL`` exactly once (``uniqExact(step, node)`` against what was sent;
  ``count()`` against ``uniqExact(step, rank)``; with ``run`` first where the table
  keys rows by run);
- ``alerts_missed``: injected faults without a firing alert naming them (archived
  alerts against the simulator truth);
- ``false_hangs``: hang episodes raised after the job's END, or at a checkpoint step
  outside an injected hang/crash (``other_unexplained_hangs`` counts the rest);
- ``duplicate_commands``: command ids with more than one ``succeeded`` result from the
  same executor (read from the results topic: the archive's FINAL collapses them);
- ``false_alert_episodes`` / ``false_isolations``: alerts on, and ISOLATE commands
  for, nodes without an injected fault;
- ``restarts_survived``: killed services back up 30 s after their restart;
- ``worker_rss_mb_start`` / ``_end``: VmRSS of both workers after the first 2 minutes
  (``--quick``: 1 minute) and at the end; target: within 20 %.

Each miss or false alarm is listed with the disruptions around it (kills, the outage).
The services run a copy of the packages taken at the start (``--code``: HEAD by
default), so people editing the tree meanwhile change nothing a restart runs. Every
child writes its own log under a temporary directory (printed at start, kept with an
``archive.json`` of the job's alerts, lifecycle and commands); the exit status is 0
even when a target is missed (the summary names it).

    .venv/bin/python benchmarks/soak.py --quick --json /tmp/soak.json
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec

ROOT = Path(__file__).resolve().parents[1]
#: the packages the soak and its services run: a snapshot taken at the start (``--code``),
#: set by the parent process before it re-executes this script (see ``main``)
CODE = Path(os.environ.get("SOAK_CODE_DIR") or ROOT)
sys.path.insert(0, str(CODE))

from _common import command_line, cores_busy, environment, write_section  # noqa: E402

from pipeline.io.embedded import free_port  # noqa: E402
from pipeline.io.kafka import client_config, read_back, registry_of  # noqa: E402
from pipeline.io.settings import Settings, load_settings  # noqa: E402
from pipeline.services.archive import open_backend  # noqa: E402
from pipeline.tools.simulator import Scenario  # noqa: E402
from pipeline.tools.simulator.player import play  # noqa: E402
from schemas import TOPICS, CommandKind, CommandStatus  # noqa: E402

STEPGUARD = Path(sys.executable).parent / "stepguard"
PACKAGES = ("pipeline", "detectors", "schemas")
KILL_KINDS = ("worker", "actuator", "archiver", "executor")
#: a restarted service must still be up this long after its restart to count as survived
SURVIVE_S = 30.0
#: children of a killed service (the archiver's decode processes) get this long to exit
ORPHAN_GRACE_S = 5.0


# -- what the driver plays ----------------------------------------------------------------
@dataclass(frozen=True)
class Profile:
    """Sizes of one soak: jobs, their shape, how often something is killed."""

    jobs: int
    sizes: tuple[int, ...]  #: node counts to draw from ...
    weights: tuple[float, ...]  #: ... with these weights
    steps: tuple[int, int]  #: steps per job (inclusive range)
    base_compute_s: float  #: ~ the step time
    checkpoint_every: int
    checkpoint_s: tuple[float, float]
    kill_every_s: float
    rss_baseline_s: float


FULL = Profile(
    jobs=50, sizes=(16, 32, 64, 128, 256), weights=(4, 3, 2, 1, 1), steps=(50, 65),
    base_compute_s=1.2, checkpoint_every=20, checkpoint_s=(4.0, 7.0), kill_every_s=60.0,
    rss_baseline_s=120.0,
)  # fmt: skip
QUICK = Profile(
    jobs=12, sizes=(16, 32, 64), weights=(3, 2, 1), steps=(55, 65), base_compute_s=0.5,
    checkpoint_every=15, checkpoint_s=(2.5, 4.0), kill_every_s=40.0, rss_baseline_s=60.0,
)  # fmt: skip
#: fault of job i: FAULT_CYCLE[i % 5] (a fifth of the jobs are clean)
FAULT_CYCLE = ("straggler", "hang", "crash", "clean", "straggler")
#: seconds a crashed job stays silent before it ends
CRASH_DEAD_S = 40.0


@dataclass(frozen=True)
class JobPlan:
    job_id: str
    start_s: float  #: offset from the start of the chaos phase
    spec: dict[str, Any]  #: the Scenario, less its start time (set when it starts)
    fault: str

    def scenario(self) -> Scenario:
        return Scenario.model_validate(self.spec | {"start_time": datetime.now(UTC)})

    @property
    def est_s(self) -> float:
        sc = Scenario.model_validate(self.spec)
        n_ckpt = sc.steps // max(1, sc.checkpoint_every)
        stalls = sum(f.hang_steps if f.kind.value == "crash" else 10 for f in sc.faults)
        return (sc.steps + stalls + 5) * sc.nominal_step_s + n_ckpt * sc.checkpoint_s


def plan_jobs(profile: Profile, n_jobs: int, window_s: float, tag: str, seed: int) -> list[JobPlan]:
    """Jobs with their start offsets, spread so the last one ends inside the window."""
    rng = random.Random(seed)
    plans = []
    for i in range(n_jobs):
        nodes = rng.choices(profile.sizes, profile.weights)[0]
        if profile is FULL and i in (1, n_jobs // 2):
            nodes = 256  # the largest size is always in a full soak
        steps = rng.randint(*profile.steps)
        every = profile.checkpoint_every
        spec: dict[str, Any] = {
            "name": f"soak-{tag}-{i:03d}", "job_id": f"soak-{tag}-{i:03d}", "seed": seed + i,
            "nodes": nodes, "pp": rng.choice((1, 2, 4)), "steps": steps, "warmup_steps": 5,
            "base_compute_s": profile.base_compute_s, "checkpoint_every": every,
            "checkpoint_s": round(rng.uniform(*profile.checkpoint_s), 2),
        }  # fmt: skip
        kind = FAULT_CYCLE[i % len(FAULT_CYCLE)]
        # after the detectors' warm-up (20 TRAIN steps a rank learns before it is
        # scored: a rank slow from the start is learned as its normal), 20 steps before
        # the end
        onset = rng.randint(30, steps - 20)
        while (onset + 1) % every == 0 or (onset + 2) % every == 0:
            onset += 1  # keep injected stalls off checkpoint steps: the windows stay apart
        node = rng.randrange(nodes)
        # a crashed node stays dead CRASH_DEAD_S before the job ends: longer than a broker
        # outage plus the grace the worker gives every job after one
        nominal = Scenario.model_validate(spec).nominal_step_s
        crash_steps = math.ceil(CRASH_DEAD_S / nominal)
        fault = {
            "straggler": {"kind": "straggler", "node": node, "gpu": rng.randrange(8),
                          "onset_step": onset, "magnitude": 0.3},
            "hang": {"kind": "hang", "onset_step": onset, "duration_steps": 10},
            "crash": {"kind": "crash", "node": node, "onset_step": onset,
                      "hang_steps": crash_steps},
            "clean": None,
        }[kind]  # fmt: skip
        spec["faults"] = [fault] if fault else []
        plans.append(JobPlan(spec["job_id"], 0.0, spec, kind))
    longest = max(p.est_s for p in plans)
    span = max(0.0, window_s - longest)
    return [
        JobPlan(p.job_id, span * i / max(1, n_jobs - 1), p.spec, p.fault)
        for i, p in enumerate(plans)
    ]


class Driver:
    """Starts each job at its offset in a thread of its own and plays it in real time."""

    def __init__(self, settings: Settings, plans: list[JobPlan], broker_up: threading.Event):
        self.settings = settings
        self.plans = plans
        self.broker_up = broker_up
        self.lock = threading.Lock()
        self.started: dict[str, Scenario] = {}
        self.sent: dict[str, int] = {}  #: step messages of jobs that ended
        self.errors: dict[str, str] = {}
        self.held_s = 0.0  #: job starts delayed while the broker was down
        self._threads: list[threading.Thread] = []
        self._scheduler = threading.Thread(target=self._schedule, name="driver", daemon=True)
        self._stop = threading.Event()

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._scheduler.start()

    def stop(self) -> None:
        self._stop.set()

    @property
    def done(self) -> bool:
        return not self._scheduler.is_alive() and not any(t.is_alive() for t in self._threads)

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return len(self.started), len(self.sent)

    def _schedule(self) -> None:
        for plan in self.plans:
            if self._stop.wait(max(0.0, self._t0 + plan.start_s - time.monotonic())):
                return
            t = time.monotonic()
            self.broker_up.wait()
            self.held_s += time.monotonic() - t
            thread = threading.Thread(target=self._run, args=(plan,), name=plan.job_id, daemon=True)
            self._threads.append(thread)
            thread.start()

    def _run(self, plan: JobPlan) -> None:
        sc = plan.scenario()
        with self.lock:
            self.started[plan.job_id] = sc
        try:
            stats = play(self.settings, sc, speed=1.0, announce_phases=True)
        except Exception as exc:  # reported as a driver failure; the soak goes on
            with self.lock:
                self.errors[plan.job_id] = f"{type(exc).__name__}: {exc}"
            return
        with self.lock:
            self.sent[plan.job_id] = stats.step_messages


# -- infrastructure started by the soak -----------------------------------------------------
def _run_script(name: str, args: list[str], env: dict[str, str], log: Path) -> str:
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / name), *args], env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    with log.open("a") as f:
        f.write(f"$ {name} {' '.join(args)}\n{out.stderr}{out.stdout}")
    if out.returncode != 0:
        raise RuntimeError(f"{name} {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return out.stdout


_HANDED_OUT: set[int] = set()

#: where services' ports come from without ``--ports``: below Linux's default ephemeral
#: range (32768-60999), so that no client socket of the run takes one of them while its
#: service is down (the broker restarts on its own port, with its data)
DEFAULT_PORTS = "20000-28999"


def ephemeral_ports() -> tuple[int, int] | None:
    """The kernel's range for the local ports of outgoing connections, if known."""
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    except (OSError, ValueError):
        return None
    return int(lo), int(hi)


def pick_port() -> int:
    """A free local port: from ``SOAK_PORTS`` (``LO-HI``: a range agreed with whoever
    else runs services on the machine; ``--ports``, outside the ephemeral range) when
    set, else any the system gives. A port is handed out once per run (services bind
    theirs later)."""
    spec = os.environ.get("SOAK_PORTS")
    if not spec:
        return free_port()
    lo, hi = (int(x) for x in spec.split("-", 1))
    for port in random.sample(range(lo, hi + 1), hi - lo + 1):
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free port left in SOAK_PORTS={spec}")


class KafkaBroker:
    """``scripts/kafka.sh`` with its own state dir and ports; ``--keep-data`` always, so
    :meth:`restart` keeps topics, records and committed offsets."""

    def __init__(self, home: Path, logs: Path) -> None:
        self.port = pick_port()
        self.version = os.environ.get("KAFKA_VERSION", "4.4.0")
        self.env = {
            **os.environ, "KAFKA_HOME_DIR": str(home), "KAFKA_PORT": str(self.port),
            "KAFKA_CONTROLLER_PORT": str(pick_port()),
        }  # fmt: skip
        shared = Path("/tmp/stepguard-kafka") / f"libs-{self.version}"  # kafka.sh's default
        if "KAFKA_LIBS_DIR" not in os.environ and (shared / ".complete").exists():
            self.env["KAFKA_LIBS_DIR"] = str(shared)  # no second Maven fetch
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.log = logs / "kafka.sh.log"
        self.server_log = home / "logs" / "server.log"

    def start(self) -> None:
        _run_script("kafka.sh", ["start", "--keep-data"], self.env, self.log)

    def stop(self, keep: bool = True) -> None:
        _run_script("kafka.sh", ["stop", *(["--keep-data"] if keep else [])], self.env, self.log)


class ClickHouseServer:
    """``scripts/clickhouse.sh`` with its own state dir and ports."""

    def __init__(self, state: Path, logs: Path) -> None:
        self.state = state
        self.logs = logs
        self.env = {
            **os.environ, "CLICKHOUSE_STATE_DIR": str(state),
            "CLICKHOUSE_TCP_PORT": str(pick_port()), "CLICKHOUSE_HTTP_PORT": str(pick_port()),
        }  # fmt: skip
        self.log = logs / "clickhouse.sh.log"

    def start(self) -> str:
        out = _run_script("clickhouse.sh", ["start"], self.env, self.log)
        return out.strip().splitlines()[-1].split("=", 1)[1]

    def stop(self) -> None:
        err = self.state / "log" / "clickhouse-server.err.log"
        with contextlib.suppress(OSError):
            shutil.copy(err, self.logs / "clickhouse-server.err.log")
        _run_script("clickhouse.sh", ["stop"], self.env, self.log)


# -- the services, as a supervisor runs them ------------------------------------------------
def _group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (a service runs in a session of its own)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(p.name))
    return out


def _cmdline(pid: int) -> str:
    """What a process runs, short: the code of ``python -c CODE``, else its argv."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return "?"
    if "-c" in argv[:-1]:
        return "python -c " + " ".join(argv[argv.index("-c") + 1].split())[:60]
    return " ".join(Path(argv[0]).name.split() + argv[1:])[:80]


class Service:
    """One ``stepguard <service>`` process; every incarnation logs to a file of its own."""

    def __init__(
        self, name: str, kind: str, args: list[str], env: Callable[[Service], dict[str, str]],
        logs: Path,
    ) -> None:  # fmt: skip
        self.name, self.kind, self.args, self._env, self.logs = name, kind, args, env, logs
        self.proc: subprocess.Popen[bytes] | None = None
        self.incarnation = 0
        self.port = 0  #: metrics port (workers)
        self.started_at = 0.0
        self.restart_at: float | None = None
        self.killed = False
        self.fast_failures = 0

    @property
    def log(self) -> Path:
        return self.logs / f"{self.name}.{self.incarnation}.log"

    def start(self) -> None:
        self.incarnation += 1
        self.port = pick_port() if self.kind == "worker" else 0
        self.killed = False
        self.restart_at = None
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(STEPGUARD), *self.args], cwd=ROOT, env=self._env(self), stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else -1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> list[str]:
        """SIGKILL the service (its main process only); returns the other processes of
        its group still running a moment later."""
        assert self.proc is not None
        self.killed = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        time.sleep(0.3)
        return [f"{pid} {_cmdline(pid)}" for pid in _group_members(self.proc.pid)]

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # anything it left behind
        return self.proc.returncode

    def rss_mb(self) -> float | None:
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return None
        m = re.search(r"VmRSS:\s+(\d+) kB", status)
        return int(m.group(1)) / 1024 if m else None

    def metrics(self) -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as r:
                return str(r.read().decode())
        except OSError:
            return None

    def lag(self) -> float | None:
        """The worker's consumer lag, less its own table changelog (which it writes and
        reads only when it recovers: the metric counts it as lag for good)."""
        text = self.metrics()
        if text is None:
            return None
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("stepguard_worker_consumer_lag{") and "-changelog" not in line
        )

    def metric(self, name: str) -> float | None:
        text = self.metrics()
        if text is None:
            return None
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and not line.startswith("#")
        )


# -- consumer lag ----------------------------------------------------------------------------
def group_lag(settings: Settings, group: str, logical: list[str]) -> int | None:
    """Records of ``logical`` topics not yet committed by ``group`` (None: no answer)."""
    from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

    registry = registry_of(settings)
    cfg = client_config(settings) | {"request_timeout_ms": 5000}
    admin = consumer = None
    try:
        admin = KafkaAdminClient(**cfg)
        committed = admin.list_group_offsets(group).get(group, {})
        consumer = KafkaConsumer(**cfg, group_id=None)
        parts = [
            TopicPartition(registry.name(t), p)
            for t in logical
            for p in sorted(consumer.partitions_for_topic(registry.name(t)) or ())
        ]
        end = consumer.end_offsets(parts)
        lag = 0
        for tp in parts:
            done = committed.get(tp)
            lag += max(0, end[tp] - (done.offset if done is not None and done.offset >= 0 else 0))
        return lag
    except Exception:  # the broker is restarting or busy: no figure this time
        return None
    finally:
        for client in (consumer, admin):
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close()


class _StepKey(msgspec.Struct):
    job_id: str
    node: str
    step: int
    ts_end: datetime


class _EventTime(msgspec.Struct):
    ts: datetime
    kind: str = ""


def _quantiles(values: list[float]) -> dict[str, Any]:
    values = sorted(values)
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50_s": round(values[len(values) // 2], 3),
        "p99_s": round(values[min(len(values) - 1, int(len(values) * 0.99))], 3),
        "max_s": round(values[-1], 3),
    }


def read_topic(settings: Settings, topic: str) -> Iterator[Any]:
    """Every record of ``topic`` up to its end now (kafka-python ConsumerRecords)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        **client_config(settings), group_id=None, enable_auto_commit=False,
        max_partition_fetch_bytes=16 * 1024 * 1024, fetch_max_bytes=64 * 1024 * 1024,
    )  # fmt: skip
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        end = consumer.end_offsets(parts)
        deadline = time.monotonic() + 300
        while any(consumer.position(tp) < end[tp] for tp in parts):
            if time.monotonic() > deadline:
                raise RuntimeError(f"reading {topic} took over 300 s")
            for tp, records in consumer.poll(timeout_ms=1000, max_records=50_000).items():
                yield from (r for r in records if r.offset < end[tp])
    finally:
        consumer.close()


def steps_in_topic(
    settings: Settings, prefix: str
) -> tuple[dict[str, tuple[int, int]], dict[str, Any]]:
    """Per job: (messages, distinct (step, node)) in the steps topic itself; and how late
    the driver published them (record timestamp minus the step's end: real time kept?)."""
    decoder = msgspec.json.Decoder(_StepKey)
    total: Counter[str] = Counter()
    keys: dict[str, set[tuple[int, str]]] = defaultdict(set)
    late: list[float] = []
    for r in read_topic(settings, registry_of(settings).name("steps")):
        k = decoder.decode(r.value)
        if k.job_id.startswith(prefix):
            total[k.job_id] += 1
            keys[k.job_id].add((k.step, k.node))
            late.append(r.timestamp / 1000 - k.ts_end.timestamp())
    return {job: (total[job], len(keys[job])) for job in total}, _quantiles(late)


def forward_delays(settings: Settings) -> dict[str, Any]:
    """How long the workers took to re-key lifecycle events and health reports to the
    internal jobs topic, where the job's owner reads them: the forwarded record's
    timestamp minus the original's (first forward of each), seconds, per kind."""
    from pipeline.services.worker.app import jobs_topic_name
    from pipeline.services.worker.state import KIND_HEADER

    registry = registry_of(settings)
    sent: dict[str, dict[bytes, int]] = {}
    published_late: list[float] = []  # announcements: record timestamp - event time
    event_time = msgspec.json.Decoder(_EventTime)
    for kind in ("lifecycle", "health"):
        sent[kind] = {}
        for r in read_topic(settings, registry.name(kind)):
            sent[kind].setdefault(hashlib.blake2b(r.value, digest_size=16).digest(), r.timestamp)
            if kind == "lifecycle":
                e = event_time.decode(r.value)
                if e.kind == "phase":
                    published_late.append(r.timestamp / 1000 - e.ts.timestamp())
    delays: dict[str, list[float]] = defaultdict(list)
    slow: list[dict[str, Any]] = []  # lifecycle events forwarded more than 1 s late
    done: set[bytes] = set()
    for r in read_topic(settings, jobs_topic_name(settings)):
        kind = dict(r.headers or []).get(KIND_HEADER, b"").decode()
        if kind not in sent:
            continue
        digest = hashlib.blake2b(r.value, digest_size=16).digest()
        if digest in done or digest not in sent[kind]:
            continue
        done.add(digest)
        delay = (r.timestamp - sent[kind][digest]) / 1000
        delays[kind].append(delay)
        if kind == "lifecycle" and delay > 1.0:
            event = json.loads(r.value)
            slow.append({"job": event.get("job_id"), "event": event.get("kind"),
                         "step": event.get("step"), "sent_ms": sent[kind][digest],
                         "delay_s": round(delay, 2)})  # fmt: skip
    out: dict[str, Any] = {kind: _quantiles(values) for kind, values in delays.items()}
    return out | {"slow_lifecycle": slow, "phase_published_late": _quantiles(published_late)}


# -- the soak ---------------------------------------------------------------------------------
@dataclass
class Chaos:
    kills: list[dict[str, Any]] = field(default_factory=list)
    self_exits: list[dict[str, Any]] = field(default_factory=list)
    broker: list[dict[str, Any]] = field(default_factory=list)
    checks: list[tuple[float, Service, int, dict[str, Any]]] = field(default_factory=list)
    #: (when, process group, kill record): children of a killed service still running
    orphans: list[tuple[float, int, dict[str, Any]]] = field(default_factory=list)


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.profile = QUICK if args.quick else FULL
        self.tag = os.environ.get("SOAK_TAG") or secrets.token_hex(3)
        self.tmp = Path(os.environ.get("SOAK_TMP") or snapshot_root(self.tag))
        self.logs = self.tmp / "logs"
        self.logs.mkdir()
        self.broker: KafkaBroker | None = None
        self.clickhouse: ClickHouseServer | None = None
        self.services: list[Service] = []
        self.broker_up = threading.Event()
        self.broker_up.set()
        self.chaos = Chaos()
        self.result: dict[str, Any] = {}
        self.t0 = self.wall_t0 = 0.0
        self.n_jobs = 0
        #: (seconds, RSS MB per worker, incarnation per worker, jobs running), every 10 s
        self.rss_series: list[tuple[int, list[int | None], list[int], int]] = []
        self.code = CODE
        self.revision = os.environ.get("SOAK_REVISION") or _revision("worktree")
        self.keys: dict[str, dict[str, str]] = {}  #: signing settings per service kind

    # -- set-up ------------------------------------------------------------------------------
    def infrastructure(self) -> Settings:
        args = self.args
        if args.bootstrap:
            bootstrap = args.bootstrap
            print(f"broker: {bootstrap} (given; it is not restarted)", flush=True)
        else:
            print("starting Apache Kafka (scripts/kafka.sh --keep-data) ...", flush=True)
            self.broker = KafkaBroker(self.tmp / "kafka", self.logs)
            self.broker.start()
            bootstrap = self.broker.bootstrap
        if args.clickhouse:
            dsn = args.clickhouse
        else:
            print("starting ClickHouse (scripts/clickhouse.sh) ...", flush=True)
            self.clickhouse = ClickHouseServer(self.tmp / "clickhouse", self.logs)
            dsn = self.clickhouse.start()
        dsn = urlsplit(dsn)._replace(path=f"/soak_{self.tag}").geturl()  # a fresh database
        return load_settings(
            {}, kafka_bootstrap=bootstrap, broker_flavor="kafka",
            topic_prefix=f"soak{self.tag}.", consumer_group=f"soak{self.tag}",
            clickhouse_dsn=dsn,
        )  # fmt: skip

    def signing(self) -> dict[str, dict[str, str]]:
        """Signing settings per service kind: one HMAC key shared by all
        (``STEPGUARD_COMMAND_KEYS``), or, where the code has them, an Ed25519 key pair per
        role (every ``<role>_private_key`` setting; ``stepguard keys generate``): each
        service the private key of its own role, if it has one, and every public key."""
        kinds = ("worker", "actuator", "executor", "archiver", "setup")
        if "command_keys" in Settings.model_fields:
            shared = {"STEPGUARD_COMMAND_KEYS": f"soak:{secrets.token_hex(16)}"}
            return dict.fromkeys(kinds, shared)
        # a job controller's key signs for one job (``keys generate --job``): the soak
        # runs no job controller (its executor is dry-run), so it needs none
        roles = [f.removesuffix("_private_key") for f in Settings.model_fields
                 if f.endswith("_private_key") and f != "job_controller_private_key"]  # fmt: skip
        lines: dict[str, str] = {}
        for role in roles:
            out = subprocess.run(
                [str(STEPGUARD), "keys", "generate", "--role", role], cwd=ROOT, check=True,
                capture_output=True, text=True, timeout=60,
                env={**os.environ, "PYTHONPATH": str(self.code)},
            )  # fmt: skip
            lines |= dict(line.split("=", 1) for line in out.stdout.split() if "=" in line)
        public = {k: v for k, v in lines.items() if k.endswith("_PUBLIC_KEYS")}
        own = {kind: f"STEPGUARD_{kind.upper()}_PRIVATE_KEY" for kind in kinds}
        return {
            kind: public | ({own[kind]: lines[own[kind]]} if own[kind] in lines else {})
            for kind in kinds
        }

    def service_env(self, settings: Settings, spares: int) -> Callable[[Service], dict[str, str]]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("STEPGUARD_")} | {
            "PYTHONUNBUFFERED": "1",
            "STEPGUARD_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "STEPGUARD_BROKER_FLAVOR": "kafka",
            "STEPGUARD_TOPIC_PREFIX": settings.topic_prefix,
            "STEPGUARD_CONSUMER_GROUP": settings.consumer_group,
            "STEPGUARD_CLICKHOUSE_DSN": settings.clickhouse_dsn.get_secret_value(),  # type: ignore[union-attr]
            "STEPGUARD_STATE_DIR": str(self.tmp / "state"),
            "STEPGUARD_CHDB_PATH": str(self.tmp / "state" / "chdb-unused"),
            # the code as it was at the start: a restart never runs a newer version
            "PYTHONPATH": str(self.code),
        }

        keys = self.signing()

        def env(s: Service) -> dict[str, str]:
            out = base | keys[s.kind]
            if s.kind == "worker":
                out["STEPGUARD_WORKER_METRICS_PORT"] = str(s.port)
                out["STEPGUARD_WORKER_DATA_DIR"] = str(self.tmp / "state" / s.name)
            if s.kind == "actuator":
                out["STEPGUARD_ACTUATOR_MODE"] = "auto"
                out["STEPGUARD_SPARE_NODES"] = ",".join(f"spare-{i:03d}" for i in range(spares))
            return out

        return env

    def start_services(self, settings: Settings) -> None:
        env = self.service_env(settings, spares=4 * self.profile.jobs)
        once = env(Service("setup", "setup", [], env, self.logs))
        for args in (["topics"], ["archive", "migrate"]):
            out = subprocess.run(
                [str(STEPGUARD), *args], cwd=ROOT, env=once, capture_output=True, text=True,
                timeout=120, check=False,
            )  # fmt: skip
            (self.logs / f"{args[-1]}.log").write_text(out.stdout + out.stderr)
            if out.returncode != 0:
                raise RuntimeError(f"stepguard {' '.join(args)} failed:\n{out.stderr[-2000:]}")
        self.services = [
            Service("worker-a", "worker", ["worker", "--loglevel", "info"], env, self.logs),
            Service("worker-b", "worker", ["worker", "--loglevel", "info"], env, self.logs),
            Service("actuator", "actuator", ["actuator", "--verbose"], env, self.logs),
            Service("executor", "executor", ["executor", "dry-run"], env, self.logs),
            Service("archiver", "archiver", ["archiver", "--progress-s", "10"], env, self.logs),
        ]
        for s in self.services:
            s.start()
        workers = self.workers
        deadline = time.monotonic() + 120
        owned = 0.0
        while time.monotonic() < deadline:
            self.supervise()
            each = [w.metric("stepguard_worker_assigned_partitions") or 0 for w in workers]
            owned = sum(each)
            if owned >= 16 and all(each):
                break  # steps + the internal jobs topic, 8 partitions each, split in two
            time.sleep(1)
        print(f"services up: workers own {owned:.0f} of 16 partitions", flush=True)

    @property
    def workers(self) -> list[Service]:
        return [s for s in self.services if s.kind == "worker"]

    # -- the supervisor --------------------------------------------------------------------
    def supervise(self) -> None:
        now = time.monotonic()
        for s in self.services:
            if s.restart_at is None and not s.alive():
                lived = now - s.started_at
                if not s.killed:
                    rc = s.proc.returncode if s.proc is not None else None
                    exit_ = {"t": round(self.elapsed, 1), "service": s.name, "rc": rc,
                             "lived_s": round(lived, 1), "log": str(s.log)}  # fmt: skip
                    self.chaos.self_exits.append(exit_)
                    print(f"  ! {s.name} exited by itself (rc {rc}) after {lived:.0f}s; "
                          f"restarting (log {s.log})", flush=True)  # fmt: skip
                s.fast_failures = s.fast_failures + 1 if lived < 10 and not s.killed else 0
                s.restart_at = now + min(15.0, 1.0 * 2**s.fast_failures)
            if s.restart_at is not None and now >= s.restart_at:
                s.start()
        for check in list(self.chaos.checks):
            due, s, inc, record = check
            if now < due:
                continue
            ok = s.incarnation == inc and s.alive()
            if ok and s.kind == "worker":
                ok = s.metrics() is not None
            record["survived"] = ok
            self.chaos.checks.remove(check)
        for orphan in list(self.chaos.orphans):
            due, pgid, record = orphan
            if now < due:
                continue
            left = [f"{pid} {_cmdline(pid)}" for pid in _group_members(pgid)]
            record["orphans"] = left
            if left:  # what a supervisor that stops a cgroup or container does
                print(f"  ! {len(left)} process(es) of killed {record['service']} still "
                      f"running after {ORPHAN_GRACE_S:.0f}s: killing them", flush=True)  # fmt: skip
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
            self.chaos.orphans.remove(orphan)

    def kill_one(self, rng: random.Random, order: list[str]) -> None:
        if not order:
            order.extend(rng.sample(KILL_KINDS, len(KILL_KINDS)))
        kind = order.pop(0)
        candidates = [s for s in self.services if s.kind == kind and s.alive()]
        if not candidates:
            return
        s = rng.choice(candidates)
        pid = s.pid
        left = s.kill()
        record = {"t": round(self.elapsed, 1), "wall": time.time(), "service": s.name,
                  "pid": pid, "children_at_kill": len(left), "orphans": []}  # fmt: skip
        self.chaos.kills.append(record)
        now = time.monotonic()
        s.restart_at = now + 1.0  # a supervisor's restart delay
        self.chaos.checks.append((now + 1.0 + SURVIVE_S, s, s.incarnation + 1, record))
        if left:
            self.chaos.orphans.append((now + ORPHAN_GRACE_S, pid, record))
        extra = f" ({len(left)} child process(es) still running)" if left else ""
        print(f"  x SIGKILL {s.name} (pid {pid}){extra}", flush=True)

    def restart_broker(self) -> None:
        assert self.broker is not None
        record: dict[str, Any] = {"t": round(self.elapsed, 1)}
        self.chaos.broker.append(record)
        print("  x broker: stop (data kept) ...", flush=True)
        self.broker_up.clear()
        t = time.monotonic()
        record["wall_down"] = time.time()
        try:
            self.broker.stop(keep=True)
            record["stopped_s"] = round(time.monotonic() - t, 1)
            self.broker.start()
            record["down_s"] = round(time.monotonic() - t, 1)
            record["wall_up"] = time.time()
            print(f"  x broker: back after {record['down_s']}s", flush=True)
        except Exception as exc:
            record["error"] = str(exc)[-500:]
            print(f"  ! broker restart failed: {exc}", flush=True)
        finally:
            self.broker_up.set()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.t0 if self.t0 else 0.0

    # -- the run ------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        args, profile = self.args, self.profile
        print(f"soak {self.tag}: logs in {self.logs}", flush=True)
        settings = self.infrastructure()
        self.start_services(settings)
        window = args.minutes * 60.0
        n_jobs = self.n_jobs = args.jobs or profile.jobs
        plans = plan_jobs(profile, n_jobs, window, self.tag, args.seed)
        kinds = Counter(p.fault for p in plans)
        sizes = sorted(Scenario.model_validate(p.spec).nodes for p in plans)
        every = args.kill_every or profile.kill_every_s
        print(f"{n_jobs} jobs of {sizes[0]}-{sizes[-1]} nodes over {window:.0f}s "
              f"(faults: {dict(kinds)}); kill every ~{every:.0f}s", flush=True)  # fmt: skip
        driver = Driver(settings, plans, self.broker_up)
        rng = random.Random(args.seed)
        kill_at = every * (1 + rng.uniform(-0.1, 0.1))
        order: list[str] = []
        k_mid = max(1, round(window / 2 / every))
        broker_at = (k_mid + 0.5) * every if self.broker is not None else None
        broker_thread: threading.Thread | None = None
        rss_start: float | None = None
        worker_inc_at_baseline: list[int] = []
        busy0 = cores_busy()
        self.t0, self.wall_t0 = time.monotonic(), time.time()
        driver.start()
        next_progress = 0.0
        hard_stop = window + args.overrun_s
        while True:
            el = self.elapsed
            self.supervise()
            if el >= kill_at and el < window:
                if broker_thread is None or not broker_thread.is_alive():
                    self.kill_one(rng, order)
                kill_at += every * (1 + rng.uniform(-0.1, 0.1))
            if broker_at is not None and el >= broker_at and broker_thread is None:
                broker_thread = threading.Thread(target=self.restart_broker, daemon=True)
                broker_thread.start()
            if rss_start is None and el >= profile.rss_baseline_s:
                rss = [w.rss_mb() for w in self.workers]
                if all(r is not None for r in rss) and all(w.alive() for w in self.workers):
                    rss_start = sum(r for r in rss if r is not None)
                    worker_inc_at_baseline = [w.incarnation for w in self.workers]
            if el >= next_progress:
                self.progress(settings, driver)
                next_progress += 10.0
            restarting = broker_thread is not None and broker_thread.is_alive()
            if driver.done and el >= window and not restarting:
                break
            if el >= hard_stop:
                print(f"  ! jobs still running at {hard_stop:.0f}s: driver stopped", flush=True)
                driver.stop()
                break
            time.sleep(0.5)
        busy1 = cores_busy()
        chaos_s = self.elapsed
        print(f"chaos phase over after {chaos_s:.0f}s; draining ...", flush=True)
        drained, drain_s = self.drain(settings, args.drain_timeout)
        rss_end = sum(w.rss_mb() or 0.0 for w in self.workers)
        for w in self.workers:  # what the workers said last, for the record
            (self.logs / f"{w.name}.{w.incarnation}.metrics.txt").write_text(w.metrics() or "")
        worker_restarts = sum(
            w.incarnation - i for w, i in zip(self.workers, worker_inc_at_baseline, strict=False)
        )
        for _, _, _, record in self.chaos.checks:  # still pending: judge them now
            record.setdefault("survived", None)
        r = self.measure(settings, driver)
        r |= {
            "mode": "quick" if args.quick else "full",
            "minutes": args.minutes,
            "chaos_s": round(chaos_s, 1),
            "drained": drained,
            "drain_s": round(drain_s, 1),
            "kills": len(self.chaos.kills),
            "restarts_survived": sum(1 for k in self.chaos.kills if k.get("survived")),
            "kill_log": self.chaos.kills,
            "self_exits": self.chaos.self_exits,
            "broker_restarts": self.chaos.broker,
            "job_starts_held_s": round(driver.held_s, 1),
            "worker_rss_mb_start": round(rss_start, 1) if rss_start is not None else None,
            "worker_rss_mb_end": round(rss_end, 1),
            "worker_restarts_after_rss_start": worker_restarts,
            "worker_rss_mb_end_each": [round(w.rss_mb() or 0.0, 1) for w in self.workers],
            "worker_rss_series": self.rss_series,
            "cores_busy": (
                round((busy1[0] - busy0[0]) / (busy1[1] - busy0[1]) * (os.cpu_count() or 1), 2)
                if busy0 and busy1 and busy1[1] > busy0[1]
                else None
            ),
            "logs": str(self.logs),
        }
        return r

    def progress(self, settings: Settings, driver: Driver) -> None:
        started, ended = driver.counts()
        if self.broker_up.is_set():
            lag = group_lag(settings, f"{settings.consumer_group}.archiver", list(TOPICS))
            lag_s = "?" if lag is None else f"{lag:,}"
        else:
            lag_s = "(broker down)"
        wlag = [w.lag() for w in self.workers]
        wlag_s = "/".join("-" if x is None else f"{x:.0f}" for x in wlag)
        rss = [w.rss_mb() for w in self.workers]
        self.rss_series.append(
            (round(self.elapsed), [None if x is None else round(x) for x in rss],
             [w.incarnation for w in self.workers], started - ended - len(driver.errors))
        )  # fmt: skip
        rss_s = "/".join("-" if x is None else f"{x:.0f}" for x in rss)
        down = [s.name for s in self.services if not s.alive()]
        print(
            f"[{self.elapsed:5.0f}s] jobs started {started}, ended {ended}, running "
            f"{started - ended - len(driver.errors)}; kills {len(self.chaos.kills)}, "
            f"self-exits {len(self.chaos.self_exits)}; archiver lag {lag_s}, worker lag "
            f"{wlag_s}, worker RSS {rss_s} MB" + (f"; down: {','.join(down)}" if down else ""),
            flush=True,
        )

    def drain(self, settings: Settings, timeout_s: float) -> tuple[bool, float]:
        """Wait until every service's group has committed everything, twice in a row, and
        the last restarts have been up long enough to judge."""
        cg = settings.consumer_group
        groups = {
            f"{cg}.worker": ["steps", "lifecycle"],
            f"{cg}.actuator": ["decisions"],
            f"{cg}.executor.dry-run": ["commands"],
            f"{cg}.archiver": list(TOPICS),
        }
        t0 = time.monotonic()
        zero_in_row = 0
        last: dict[str, int | None] = {}
        while time.monotonic() - t0 < timeout_s:
            self.supervise()
            last = {g: group_lag(settings, g, topics) for g, topics in groups.items()}
            zero_in_row = zero_in_row + 1 if all(v == 0 for v in last.values()) else 0
            if zero_in_row >= 2 and not self.chaos.checks and not self.chaos.orphans:
                return True, time.monotonic() - t0
            time.sleep(3)
        print(f"  ! not drained after {timeout_s:.0f}s: {last}", flush=True)
        return False, time.monotonic() - t0

    # -- measurements -------------------------------------------------------------------------
    def measure(self, settings: Settings, driver: Driver) -> dict[str, Any]:
        prefix = f"soak-{self.tag}-"
        backend = open_backend(settings)
        db = backend.database
        like = f"job_id LIKE '{prefix}%'"
        try:
            _, version = backend.query("SELECT version()")
            # the table's key: (job_id, step, rank), or (job_id, run, step, rank) where
            # the archive keeps each run of a job apart
            _, columns = backend.query(
                f"SELECT name FROM system.columns WHERE database = '{db}' AND table = 'steps'"
            )
            run = "run, " if ("run",) in columns else ""
            _, step_rows = backend.query(
                f"SELECT job_id, count(), uniqExact({run}step, node), uniqExact({run}step, rank) "
                f"FROM {db}.steps FINAL WHERE {like} GROUP BY job_id"
            )
            _, end_of_step = backend.query(
                f"SELECT job_id, step, max(ts_ms) FROM {db}.steps FINAL WHERE {like} "
                "GROUP BY job_id, step"
            )
            _, alert_rows = backend.query(
                f"SELECT job_id, fingerprint, seq, kind, toString(state), node, step, ts_ms "
                f"FROM {db}.alerts FINAL WHERE {like} ORDER BY job_id, fingerprint, seq"
            )
            _, end_rows = backend.query(
                f"SELECT job_id, max(ts_ms) FROM {db}.job_events FINAL "
                f"WHERE {like} AND kind = 'end' GROUP BY job_id"
            )
            _, cmd_rows = backend.query(
                f"SELECT kind, count() FROM {db}.commands FINAL WHERE {like} GROUP BY kind"
            )
            _, dl_rows = backend.query(f"SELECT count() FROM {db}.dead_letters FINAL")
            dump = {
                table: backend.query(f"SELECT {cols} FROM {db}.{table} FINAL WHERE {like} "
                                     "ORDER BY ts_ms")[1]
                for table, cols in (
                    ("alerts", "job_id, kind, grade, state, node, step, ts_ms, summary"),
                    ("job_events", "job_id, kind, step, phase, reason, ts_ms"),
                    ("commands", "job_id, command_id, kind, targets, ts_ms"),
                    ("command_results", "job_id, command_id, executor, status, ts_ms"),
                )
            }  # fmt: skip
        finally:
            backend.close()
        dump["jobs"] = [sc.model_dump(mode="json") for sc in driver.started.values()]
        (self.logs / "archive.json").write_text(json.dumps(dump, default=str, indent=1))
        archived = {r[0]: (int(r[1]), int(r[2]), int(r[3])) for r in step_rows}
        topic, steps_late = steps_in_topic(settings, prefix)
        ends = {r[0]: int(r[1]) for r in end_rows}
        started, sent = dict(driver.started), dict(driver.sent)
        lost_by_job = {
            job: n - archived.get(job, (0, 0, 0))[1]
            for job, n in sent.items()
            if n != archived.get(job, (0, 0, 0))[1]
        }
        commands = list(read_back(settings, "commands"))
        isolations = [
            (c.job_id, node)
            for c in (r.message for r in commands)
            if c.kind is CommandKind.ISOLATE  # type: ignore[attr-defined]
            for node in c.targets  # type: ignore[attr-defined]
        ]
        step_end = {(r[0], int(r[1])): int(r[2]) for r in end_of_step}
        delays = forward_delays(settings)
        for item in delays["slow_lifecycle"]:
            sent_ms = item.pop("sent_ms")
            item |= {"at_s": self.at_s(sent_ms), "near": self.near(sent_ms)}
        alerts = self.judge_alerts(started, alert_rows, ends, step_end, isolations)
        results = list(read_back(settings, "results"))
        succeeded = Counter(
            (r.message.command_id, r.message.executor)  # type: ignore[attr-defined]
            for r in results
            if r.message.status is CommandStatus.SUCCEEDED  # type: ignore[attr-defined]
        )
        return {
            "clickhouse_version": str(version[0][0]),
            "jobs_planned": self.n_jobs,
            "jobs_started": len(started),
            "jobs_ended": len(sent),
            "driver_errors": dict(driver.errors),
            "nodes_min": min((sc.nodes for sc in started.values()), default=0),
            "nodes_max": max((sc.nodes for sc in started.values()), default=0),
            "records_sent": sum(sent.values()),
            "records_in_topic": sum(topic.get(j, (0, 0))[1] for j in sent),
            "topic_duplicates": sum(a - b for a, b in topic.values()),
            "records_archived": sum(archived.get(j, (0, 0, 0))[1] for j in sent),
            "lost_records": sum(max(0, v) for v in lost_by_job.values()),
            "lost_by_job": lost_by_job,
            "duplicate_rows": sum(rows - keys for rows, _, keys in archived.values()),
            "dead_letters": int(dl_rows[0][0]) if dl_rows else 0,
            **alerts,
            "commands_issued": len({r.message.command_id for r in commands}),  # type: ignore[attr-defined]
            "command_messages": len(commands),
            "commands_by_kind": {str(k): int(n) for k, n in cmd_rows},
            "command_results_succeeded": len(succeeded),
            "duplicate_commands": sum(1 for n in succeeded.values() if n > 1),
            "checkpoints_announced": sum(1 for e in dump["job_events"] if e[1] == "phase"),
            "forward_delays": delays,
            "driver_steps_published_late": steps_late,
        }

    def judge_alerts(
        self,
        started: dict[str, Scenario],
        rows: list[tuple[Any, ...]],
        ends: dict[str, int],
        step_end: dict[tuple[str, int], int],
        isolations: list[tuple[str, str]],
    ) -> dict[str, Any]:
        """Injected faults against the archived alerts; hang episodes against the faults,
        the checkpoints and each job's END; alerts and isolations of healthy nodes. Each
        miss or false alarm names the disruptions (kills, broker outage) around it."""
        firing: dict[str, list[tuple[str, str, int, str]]] = defaultdict(list)  # job -> ...
        first: dict[str, tuple[str, str, str, int, int]] = {}  # fp -> job, kind, node, step, ts
        for job, fp, _seq, kind, state, node, step, ts_ms in rows:
            if state != "firing":
                continue
            firing[job].append((kind, node, int(step), fp))
            first.setdefault(fp, (job, kind, node, int(step), int(ts_ms)))
        expected, missed = 0, []
        for job, sc in started.items():
            for f in sc.faults:
                if f.is_trap:
                    continue
                expected += 1
                node = f"node-{f.node:04d}" if f.node is not None else None
                hit = any(
                    _explains(f.kind.value, f.onset_step, node, kind, a_node, step)
                    for kind, a_node, step, _ in firing.get(job, [])
                )
                if not hit:
                    seen = sorted({(k, n, s) for k, n, s, _ in firing.get(job, [])})[:6]
                    onset_ms = step_end.get((job, f.onset_step - 1))
                    item = {"job": job, "fault": f.kind.value, "node": node,
                            "onset_step": f.onset_step, "alerts_seen": seen}  # fmt: skip
                    missed.append(item | {"at_s": self.at_s(onset_ms), "near": self.near(onset_ms)})
        classes: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for fp, (job, kind, _node, step, ts_ms) in first.items():
            if kind != "hang":
                continue
            sc = started.get(job)
            item = {"job": job, "step": step, "fingerprint": fp, "at_s": self.at_s(ts_ms),
                    "near": self.near(ts_ms)}  # fmt: skip
            if sc is None:
                classes["unknown_job"].append(item)
            elif any(_in_stall(f.kind.value, f.onset_step, step) for f in sc.faults):
                classes["explained"].append(item)
            elif job in ends and ts_ms > ends[job]:
                classes["after_end"].append(item | {"after_end_s": (ts_ms - ends[job]) / 1000})
            elif sc.checkpoint_every and (step + 1) % sc.checkpoint_every == 0:
                classes["checkpoint"].append(item)
            else:
                classes["other"].append(item)
        fault_nodes = {
            job: {f"node-{f.node:04d}" for f in sc.faults if f.node is not None}
            for job, sc in started.items()
        }
        false_alerts = [
            {
                "job": job,
                "kind": kind,
                "node": node,
                "step": step,
                "at_s": self.at_s(ts_ms),
                "near": self.near(ts_ms),
            }
            for job, kind, node, step, ts_ms in first.values()
            if kind not in ("hang", "guardrail") and node not in fault_nodes.get(job, set())
        ]
        false_isolations = sorted(
            {(job, n) for job, n in isolations if n not in fault_nodes.get(job, set())}
        )
        return {
            "alerts_expected": expected,
            "alerts_missed": len(missed),
            "alerts_missed_near_a_disruption": sum(1 for m in missed if m["near"]),
            "missed": missed,
            "hang_episodes": sum(1 for v in first.values() if v[1] == "hang"),
            "false_hangs": len(classes["after_end"]) + len(classes["checkpoint"]),
            "false_hangs_after_end": classes["after_end"],
            "false_hangs_checkpoint": classes["checkpoint"],
            "other_unexplained_hangs": len(classes["other"]) + len(classes["unknown_job"]),
            "other_unexplained_hang_list": classes["other"] + classes["unknown_job"],
            "false_alert_episodes": len(false_alerts),
            "false_alert_kinds": dict(Counter(a["kind"] for a in false_alerts)),
            "false_alert_list": false_alerts,
            "false_isolations": len(false_isolations),
            "false_isolation_list": [list(x) for x in false_isolations],
        }

    def at_s(self, ts_ms: int | None) -> float | None:
        """An event time as seconds into the chaos phase."""
        return None if ts_ms is None else round(ts_ms / 1000 - self.wall_t0, 1)

    def near(self, ts_ms: int | None, slack_s: float = 5.0) -> list[str]:
        """The disruptions whose effect may cover ``ts_ms``: a worker kill (session
        timeout, rebalance and recovery: 30 s), another kill (10 s), the broker outage and
        the grace the worker gives afterwards (as long as the outage)."""
        if ts_ms is None:
            return []
        t = ts_ms / 1000
        out = []
        for k in self.chaos.kills:
            span = 30.0 if k["service"].startswith("worker") else 10.0
            if k["wall"] - slack_s <= t <= k["wall"] + span:
                out.append(f"{k['service']} killed at {k['t']:.0f}s")
        for b in self.chaos.broker:
            down, up = b.get("wall_down"), b.get("wall_up")
            if down is not None and up is not None and down - slack_s <= t <= up + (up - down):
                out.append(f"broker down {b['t']:.0f}-{b['t'] + (up - down):.0f}s")
        return out

    # -- tear-down ----------------------------------------------------------------------------
    def close(self) -> None:
        codes = {s.name: s.stop() for s in self.services}
        if codes:
            print(f"services stopped: {codes}", flush=True)
        if self.clickhouse is not None:
            with contextlib.suppress(Exception):
                self.clickhouse.stop()
        if self.broker is not None:
            with contextlib.suppress(Exception):
                self.broker.stop(keep=False)
        with contextlib.suppress(OSError):
            shutil.rmtree(self.tmp / "state")
        print(f"logs kept in {self.logs}", flush=True)


def _git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _revision(code: str) -> str:
    """The commit the soak runs, and whether it includes uncommitted changes."""
    if code != "worktree":
        return _git("rev-parse", "--short", code)
    dirty = _git("status", "--porcelain", "--", *PACKAGES)
    return _git("rev-parse", "--short", "HEAD") + (" + uncommitted changes" if dirty else "")


def snapshot_root(tag: str) -> Path:
    root = Path(tempfile.mkdtemp(prefix=f"stepguard-soak-{tag}-"))
    root.chmod(0o755)  # clickhouse-server runs as its own user and needs to enter it
    return root


def snapshot(code: str, into: Path) -> None:
    """The packages at git ref ``code`` (``git archive``), or as the working tree has
    them now (``worktree``), copied to ``into``."""
    into.mkdir(parents=True)
    if code == "worktree":
        for package in PACKAGES:
            shutil.copytree(
                ROOT / package, into / package, ignore=shutil.ignore_patterns("__pycache__")
            )
        return
    archive = subprocess.run(
        ["git", "archive", "--format=tar", code, *PACKAGES], cwd=ROOT, capture_output=True,
        check=True,
    )  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)


def _explains(fault: str, onset: int, node: str | None, kind: str, a_node: str, step: int) -> bool:
    """Whether a firing alert (kind, node, step) reports the injected fault."""
    if step < onset - 1:
        return False
    if fault == "hang":
        return kind == "hang" and _in_stall(fault, onset, step)
    if fault == "crash":
        return kind == "hang" or a_node == node
    return kind != "hang" and a_node == node


def _in_stall(fault: str, onset: int, step: int) -> bool:
    """Whether a hang naming ``step`` (the step in progress) falls in an injected stall:
    a hang holds step ``onset`` (and is released by it), a crash stops the job there."""
    if fault == "hang":
        return onset <= step <= onset + 1
    if fault == "crash":
        return step >= onset
    return False


# -- report ------------------------------------------------------------------------------------
def targets(r: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    """(check, measured, target, met) rows of the summary."""
    rss0, rss1 = r["worker_rss_mb_start"], r["worker_rss_mb_end"]
    growth = (rss1 / rss0 - 1) if rss0 else None
    survived = r["restarts_survived"]
    broker = r["broker_restarts"]
    broker_ok = all("error" not in b for b in broker)
    return [
        ("jobs started / ended", f"{r['jobs_started']} / {r['jobs_ended']}",
         "all started jobs end", r["jobs_ended"] == r["jobs_started"] and r["jobs_started"] > 0),
        ("step records sent / in topic / archived",
         f"{r['records_sent']:,} / {r['records_in_topic']:,} / {r['records_archived']:,}", "",
         None),
        ("lost records", str(r["lost_records"]), "0", r["lost_records"] == 0),
        ("duplicate rows (same job, step, rank under FINAL)", str(r["duplicate_rows"]), "0",
         r["duplicate_rows"] == 0),
        ("faults without a firing alert (next to a kill or the outage)",
         f"{r['alerts_missed']} of {r['alerts_expected']} "
         f"({r['alerts_missed_near_a_disruption']})", "0", r["alerts_missed"] == 0),
        ("false hangs (after END / at one of the announced checkpoints)",
         f"{r['false_hangs']} ({len(r['false_hangs_after_end'])} / "
         f"{len(r['false_hangs_checkpoint'])} of {r['checkpoints_announced']})", "0",
         r["false_hangs"] == 0),
        ("other hangs outside any injected hang or crash", str(r["other_unexplained_hangs"]),
         "0", r["other_unexplained_hangs"] == 0),
        ("alert episodes on nodes without a fault", f"{r['false_alert_episodes']}"
         + (f" {r['false_alert_kinds']}" if r["false_alert_kinds"] else ""), "0",
         r["false_alert_episodes"] == 0),
        ("isolations of nodes without a fault (auto mode)", str(r["false_isolations"]), "0",
         r["false_isolations"] == 0),
        ("commands executed twice", f"{r['duplicate_commands']} of "
         f"{r['command_results_succeeded']} executed", "0", r["duplicate_commands"] == 0),
        ("services SIGKILLed / back up 30 s later", f"{r['kills']} / {survived}", "all",
         survived == r["kills"]),
        ("broker restarts (data kept)", f"{len(broker)}" + ("" if broker_ok else " (failed)"),
         "1", len(broker) == 1 and broker_ok if broker else None),
        ("drained (every group's lag 0)", f"{r['drained']} after {r['drain_s']} s", "",
         r["drained"]),
        ("worker RSS, both (MB): start -> end",
         f"{rss0} -> {rss1}" + (f" ({growth:+.0%})" if growth is not None else ""),
         "within 20 %", None if growth is None else abs(growth) <= 0.20),
        ("services that exited by themselves", str(len(r["self_exits"])), "", None),
        *[(f"{kind} re-keyed to the job's worker: delay p50 / p99 / max (s)",
           f"{d['p50_s']} / {d['p99_s']} / {d['max_s']}", "", None)
          for kind, d in sorted(r["forward_delays"].items()) if kind in ("health", "lifecycle")],
        *[(f"driver: {what} published after their event time by p50 / p99 / max (s)",
           f"{d['p50_s']} / {d['p99_s']} / {d['max_s']}", "", None)
          for what, d in (("steps", r["driver_steps_published_late"]),
                          ("checkpoint announcements", r["forward_delays"]["phase_published_late"]))
          if d.get("n")],
    ]  # fmt: skip


def findings(r: dict[str, Any], paths: bool = True) -> list[str]:
    """What a person should look at, one line each (``paths``: with log files)."""
    out = []

    def near(item: dict[str, Any]) -> str:
        return f" at {item['at_s']}s" + (f" ({'; '.join(item['near'])})" if item["near"] else "")

    for m in r["missed"]:
        out.append(f"missed: {m['job']} {m['fault']} on {m['node'] or 'the job'} at step "
                   f"{m['onset_step']}{near(m)}; firing alerts of the job: "
                   f"{m['alerts_seen'] or 'none'}")  # fmt: skip
    for h in r["false_hangs_after_end"]:
        out.append(f"hang {h['after_end_s']:.1f}s after END: {h['job']} step {h['step']}{near(h)}")
    for h in r["false_hangs_checkpoint"]:
        out.append(f"hang at an announced checkpoint: {h['job']} step {h['step']}{near(h)}")
    for h in r["other_unexplained_hang_list"]:
        out.append(f"hang outside any injected stall: {h['job']} step {h['step']}{near(h)}")
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for a in r["false_alert_list"]:
        groups[(a["job"], a["kind"])].append(a)
    for (job, kind), items in groups.items():
        where = "; ".join(sorted({x for a in items for x in a["near"]}))
        since = min(a["at_s"] or 0 for a in items)
        out.append(f"{len(items)} {kind} episode(s) on nodes of {job} without a fault, from "
                   f"{since}s" + (f" ({where})" if where else ""))  # fmt: skip
    if r["false_isolations"]:
        out.append(f"isolated without a fault: {r['false_isolation_list']}")
    rss0, rss1 = r["worker_rss_mb_start"], r["worker_rss_mb_end"]
    if rss0 and abs(rss1 / rss0 - 1) > 0.20:
        points = ", ".join(
            f"{t}s {'+'.join(str(x) for x in each)} ({running})"
            for t, each, _, running in r["worker_rss_series"][::6]
        )
        kills = [f"{k['service']} at {k['t']:.0f}s" for k in r["kill_log"]
                 if k["service"].startswith("worker")]  # fmt: skip
        out.append(f"workers' RSS in MB, a+b (jobs running), every minute: {points}; "
                   f"workers killed: {', '.join(kills) or 'none'}")  # fmt: skip
    slow = sorted(r["forward_delays"].get("slow_lifecycle", []), key=lambda e: -e["delay_s"])
    for e in slow[:5]:
        out.append(f"{e['event']} of {e['job']} (step {e['step']}) reached its worker "
                   f"{e['delay_s']}s late" + near(e))  # fmt: skip
    if len(slow) > 5:
        out.append(f"... and {len(slow) - 5} more lifecycle events over 1 s late")
    if r["lost_records"]:
        out.append(f"lost records by job: {r['lost_by_job']}")
    for e in r["self_exits"]:
        out.append(f"{e['service']} exited by itself (rc {e['rc']}) at {e['t']}s after "
                   f"{e['lived_s']}s up" + (f": {e['log']}" if paths else ""))  # fmt: skip
    for k in r["kill_log"]:
        if k["orphans"]:
            late = f"{ORPHAN_GRACE_S:.0f}s later"
            names = [o.split(" ", 1)[-1] for o in k["orphans"]]
            out.append(f"SIGKILL {k['service']} at {k['t']}s: {len(k['orphans'])} process(es) of "
                       f"its group still ran {late}: {names}")  # fmt: skip
    for job, err in r["driver_errors"].items():
        out.append(f"driver failed on {job}: {err}")
    return out


def write_markdown(r: dict[str, Any], env: dict[str, Any]) -> None:
    mark = {True: "✅", False: "❌", None: ""}
    kills = Counter(k["service"].split("-")[0] for k in r["kill_log"])
    b = r["broker_restarts"]
    broker = "no broker restart (--bootstrap)"
    if b:
        broker = (f"the broker restarted once at {b[0]['t']:.0f}s with its data kept "
                  f"(down {b[0].get('down_s', '?')}s)")  # fmt: skip
    quick = (
        " `--quick`: 12 jobs of 16-64 nodes and ~0.6 s steps, a kill every ~40 s (the full "
        "soak: 50 jobs of 16-256 nodes, ~1.3 s steps, a kill every ~60 s)."
        if r["mode"] == "quick"
        else ""
    )
    body = [
        "## Chaos soak (`benchmarks/soak.py`)",
        "",
        f"`{env['command']}` — {env['date']}, at {env['revision']}; {env['machine']}; Apache Kafka "
        f"{env['kafka']}, ClickHouse {r['clickhouse_version']}; "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items())
        + ".",
        "",
        f"{r['jobs_started']} simulated jobs of {r['nodes_min']}-{r['nodes_max']} nodes x 8 "
        "ranks, played in real time, several at once, every checkpoint announced; a fifth "
        "clean, the rest with a straggler, a hang or a crash. Two `stepguard worker`, the "
        "actuator in auto mode, `stepguard executor dry-run` and `stepguard archiver` (into "
        f"ClickHouse) ran as separate processes; {r['kills']} SIGKILLs ("
        + ", ".join(f"{k} {n}" for k, n in sorted(kills.items()))
        + f") each followed by a supervisor's restart 1 s later, and {broker}. "
        f"Chaos phase {r['chaos_s']:.0f}s, then drained in {r['drain_s']:.0f}s; the machine's "
        f"cores busy (other work included) {r['cores_busy']} of {os.cpu_count()}.{quick}",
        "",
        "| check | measured | target | |",
        "|---|---|---|---|",
        *[f"| {a} | {m} | {t} | {mark[ok]} |" for a, m, t, ok in targets(r)],
    ]
    notes = findings(r, paths=False)
    if notes:
        body += ["", "Seen in this run:", "", *[f"- {n}" for n in notes[:30]]]
    write_section("soak", "\n".join(body))


def summarise(r: dict[str, Any]) -> None:
    """The summary table and the findings, on standard output."""
    print()
    print(f"{'check':<52} {'measured':>28}  target")
    for check, measured, target, ok in targets(r):
        flag = {True: "ok", False: "MISSED", None: ""}[ok]
        print(f"{check:<52} {measured:>28}  {target} {flag}")
    for note in findings(r):
        print(f"  - {note}")
    missed = [c for c, _, _, ok in targets(r) if ok is False]
    print(f"targets missed: {', '.join(missed)}" if missed else "every target met", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=None, help="chaos phase (default 10)")
    ap.add_argument("--quick", action="store_true", help="about 3 minutes, 12 small jobs")
    ap.add_argument("--json", type=Path, help="write the numbers here")
    ap.add_argument("--bootstrap", default="", help="a running Kafka (not restarted)")
    ap.add_argument("--clickhouse", default="", help="a running ClickHouse (DSN); a fresh "
                    "database soak_<tag> is used in it")  # fmt: skip
    ap.add_argument("--jobs", type=int, default=0, help="jobs to play (default 50; quick 12)")
    ap.add_argument("--kill-every", type=float, default=0.0, help="seconds (60; quick 40)")
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--drain-timeout", type=float, default=180.0)
    ap.add_argument("--overrun-s", type=float, default=300.0,
                    help="the driver is stopped this long after the window")  # fmt: skip
    ap.add_argument("--no-markdown", action="store_true", help="do not touch BENCHMARKS.md")
    ap.add_argument("--code", default="HEAD",
                    help="what runs: a git ref (default HEAD: committed code) or 'worktree' "
                    "(uncommitted changes included); copied at the start, so a restarted "
                    "service runs the same code while people edit the tree")  # fmt: skip
    ap.add_argument("--ports", metavar="LO-HI",
                    help="take every port (broker, ClickHouse, worker metrics) from this "
                    "range, outside the kernel's ephemeral ports "
                    f"(default {DEFAULT_PORTS})")  # fmt: skip
    ap.add_argument("--report", type=Path,
                    help="only print the summary of a saved --json result and write its "
                    "BENCHMARKS.md section (nothing runs)")  # fmt: skip
    args = ap.parse_args()
    if args.report:
        r = json.loads(args.report.read_text())
        summarise(r)
        if not args.no_markdown:
            write_markdown(r, r["environment"])
        return 0
    if args.minutes is None:
        args.minutes = 3.0 if args.quick else 10.0
    ephemeral = ephemeral_ports()
    ports = args.ports or os.environ.get("SOAK_PORTS") or DEFAULT_PORTS
    lo, _, hi = ports.partition("-")
    if not (lo.isdigit() and hi.isdigit() and 0 < int(lo) <= int(hi) < 65536):
        ap.error(f"--ports must be LO-HI, got {ports!r}")
    if ephemeral is not None and int(lo) <= ephemeral[1] and int(hi) >= ephemeral[0]:
        # seen: the broker's restart on its port failed ("Address already in use")
        # because one of the run's own client connections had been given it
        ap.error(
            f"--ports {ports} overlaps the kernel's ephemeral ports {ephemeral[0]}-"
            f"{ephemeral[1]} (net.ipv4.ip_local_port_range): a client connection can "
            "take a service's port while the service restarts; choose a range outside it"
        )
    os.environ["SOAK_PORTS"] = ports  # kept across the re-exec below
    if "SOAK_CODE_DIR" not in os.environ:  # take the snapshot, then run on it
        tag = secrets.token_hex(3)
        root = snapshot_root(tag)
        snapshot(args.code, root / "code")
        env = os.environ | {"SOAK_CODE_DIR": str(root / "code"), "SOAK_TMP": str(root),
                            "SOAK_TAG": tag, "SOAK_REVISION": _revision(args.code)}  # fmt: skip
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    soak = Soak(args)

    def _term(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
    try:
        r = soak.run()
    finally:
        soak.close()
    env = environment(
        command_line(),
        ("faust-streaming", "aiokafka", "kafka-python", "clickhouse-driver", "river", "numpy"),
    )
    env["kafka"] = soak.broker.version if soak.broker is not None else "(given)"
    env["revision"] = soak.revision
    r["environment"] = env
    summarise(r)
    if args.json:
        args.json.write_text(json.dumps(r, indent=2, default=str) + "\n")
    if not args.no_markdown:
        write_markdown(r, env)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
