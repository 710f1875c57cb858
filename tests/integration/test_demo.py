"""``stepguard demo`` as a person runs it: the production services as child processes.

Runs ``stepguard demo --scenario ci_smoke --json`` in a temp dir against the test
broker (real Kafka under CI, embedded Tansu here): the worker, actuator, dry-run
executor and archiver run as processes, this test only reads what the command wrote.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pipeline.tools.simulator import find_scenario

pytestmark = pytest.mark.integration

STEPGUARD = str(Path(sys.executable).parent / "stepguard")


def test_demo_plays_ci_smoke_against_the_services_and_scores_it(broker_settings, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPGUARD_")}
    env |= {
        "STEPGUARD_KAFKA_BOOTSTRAP": broker_settings.kafka_bootstrap,
        "STEPGUARD_BROKER_FLAVOR": broker_settings.broker_flavor,
        "STEPGUARD_TOPIC_PREFIX": f"t{uuid.uuid4().hex[:10]}.",
    }
    out = tmp_path / "demo.json"
    launched = datetime.now(UTC)
    done = subprocess.run(
        [STEPGUARD, "demo", "--scenario", "ci_smoke", "--json", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    s = json.loads(out.read_text())
    scenario = find_scenario("ci_smoke")

    # scored against the truth read back from the truth topic
    assert s["faults_injected"] == 1 and s["faults_detected"] == 1, s
    assert s["trap_alerts"] == 0 and s["false_alerts"] == 0, s
    (slow,) = s["faults"]
    assert slow["node"] == "node-0005" and slow["alert_kinds"] == ["straggler"], slow
    # closed loop: the actuator (auto mode) replaced the slow node, the job obeyed
    assert s["isolated_nodes"] == ["node-0005"] and s["false_isolations"] == 0, s
    assert any("isolate node-0005->spare-000" in a for a in s["actions_applied"]), s
    assert s["commands"].get("isolate") == 1, s
    # counted from what the job applied (its signed results), not from what was issued
    (applied,) = [a for a in s["applied"] if a.startswith("isolate ['node-0005']")]
    assert applied.endswith("by simulated-job") and s["unanswered"] == [], s
    # the job is dated from the stack's clock: never before the demo started (it was
    # back-dated by what the 8x speed-up gains, ~3 minutes before the demo for ci_smoke)
    assert datetime.fromisoformat(s["job_started_at"]) >= launched, s["job_started_at"]
    # every rank-step the job played was archived by the archiver (and its hand-over)
    assert s["steps_completed"] >= scenario.steps
    assert s["archived_rows"] >= s["steps_completed"] * scenario.n_ranks, s
    assert s["dead_letters"] == 0 and s["service_restarts"] == {}, s

    # the services were child processes, each with its log, and none outlived the demo
    (state,) = (tmp_path / ".stepguard" / "demo").iterdir()
    status = json.loads((state / "up.json").read_text())
    services = status["services"]
    assert {"worker-1", "actuator", "executor-dry-run", "archiver"} <= set(services)
    assert "broker" not in services  # the test's broker was given
    assert all(svc["pid"] is None for svc in services.values()), services
    assert status["job_id"] == s["job_id"]
    for name in ("worker-1", "actuator", "executor-dry-run", "archiver"):
        assert (state / "logs" / f"{name}.log").stat().st_size > 0
    assert "would isolate" in (state / "logs" / "executor-dry-run.log").read_text()


def test_a_worker_killed_while_the_job_plays_is_restarted_and_the_demo_still_scores_it(
    broker_settings, tmp_path
):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPGUARD_")}
    env |= {
        "STEPGUARD_KAFKA_BOOTSTRAP": broker_settings.kafka_bootstrap,
        "STEPGUARD_BROKER_FLAVOR": broker_settings.broker_flavor,
        "STEPGUARD_TOPIC_PREFIX": f"t{uuid.uuid4().hex[:10]}.",
    }
    out, log = tmp_path / "demo.json", tmp_path / "demo.log"
    argv = [STEPGUARD, "demo", "--scenario", "ci_smoke", "--json", str(out)]
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=sink, stderr=sink)
    try:
        deadline = time.monotonic() + 180
        while "plays at" not in log.read_text(errors="replace"):  # the job has started
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)  # polling the demo's own output, bounded
        (status,) = (tmp_path / ".stepguard" / "demo").glob("*/up.json")
        pid = json.loads(status.read_text())["services"]["worker-1"]["pid"]
        os.kill(pid, signal.SIGKILL)
        assert proc.wait(timeout=600) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    s = json.loads(out.read_text())
    assert s["service_restarts"] == {"worker-1": 1}, s
    assert "worker-1: exited with code -9" in log.read_text()
    assert s["faults_detected"] == 1 and s["false_isolations"] == 0, s
    assert s["isolated_nodes"] == ["node-0005"], s
