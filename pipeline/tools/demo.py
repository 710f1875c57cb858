"""``stepguard demo``: a simulated job with injected faults, played in accelerated real
time against the production services, then scored against the simulator's truth.

The services are the ones ``stepguard up`` runs, as supervised child processes
(:func:`pipeline.tools.up.build_plan`, :func:`pipeline.tools.up.start_group`): the embedded broker
(or the configured one), topic creation, the detection worker(s), the actuator in auto
mode with the job's spare nodes, the dry-run executor and the archiver. This process is
the training job: :func:`pipeline.tools.simulator.player.play` (what ``stepguard simulate
--control`` runs) publishes its steps, health, announced phases, lifecycle and ground
truth at SPEED x real time, and its job controller (a
:class:`~pipeline.client.listener.CommandListener`) applies the actuator's commands at step
boundaries, so isolations, checkpoints and restarts change what is played next. It
reads the decision and command topics as any subscriber does.

Accelerated real time: the job's events are dated from now (back-dated by what the
speed-up gains, so that none is ahead of the wall clock), and the actuator's wall-clock
guardrails (guard window, node and relaunch cooldowns) are divided by the speed, as
the job's hours pass in minutes. Detection is the production worker, untouched.

At the end it waits until detection and the actuator have handled everything (every
episode of the job resolved, as the job's end resolves them, and the actuator's
committed offsets at what the decisions topic holds), stops the archiver and finishes
its work here (chDB has one owner at a time), and scores the alerts
(:func:`match_alerts`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from pipeline.io.errors import EmbeddedServiceError
from pipeline.io.kafka import consumer_config, make_consumer, registry_of
from pipeline.io.settings import ENV_PREFIX, Settings, load_settings
from pipeline.services.archive import migrate, open_backend
from pipeline.services.archive.archiver import Archiver
from pipeline.services.archive.backend import ArchiveBackend
from pipeline.tools.demo_summary import (
    DEFAULT_SPEED,
    DemoSummary,
    command_outcomes,
    match_alerts,
)
from pipeline.tools.simulator import Scenario, SimulatedJob, lead_s, start_from_now
from pipeline.tools.simulator.closed_loop import play_with_controller
from pipeline.tools.simulator.control import JobController
from pipeline.tools.simulator.player import PlayStats
from pipeline.tools.supervisor import ServiceState
from pipeline.tools.up import (
    MEMORY_ONLY,
    STATUS_FILE,
    UpOptions,
    build_plan,
    start_group,
    status_document,
)
from pipeline.tools.up_board import status_table
from schemas import (
    TOPICS,
    ActionRecord,
    Alert,
    AlertKind,
    AlertState,
    Command,
    CommandResult,
    FaultTruth,
    Rejected,
    decode,
)

__all__ = [
    "run_demo",
]

#: Event time x this in real time by default: the default scenario (256 nodes x 8 GPUs,
#: ~15 minutes of training with its restarts) in about two minutes.
#: How long the services may take to start, and to finish what is in flight.
START_TIMEOUT_S = 120.0
SETTLE_TIMEOUT_S = 90.0


# -- the services ------------------------------------------------------------------------


def _base_env(settings: Settings, base: Mapping[str, str], run: str) -> dict[str, str]:
    """What every child inherits: the caller's environment with the demo's own topics,
    consumer groups and archive (``settings`` may come from a test, not the env)."""
    p = ENV_PREFIX
    env = dict(base)
    env[p + "TOPIC_PREFIX"] = f"{settings.topic_prefix}demo-{run}."
    env[p + "CONSUMER_GROUP"] = f"{settings.consumer_group}.demo-{run}"
    if settings.clickhouse_dsn is not None:
        env[p + "CLICKHOUSE_DSN"] = settings.clickhouse_dsn.get_secret_value()
    else:
        env.pop(p + "CLICKHOUSE_DSN", None)
        env[p + "CHDB_PATH"] = str(settings.chdb_path.resolve())
    return env


def _actuator_env(settings: Settings, job: SimulatedJob, speed: float) -> dict[str, str]:
    """Auto mode with the job's spares; wall-clock guardrails divided by the speed."""
    p = ENV_PREFIX
    return {
        p + "ACTUATOR_MODE": "auto",
        p + "SPARE_NODES": ",".join(job.spare_pool),
        p + "GUARD_JOB_NODES": str(job.scenario.nodes),
        p + "GUARD_WINDOW_S": f"{settings.guard_window_s / speed:.3f}",
        p + "GUARD_NODE_COOLDOWN_S": f"{settings.guard_node_cooldown_s / speed:.3f}",
        p + "GUARD_RELAUNCH_COOLDOWN_S": f"{settings.guard_relaunch_cooldown_s / speed:.3f}",
    }


