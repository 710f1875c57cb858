"""``stepguard simulate --control`` faster than real time, as ``stepguard up --scenario``
runs it: the job controller applies the actuator's restart, and neither the job's steps
nor the actuator's commands look dated in the future.

A job played at SPEED > 1 starts on the stack's clock and runs ahead of it, held back
to a share of STEPGUARD_MAX_CLOCK_SKEW_S (:mod:`pipeline.tools.simulator.timing`); the
job controller judges commands on the wall clock (a job clock behind or ahead of it
changes nothing), and dates its own results by the job's clock.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pipeline.client.listener import CommandListener
from pipeline.io.kafka import control_producer, create_topics, publish, read_back, registry_of
from pipeline.io.settings import load_settings
from pipeline.io.trust import sign
from schemas import ActuatorMode, Command, CommandKind, CommandStatus
from tests.factories import ACTUATOR_KEY, key_settings

pytestmark = pytest.mark.integration

STEPGUARD = str(Path(sys.executable).parent / "stepguard")
#: metrics ports of up's children come from this suite's agreed range
PORT_RANGE = range(41200, 41300)


def _free_block(size: int = 8) -> int:
    """The first of ``size`` consecutive free ports in :data:`PORT_RANGE` (a port a run
    just closed stays in TIME_WAIT for a while: up's check refuses it)."""
    for base in range(PORT_RANGE.start, PORT_RANGE.stop - size + 1, size):
        with contextlib.ExitStack() as stack:
            try:
                for port in range(base, base + size):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return base
    pytest.fail(f"no {size} free ports in {PORT_RANGE}")


def _command(cid: str, issued: datetime) -> Command:
    return sign(Command(command_id=cid, kind=CommandKind.CHECKPOINT, job_id="job-1",
                        reason=("fp",), mode=ActuatorMode.AUTO, issued_at=issued,
                        expires_at=issued + timedelta(minutes=5)), ACTUATOR_KEY)  # fmt: skip


def test_a_job_controller_on_a_back_dated_job_clock_judges_commands_on_the_wall_clock(settings):
    s = settings.model_copy(update=key_settings())
    create_topics(s)
    now = datetime.now(UTC)
    producer = control_producer(s)
    try:  # one partition (keyed by job): the future one is judged before the good one
        for cmd in (_command("cmd-tomorrow", now + timedelta(days=1)), _command("cmd-now", now)):
            publish(producer, registry_of(s), "commands", cmd).get(30)
    finally:
        producer.close()
    hour = timedelta(hours=1)  # a job played fast, back-dated an hour
    with CommandListener(
        s, "job-1", on_checkpoint=lambda c, step: "saved",
        clock=lambda: datetime.now(UTC) - hour,
    ) as listener:  # fmt: skip
        applied = listener.poll_step_boundary(7, wait_s=30)
    assert [c.command_id for c in applied] == ["cmd-now"]  # not "an hour ahead"
    results = {(r.message.command_id, r.message.status): r.message
               for r in read_back(s, "results")}  # fmt: skip
    refused = results[("cmd-tomorrow", CommandStatus.REFUSED)]
    assert (
        refused.detail.startswith("issued_at ") and "STEPGUARD_MAX_CLOCK_SKEW_S" in refused.detail
    )
    done = results[("cmd-now", CommandStatus.SUCCEEDED)]
    assert done.ts < now - hour / 2  # what it publishes is dated by the job's clock


def _up_env(broker_settings, tmp: Path, prefix: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPGUARD_")}
    return env | {
        "STEPGUARD_KAFKA_BOOTSTRAP": broker_settings.kafka_bootstrap,
        "STEPGUARD_BROKER_FLAVOR": broker_settings.broker_flavor,
        "STEPGUARD_STATE_DIR": str(tmp / ".stepguard"),
        "STEPGUARD_TOPIC_PREFIX": prefix,
        "STEPGUARD_CONSUMER_GROUP": f"g{uuid.uuid4().hex[:10]}",
        "STEPGUARD_WORKER_TICK_INTERVAL_S": "0.5",
        # ci_smoke at 8x would lead the wall clock by ~177 s: simulate holds its events
        # to 80 % of this (24 s ahead at most), so none is refused as from the future
        "STEPGUARD_MAX_CLOCK_SKEW_S": "30",
    }


def test_simulate_control_at_8x_applies_the_restart_and_dates_nothing_in_the_future(
    broker_settings, tmp_path
):
    prefix = f"t{uuid.uuid4().hex[:10]}."
    env = _up_env(broker_settings, tmp_path, prefix)
    state = tmp_path / ".stepguard"
    argv = [STEPGUARD, "up", "--scenario", "ci_smoke", "--speed", "8", "--workers", "1",
            "--base-port", str(_free_block())]  # fmt: skip
    out = tmp_path / "up.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=sink, stderr=sink)
    pids: set[int] = set()

    def status() -> dict:
        try:
            doc = json.loads((state / "up.json").read_text())
        except (OSError, ValueError):
            return {}
        pids.update(s["pid"] for s in doc["services"].values() if s["pid"])
        return doc

    def tail() -> str:
        logs = "".join(f"\n== {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                       for p in sorted((state / "logs").glob("*.log")))  # fmt: skip
        return out.read_text(errors="replace")[-3000:] + logs

    try:
        deadline = time.monotonic() + 420  # ~180 s of play: held to the clock
        doc = status()
        while not (doc and doc["services"]["simulate"]["state"] in ("done", "failed")):
            assert proc.poll() is None and time.monotonic() < deadline, tail()
            time.sleep(0.2)  # polling up.json, bounded
            doc = status()
        assert doc["services"]["simulate"]["state"] == "done", tail()
        job = doc["job_id"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, tail()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    s = load_settings({}, kafka_bootstrap=broker_settings.kafka_bootstrap,
                      broker_flavor=broker_settings.broker_flavor, topic_prefix=prefix)  # fmt: skip
    commands = {r.message.command_id: r.message for r in read_back(s, "commands")
                if r.message.job_id == job}  # fmt: skip
    results = [r.message for r in read_back(s, "results") if r.message.job_id == job]
    ours = {(r.command_id, r.status): r for r in results if r.executor == "simulated-job"}
    restarts = [c for c in commands.values() if c.kind is CommandKind.RESTART]
    assert restarts and restarts[0].targets == ("node-0005",), (commands, tail())
    # the job controller took every command (none refused as from the future) ...
    assert not [r for r in results if r.status is CommandStatus.REFUSED], results
    # ... and relaunched the job: a RESTART is reported only once it ran
    done = ours.get((restarts[0].command_id, CommandStatus.SUCCEEDED))
    assert done is not None and done.detail.startswith("restarted from step"), (results, tail())
    log = (state / "logs" / "simulate.log").read_text()
    assert "job applied at step" in log and ": restart from " in log, log[-3000:]
    # no step, health report or lifecycle event of the job was dated in the future
    letters = [d.message for d in read_back(s, "deadletter")]
    assert not [d for d in letters if d.stage == "clock"], letters
    assert not letters, letters
