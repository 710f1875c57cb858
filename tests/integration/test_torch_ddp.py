"""A real ``torch.distributed`` job watched by the real services (issue 25).

``stepguard up --job J --nodes node-a,node-b --spares spare-0 --mode M --workers 1``
runs the worker, actuator, dry-run executor and archiver as child processes against
the test broker (real Kafka under CI, embedded Tansu here); the job is
the command line of docs/pytorch.md's step 4, read from the page (``stepguard-torchrun --
torchrun --standalone ...`` with torch_job.py for train.py; gloo, CPU, one thread per
rank, two emulated nodes of two ranks, the venv's bin off PATH), configured only by what
``up`` wrote (up.env, job-controller.env), as the page says. Every
wait is a bounded poll of a topic, a metric or a process.

torch is an optional extra: without it these tests skip, except under ``CI=true``
(.ci/run installs ``.[dev,torch]``), where they fail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IN_CI
from tests.factories import metric_sum
from tests.integration.pytorch_page import job_step

try:
    import torch
except ImportError:
    if IN_CI:
        raise  # CI=true: .ci/run must install .[dev,torch]
    pytest.skip("torch is not installed (pip install -e '.[dev,torch]')", allow_module_level=True)

from pipeline.io.kafka import make_consumer, registry_of
from pipeline.io.settings import Settings
from schemas import (
    Alert,
    AlertKind,
    AlertState,
    Command,
    CommandKind,
    JobEvent,
    JobEventKind,
    RecommendedAction,
    decode,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BIN = Path(sys.executable).parent
JOB_SCRIPT = Path(__file__).with_name("torch_job.py")
NODES = ("node-a", "node-b")  # ranks 0-1 on node-a, 2-3 on node-b
SPARE = "spare-0"


def _env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key] = value
    return out


class Stack:
    """``stepguard up --job`` in a temp dir, and the job run under it."""

    def __init__(self, base: Settings, tmp: Path, mode: str) -> None:
        self.tmp = tmp
        self.job = f"ddp-{uuid.uuid4().hex[:8]}"
        self.state = tmp / ".stepguard"
        self.prefix = f"t{uuid.uuid4().hex[:10]}."
        env = {k: v for k, v in os.environ.items() if not k.startswith("STEPGUARD_")}
        env |= {
            "STEPGUARD_KAFKA_BOOTSTRAP": base.kafka_bootstrap,
            "STEPGUARD_BROKER_FLAVOR": base.broker_flavor,
            "STEPGUARD_TOPIC_PREFIX": self.prefix,
            "STEPGUARD_CONSUMER_GROUP": f"g{uuid.uuid4().hex[:10]}",
            "STEPGUARD_STATE_DIR": str(self.state),
            "STEPGUARD_WORKER_TICK_INTERVAL_S": "0.5",
        }
        self.base_env = env
        argv = [str(BIN / "stepguard"), "up", "--job", self.job, "--nodes", ",".join(NODES),
                "--spares", SPARE, "--mode", mode, "--workers", "1"]  # fmt: skip
        self.out = tmp / "up.out"
        with self.out.open("wb") as out:
            self.proc = subprocess.Popen(argv, cwd=tmp, env=env, stdout=out, stderr=out)
        self.settings = base.model_copy(update={"topic_prefix": self.prefix})
        self.summary, self.ranks_out = tmp / "relaunch.json", tmp / "ranks"
        self.jobs: list[subprocess.Popen[bytes]] = []
        self.alerts: list[Alert] = []
        self.commands: list[Command] = []
        self.events: list[JobEvent] = []
        topics = [
            registry_of(self.settings).name(t) for t in ("decisions", "commands", "lifecycle")
        ]
        self._consumer = make_consumer(self.settings, topics, None)

    # -- the stack ---------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        try:
            return json.loads((self.state / "up.json").read_text())
        except (OSError, ValueError):
            return {}

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        names = ("worker-1", "actuator", "executor-dry-run", "archiver")
        while time.monotonic() < deadline:
            doc = self.status()
            up = doc and all(doc["services"][n]["state"] == "running" for n in names)
            if up and self.metric("stepguard_worker_assigned_partitions") >= 1:
                return
            assert self.proc.poll() is None, self.tail()
            time.sleep(0.3)  # polling up.json and the worker's metrics, bounded
        pytest.fail(f"the stack did not come up\n{self.tail()}")

    def metric(self, name: str) -> float:
        port = self.status().get("services", {}).get("worker-1", {}).get("metrics_port")
        if not port:
            return 0.0
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return 0.0
        return metric_sum(text, name)

    def tail(self) -> str:
        logs = ""
        for log in sorted((self.state / "logs").glob("*.log")):
            logs += f"\n== {log.name}\n{log.read_text(errors='replace')[-2000:]}"
        return self.out.read_text(errors="replace")[-2000:] + logs

    def close(self) -> None:
        for job in self.jobs:  # a test that failed while its job ran: nothing outlives it
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait(30)
        self._consumer.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # up stops its children in order
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    # -- the job -----------------------------------------------------------------------
    def run_job(
        self, *args: str, steps: int, timeout: float = 600, script: Path = JOB_SCRIPT,
        sourced: tuple[str, ...] | None = None, check: bool = True,
    ) -> dict[str, Any]:  # fmt: skip
        proc = self.start_job(*args, steps=steps, script=script, sourced=sourced)
        return self.finish_job(proc, timeout, check=check)

    def start_job(
        self, *args: str, steps: int, script: Path = JOB_SCRIPT,
        sourced: tuple[str, ...] | None = None,
    ) -> subprocess.Popen[bytes]:  # fmt: skip
        # docs/pytorch.md's step 4 as written: the files up wrote sourced, the venv not
        # activated (its bin is off PATH: stepguard-torchrun finds torchrun itself)
        page = job_step()
        env = dict(self.base_env)
        path = [p for p in env.get("PATH", os.defpath).split(os.pathsep) if Path(p) != BIN]
        env["PATH"] = os.pathsep.join(path)
        for name in page.sourced if sourced is None else sourced:  # this test's up wrote
            env |= _env_file(self.state / Path(name).name)
        env |= page.env | {"OMP_NUM_THREADS": "1"}
        summary, out = self.summary, self.ranks_out
        launcher, dashes, *torchrun, train = page.argv
        assert launcher == ".venv/bin/stepguard-torchrun" and train == "train.py", page
        argv = [
            str(BIN / "stepguard-torchrun"), "--summary", str(summary), dashes, *torchrun,
            str(script), "--steps", str(steps), "--ckpt-dir", str(self.tmp), "--out", str(out),
            *args,
        ]  # fmt: skip
        self.job_log = self.tmp / "job.log"
        with self.job_log.open("wb") as log:  # its own session: nothing outlives a timeout
            proc = subprocess.Popen(argv, cwd=self.tmp, env=env, stdout=log, stderr=log,
                                    start_new_session=True)  # fmt: skip
        self.jobs.append(proc)
        return proc

    def finish_job(
        self, proc: subprocess.Popen[bytes], timeout: float = 600, check: bool = True
    ) -> dict[str, Any]:
        """Wait for the job started by :meth:`start_job`; its summary and ranks' figures."""
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            pytest.fail(f"the job ran past {timeout} s\n{self.job_log.read_text()[-4000:]}")
        if not check:
            return {"exit_code": code, "log": self.job_log.read_text(errors="replace")}
        assert code == 0, self.job_log.read_text()[-6000:]
        doc = json.loads(self.summary.read_text())
        doc["ranks"] = [
            json.loads(p.read_text()) for p in sorted(self.ranks_out.glob("rank-*.json"))
        ]
        return doc

    def wait_steps(self, total: int, timeout: float = 120) -> None:
        """Until the worker has scored ``total`` rank-steps of the job's messages."""
        deadline = time.monotonic() + timeout
        while self.metric("stepguard_worker_rank_steps_total") < total:
            assert time.monotonic() < deadline, f"worker saw too few steps\n{self.tail()}"
            time.sleep(0.3)  # polling the worker's metrics, bounded
        self.poll(1.0)

    def poll(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for tp, records in self._consumer.poll(timeout_ms=200).items():
                for r in records:
                    if tp.topic.endswith("decisions"):
                        a = decode(Alert, r.value)
                        if isinstance(a, Alert) and a.job_id == self.job:
                            self.alerts.append(a)
                    elif tp.topic.endswith("lifecycle"):
                        e = decode(JobEvent, r.value)
                        if isinstance(e, JobEvent) and e.job_id == self.job:
                            self.events.append(e)
                    else:
                        c = decode(Command, r.value)
                        if isinstance(c, Command) and c.job_id == self.job:
                            self.commands.append(c)

    def wait_alert(self, pred: Callable[[Alert], bool], timeout: float, what: str) -> Alert:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [a for a in self.alerts if pred(a)]
            if found:
                return found[0]
            self.poll(0.5)
        pytest.fail(f"no {what}; alerts: {[(a.kind, a.node, a.step) for a in self.alerts]}"
                    f"\n{self.tail()}")  # fmt: skip


@pytest.fixture
def stack(broker_settings: Settings, tmp_path: Path) -> Iterator[Callable[[str], Stack]]:
    made: list[Stack] = []

    def start(mode: str) -> Stack:
        s = Stack(broker_settings, tmp_path, mode)
        made.append(s)
        s.wait_ready()
        return s

    yield start
    for s in made:
        s.close()


def firing(kind: AlertKind, node: str) -> Callable[[Alert], bool]:
    return lambda a: a.kind is kind and a.node == node and a.state is AlertState.FIRING


def described(alerts: list[Alert]) -> list[tuple[Any, ...]]:
    """What an assertion prints of unexpected alerts: who, when, how sure, and why."""
    return [(a.kind.value, a.node, a.rank, a.step, a.grade.name, a.evidence.metric,
             a.evidence.detail) for a in alerts]  # fmt: skip


@pytest.mark.xfail(
    strict=False,
    reason="issue 44, open: an 80-step clean run on this 2-core host raised a WARNING in 2 "
    "of the last runs: a compute straggler on the leader (compute +23 % vs peers for 3 steps "
    "at step 76, a fresh-clone CI run) and a data stall on the leader (data wait 15, 11, 30 "
    "ms vs peers' 2-5 ms, at load 4-6)",
)
def test_a_clean_ddp_run_raises_nothing(stack):
    s = stack("observe")
    doc = s.run_job(steps=80)
    assert doc["relaunches"] == [], doc
    assert {r["node"] for r in doc["ranks"]} == set(NODES)
    s.wait_steps(80 * 4)
    assert [a for a in s.alerts if a.state is AlertState.FIRING] == []
    # lifecycle once per job (rank 0), not once per rank: a start, one phase per
    # checkpoint (steps 49, 79), an end
    kinds = [e.kind for e in s.events]
    assert kinds.count(JobEventKind.START) == 1 and kinds.count(JobEventKind.END) == 1, kinds
    assert kinds.count(JobEventKind.PHASE) == 1, kinds


@pytest.mark.xfail(
    strict=False,
    reason="issue 44, open: in a fresh-clone CI run the compute rule raised a straggler "
    "WARNING on the leader (compute +37.6 % vs peers for a few steps at step 42, resolved at "
    "47), the shared host's noise of issue 44 2(b); it passed in the CI run before",
)
def test_a_long_clean_run_raises_no_warning(stack):
    """Shared-host noise is not a fault (issue 44): 300 clean steps (every rank's compute
    and waits spiking for a few steps as the host's other work comes and goes) raise no
    alert of WARNING or above, so nothing recommends replacing a node."""
    s = stack("observe")
    steps = 300
    doc = s.run_job(steps=steps)
    assert doc["relaunches"] == [], doc
    s.wait_steps(steps * 4)
    loud = [a for a in s.alerts if a.state is AlertState.FIRING and a.grade.level >= 1]
    assert not loud, described(loud)


@pytest.mark.xfail(
    strict=False,
    reason="issue 44, open: replayed through the suite, 5 of 6 recorded hog runs were named "
    "on node-b within 15 steps (+9 to +12) and none named another node; in the sixth rank 3 "
    "already arrived last in about 30 % of the clean steps, so under the false-alarm bound "
    "(waits_last_p 3e-4, which keeps 16 seeds of ranks sharing busy cores silent) it needed "
    "every step of 10 and was named at +23",
)
def test_a_cpu_hog_on_one_ranks_core_is_named_on_its_node_within_15_steps(stack):
    """A noisy neighbour (issue 44): from step 40 a busy process shares rank 3's core. Its
    thread computes no more (its compute clock reads normal); it gets less of its core,
    so its peers wait on it, and the waits name its node within 15 steps, no other node.
    On a quiet host the hog costs the step only 8-18 % (within the step's own noise):
    what names it is that rank 3 arrives last at the collectives step after step, beyond
    its usual rate (``waits_last_span``, ``waits_last_p``).

    Ranks are pinned (``--pin``): each to a core of its own where the host has 4, else
    each emulated node to its own share of the cores, so the hog contends with node-b
    alone (unpinned, the scheduler moves the other ranks on and off the hog's core, and
    how much of it rank 3 loses varies from run to run: it waited least in 31 of 50
    steps in one measured run, 45 of 50 in another)."""
    s = stack("observe")
    onset = 40
    s.run_job("--pin", "--hog-rank", "3", "--hog-from", str(onset), steps=90)
    alert = s.wait_alert(firing(AlertKind.STRAGGLER, "node-b"), 60, "straggler alert on node-b")
    print(f"hog from step {onset}: named at step {alert.step}:", described([alert]))
    assert alert.step is not None and onset <= alert.step <= onset + 15, described([alert])
    wrong = [a for a in s.alerts if a.node != "node-b" and a.state is AlertState.FIRING]
    assert not wrong, described(wrong)


def test_a_compute_straggler_is_named_within_ten_steps_with_cause_compute(stack):
    s = stack("observe")
    onset = 40
    s.run_job("--slow-rank", "3", "--slow-from", str(onset), steps=90)
    alert = s.wait_alert(firing(AlertKind.STRAGGLER, "node-b"), 60, "straggler alert on node-b")
    assert alert.rank == 3, alert
    assert alert.evidence.metric.startswith("compute"), alert.evidence
    assert alert.step is not None and alert.step <= onset + 10, alert
    wrong = [a for a in s.alerts if a.node == "node-a" and a.state is AlertState.FIRING]
    assert not wrong, described(wrong)


def test_a_data_loader_stall_is_named_as_data_wait(stack):
    s = stack("observe")
    onset = 40
    s.run_job("--stall-rank", "1", "--stall-from", str(onset), "--stall-s", "0.2", steps=90)
    alert = s.wait_alert(firing(AlertKind.DATA_STALL, "node-a"), 60, "data stall on node-a")
    assert alert.rank == 1 and alert.evidence.metric.startswith("data"), alert
    # issue 44: the remedy is the input path's, never replacing the node
    stalls = [a for a in s.alerts if a.kind is AlertKind.DATA_STALL]
    fired = [a for a in stalls if a.state is AlertState.FIRING]
    assert all(a.recommended_action is RecommendedAction.INVESTIGATE for a in fired), fired
    wrong = [a for a in s.alerts if a.kind is AlertKind.STRAGGLER and a.node == "node-a"
             and a.state is AlertState.FIRING]  # fmt: skip
    assert not wrong, described(wrong)


def test_auto_mode_replaces_the_straggler_and_a_90_s_relaunch_is_relaunching_not_a_hang(stack):
    """Auto mode checkpoints, isolates the straggler's node and restarts the job once
    with the spare in; the relaunch takes 90 s (every rank of the new run waits that
    long before it joins the group: a scheduler's queue, a node's boot), and all that
    while the worker holds the job as relaunching (its ``jobs_by_state`` gauge), raises
    no hang and issues no second RESTART (issue 44)."""
    s = stack("auto")
    delay = 90.0
    proc = s.start_job("--slow-rank", "3", "--slow-from", "40",
                       "--relaunch-delay-s", str(delay), steps=160)  # fmt: skip
    deadline = time.monotonic() + 300
    while "stepguard-torchrun: relaunch 1:" not in s.job_log.read_text(errors="replace"):
        assert proc.poll() is None, s.job_log.read_text(errors="replace")[-6000:]
        assert time.monotonic() < deadline, f"no relaunch\n{s.tail()}"
        s.poll(0.5)  # reading the topics while the old run goes on, bounded
    # the new run is in its 90 s start-up: relaunching until its first step, then running
    relaunched = time.monotonic()
    gauge = 'stepguard_worker_jobs_by_state{state="%s"}'
    while s.metric(gauge % "relaunching") < 1:
        assert time.monotonic() < relaunched + 60, f"never relaunching\n{s.tail()}"
        s.poll(0.5)  # the alerts and commands of the relaunch, as they come
    shown = time.monotonic() - relaunched
    while s.metric(gauge % "running") < 1:
        assert proc.poll() is None, s.job_log.read_text(errors="replace")[-6000:]
        assert time.monotonic() < relaunched + delay + 120, f"not back\n{s.tail()}"
        s.poll(0.5)
    back = time.monotonic() - relaunched
    print(f"relaunch: relaunching shown {shown:.1f} s in, running again at {back:.1f} s")
    assert shown < delay <= back, (shown, back)  # relaunching the whole time it took
    doc = s.finish_job(proc)
    (relaunch,) = doc["relaunches"]  # exactly once
    assert relaunch["exclude"] == ["node-b"] and doc["nodes"] == ["node-a", SPARE], doc
    second = [r for r in doc["ranks"] if r["attempt"] == "1"]
    assert {r["node"] for r in second} == {"node-a", SPARE}, doc["ranks"]
    assert all(r["start"] == relaunch["step"] + 1 for r in second), doc  # from the checkpoint
    s.poll(3.0)
    kinds = [c.kind for c in s.commands]
    assert kinds.count(CommandKind.RESTART) == 1, kinds
    assert CommandKind.CHECKPOINT in kinds and CommandKind.ISOLATE in kinds, kinds
    isolate = next(c for c in s.commands if c.kind is CommandKind.ISOLATE)
    assert isolate.targets == ("node-b",) and isolate.replacements == (SPARE,), isolate
    hangs = [a for a in s.alerts if a.kind is AlertKind.HANG]
    assert not hangs, described(hangs)


def test_one_process_without_a_process_group_publishes_its_measured_steps(settings):
    """The fast check of the whole publishing path (no torchrun): watch() in this
    process, five steps of real work, the node's message read back from the topic."""
    from pipeline.client.pytorch import watch
    from schemas import StepTelemetry

    env = {"STEPGUARD_JOB_ID": f"one-{uuid.uuid4().hex[:6]}", "STEPGUARD_NODE": "node-x"}
    guard = watch(commands=False, settings=settings, env=env)
    a = torch.randn(128, 128)
    for _step, batch in guard.steps(iter([a] * 5), total=5):
        (batch @ batch).sum().item()
    stats = guard.close()
    assert stats.steps == 5 and stats.record_s > 0
    consumer = make_consumer(settings, [registry_of(settings).name("steps")], None)
    try:
        got: list[StepTelemetry] = []
        deadline = time.monotonic() + 30
        while len(got) < 5 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=300).values():
                got += [m for r in records if isinstance(m := decode(StepTelemetry, r.value),
                                                          StepTelemetry)]  # fmt: skip
    finally:
        consumer.close()
    assert sorted(m.step for m in got) == [0, 1, 2, 3, 4], got
    (rank,) = got[-1].samples
    assert got[-1].node == "node-x" and rank.rank == 0 and rank.dp_group == 0
    assert rank.compute_s > 0 and rank.comm_wait_s == 0 and rank.step_time_s >= rank.compute_s