class _Watch:
    """The demo's view of the topics, as any subscriber's: this job's alerts, commands,
    their results and the actuator's action records, the ground truth, and how far the
    decisions topic goes."""

    def __init__(self, settings: Settings, job_id: str) -> None:
        self.job_id = job_id
        self.registry = registry_of(settings)
        names = ("decisions", "commands", "truth", "results", "actions")
        self.topics = {self.registry.name(n): n for n in names}
        self.consumer = make_consumer(settings, list(self.topics), None)
        self.alerts: list[Alert] = []  #: detection's (the workers')
        self.guardrails: list[Alert] = []  #: the actuator's guardrail alerts
        self.commands: dict[str, Command] = {}
        self.truth: dict[str, FaultTruth] = {}
        self.results: list[CommandResult] = []
        self.actions: dict[str, ActionRecord] = {}  #: latest record per action
        self.undecodable = 0
        #: next offset of each decisions partition read so far
        self.decisions_end: dict[int, int] = {}

    def poll(self, timeout_ms: int = 200) -> int:
        got = 0
        for tp, records in self.consumer.poll(timeout_ms=timeout_ms).items():
            logical = self.topics.get(tp.topic)
            for rec in records:
                got += 1
                if logical == "decisions":
                    self.decisions_end[tp.partition] = rec.offset + 1
                model = TOPICS[logical or "truth"].model
                msg = decode(model, rec.value, topic=tp.topic, partition=tp.partition,
                             offset=rec.offset, key=rec.key)  # fmt: skip
                if isinstance(msg, Rejected):
                    self.undecodable += 1  # the services dead-letter it; not ours to
                elif msg.job_id != self.job_id:
                    continue
                elif isinstance(msg, Alert) and msg.kind is AlertKind.GUARDRAIL:
                    self.guardrails.append(msg)  # the actuator's, not detection's
                elif isinstance(msg, Alert):
                    self.alerts.append(msg)
                elif isinstance(msg, Command):
                    self.commands.setdefault(msg.command_id, msg)
                elif isinstance(msg, CommandResult):
                    self.results.append(msg)
                elif isinstance(msg, ActionRecord):
                    self.actions[msg.action_id] = msg
                elif isinstance(msg, FaultTruth):
                    self.truth[msg.fault_id] = msg
        return got

    def open_episodes(self) -> set[str]:
        last: dict[str, Alert] = {}
        for a in sorted(self.alerts, key=lambda a: a.seq):
            last[a.fingerprint] = a
        return {fp for fp, a in last.items() if a.state is AlertState.FIRING}

    def close(self) -> None:
        self.consumer.close()


@dataclass(frozen=True)
class _WorkerGauges:
    steps: int  #: job steps scored, all workers
    jobs: int  #: jobs held, all workers
    least_assigned: int  #: partitions owned by the worker that owns the fewest


def _signed_results(settings: Settings, results: list[CommandResult]) -> list[CommandResult]:
    """The results an executor's or the job controller's key signed (nothing read from
    a topic is trusted)."""
    from pipeline.io.trust import public_keys, signature_problem

    keys = public_keys(settings, "executor") | public_keys(settings, "job_controller")
    return [r for r in results if signature_problem(r, keys) is None]


