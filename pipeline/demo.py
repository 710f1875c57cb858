"""``stepguard demo``: the whole path on the embedded default, then a summary.

simulator -> exporter (kafka-python) -> broker -> detection stage -> decision topic
-> archiver -> chDB, then scores the alerts against the simulator's ground truth.

Stages run one after another in this process, so a 2-core laptop shows every part
working on real services without Docker or a JVM. The detection stage drives the one
detection core (:class:`~pipeline.detection.JobDetection`) that ``stepguard worker``
(Faust, the production path) drives too.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pipeline.actuator.service import Actuator
from pipeline.actuator.signing import (
    ephemeral_keys,
    public_keys,
    sign,
    signature_problem,
    signing_key,
)
from pipeline.archive import migrate, open_backend
from pipeline.archive.archiver import Archiver
from pipeline.archive.backend import ArchiveBackend
from pipeline.detection import JobDetection
from pipeline.embedded import TansuBroker
from pipeline.kafka import (
    consume_decoded,
    create_topics,
    make_consumer,
    make_producer,
    publish,
    registry_of,
)
from pipeline.listener import CommandListener
from pipeline.settings import ROLES, Settings
from pipeline.simulator import Scenario, SimulatedJob
from pipeline.simulator.control import JobController
from schemas import (
    Alert,
    AlertKind,
    AlertState,
    Command,
    CommandResult,
    EndReason,
    FaultKind,
    FaultTruth,
    JobEvent,
    JobEventKind,
    NodeHealth,
    StepTelemetry,
)

__all__ = [
    "DemoSummary",
    "match_alerts",
    "run_demo",
]


@dataclass
class FaultOutcome:
    fault_id: str
    kind: str
    node: str | None
    onset_step: int
    detected: bool
    detected_step: int | None
    delay_steps: int | None
    alert_kinds: list[str]


@dataclass
class DemoSummary:
    scenario: str
    job_id: str
    nodes: int
    ranks: int
    steps_completed: int
    faults_injected: int
    faults_detected: int
    traps: int
    trap_alerts: int
    false_alerts: int
    false_isolations: int
    goodput: float
    wall_seconds: float
    messages_published: int
    archived_rows: int
    dead_letters: int
    alerts_by_grade: dict[str, int]
    faults: list[FaultOutcome] = field(default_factory=list)
    commands: dict[str, int] = field(default_factory=dict)
    isolated_nodes: list[str] = field(default_factory=list)
    actions_applied: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


#: Faults that leave a rank dead: nothing completes until the job is restarted.
_STALLS_THE_JOB = frozenset({FaultKind.CRASH, FaultKind.ECC_STORM})


def match_alerts(
    truth: list[FaultTruth], alerts: list[Alert], grace_steps: int = 30
) -> tuple[list[FaultOutcome], int, int]:
    """Match firing alert episodes to faults: same node (or job-level for job-wide
    faults) and a step inside [onset, end + grace]. A fault that kills a rank (crash,
    and the XID 48 that ends an ECC storm) stops the whole job until a restart, so a
    job-level hang in its window is its consequence, not a false alert. Returns
    outcomes, alerts on traps, and firing episodes that match no fault."""
    firing = [a for a in alerts if a.state is AlertState.FIRING]
    first_by_fp: dict[str, Alert] = {}
    for a in sorted(firing, key=lambda a: (a.step or 0, a.seq)):
        first_by_fp.setdefault(a.fingerprint, a)
    episodes = list(first_by_fp.values())
    matched: set[str] = set()
    outcomes = []
    for f in (t for t in truth if not t.is_trap):
        end = (f.end_step if f.end_step is not None else 10**12) + grace_steps
        hits = [
            a
            for a in episodes
            if f.onset_step <= (a.step or 0) <= end
            and (
                f.node is None
                or a.node == f.node
                or (f.kind in _STALLS_THE_JOB and not a.node and a.kind is AlertKind.HANG)
            )
        ]
        if f.node is None:  # job-wide faults (hang, divergence) accept job-level alerts
            hits = [a for a in hits if a.kind.value in ("hang", "missing", "divergence")]
        matched.update(a.fingerprint for a in hits)
        first = min(hits, key=lambda a: a.step or 0) if hits else None
        outcomes.append(
            FaultOutcome(
                fault_id=f.fault_id, kind=f.kind.value, node=f.node, onset_step=f.onset_step,
                detected=first is not None, detected_step=first.step if first else None,
                delay_steps=(first.step or 0) - f.onset_step if first else None,
                alert_kinds=sorted({a.kind.value for a in hits}),
            )
        )  # fmt: skip
    trap_nodes = {t.node for t in truth if t.is_trap and t.node}
    unmatched = [a for a in episodes if a.fingerprint not in matched]
    trap_alerts = sum(1 for a in unmatched if a.node in trap_nodes)
    return outcomes, trap_alerts, len(unmatched)


class _Pace:
    """Frames published by the job vs frames processed by detection: the job waits
    when detection falls ``lag`` frames behind (a real job runs at its own pace and
    detection keeps up; a compressed simulation must not outrun the loop it tests)."""

    def __init__(self, lag: int) -> None:
        self.lag = lag
        self.published = 0
        self.processed = 0
        self.sent_msgs = 0  #: step messages the job published
        self.seen_msgs = 0  #: step messages detection consumed
        self.closed = False
        self._cond = threading.Condition()

    def publish(self, messages: int) -> None:
        with self._cond:
            self.published += 1
            self.sent_msgs += messages

    def seen(self, messages: int) -> None:
        with self._cond:
            self.seen_msgs += messages
            self._cond.notify_all()

    def processed_one(self, count: int = 1) -> None:
        with self._cond:
            self.processed += count
            self._cond.notify_all()

    def wait(self, timeout_s: float = 30.0) -> None:
        with self._cond:
            self._cond.wait_for(
                lambda: self.closed or self.processed >= self.published - self.lag, timeout_s
            )

    def wait_until(self, condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self.closed or condition(), timeout_s)

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()


def _reached(detection: DetectionStage, ts: float) -> bool:
    return (detection.core.now or 0.0) >= ts


class DetectionStage:
    """The demo's detection path: steps, health, commands and results from the broker
    into the one detection core (:class:`~pipeline.detection.JobDetection`, which
    orders them on event time), alerts to the decision topic.

    What is left here is transport: after ``stall_polls`` polls in a row bring no step
    (a stalled job), the clock is ticked at the health partitions' watermark (the
    oldest newest-report among them), so held reports carry the time forward while a
    partition that is behind cannot make its nodes look silent.
    """

    def __init__(self, settings: Settings, job_id: str, pace: _Pace) -> None:
        self.registry = registry_of(settings)
        # as the worker: alerts signed, only the actuator's commands obeyed
        self._key = signing_key(settings, "worker", "the demo's detection")
        self._command_keys = public_keys(settings, "actuator", "the demo's detection")
        self._result_keys = public_keys(settings, "executor", "the demo's detection")
        self.core = JobDetection(job_id)
        self.pace = pace
        self.alerts: list[Alert] = []
        self.messages = 0
        self.stall_polls = 3
        self._idle = 0
        self.error: BaseException | None = None
        self._health_wm: dict[int, float] = {}
        self._ended: list[JobEvent] = []
        self._producer = make_producer(settings)
        self._consumer = make_consumer(
            settings,
            [
                self.registry.name(t)
                for t in ("steps", "health", "commands", "results", "lifecycle")
            ],
            f"{settings.consumer_group}.detect",
        )

    @property
    def frames(self) -> int:
        return self.core.frames

    @property
    def restarts(self) -> int:
        return self.core.relaunches

    def _emit(self, alerts: list[Alert]) -> None:
        for a in alerts:
            publish(self._producer, self.registry, "decisions", sign(a, self._key))
        self.alerts.extend(alerts)

    def poll(self) -> int:
        core = self.core
        steps = 0
        relaunches, now = core.relaunches, core.now
        got = list(consume_decoded(self._consumer, self.registry, self._producer, 200))
        # commands and results first: a relaunch is known before the steps that follow it
        for d in got:
            msg = d.message
            if isinstance(msg, Command) and signature_problem(msg, self._command_keys):
                continue
            if isinstance(msg, CommandResult) and signature_problem(msg, self._result_keys):
                continue
            if isinstance(msg, Command | CommandResult) and msg.job_id == core.job_id:
                self._emit(
                    core.on_command(msg) if isinstance(msg, Command) else core.on_result(msg)
                )
        for d in got:
            msg = d.message
            if isinstance(msg, NodeHealth):
                hts = msg.ts.timestamp()
                self._health_wm[d.partition] = max(self._health_wm.get(d.partition, hts), hts)
                self._emit(core.on_health(msg))
            elif isinstance(msg, JobEvent) and msg.job_id == core.job_id:
                if msg.kind is JobEventKind.END:
                    self._ended.append(msg)  # after the job's last steps: see drain()
                else:
                    self._emit(core.on_lifecycle(msg))
            elif isinstance(msg, StepTelemetry):
                steps += 1
                detected = core.on_step(msg)
                self._emit(detected.alerts)
                self.pace.processed_one(len(detected.frames))
        self._idle = 0 if steps else self._idle + 1
        self.pace.seen(steps)
        if self._idle >= self.stall_polls and core.frames and self._health_wm:
            self._emit(core.tick(min(self._health_wm.values())))  # stalled: reports carry time
        if core.relaunches != relaunches or core.now != now:
            self.pace.processed_one(count=0)  # wake a job waiting for detection to see it
        self._producer.flush()
        self._consumer.commit()
        self.messages += len(got)
        return len(got)

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                self.poll()
        except BaseException as exc:  # surfaced by the main thread
            self.error = exc
            self.pace.close()

    def drain(self, idle_polls: int = 5) -> None:
        idle = 0
        while idle < idle_polls:
            idle = idle + 1 if self.poll() == 0 else 0
        self._emit(self.core.flush())
        for event in self._ended:
            self._emit(self.core.on_lifecycle(event))
        self._producer.flush()

    def close(self) -> None:
        self._consumer.close()
        self._producer.close()


def run_demo(
    settings: Settings,
    scenario: Scenario,
    console: Console | None = None,
    backend: ArchiveBackend | None = None,
    lag_frames: int = 4,
) -> DemoSummary:
    """Run the scenario closed loop through every stage; ``backend`` defaults to the
    settings' archive (tests pass their own: chDB allows one data path per process)."""
    console = console or Console(stderr=True)
    t0 = time.monotonic()
    notes: list[str] = []
    stop = threading.Event()
    with ExitStack() as stack:
        if not settings.kafka_bootstrap:
            broker = stack.enter_context(TansuBroker(log_dir=settings.state_dir / "tansu"))
            settings = settings.model_copy(
                update={"kafka_bootstrap": broker.bootstrap, "broker_flavor": "tansu"}
            )
            notes.append(f"embedded Tansu broker on {broker.bootstrap}")
        run = uuid.uuid4().hex[:8]
        # a job id per run, so that runs archived side by side stay apart
        scenario = scenario.model_copy(update={"job_id": f"{scenario.job}-{run}"})
        job = SimulatedJob(scenario)
        update: dict[str, Any] = {
            "topic_prefix": f"{settings.topic_prefix}demo-{run}.",
            "consumer_group": f"{settings.consumer_group}.demo-{run}",
            "actuator_mode": "auto",
            "spare_nodes": ",".join(job.spare_pool),
            "guard_job_nodes": scenario.nodes,
        }
        keys = ephemeral_keys(settings, f"demo-{run}", ROLES)
        if keys:
            roles = [k.removesuffix("_private_key") for k in keys if k.endswith("_private_key")]
            notes.append("signed with ephemeral demo keys: " + ", ".join(roles))
        settings = settings.model_copy(update=update | keys)
        registry = registry_of(settings)
        topics = create_topics(settings)
        if backend is None:
            backend = open_backend(settings)
            stack.callback(backend.close)
        migrate(backend)
        notes.append(f"archive: {backend.name} database {backend.database}")
        producer = make_producer(settings)
        stack.callback(producer.close)

        pace = _Pace(lag_frames)
        detection = DetectionStage(settings, scenario.job, pace)
        stack.callback(detection.close)

        # guardrail windows, cooldowns and command expiry run on the job's event time:
        # the demo compresses hours into minutes
        def sim_clock() -> datetime:
            return datetime.fromtimestamp(job.ts, UTC)

        actuator = Actuator(settings, clock=sim_clock)
        stack.callback(actuator.close)
        controller = JobController(job)
        listener = CommandListener(
            settings, scenario.job, name="simulated-job",
            on_checkpoint=controller.checkpoint, on_isolate=controller.isolate,
            clock=sim_clock,
        ).start()  # fmt: skip
        controller.listener = listener
        stack.callback(listener.close)
        threads = [
            threading.Thread(target=detection.run, args=(stop,), name="detect", daemon=True),
            threading.Thread(target=actuator.run, args=(stop.is_set,), name="act", daemon=True),
        ]
        for t in threads:
            t.start()
        stack.callback(stop.set)

        progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console,
        )  # fmt: skip
        counts: Counter[str] = Counter()
        with progress:
            task = progress.add_task("training", total=scenario.steps, info="")
            truth = scenario.truth()
            for t in truth:
                publish(producer, registry, "truth", t)
                counts["truth"] += 1
            publish(producer, registry, "lifecycle", _job_event(scenario, JobEventKind.START, job))
            for ev in job.events():
                if ev.frame is not None:
                    messages = ev.frame.to_messages()
                    for m in messages:
                        publish(producer, registry, "steps", m)
                    counts["steps"] += len(messages)
                    producer.flush()
                    pace.publish(len(messages))
                    pace.wait()
                for h in ev.health:
                    publish(producer, registry, "health", h)
                    counts["health"] += 1
                if ev.frame is None and ev.health:
                    # compressed time: a stall lasts long enough for detection to see
                    # it (in real time it lasts seconds to minutes)
                    producer.flush()
                    pace.wait_until(partial(_reached, detection, ev.ts), timeout_s=5.0)
                if detection.error is not None:
                    raise detection.error
                controller.queue(listener.poll_step_boundary(job.step))
                if controller.restart_due():
                    # compressed time: detection sees every step of the old run first
                    pace.wait_until(lambda: pace.seen_msgs >= pace.sent_msgs)
                if controller.at_boundary():
                    # compressed time: let detection see the relaunch before the
                    # relaunch's silent seconds are played to it
                    pace.wait_until(lambda: detection.restarts >= controller.relaunches)
                grades = Counter(
                    a.grade.value for a in detection.alerts if a.state is AlertState.FIRING
                )
                progress.update(
                    task, completed=max(job.step, 0),
                    info=f"alerts {dict(grades)} commands {actuator.stats.commands} "
                    f"goodput {job.goodput().fraction:.2f}",
                )  # fmt: skip
            # the training code's exporter announces the end when it closes
            end = _job_event(scenario, JobEventKind.END, job, reason=EndReason.COMPLETED)
            publish(producer, registry, "lifecycle", end)
            counts["lifecycle"] += 2
            producer.flush()
            progress.stop_task(task)

            # let detection and the actuator finish what is in flight
            settle = progress.add_task("settle", total=None, info="")
            stop.set()
            for t in threads:
                t.join(timeout=60)
            detection.drain()
            while actuator.poll_once(timeout_ms=300):
                pass
            controller.queue(listener.poll_step_boundary(job.step))
            progress.stop_task(settle)

            # archive every topic
            archive_task = progress.add_task("archive", total=None, info="")
            archiver = Archiver(settings, backend, max_batch=20000, max_wait_s=0.5)
            stack.callback(archiver.close)
            idle = 0
            while idle < 6:
                idle = idle + 1 if archiver.poll_batch() == 0 else 0
                progress.update(archive_task, info=f"{archiver.stats.rows} rows")
            progress.stop_task(archive_task)

        alerts = detection.alerts
        outcomes, trap_alerts, false_alerts = match_alerts(truth, alerts)
        db = backend.database
        _, dl = backend.query(f"SELECT count() FROM {db}.dead_letters")
        _, cmds = backend.query(
            f"SELECT kind, targets FROM {db}.commands FINAL WHERE job_id = '{scenario.job}'"
        )
        faulty = {t.node for t in truth if not t.is_trap and t.node}
        isolated = [n for kind, targets in cmds if kind == "isolate" for n in targets]
        grades = Counter(a.grade.value for a in alerts if a.state is AlertState.FIRING)
        summary = DemoSummary(
            scenario=scenario.name, job_id=scenario.job, nodes=scenario.nodes,
            ranks=scenario.n_ranks,
            steps_completed=detection.frames,
            faults_injected=len(outcomes), faults_detected=sum(o.detected for o in outcomes),
            traps=sum(1 for t in truth if t.is_trap), trap_alerts=trap_alerts,
            false_alerts=false_alerts,
            false_isolations=sum(1 for n in isolated if n not in faulty),
            goodput=round(job.goodput().fraction, 4),
            wall_seconds=round(time.monotonic() - t0, 2),
            messages_published=sum(counts.values()) + len(alerts),
            archived_rows=archiver.stats.rows, dead_letters=int(dl[0][0]),
            alerts_by_grade=dict(grades), faults=outcomes,
            commands=dict(Counter(str(kind) for kind, _ in cmds)),
            isolated_nodes=isolated,
            actions_applied=[f"step {s}: {k} {d}".strip() for s, k, d in controller.applied],
            notes=[*notes, f"topics: {', '.join(sorted(topics.values()))}"],
        )  # fmt: skip
    return summary


