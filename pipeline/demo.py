"""``stepguard demo``: the whole path on the embedded default, then a summary.

simulator -> exporter (kafka-python) -> broker -> detection stage -> decision topic
-> archiver -> chDB, then scores the alerts against the simulator's ground truth.

Stages run one after another in this process, so a 2-core laptop shows every part
working on real services without Docker or a JVM. The detection stage here is the
detection core driven directly; ``stepguard worker`` (Faust) is the production path.
"""

from __future__ import annotations

import heapq
import itertools
import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pipeline.archive import migrate, open_backend
from pipeline.archive.archiver import Archiver
from pipeline.archive.backend import ArchiveBackend
from pipeline.assembly import StepAssembler
from pipeline.embedded import TansuBroker
from pipeline.errors import ConfigError
from pipeline.kafka import (
    consume_decoded,
    create_topics,
    make_consumer,
    make_producer,
    publish,
    registry_of,
)
from pipeline.settings import Settings
from pipeline.simulator import Scenario, SimulatedJob, load_suite
from schemas import Alert, AlertState, FaultTruth, NodeHealth, StepTelemetry

__all__ = [
    "DEMO_DIR",
    "DemoSummary",
    "find_scenario",
    "match_alerts",
    "resize_scenario",
    "run_demo",
]

DEMO_DIR = Path(__file__).parent / "demo_scenarios"