def _worker_gauges(ports: list[int]) -> _WorkerGauges | None:
    """What the workers' Prometheus endpoints say; None while one does not answer."""
    steps = jobs = 0.0
    assigned: list[float] = []
    for port in ports:
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            with urllib.request.urlopen(url, timeout=1.0) as r:
                text = r.read().decode(errors="replace")
        except OSError:
            return None
        owned = 0.0
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name == "stepguard_worker_steps_total":
                steps += float(value)
            elif name == "stepguard_worker_jobs":
                jobs += float(value)
            elif name == "stepguard_worker_assigned_partitions":
                owned = float(value)
        assigned.append(owned)
    return _WorkerGauges(int(steps), int(jobs), int(min(assigned, default=0)))


def _committed(settings: Settings, group: str, topic: str, partitions: list[int]) -> dict[int, int]:
    """The offsets ``group`` committed (OffsetFetch: nothing joins the group)."""
    consumer = KafkaConsumer(**consumer_config(settings, group))
    try:
        out = {}
        for p in partitions:
            off = consumer.committed(TopicPartition(topic, p))
            out[p] = -1 if off is None else off
        return out
    finally:
        consumer.close()


def _archived_rows(backend: ArchiveBackend, job_id: str) -> int:
    """Rows archived for the job, in every stored table that has a ``job_id`` column."""
    db = backend.database
    _, tables = backend.query(
        f"SELECT name FROM system.tables WHERE database = '{db}' "
        "AND engine IN ('MergeTree', 'ReplacingMergeTree')"
    )
    _, with_job = backend.query(
        f"SELECT table FROM system.columns WHERE database = '{db}' AND name = 'job_id'"
    )
    stored = {t for (t,) in tables} & {t for (t,) in with_job}
    total = 0
    for table in sorted(stored):
        _, rows = backend.query(f"SELECT count() FROM {db}.`{table}` WHERE job_id = '{job_id}'")
        total += int(rows[0][0])
    return total