def test_the_leaders_long_wait_for_a_batch_is_said_while_it_lasts(settings):
    """A stalled input pipeline is told from a hung job while it lasts: the job's
    leader waits for its tenth batch, and the loader gives it only once the ``wait``
    event (after step 8, dated at the wait's start) is on the lifecycle topic."""
    from pipeline.client.pytorch import watch

    job = f"wait-{uuid.uuid4().hex[:6]}"
    guard = watch(commands=False, settings=settings, env={"STEPGUARD_JOB_ID": job,
                                                          "STEPGUARD_NODE": "node-x"})  # fmt: skip
    consumer = make_consumer(settings, [registry_of(settings).name("lifecycle")], None)
    said: list[JobEvent] = []
    waited_from: list[float] = []

    def batches() -> Iterator[torch.Tensor]:
        a = torch.randn(64, 64)
        for i in range(12):
            if i == 9:  # the storage stalls: the batch comes once the stall is said
                waited_from.append(time.time())
                deadline = time.monotonic() + 60
                while not said and time.monotonic() < deadline:
                    for records in consumer.poll(timeout_ms=300).values():
                        events = [decode(JobEvent, r.value) for r in records]
                        said.extend(
                            e for e in events if isinstance(e, JobEvent)
                            and e.job_id == job and e.kind is JobEventKind.WAIT
                        )  # fmt: skip
            yield a

    try:
        for _step, batch in guard.steps(batches(), total=12):
            (batch @ batch).sum().item()
        guard.close()
    finally:
        consumer.close()
    assert len(said) == 1, said
    assert said[0].step == 8 and said[0].source == "node-x", said[0]
    assert abs(said[0].ts.timestamp() - waited_from[0]) < 0.5, (said[0].ts, waited_from)