def find_scenario(name: str) -> Scenario:
    """A demo scenario by name, a suite scenario by name, or a YAML path."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.exists():
        return Scenario.from_yaml(path)
    candidate = DEMO_DIR / f"{name}.yaml"
    if candidate.is_file():
        return Scenario.from_yaml(candidate)
    suite = {s.name: s for s in load_suite()}
    if name in suite:
        return suite[name]
    demos = sorted(p.stem for p in DEMO_DIR.glob("*.yaml"))
    raise ConfigError(
        f"--scenario: unknown scenario {name!r}; demos: {demos}; suite: {sorted(suite)[:6]}..."
    )


def resize_scenario(scenario: Scenario, nodes: int | None, steps: int | None) -> Scenario:
    """The same story on another job size: fault nodes and steps are scaled
    proportionally (node 77 of 256 becomes node 19 of 64; onset 420 of 900 steps
    becomes 140 of 300), so ``--nodes``/``--steps`` keep every fault and trap."""
    data = scenario.model_dump()
    fn = (nodes / scenario.nodes) if nodes else 1.0
    fs = (steps / scenario.steps) if steps else 1.0
    faults = []
    for spec in data["faults"]:
        f = dict(spec)
        if f.get("node") is not None:
            f["node"] = min(int(f["node"] * fn), (nodes or scenario.nodes) - 1)
        f["onset_step"] = int(f["onset_step"] * fs)
        for key in ("duration_steps", "ramp_steps"):
            if f.get(key) is not None:
                f[key] = max(1, int(f[key] * fs))
        faults.append(f)
    data["faults"] = faults
    for key in ("eval_every", "checkpoint_every"):
        if data.get(key):
            data[key] = max(1, int(data[key] * fs))
    data["warmup_steps"] = min(data["warmup_steps"], max(1, int(data["warmup_steps"] * fs)))
    if nodes:
        data["nodes"] = nodes
    if steps:
        data["steps"] = steps
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"--nodes/--steps: cannot resize {scenario.name}: {exc}") from exc


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
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def match_alerts(
    truth: list[FaultTruth], alerts: list[Alert], grace_steps: int = 30
) -> tuple[list[FaultOutcome], int, int]:
    """Match firing alert episodes to faults: same node (or job-level for job-wide
    faults) and a step inside [onset, end + grace]. Returns outcomes, alerts on traps,
    and firing episodes that match no fault."""
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
            if (f.node is None or a.node == f.node) and f.onset_step <= (a.step or 0) <= end
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


def _merge_by_time(
    frames: Iterator[tuple[float, Any]], health: list[NodeHealth]
) -> Iterator[tuple[float, Any]]:
    heap = [(h.ts.timestamp(), i, h) for i, h in enumerate(health)]
    heapq.heapify(heap)
    for ts, item in frames:
        while heap and heap[0][0] <= ts:
            hts, _, h = heapq.heappop(heap)
            yield hts, h
        yield ts, item
    while heap:
        hts, _, h = heapq.heappop(heap)
        yield hts, h


def run_demo(
    settings: Settings,
    scenario: Scenario,
    console: Console | None = None,
    backend: ArchiveBackend | None = None,
) -> DemoSummary:
    """Run the scenario through every stage; ``backend`` defaults to the settings'
    archive (tests pass their own: chDB allows one data path per process)."""
    from detectors.engine import JobMonitor  # the detection core

    console = console or Console(stderr=True)
    t0 = time.monotonic()
    notes: list[str] = []
    with ExitStack() as stack:
        if not settings.kafka_bootstrap:
            broker = stack.enter_context(TansuBroker(log_dir=settings.state_dir / "tansu"))
            settings = settings.model_copy(
                update={"kafka_bootstrap": broker.bootstrap, "broker_flavor": "tansu"}
            )
            notes.append(f"embedded Tansu broker on {broker.bootstrap}")
        run = uuid.uuid4().hex[:8]
        settings = settings.model_copy(
            update={
                "topic_prefix": f"{settings.topic_prefix}demo-{run}.",
                "consumer_group": f"{settings.consumer_group}.demo-{run}",
            }
        )
        registry = registry_of(settings)
        topics = create_topics(settings)
        if backend is None:
            backend = open_backend(settings)
            stack.callback(backend.close)
        migrate(backend)
        notes.append(f"archive: {backend.name} database {backend.database}")
        producer = make_producer(settings)
        stack.callback(producer.close)

        progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console,
        )  # fmt: skip
        with progress:
            # 1. exporter: the simulated job publishes telemetry and its ground truth
            task = progress.add_task("export", total=scenario.steps, info="")
            truth = scenario.truth()
            counts: Counter[str] = Counter()
            for t in truth:
                publish(producer, registry, "truth", t)
                counts["truth"] += 1
            sim = SimulatedJob(scenario)
            for ev in sim.events():
                if ev.frame is not None:
                    for m in ev.frame.to_messages():
                        publish(producer, registry, "steps", m)
                        counts["steps"] += 1
                    progress.update(task, completed=ev.frame.step + 1)
                for h in ev.health:
                    publish(producer, registry, "health", h)
                    counts["health"] += 1
                progress.update(task, info=f"{sum(counts.values())} msgs")
            producer.flush()
            progress.update(task, completed=scenario.steps)
            progress.stop_task(task)

            # 2. detection: assemble steps, run the detection core, publish alerts
            task = progress.add_task("detect", total=counts["steps"] + counts["health"], info="")
            health = _read_all(
                settings, registry, producer, "health", counts["health"], progress, task
            )
            monitor = JobMonitor(scenario.job)
            assembler = StepAssembler()
            alerts: list[Alert] = []
            steps_done = 0
            for ts, item in _merge_by_time(
                _frames(settings, registry, producer, assembler, counts["steps"], progress, task),
                health,
            ):
                if isinstance(item, NodeHealth):
                    new = monitor.process_health(item) + monitor.tick(ts)
                else:
                    new = monitor.tick(ts) + monitor.process_step(item)
                    steps_done += 1
                for a in new:
                    publish(producer, registry, "decisions", a)
                alerts.extend(new)
                grades = Counter(a.grade.value for a in alerts if a.state is AlertState.FIRING)
                progress.update(task, info=f"alerts {dict(grades)}")
            producer.flush()
            progress.stop_task(task)
            counts["decisions"] = len(alerts)

            # 3. archive every topic
            total = sum(counts.values())
            task = progress.add_task("archive", total=total, info="")
            archiver = Archiver(settings, backend, max_batch=20000, max_wait_s=0.5)
            stack.callback(archiver.close)
            idle = 0
            while archiver.stats.messages < total and idle < 20:
                got = archiver.poll_batch()
                idle = idle + 1 if got == 0 else 0
                progress.update(
                    task, completed=archiver.stats.messages, info=f"{archiver.stats.rows} rows"
                )
            progress.stop_task(task)
            if archiver.stats.messages < total:
                notes.append(f"archived {archiver.stats.messages} of {total} messages")

        outcomes, trap_alerts, false_alerts = match_alerts(truth, alerts)
        _, dl = backend.query(f"SELECT count() FROM {backend.database}.dead_letters")
        grades = Counter(a.grade.value for a in alerts if a.state is AlertState.FIRING)
        summary = DemoSummary(
            scenario=scenario.name, nodes=scenario.nodes, ranks=scenario.n_ranks,
            steps_completed=steps_done,
            faults_injected=len(outcomes), faults_detected=sum(o.detected for o in outcomes),
            traps=sum(1 for t in truth if t.is_trap), trap_alerts=trap_alerts,
            false_alerts=false_alerts, false_isolations=0,
            goodput=round(_goodput(sim), 4),
            wall_seconds=round(time.monotonic() - t0, 2),
            messages_published=total, archived_rows=archiver.stats.rows,
            dead_letters=int(dl[0][0]), alerts_by_grade=dict(grades), faults=outcomes,
            notes=[
                *notes,
                "no actuator yet: no isolation was issued (false_isolations counts none)",
                f"topics: {', '.join(sorted(topics.values()))}",
            ],
        )  # fmt: skip
    return summary


def _goodput(job: SimulatedJob) -> float:
    return job.goodput().fraction


def _read_all(settings, registry, producer, logical, expected, progress, task) -> list[Any]:
    consumer = make_consumer(settings, [registry.name(logical)], None)
    out: list[Any] = []
    try:
        for _ in itertools.count():
            got = [d.message for d in consume_decoded(consumer, registry, producer, 500)]
            out.extend(got)
            progress.advance(task, len(got))
            if len(out) >= expected or (not got and _ > 40):
                break
    finally:
        consumer.close()
    return out


def _frames(settings, registry, producer, assembler, expected, progress, task):
    consumer = make_consumer(
        settings, [registry.name("steps")], f"{settings.consumer_group}.detect"
    )
    seen = 0
    idle = 0
    try:
        while seen < expected and idle < 40:
            batch = list(consume_decoded(consumer, registry, producer, 500))
            idle = idle + 1 if not batch else 0
            for d in batch:
                seen += 1
                msg = d.message
                assert isinstance(msg, StepTelemetry)
                for frame in assembler.add(msg):
                    yield frame.ts, frame
            progress.advance(task, len(batch))
            consumer.commit()
        for frame in assembler.flush():
            yield frame.ts, frame
    finally:
        consumer.close()


def print_summary(summary: DemoSummary, console: Console) -> None:
    table = Table(title=f"stepguard demo: {summary.scenario}")
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
    for n in summary.notes:
        console.print(f"  - {n}")


def write_json(summary: DemoSummary, path: Path) -> None:
    path.write_text(json.dumps(summary.to_json(), indent=2, default=str) + "\n")