def run_demo(
    settings: Settings,
    scenario: Scenario,
    console: Console | None = None,
    *,
    speed: float = DEFAULT_SPEED,
    workers: int = 1,
    backend: ArchiveBackend | None = None,
    base_env: Mapping[str, str] | None = None,
) -> DemoSummary:
    """Play ``scenario`` against the production services and score what they did.

    ``backend``: archive into this one, here at the end, instead of running the
    archiver service (tests pass their own: chDB allows one data path per process).
    ``base_env``: the environment the services inherit (default: this process's).
    """
    if speed <= 0:
        raise ValueError("speed must be positive")
    console = console or Console(stderr=True)
    t0 = time.monotonic()
    phases: dict[str, float] = {}

    def mark(name: str) -> None:
        """The wall time of the stage that ends now."""
        phases[name] = round(time.monotonic() - t0 - sum(phases.values()), 2)

    run = secrets.token_hex(4)
    job_id = f"{scenario.job}-{run}"
    scenario = scenario.model_copy(update={"job_id": job_id})
    job = SimulatedJob(scenario)  # dated when it plays (below): the spares are the same
    scratch = (settings.state_dir / "demo" / run).resolve()
    logs = scratch / "logs"
    env = _base_env(settings, os.environ if base_env is None else base_env, run)
    # the job's event time runs at SPEED x the wall clock's: so does a silent job's clock
    # in the worker (hangs, presence, and the job's end, confirmed end_confirm_s of event
    # time after it: 60 s of wall time at 1x, a third of the demo's wall time)
    env[ENV_PREFIX + "WORKER_EVENT_RATE"] = f"{speed:g}"
    # the job starts when it plays, on the stack's clock, and its clock runs ahead of
    # the wall clock by up to its lead: this throw-away stack allows that much more skew
    # (every record stays dated after the stack started, and effects after causes)
    skew = settings.max_clock_skew_s + lead_s(scenario, speed)
    env[ENV_PREFIX + "MAX_CLOCK_SKEW_S"] = f"{skew:.0f}"
    plan = build_plan(
        settings.model_copy(update={"state_dir": scratch}),
        UpOptions(workers=workers, grace_s=10.0),
        env,
        run_id=run,
        job=job_id,  # the demo plays the job: its controller key is made for it
    )
    actuator_env = _actuator_env(settings, job, speed)
    specs = []
    for spec in plan.specs:
        if spec.name == "actuator":
            specs.append(replace(spec, env={**spec.env, **actuator_env}))
        elif spec.name != "archiver":
            specs.append(spec)
        elif backend is None:
            # the archive may lag and catch up; detection and the closed loop may not
            nice = ("nice", "-n", "10") if shutil.which("nice") else ()
            specs.append(replace(spec, argv=(*nice, *spec.argv)))
    planned, plan.specs = plan.specs, specs  # the archiver's keys even when it is not run
    # the job's controller verifies commands with the actuator's public keys (as an
    # executor does) and signs its results with its own job's key, never an executor's
    # (it judges commands on the wall clock, as the actuator dates them)
    executor_env = next(s.env for s in plan.specs if s.name.startswith("executor-"))
    job_env = {k: v for k, v in executor_env.items() if not k.endswith("_PRIVATE_KEY")}
    job_settings = load_settings(job_env | plan.job_env)
    # the archiver's own keys (every signing role's public keys): what it verifies
    archive_settings = load_settings(next(s.env for s in planned if s.name == "archiver"))
    registry = registry_of(job_settings)
    # the demo's topics are its own and thrown away: no word on keeping them
    notes = [n for n in plan.notes if not n.startswith(("no STEPGUARD_OPERATOR", MEMORY_ONLY))]
    notes += [
        f"services: {', '.join(s.name for s in plan.specs)} (child processes; logs in {logs})",
        f"played at {speed:g}x real time; actuator in auto mode, its guard window and "
        "cooldowns divided by the speed",
    ]

    live: Live | None = None

    def event(name: str, text: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {name}: {text}"
        (live.console if live is not None else console).print(line, highlight=False)

    sup, group, board = start_group(plan, event)
    worker_ports = [s.metrics_port for s in plan.specs if s.name.startswith("worker-")]
    worker_ports = [p for p in worker_ports if p]
    controller = JobController(job)
    outcome: dict[str, Any] = {}
    watch: _Watch | None = None
    title = f"stepguard demo: {scenario.name} as job {job_id} on {plan.bootstrap}"
    last_line = time.monotonic()  # the first progress line once the job plays
    # steps the workers scored (a restarted worker's counter starts again at 0: what
    # the counters held before is kept in the base), the last reading, when scraped
    scored: list[float] = [0, 0, 0.0]
    status_at = [0.0]  # when up.json was last written

    def progress_line() -> str:
        found = 0
        if watch is not None and watch.truth:
            outcomes, _, _ = match_alerts(list(watch.truth.values()), watch.alerts)
            found = sum(o.detected for o in outcomes)
        faults = sum(1 for f in scenario.faults if not f.is_trap)
        grades = Counter(
            a.grade.value for a in (watch.alerts if watch else []) if a.state is AlertState.FIRING
        )
        now = time.monotonic()
        if now - scored[2] >= 2.0:
            gauges = _worker_gauges(worker_ports)
            if gauges is not None:
                if gauges.steps < scored[1]:
                    scored[0] += scored[1]
                scored[1] = gauges.steps
            scored[2] = now
        behind = max(0, job.goodput().executed_steps - int(scored[0] + scored[1]))
        return (
            f"job step {max(job.step, 0)}/{scenario.steps} (detection {behind} steps "
            f"behind), faults detected {found}/{faults}, "
            f"alerts {dict(grades) or 0}, commands {len(watch.commands) if watch else 0}, "
            f"goodput {job.goodput().fraction:.2f}"
        )

    started_at = datetime.now(UTC)

    def write_status() -> None:
        """``up.json`` in the demo's state dir, as ``up`` writes it: every child's pid."""
        doc = status_document(plan, sup, time.monotonic(), started_at) | {"job_id": job_id}
        tmp = scratch / (STATUS_FILE + ".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(scratch / STATUS_FILE)

    def refresh(force: bool = False) -> None:
        nonlocal last_line
        now = time.monotonic()
        if force or now - status_at[0] >= 1.0:
            status_at[0] = now
            write_status()
        if live is not None:
            table = status_table(sup, board, now, title)
            live.update(Group(table, Text(progress_line())), refresh=True)
        elif force or now - last_line >= 10.0:
            last_line = now
            console.print(f"{time.strftime('%H:%M:%S')} {progress_line()}", highlight=False)

    def supervise(until: float, done: Callable[[], bool]) -> bool:
        """Tick the services and read the topics until ``done`` (True) or ``until``."""
        while not done():
            if time.monotonic() > until:
                return False
            group.tick()
            if watch is not None:
                watch.poll(200)
            else:
                time.sleep(0.2)  # the services are starting: nothing to read yet
            failed = [n for n, s in sup.services.items() if s.state is ServiceState.FAILED]
            if failed:
                raise EmbeddedServiceError(f"demo: {', '.join(failed)} failed; see {logs}")
            if "error" in outcome:
                raise outcome["error"]
            refresh()
        return True

    def started() -> bool:
        """Every service up, and every worker in its consumer group with partitions
        (a job played to a worker still joining reaches it unevenly: one health
        partition read seconds after the others looks like a silent node at 8x)."""
        if not all(
            s.state is (ServiceState.DONE if s.spec.one_shot else ServiceState.RUNNING)
            for s in sup.services.values()
        ):
            return False
        gauges = _worker_gauges(worker_ports)
        return gauges is not None and gauges.least_assigned > 0

    scratch.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        stack.callback(write_status)  # last: every child stopped
        stack.callback(board.close)
        stack.callback(group.stop, 10.0)
        if console.is_terminal:
            live = Live(console=console, auto_refresh=False, transient=False)
            live.start()
            stack.callback(live.stop)
        mark("setup")
        if not supervise(time.monotonic() + START_TIMEOUT_S, started):
            raise EmbeddedServiceError(f"demo: the services did not start; see {logs}")
        mark("start")
        watch = _Watch(job_settings, job_id)
        stack.callback(watch.close)

        def play_job() -> None:
            try:
                outcome["stats"] = play_with_controller(
                    job_settings, controller, speed=speed, announce_phases=True
                )
            except BaseException as exc:  # surfaced by the supervising loop
                outcome["error"] = exc

        def player_done() -> bool:
            return "stats" in outcome

        # the job starts now, on the stack's clock: never before the stack started
        scenario = scenario.model_copy(update={"start_time": start_from_now(scenario, speed)})
        job = SimulatedJob(scenario)
        controller = JobController(job)
        player = threading.Thread(target=play_job, name="simulated-job", daemon=True)
        player.start()
        event("job", f"{job_id} plays at {speed:g}x: {scenario.nodes} nodes, "
                     f"{scenario.steps} steps, {len(scenario.faults)} faults/traps")  # fmt: skip
        played_s = scenario.steps * scenario.nominal_step_s * 2 / speed
        if not supervise(time.monotonic() + START_TIMEOUT_S + played_s, player_done):
            raise EmbeddedServiceError(f"demo: the job did not finish playing; see {logs}")
        player.join()
        mark("play")

        # detection and the actuator finish what is in flight: the job's end resolves
        # every episode, and the actuator commits a poll only after its commands
        actuator_group = f"{job_settings.consumer_group}.actuator"
        decisions = registry.name("decisions")

        def settled() -> bool:
            # the workers scored the job and dropped it (its end), every episode is
            # resolved, and the actuator committed every decision
            gauges = _worker_gauges(worker_ports)
            if gauges is None or gauges.steps == 0 or gauges.jobs != 0:
                return False
            if watch is None or watch.open_episodes():
                return False
            done = _committed(job_settings, actuator_group, decisions, list(watch.decisions_end))
            return all(done[p] >= end for p, end in watch.decisions_end.items())

        if not supervise(time.monotonic() + SETTLE_TIMEOUT_S, settled):
            notes.append(f"not settled after {SETTLE_TIMEOUT_S:.0f} s: open episodes "
                         f"{sorted(watch.open_episodes())}")  # fmt: skip
        while watch.poll(500):  # the commands of the last decisions
            pass
        refresh(force=True)
        mark("settle")

        # the archiver's work: stop it (it commits what it stored), finish here
        group.stop_one("archiver")
        if backend is None:
            backend = open_backend(job_settings)
            stack.callback(backend.close)
        migrate(backend)
        archiver = Archiver(archive_settings, backend, max_batch=20000, max_wait_s=0.5)
        idle = 0
        while idle < 4:
            idle = idle + 1 if archiver.poll_batch() == 0 else 0
        archiver.close()
        archived = _archived_rows(backend, job_id)
        db = backend.database
        prefix = registry.name("steps").removesuffix("stepguard.steps")
        _, dl = backend.query(
            f"SELECT count() FROM {db}.dead_letters WHERE startsWith(source_topic, '{prefix}')"
        )
        restarts = {n: s.restarts for n, s in sup.services.items() if s.restarts}
        mark("archive")
    mark("stop")  # every child stopped

    stats: PlayStats = outcome["stats"]
    truth = list(watch.truth.values())
    alerts = watch.alerts
    outcomes, trap_alerts, false_alerts = match_alerts(truth, alerts)
    cmds = list(watch.commands.values())
    faulty = {t.node for t in truth if not t.is_trap and t.node}
    # what took effect: the job's own results, not what was issued
    done = command_outcomes(cmds, _signed_results(job_settings, watch.results),
                            list(watch.actions.values()))  # fmt: skip
    isolated = done.isolated
    grades = Counter(a.grade.value for a in alerts if a.state is AlertState.FIRING)
    published = stats.step_messages + stats.health_messages + stats.truth_messages + 2
    return DemoSummary(
        scenario=scenario.name, job_id=job_id, nodes=scenario.nodes, ranks=scenario.n_ranks,
        steps_completed=stats.steps,
        faults_injected=len(outcomes), faults_detected=sum(o.detected for o in outcomes),
        traps=sum(1 for t in truth if t.is_trap), trap_alerts=trap_alerts,
        false_alerts=false_alerts,
        false_isolations=sum(1 for n in isolated if n not in faulty),
        goodput=round(job.goodput().fraction, 4),
        wall_seconds=round(sum(phases.values()), 2),
        messages_published=published + len(alerts),
        archived_rows=archived, dead_letters=int(dl[0][0]),
        alerts_by_grade=dict(grades), faults=outcomes,
        commands=dict(Counter(c.kind.value for c in cmds)),
        isolated_nodes=isolated, applied=done.applied, refused=done.refused,
        unanswered=done.unanswered,
        actions_applied=[f"step {s}: {k} {d}".strip() for s, k, d in controller.applied],
        notes=[
            *notes,
            *[f"actuator guardrail: {g.summary}" for g in watch.guardrails[:5]],
            f"archive: {backend.name} database {db}",
        ],
        speed=speed, played_seconds=round(stats.wall_s, 2), service_restarts=restarts,
        phase_seconds=phases, job_started_at=scenario.start_time.isoformat(),
    )  # fmt: skip
