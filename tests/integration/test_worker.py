"""exporters -> broker -> ``stepguard worker`` (subprocess) -> decision topic.

Workers run as real processes with explicit STEPGUARD_* settings; every wait is a
bounded poll of a topic or a metrics endpoint, never a sleep before an assertion.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from kafka import TopicPartition

from detectors.frame import StepFrame
from detectors.job import JobDetection
from pipeline.client import StepExporter
from pipeline.io.embedded import free_port
from pipeline.io.kafka import create_topics, make_consumer, make_producer, publish, registry_of
from pipeline.io.settings import Settings, load_settings
from pipeline.io.trust import sign, signature_problem
from pipeline.services.worker.app import changelog_topic_name
from pipeline.services.worker.ended import EndMark, read_mark
from pipeline.services.worker.seal import Seal, derive_key
from pipeline.services.worker.state import partition_for
from pipeline.tools.simulator import Scenario, simulate
from pipeline.tools.simulator.player import play
from schemas import (
    ActuatorMode,
    Alert,
    AlertKind,
    AlertState,
    Command,
    CommandKind,
    DeadLetter,
    Grade,
    RecommendedAction,
    decode,
    encode,
)
from tests.conftest import fresh_settings
from tests.factories import (
    ACTUATOR_KEY,
    TELEMETRY_SECRET,
    WORKER_KEY,
    job_controller_key,
    job_controller_settings,
    key_env,
    metric_sum,
    signed_headers,
    telemetry_settings,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def scenario(name: str, faults: list[dict], **kw: object) -> Scenario:
    spec = {"name": name, "nodes": 16, "steps": 150, "seed": 3, "faults": faults} | kw
    return Scenario.model_validate(spec)


class Worker:
    """``python -m pipeline.services.worker`` with settings passed as environment variables."""

    def __init__(self, settings: Settings, tmp: Path, name: str, **extra: str) -> None:
        self.metrics_port = free_port()
        self.log = tmp / f"worker-{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("STEPGUARD_")}
        env |= {
            "STEPGUARD_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "STEPGUARD_BROKER_FLAVOR": settings.broker_flavor,
            "STEPGUARD_TOPIC_PREFIX": settings.topic_prefix,
            "STEPGUARD_CONSUMER_GROUP": settings.consumer_group,
            "STEPGUARD_WORKER_METRICS_PORT": str(self.metrics_port),
            "STEPGUARD_WORKER_DATA_DIR": str(tmp / f"data-{name}"),
            "STEPGUARD_WORKER_SESSION_TIMEOUT_S": "6",
            "STEPGUARD_WORKER_TICK_INTERVAL_S": "0.5",
        } | {f"STEPGUARD_{k.upper()}": v for k, v in extra.items()}
        # it signs its alerts and obeys the actuator's signed commands
        env |= key_env(("worker",)) | {"STEPGUARD_ACTUATOR_PUBLIC_KEYS": ACTUATOR_KEY.public_text()}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pipeline.services.worker", "--loglevel", "info"],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def metric(self, name: str) -> float:
        """Sum of every sample of ``name`` (0 while the endpoint is not up)."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2
            ) as r:
                text = r.read().decode()
        except OSError:
            return 0.0
        return metric_sum(text, name)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