def test_close_after_one_epoch_short_of_total_announces_no_end(settings):
    """guard.steps(loader) ends with the loader (one epoch); close() then must not say
    the job completed when `total` was not reached (issue 41 item 7): no end, unless
    close("completed") says so. Epochs as docs/pytorch.md shows reach total: completed."""
    from pipeline.client.pytorch import watch
    from schemas import EndReason

    def run(epochs: int, *, reason: Any = None, explicit: bool = False) -> list[Any]:
        env = {"STEPGUARD_JOB_ID": f"ep-{uuid.uuid4().hex[:6]}", "STEPGUARD_NODE": "node-x"}
        guard = watch(commands=False, settings=settings, env=env)
        said: list[Any] = []
        close = guard.exporter.close

        def spy(*a: Any, **kw: Any) -> Any:
            said.append(kw.get("reason"))
            return close(*a, **kw)

        guard.exporter.close = spy  # type: ignore[method-assign]
        a = torch.randn(16, 16)
        step = 0
        for _epoch in range(epochs):  # the page's loop: one guard, global steps
            for step, batch in guard.steps(iter([a] * 3), start=step, total=6):
                (batch @ batch).sum().item()
            step += 1
        guard.close(reason) if explicit else guard.close()
        return said

    assert run(1) == [None]  # 3 of 6 steps: the job may go on
    assert run(1, reason="completed", explicit=True) == ["completed"]
    assert run(2) == [EndReason.COMPLETED]  # two epochs of 3 reach total=6


def test_sourcing_only_up_env_stops_every_rank_saying_why_and_which_file_to_source(stack):
    """Issue 41 item 7: with only up.env sourced, rank 0's listener has no key and the
    node aggregators no telemetry secret; every rank (not only those) says why, and the
    advice is the job-controller.env that up wrote (the key the running actuator trusts,
    the stack's secret), not a key of a new `keys generate`."""
    s = stack("observe")
    doc = s.run_job(steps=20, sourced=(".stepguard/up.env",), check=False)
    assert doc["exit_code"] != 0
    # each rank's error as raised (not the traceback's source line that raises it)
    said = [line for line in doc["log"].splitlines() if "RuntimeError: stepguard:" in line]
    assert len(said) >= 4, doc["log"][-4000:]  # each of the 4 ranks
    for line in said:
        assert "STEPGUARD_JOB_CONTROLLER_PRIVATE_KEY is not set" in line, line
        assert "job-controller.env" in line and "keys generate" not in line, line
        # the node aggregators (ranks 0 and 2) lack the telemetry secret too, and say so
        assert "ranks 0" not in line and "rank 2: the node aggregator" in line, line
        assert "STEPGUARD_TELEMETRY_NODE_KEYS is required" in line, line