def _job_event(scenario: Scenario, kind: JobEventKind, job: SimulatedJob, **kw: Any) -> JobEvent:
    return JobEvent(
        job_id=scenario.job, kind=kind, ts=datetime.fromtimestamp(job.ts, UTC),
        step=max(job.step, 0), source="simulated-job", **kw,
    )  # fmt: skip


def print_summary(summary: DemoSummary, console: Console) -> None:
    table = Table(title=f"stepguard demo: {summary.scenario} (job {summary.job_id})")
    for col in ("fault", "kind", "node", "onset", "detected at", "delay (steps)", "alerts"):
        table.add_column(col)
    for o in summary.faults:
        table.add_row(
            o.fault_id, o.kind, o.node or "(job)", str(o.onset_step),
            str(o.detected_step) if o.detected else "[red]missed",
            "" if o.delay_steps is None else str(o.delay_steps), ", ".join(o.alert_kinds),
        )  # fmt: skip
    console.print(table)
    console.print(
        f"{summary.nodes} nodes x {summary.ranks // max(summary.nodes, 1)} GPUs, "
        f"{summary.steps_completed} steps; faults detected {summary.faults_detected}/"
        f"{summary.faults_injected}; alerts on traps {summary.trap_alerts}; "
        f"unmatched alerts {summary.false_alerts}; alerts by grade {summary.alerts_by_grade}; "
        f"goodput {summary.goodput:.3f}; {summary.messages_published} messages, "
        f"{summary.archived_rows} archived rows, {summary.dead_letters} dead letters; "
        f"{summary.wall_seconds:.1f} s"
    )
    cmds = ", ".join(f"{n} {k}" for k, n in sorted(summary.commands.items())) or "none"
    console.print(
        f"commands issued: {cmds}; isolated {summary.isolated_nodes or 'no node'} "
        f"(false isolations {summary.false_isolations})"
    )
    for line in summary.actions_applied:
        console.print(f"  job applied {line}")
    for n in summary.notes:
        console.print(f"  - {n}")
    console.print(
        f"next: stepguard report --job {summary.job_id} --out report.html   "
        f"stepguard query incident_timeline --job {summary.job_id}"
    )


def write_json(summary: DemoSummary, path: Path) -> None:
    path.write_text(json.dumps(summary.to_json(), indent=2, default=str) + "\n")
