"""``stepguard demo`` as a person runs it: the production services as child processes.

Runs ``stepguard demo --scenario ci_smoke --json`` in a temp dir against the test
broker (real Kafka under CI, embedded Tansu here): the worker, actuator, dry-run
executor and archiver run as processes, this test only reads what the command wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from pipeline.simulator import find_scenario

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
