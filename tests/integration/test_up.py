"""``stepguard up`` as a person runs it: the whole stack as child processes.

Starts ``stepguard up --scenario ci_smoke --workers 2`` in a temp dir on the embedded
broker, waits for the straggler's alert on the decisions topic, SIGKILLs a worker,
sees the supervisor restart it (``up.json``) and the job's alerts still arrive (the
job's end resolves the straggler's episode), then Ctrl-C (SIGINT) stops every child.
Every wait is a bounded poll of ``up.json`` or the decisions topic.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.io.kafka import make_consumer, registry_of
from pipeline.io.settings import load_settings
from pipeline.tools.simulator import node_name
from schemas import Alert, AlertState, decode

pytestmark = pytest.mark.integration

STEPGUARD = str(Path(sys.executable).parent / "stepguard")
STRAGGLER = node_name(5)  # ci_smoke: node 5, gpu 3 slows down from step 60


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Up:
    def __init__(self, tmp: Path) -> None:
        self.state = tmp / ".stepguard"
        self.prefix = f"t{uuid.uuid4().hex[:10]}."
        self.out = tmp / "up.out"
        env = {k: v for k, v in os.environ.items() if not k.startswith("STEPGUARD_")}
        env |= {
            "STEPGUARD_STATE_DIR": str(self.state),
            "STEPGUARD_TOPIC_PREFIX": self.prefix,
            "STEPGUARD_CONSUMER_GROUP": f"g{uuid.uuid4().hex[:10]}",
            "STEPGUARD_WORKER_TICK_INTERVAL_S": "0.5",
            # an end takes effect once no step contradicts it for this long (issue 22)
            "STEPGUARD_END_CONFIRM_S": "5",
            # observe: nothing isolates the straggler, so its episode stays open until
            # the job's end resolves it (an alert that comes after the worker restart)
            "STEPGUARD_ACTUATOR_MODE": "observe",
        }
        argv = [STEPGUARD, "up", "--scenario", "ci_smoke", "--workers", "2", "--speed", "4"]
        with self.out.open("wb") as out:
            self.proc = subprocess.Popen(argv, cwd=tmp, env=env, stdout=out, stderr=out)
        self.pids: set[int] = set()

    def status(self) -> dict[str, Any]:
        try:
            doc = json.loads((self.state / "up.json").read_text())
        except (OSError, ValueError):
            return {}
        self.pids |= {s["pid"] for s in doc["services"].values() if s["pid"]}
        return doc

    def wait(self, pred: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            doc = self.status()
            if doc and pred(doc):
                return doc
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)  # polling up.json, bounded
        pytest.fail(f"timed out waiting for {what}; up.json: {self.status()}\n{self.tail()}")

    def tail(self) -> str:
        logs = ""
        for log in sorted((self.state / "logs").glob("*.log")):
            logs += f"\n== {log.name}\n{log.read_text(errors='replace')[-1500:]}"
        return self.out.read_text(errors="replace")[-3000:] + logs

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    u = Up(tmp_path)
    yield u
    u.close()


def running(name: str) -> Callable[[dict[str, Any]], bool]:
    return lambda doc: doc["services"][name]["state"] == "running"


def test_up_supervises_the_stack_restarts_a_killed_worker_and_stops_cleanly(up):
    doc = up.wait(running("simulate"), 45, "the scenario to start")
    job = doc["job_id"]
    settings = load_settings(
        {}, kafka_bootstrap=doc["bootstrap"], broker_flavor="tansu", topic_prefix=up.prefix
    )
    consumer = make_consumer(settings, [registry_of(settings).name("decisions")], None)
    alerts: list[Alert] = []

    def wait_alert(pred: Callable[[Alert], bool], timeout: float, what: str) -> Alert:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=300).values():
                alerts.extend(decode(Alert, r.value) for r in records)
            found = [a for a in alerts if a.job_id == job and pred(a)]
            if found:
                return found[0]
            up.status()
        pytest.fail(f"timed out waiting for {what}; got {alerts[:20]}\n{up.tail()}")

    try:
        wait_alert(
            lambda a: a.node == STRAGGLER and a.state is AlertState.FIRING, 60, "straggler alert"
        )
        killed = up.status()["services"]["worker-1"]["pid"]
        os.kill(killed, signal.SIGKILL)
        doc = up.wait(
            lambda d: d["services"]["worker-1"]["restarts"] == 1 and running("worker-1")(d),
            30,
            "worker-1 restarted",
        )
        assert doc["services"]["worker-1"]["pid"] != killed
        assert doc["services"]["worker-2"]["restarts"] == 0
        # the job's end resolves the open episode: an alert after the restart
        wait_alert(
            lambda a: a.node == STRAGGLER and a.state is AlertState.RESOLVED, 60, "resolution"
        )
    finally:
        consumer.close()

    pids = set(up.pids)
    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(60) == 0, up.tail()
    final = up.status()
    assert all(s["pid"] is None for s in final["services"].values()), final
    assert {s["state"] for s in final["services"].values()} <= {"stopped", "done"}, final
    assert final["services"]["worker-1"]["restarts"] == 1
    assert not [pid for pid in pids if alive(pid)]