@pytest.fixture
def workers(settings: Settings, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    started: list[Worker] = []

    def start(name: str = "a", **extra: str) -> Worker:
        w = Worker(settings, tmp_path, name, **extra)
        started.append(w)
        return w

    create_topics(settings)
    yield start
    for w in started:
        w.stop()


class Topic:
    """Everything read so far from one topic, polled on demand."""

    def __init__(self, settings: Settings, logical: str, model: type) -> None:
        self.consumer = make_consumer(settings, [registry_of(settings).name(logical)], None)
        self.model = model
        self.items: list = []

    def wait(
        self, pred: Callable[[list], bool], timeout: float, what: str, worker=None,
        supervise: Callable[[], None] | None = None,
    ):  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if supervise is not None:
                supervise()
            for records in self.consumer.poll(timeout_ms=300).values():
                self.items += [decode(self.model, r.value) for r in records]
            if pred(self.items):
                return self.items
        tail = worker.tail() if worker is not None else ""
        pytest.fail(
            f"timed out waiting for {what}; got {len(self.items)}: {self.describe()}\n{tail}"
        )

    def describe(self) -> list:
        return [
            (a.kind.value, a.grade.value, a.state.value, a.node, a.step)
            if isinstance(a, Alert)
            else a
            for a in self.items
        ][:40]

    def close(self) -> None:
        self.consumer.close()


@pytest.fixture
def decisions(settings: Settings) -> Iterator[Topic]:
    create_topics(settings)
    t = Topic(settings, "decisions", Alert)
    yield t
    t.close()


def firing(kind: AlertKind, node: str | None = None, grade: Grade | None = None):
    def pred(items: list) -> bool:
        return any(
            a.kind is kind
            and a.state is AlertState.FIRING
            and (node is None or a.node == node)
            and (grade is None or a.grade is grade)
            for a in items
        )

    return pred


def record_frame(exporter: StepExporter, frame: StepFrame) -> None:
    """What the training loop does for one step: one call per rank."""
    for m in frame.to_messages():
        for s in m.samples:
            exporter.record_step(
                m.step,
                s.rank,
                step_time_s=s.step_time_s,
                compute_s=s.compute_s,
                comm_wait_s=s.comm_wait_s,
                data_wait_s=s.data_wait_s,
                local_rank=s.local_rank,
                ts_start=m.ts_start.timestamp(),
                ts_end=m.ts_end.timestamp(),
                loss=s.loss,
                grad_norm=s.grad_norm,
                phase=s.phase.value,
                dp_group=s.dp_group,
                pp_stage=s.pp_stage,
                tp_group=s.tp_group,
                node=m.node,
            )


def test_straggler_from_step_exporters_reaches_decisions(settings, workers, decisions):
    sc = scenario(
        "straggler",
        [{"kind": "straggler", "node": 5, "gpu": 2, "onset_step": 40, "magnitude": 0.25}],
    )
    # single-process mode: one exporter reports every node of this small job
    exporter = StepExporter.direct(
        settings, job_id=sc.job, node="node-0000", ranks_per_node=8, register_atexit=False
    )
    for ev in simulate(sc):
        if ev.frame is not None:
            record_frame(exporter, ev.frame)
    stats = exporter.close(timeout=30)
    assert (stats.dropped, stats.invalid) == (0, 0)
    assert stats.sent == sc.nodes * sc.steps + 2  # and the job's start and end
    w = workers()
    items = decisions.wait(
        firing(AlertKind.STRAGGLER, "node-0005", Grade.CRITICAL), 40, "critical straggler", w
    )
    stragglers = {a.node for a in items if a.kind is AlertKind.STRAGGLER}
    assert stragglers == {"node-0005"}
    assert w.metric("stepguard_worker_rank_steps_total") > 0


def test_degradation_played_by_simulate_command(settings, workers, decisions, tmp_path):
    sc = scenario(
        "degrade",
        [
            {
                "kind": "degradation",
                "node": 9,
                "onset_step": 30,
                "magnitude": 0.3,
                "shape": "linear",
                "ramp_steps": 60,
            }
        ],
    )
    path = tmp_path / "degrade.yaml"
    path.write_text(yaml.safe_dump(sc.model_dump(mode="json")))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPGUARD_")} | {
        "STEPGUARD_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "STEPGUARD_BROKER_FLAVOR": settings.broker_flavor,
        "STEPGUARD_TOPIC_PREFIX": settings.topic_prefix,
        # it plays every node: the cluster telemetry secret
        "STEPGUARD_TELEMETRY_SECRET": TELEMETRY_SECRET,
    }
    w = workers()
    out = subprocess.run(
        [str(Path(sys.executable).parent / "stepguard"), "simulate", str(path), "--max"],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "published 150 steps" in out.stderr
    items = decisions.wait(firing(AlertKind.DEGRADATION, "node-0009"), 40, "degradation", w)
    nodes = {
        a.node
        for a in items
        if a.state is AlertState.FIRING and a.kind in (AlertKind.DEGRADATION, AlertKind.STRAGGLER)
    }
    assert nodes == {"node-0009"}


def test_hang_detected_by_timer_while_no_steps_arrive(settings, workers, decisions):
    # ~0.1 s steps; the job goes silent after step 60 (what a hung job looks like)
    sc = scenario("hang", [], base_compute_s=0.1, collective_s=0.01, steps=100)
    w = workers()
    play(settings, sc, speed=None, stop_after_step=60)
    # flagged at 2.5 step times (it may be a long step nobody announced), acted on at 8
    items = decisions.wait(firing(AlertKind.HANG, grade=Grade.CRITICAL), 40, "hang alert", w)
    hangs = [a for a in items if a.kind is AlertKind.HANG]
    assert [a.grade for a in hangs] == [Grade.WARNING, Grade.CRITICAL]
    hang = hangs[-1]
    assert signature_problem(hang, WORKER_KEY.verifier()) is None  # the worker signs alerts
    assert hang.step == 61 and hang.fingerprint == hangs[0].fingerprint
    assert not [a for a in items if a.kind is not AlertKind.HANG]


def test_a_crashed_node_alone_on_its_health_partition_is_named_missing(settings, workers,
                                                                       decisions):  # fmt: skip
    """A node's health silence is judged only as far as its own partition of the health
    topic has delivered (the watermarks each worker's timer writes to the jobs topic):
    a partition whose reader lags is never its nodes' silence. node-0010 is the only
    node of this job keyed to its partition, so no other report ever moves that
    partition's watermark: it is named only if the timer's watermarks flow through the
    real broker and worker. It crashes at step 30 (its steps and health stop) and the
    job hangs on it; the other 15 nodes keep reporting."""
    keys = {n: partition_for(f"node-{n:04d}", 8) for n in range(16)}
    assert [n for n in keys if keys[n] == keys[10]] == [10]  # alone on its partition
    sc = scenario("crash", [{"kind": "crash", "node": 10, "onset_step": 30, "hang_steps": 60}],
                  base_compute_s=0.1, collective_s=0.01, steps=100)  # fmt: skip
    w = workers()
    play(settings, sc, speed=1.0)
    items = decisions.wait(firing(AlertKind.MISSING, "node-0010"), 60, "node-0010 missing", w)
    named = {a.node for a in items if a.kind is AlertKind.MISSING and a.state is AlertState.FIRING}
    assert named == {"node-0010"}, decisions.describe()
    # judged by the watermarks, not as before them (where none flow, silence is judged
    # up to the job's clock): the timer wrote them, partitions read to their end
    assert w.metric('stepguard_worker_health_watermarks_total{state="read"}') > 0, w.tail()


def test_a_commanded_restart_is_relaunching_not_a_hang(settings, workers, decisions, tmp_path):
    """The actuator's restart command reaches the worker through the commands topic:
    from then until the new run's first step the job is relaunching (the
    ``stepguard_worker_jobs_by_state`` gauge says so), not hung, for as long as
    ``relaunch_max_s`` allows (30 s here, from the detector settings file); a job that
    never comes back is then ``relaunch_stuck``: a WARNING to investigate, never a
    CRITICAL hang (which would recommend a second RESTART). Without the command a hang
    is raised after 2.5 step times (~2.6 s, as in the test above).
    Silence is read in event time from the alert, so a slow worker start cannot pass
    or fail it."""
    config = tmp_path / "detectors.json"
    config.write_text(json.dumps({"relaunch_max_s": 30.0}))
    sc = scenario("relaunch", [], base_compute_s=1.0, collective_s=0.01, steps=100)
    last_ts = max(e.ts for e in simulate(sc) if e.frame is not None and e.step == 60)
    w = workers(detector_config=str(config))
    play(settings, sc, speed=None, stop_after_step=60)
    deadline = time.monotonic() + 60
    while w.metric("stepguard_worker_steps_total") < 61 and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the worker's metrics endpoint, bounded
    assert w.metric("stepguard_worker_steps_total") >= 61, w.tail()
    # the job is silent from here: the command must arrive within ~2.6 s
    producer = make_producer(settings)
    now = datetime.now(UTC)
    command = sign(Command(command_id="cmd-relaunch", kind=CommandKind.RESTART, job_id=sc.job,
                           checkpoint_step=50, reason=("test",), mode=ActuatorMode.AUTO,
                           issued_at=now, expires_at=now + timedelta(minutes=5)),
                   ACTUATOR_KEY)  # fmt: skip
    publish(producer, registry_of(settings), "commands", command)
    producer.flush()
    producer.close()
    relaunching = 'stepguard_worker_jobs_by_state{state="relaunching"}'
    deadline = time.monotonic() + 20
    while w.metric(relaunching) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the worker's metrics endpoint, bounded
    assert w.metric(relaunching) == 1, w.tail()
    items = decisions.wait(firing(AlertKind.HANG), 90, "the stuck relaunch", w)
    assert [(a.kind, a.grade, a.recommended_action) for a in items] == [
        (AlertKind.HANG, Grade.WARNING, RecommendedAction.INVESTIGATE)
    ]
    assert "relaunch_stuck" in items[0].summary
    silence = items[0].ts.timestamp() - last_ts  # event time, as the worker reads it
    assert silence >= 30, (silence, w.tail())


def test_sigkill_mid_stream_neither_loses_nor_reopens_episodes(settings, workers, decisions):
    sc = scenario(
        "restart",
        [
            {
                "kind": "straggler",
                "node": 3,
                "gpu": 1,
                "onset_step": 30,
                "duration_steps": 30,
                "magnitude": 0.3,
            },
            {"kind": "straggler", "node": 11, "gpu": 6, "onset_step": 110, "magnitude": 0.3},
        ],
        steps=160,
    )
    reference = _reference_alerts(sc)
    ref_eps = {(a.fingerprint, a.seq, a.state) for a in reference}
    assert {a.node for a in reference} == {"node-0003", "node-0011"}

    w1 = workers("first")
    play(settings, sc, speed=None, stop_after_step=90)
    # the first episode opened; kill the worker while it holds unsnapshotted steps
    decisions.wait(firing(AlertKind.STRAGGLER, "node-0003"), 40, "first episode", w1)
    w1.kill()
    producer = make_producer(settings)
    registry = registry_of(settings)
    for ev in simulate(sc):
        if ev.frame is not None and ev.frame.step > 90:
            for m in ev.frame.to_messages():
                value = encode(m)  # as its node's exporter sends it: with its proof
                producer.send(registry.name("steps"), key=sc.job.encode(), value=value,
                              headers=signed_headers("steps", m, value))  # fmt: skip
    producer.flush()
    producer.close()
    w2 = workers("second")
    # the hang at the end of the stream proves the restarted worker caught up
    decisions.wait(
        lambda xs: (
            firing(AlertKind.STRAGGLER, "node-0011")(xs)
            and any(a.kind is AlertKind.HANG and (a.step or 0) >= sc.steps for a in xs)
        ),
        60,
        "second episode and end-of-stream hang",
        w2,
    )
    got = {(a.fingerprint, a.seq, a.state) for a in decisions.items if a.kind is not AlertKind.HANG}
    # same episodes, same updates: nothing lost, nothing re-opened (duplicates allowed)
    extra = [
        (a.kind.value, a.node, a.rank, a.step, a.state.value, a.summary[:80])
        for a in decisions.items
        if a.kind is not AlertKind.HANG and (a.fingerprint, a.seq, a.state) not in ref_eps
    ]
    assert (extra, sorted(ref_eps - got)) == ([], [])


def _reference_alerts(sc: Scenario) -> list[Alert]:
    """What the detection core says of the scenario's steps, without a broker."""
    detection, out = JobDetection(sc.job), []
    for ev in simulate(sc):
        if ev.frame is None:
            continue
        for m in ev.frame.to_messages():
            out += [a for a in detection.on_step(m).alerts if a.kind is not AlertKind.HANG]
    return out


def _job_per_partition(n: int = 8) -> list[str]:
    jobs: dict[int, str] = {}
    i = 0
    while len(jobs) < n:
        jobs.setdefault(partition_for(f"job-{i}", n), f"job-{i}")
        i += 1
    return [jobs[p] for p in sorted(jobs)]


def test_second_worker_joins_splits_partitions_and_both_alert(settings, workers, decisions):
    if settings.is_tansu:
        pytest.skip(
            "Tansu: Faust's changelog recovery of the partitions a worker keeps across a "
            "rebalance never receives the changelog records (stalls); runs on Apache Kafka"
        )
    jobs = _job_per_partition(8)
    # Faust's changelog recovery of the partitions a worker keeps across a rebalance
    # sometimes waits forever (~1 run in 10 here); the worker then exits for its
    # supervisor, and this test restarts it as a supervisor would
    fast = {"worker_recovery_timeout_s": "15"}
    faults = [
        {"kind": "straggler", "node": 1, "gpu": 0, "onset_step": 30, "magnitude": 0.3},
        {"kind": "straggler", "node": 2, "gpu": 5, "onset_step": 90, "magnitude": 0.3},
    ]
    scs = [scenario(j, faults, nodes=4, steps=140, job_id=j) for j in jobs]
    a = workers("a", **fast)
    for sc in scs:
        play(settings, sc, speed=None, truth=False, stop_after_step=60)
    decisions.wait(
        lambda xs: {x.job_id for x in xs if x.node == "node-0001"} == set(jobs),
        60,
        "first straggler in every job",
        a,
    )
    b = workers("b", **fast)
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and b.metric("stepguard_worker_assigned_partitions") < 1:
        time.sleep(0.2)
    assert b.metric("stepguard_worker_assigned_partitions") >= 1, b.tail()
    producer = make_producer(settings)
    registry = registry_of(settings)
    for sc in scs:
        for ev in simulate(sc):
            if ev.frame is not None and ev.frame.step > 60:
                for m in ev.frame.to_messages():
                    value = encode(m)  # as its node's exporter sends it: with its proof
                    producer.send(registry.name("steps"), key=sc.job.encode(), value=value,
                                  headers=signed_headers("steps", m, value))  # fmt: skip
    producer.flush()
    producer.close()
    running = {"a": a, "b": b}
    restarts: list[int | None] = []

    def supervise() -> None:
        for name, w in list(running.items()):
            if w.proc.poll() is not None:
                restarts.append(w.proc.returncode)
                running[name] = workers(f"{name}{len(restarts)}", **fast)

    decisions.wait(
        lambda xs: {x.job_id for x in xs if x.node == "node-0002"} == set(jobs),
        120,
        "second straggler in every job after the join",
        b,
        supervise,
    )
    assert set(restarts) <= {75}, restarts  # only the recovery watchdog's exit
    a, b = running["a"], running["b"]

    def owned(w: Worker) -> float:
        return w.metric("stepguard_worker_assigned_partitions")

    deadline = time.monotonic() + 60  # a restarted worker may still be joining
    while time.monotonic() < deadline and not (owned(a) >= 1 and owned(a) + owned(b) == 16):
        supervise()
        a, b = running["a"], running["b"]
        time.sleep(0.2)
    # steps + internal job topic, 8 partitions each, split between the two
    assert owned(a) >= 1 and owned(a) + owned(b) == 16, (owned(a), owned(b), restarts)
    if not restarts:  # both original workers alerted for their share
        assert a.metric("stepguard_worker_alerts_total") > 0
        assert b.metric("stepguard_worker_alerts_total") > 0


def test_malformed_and_oversized_records_are_dead_lettered_while_good_ones_flow(
    settings, workers, decisions
):
    sc = scenario(
        "dlq", [{"kind": "straggler", "node": 7, "gpu": 3, "onset_step": 30, "magnitude": 0.3}]
    )
    registry = registry_of(settings)
    producer = make_producer(settings)
    bad = [
        producer.send(registry.name("steps"), key=b"dlq", value=b"{not json").get(30),
        producer.send(registry.name("health"), key=b"n1", value=b'{"node": 5}').get(30),
        producer.send(registry.name("steps"), key=b"dlq", value=b"x" * 40_000).get(30),
        producer.send(registry.name("steps"), key=b"dlq", value=_hostile_rank()).get(30),
    ]
    producer.close()
    dead = Topic(settings, "deadletter", DeadLetter)
    try:
        w = workers(worker_max_message_bytes="32768")
        # no lifecycle: the simulator holds no controller key of this job here, and a
        # start it sent would be one more (unauthenticated) dead letter
        play(settings, sc, speed=None, truth=False, lifecycle=False)
        decisions.wait(firing(AlertKind.STRAGGLER, "node-0007"), 40, "straggler", w)
        letters = dead.wait(lambda xs: len(xs) >= 4, 30, "four dead letters", w)
    finally:
        dead.close()
    coords = {(d.source_topic, d.partition, d.offset) for d in letters}
    assert coords == {(m.topic, m.partition, m.offset) for m in bad}
    errors = " | ".join(d.error for d in letters)
    assert "exceeds the limit of 32768" in errors
    assert "NodeHealth" in errors
    assert "less than 1048576" in errors  # a rank id no per-rank array is sized by
    assert w.metric("stepguard_worker_dead_letters_total") == 4


def _hostile_rank() -> bytes:
    msg = next(simulate(scenario("dlq", []))).frame.to_messages()[0]
    sample = msg.samples[0].model_copy(update={"rank": 500_000_000})  # unvalidated copy
    return encode(msg.model_copy(update={"samples": (sample,)}))


class DurableKafka:
    """A broker of this test's own (``scripts/kafka.sh`` with ``--keep-data``), so the
    session's shared broker is never restarted under other tests."""

    def __init__(self, home: Path) -> None:
        version = os.environ.get("KAFKA_VERSION", "4.4.0")
        shared = Path(os.environ.get("KAFKA_HOME_DIR", "/tmp/stepguard-kafka"))
        self.port = free_port()
        self.env = {
            **os.environ,
            "KAFKA_HOME_DIR": str(home),
            "KAFKA_PORT": str(self.port),
            "KAFKA_CONTROLLER_PORT": str(free_port()),
        }
        if (shared / f"libs-{version}" / ".complete").exists():
            self.env["KAFKA_LIBS_DIR"] = str(shared / f"libs-{version}")  # no second fetch
        self.bootstrap = f"127.0.0.1:{self.port}"

    def _script(self, *args: str) -> None:
        out = subprocess.run(
            ["bash", str(ROOT / "scripts" / "kafka.sh"), *args],
            env=self.env, capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
        assert out.returncode == 0, f"kafka.sh {' '.join(args)} failed:\n{out.stderr[-3000:]}"

    def start(self) -> None:
        self._script("start", "--keep-data")

    def stop(self, keep: bool = True) -> None:
        self._script("stop", *(["--keep-data"] if keep else []))


def test_broker_restart_is_ridden_out_by_worker_and_exporter(tmp_path):
    if not os.environ.get("STEPGUARD_TEST_KAFKA"):
        pytest.skip("needs Apache Kafka's durable storage (Tansu keeps topics in memory)")
    broker = DurableKafka(tmp_path / "kafka")
    broker.start()
    # authenticated as the session's broker settings are: the exporter plays every node
    # of the job with the tests' cluster secret
    settings = fresh_settings(
        load_settings(
            {}, kafka_bootstrap=broker.bootstrap, broker_flavor="kafka", **telemetry_settings()
        )
    )
    create_topics(settings)
    decisions = Topic(settings, "decisions", Alert)
    w = Worker(settings, tmp_path, "restart")
    try:
        # 0.1 s steps played in real time: the broker goes away at step 50 and comes
        # back while the job keeps training; the straggler starts after the restart
        sc = scenario(
            "broker-restart",
            [{"kind": "straggler", "node": 5, "gpu": 2, "onset_step": 150, "magnitude": 0.3}],
            steps=220, base_compute_s=0.1, collective_s=0.01,
        )  # fmt: skip
        frames = [ev.frame for ev in simulate(sc) if ev.frame is not None]
        exporter = StepExporter.direct(
            settings, job_id=sc.job, node="node-0000", ranks_per_node=8, register_atexit=False
        )
        deadline = time.monotonic() + 60
        while w.metric("stepguard_worker_assigned_partitions") < 1:
            assert time.monotonic() < deadline and w.proc.poll() is None, w.tail()
            time.sleep(0.2)
        restart = threading.Thread(target=lambda: (broker.stop(), broker.start()))
        t0, step_s = time.monotonic(), frames[1].ts - frames[0].ts
        slowest_call = 0.0
        for i, frame in enumerate(frames):
            if i == 50:
                restart.start()
            t = time.perf_counter()
            record_frame(exporter, frame)
            slowest_call = max(slowest_call, (time.perf_counter() - t) / frame.n_ranks)
            time.sleep(max(0.0, t0 + (i + 1) * step_s - time.monotonic()))  # pacing
        restart.join(timeout=180)
        assert not restart.is_alive()
        stats = exporter.close(timeout=60)
        # the training loop never waited on the broker, and nothing was lost
        assert slowest_call < 0.01
        assert (stats.dropped_queue_full, stats.dropped_send) == (0, 0)
        assert stats.sent == sc.nodes * sc.steps + 2  # and the job's start and end
        items = decisions.wait(
            firing(AlertKind.STRAGGLER, "node-0005", Grade.CRITICAL), 90, "straggler", w
        )
        assert w.proc.poll() is None, w.tail()
        # nothing else: the outage itself is no hang, no straggler and no lifecycle notice
        # (the end, held back with the steps, still comes after the job's last step)
        kinds = {(a.kind, a.node) for a in items}
        assert kinds == {(AlertKind.STRAGGLER, "node-0005")}, [
            (a.kind.value, a.node, a.summary) for a in items
        ]
        assert w.metric("stepguard_worker_rank_steps_total") >= 8 * sc.nodes * (sc.steps - 2)
    finally:
        decisions.close()
        w.stop()
        broker.stop(keep=False)


# -- job lifecycle, in real time --------------------------------------------------------

#: ~0.27 s steps; a checkpoint every 50 steps takes ~4.6 s, 17 step times
CHECKPOINTED = {"base_compute_s": 0.25, "collective_s": 0.01, "checkpoint_every": 50,
                "checkpoint_s": 4.6, "warmup_steps": 5}  # fmt: skip


def _end_of_step(sc: Scenario, step: int) -> float:
    return max(e.ts for e in simulate(sc) if e.frame is not None and e.step == step)


def test_learned_checkpoints_are_not_hangs_but_a_checkpoint_that_never_ends_is(
    settings, workers, decisions
):
    """Played in real time through ``stepguard worker``, unannounced: the first
    checkpoint (step 49) with the run's start teaches a candidate period, the second
    (99) confirms it, the third (149) raises no hang, and
    the job then stops where its fourth checkpoint is due (199): a hang, reported
    before the silence reaches 3 x the learned checkpoint duration."""
    sc = scenario("ckpt-learned", [], steps=200, **CHECKPOINTED)
    w = workers()
    play(settings, sc, speed=1.0, stop_after_step=198, announce_phases=False)

    def hangs(items: list) -> list[Alert]:
        return [a for a in items if a.kind is AlertKind.HANG and a.state is AlertState.FIRING]

    items = decisions.wait(
        lambda xs: any(a.step == 199 for a in hangs(xs)), 60, "the hang at the 4th checkpoint", w
    )
    ckpt = _end_of_step(sc, 149) - _end_of_step(sc, 148)  # what a checkpoint takes
    # the hang clock names the step in progress: 149 is the third checkpoint
    assert [a.step for a in hangs(items) if a.step > 100] == [199], decisions.describe()
    silence = hangs(items)[-1].ts.timestamp() - _end_of_step(sc, 198)  # event time
    assert ckpt < silence < 3 * ckpt, (silence, ckpt)
    assert not [a for a in items if a.kind is not AlertKind.HANG]


def test_announced_checkpoints_are_not_hangs_and_an_ended_job_raises_none(
    settings, workers, decisions
):
    """Every checkpoint announced (even the first raises no hang); the job then ends
    (END, completed): no hang follows, and its table entry becomes the mark of its end
    (sealed, as the worker writes it: a successor ignores its replayed steps). A second job
    that goes silent afterwards hangs, which proves the timer ran past the first
    job's threshold."""
    sc = scenario("ckpt-announced", [], steps=120, **CHECKPOINTED)
    # an end takes effect once no step contradicts it for STEPGUARD_END_CONFIRM_S; the
    # job's end and phases count only when its own controller signed them
    controller = job_controller_key(sc.job)
    w = workers(end_confirm_s="5", job_controller_public_keys=controller.public_text())
    play(settings.model_copy(update=job_controller_settings(sc.job)), sc, speed=1.0,
         announce_phases=True)  # fmt: skip
    other = scenario("after-end", [], steps=60, job_id="after-end", **CHECKPOINTED)
    play(settings, other, speed=1.0, stop_after_step=40)
    items = decisions.wait(firing(AlertKind.HANG), 60, "the second job's hang", w)
    assert [(a.job_id, a.step) for a in items if a.kind is AlertKind.HANG] == [("after-end", 41)], (
        decisions.describe()
    )
    changelog = make_consumer(settings, [changelog_topic_name(settings)], None)
    try:
        last: dict[bytes, bytes | None] = {}
        seal = Seal(derive_key(WORKER_KEY))

        def marked() -> EndMark | None:
            return read_mark(sc.job, last.get(sc.job.encode()), seal)

        deadline = time.monotonic() + 30
        while marked() is None and time.monotonic() < deadline:
            for records in changelog.poll(timeout_ms=300).values():
                last |= {r.key: r.value for r in records}
    finally:
        changelog.close()
    mark = marked()
    assert mark is not None, "no end mark for the ended job"
    assert mark.end_ts >= _end_of_step(sc, sc.steps - 1) - 1e-3, mark


def test_a_worker_over_its_job_cap_dead_letters_the_extra_job(settings, workers, decisions):
    first, second = (scenario(j, [], steps=40, job_id=j) for j in ("cap-a", "cap-b"))
    dead = Topic(settings, "deadletter", DeadLetter)
    try:
        w = workers(worker_max_jobs="1")
        play(settings, first, speed=None, lifecycle=False)
        deadline = time.monotonic() + 60  # the worker holds the first job before ...
        while w.metric("stepguard_worker_jobs") < 1 and time.monotonic() < deadline:
            time.sleep(0.05)  # polling the worker's metrics endpoint, bounded
        assert w.metric("stepguard_worker_jobs") == 1, w.tail()
        play(settings, second, speed=None, lifecycle=False)  # ... the second one comes
        n = second.nodes * second.steps
        # every step record of the extra job is dead-lettered, on the broker (2 s here;
        # bounded well above what a loaded CI machine needs). Each exactly once: the
        # worker once handled the record at a batch boundary twice and the next one
        # never (pipeline/services/worker/current.py), 632-639 letters of 640
        topic = registry_of(settings).name("deadletter")
        steps_topic = registry_of(settings).name("steps")
        tps = [TopicPartition(topic, p) for p in dead.consumer.partitions_for_topic(topic)]
        deadline = time.monotonic() + 180
        while sum(dead.consumer.end_offsets(tps).values()) < n and time.monotonic() < deadline:
            time.sleep(0.2)  # polling the broker, bounded
        held = sum(dead.consumer.end_offsets(tps).values())
        assert held >= n, (held, w.tail()[-2000:])

        # and what they say, read back as a subscriber reads them (the job's health and
        # routed records may be refused too: the step records are counted by offset)
        def of_steps(xs: list) -> set:
            return {(d.partition, d.offset) for d in xs if d.source_topic == steps_topic}

        letters = dead.wait(lambda xs: len(of_steps(xs)) >= n, 120, "cap", w)
    finally:
        dead.close()
    steps_letters = [(d.partition, d.offset) for d in letters if d.source_topic == steps_topic]
    assert sorted(o for _, o in steps_letters) == list(range(n)), "a record twice, or never"
    assert {d.stage for d in letters} == {"limit"}
    assert all("STEPGUARD_WORKER_MAX_JOBS=1" in d.error for d in letters)
    assert {d.key for d in letters if d.source_topic == steps_topic} == {b"cap-b"}
