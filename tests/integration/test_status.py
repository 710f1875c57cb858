"""``stepguard status`` and ``stepguard alerts`` against a real broker: bounded tails
that are right on Tansu (whose end offsets are short when a batch holds several
records), jobs, firing incidents, held actions, and alerts whose signature is marked."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.io.kafka import control_producer, create_topics, make_producer, publish, registry_of
from pipeline.io.trust import sign
from pipeline.tools.alerts import AlertFilter, follow_alerts
from pipeline.tools.status import collect_status
from pipeline.tools.tail import TopicTail
from schemas import (
    ActionRecord,
    ActionState,
    ActuatorMode,
    Alert,
    AlertKind,
    AlertState,
    EndReason,
    Evidence,
    Grade,
    JobEvent,
    JobEventKind,
    RecommendedAction,
)
from tests.factories import WORKER_KEY, key_settings, step_telemetry

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
NOW = datetime.now(UTC).replace(microsecond=0)


def alert(fp: str, seq: int = 0, *, job="job-1", node="node-3", state=AlertState.FIRING,
          grade=Grade.CRITICAL, incident="inc-1", ts=None) -> Alert:  # fmt: skip
    ts = ts or NOW
    return Alert(
        fingerprint=fp, seq=seq, kind=AlertKind.STRAGGLER, grade=grade, state=state,
        job_id=job, node=node, rank=5, step=100 + seq, started_at=NOW - timedelta(minutes=1),
        ts=ts, evidence=Evidence(metric="compute_s", value=1.3, peer_median=1.0, deviation=9),
        recommended_action=RecommendedAction.ISOLATE, summary=f"{node} slow", incident=incident,
    )  # fmt: skip


def send(settings, logical, *messages, batched=False):
    producer = make_producer(settings) if batched else control_producer(settings)
    try:
        reg = registry_of(settings)
        futures = [publish(producer, reg, logical, m) for m in messages]
        for f in futures:
            f.get(timeout=30)
    finally:
        producer.close()


@pytest.fixture
def st(settings, tmp_path):
    s = settings.model_copy(update=key_settings() | {"state_dir": tmp_path / "state"})
    create_topics(s)
    return s


def test_the_tail_is_the_last_n_of_each_partition_even_when_batches_hold_many(st):
    """Batched (one produce request, hundreds of records): Tansu's end offset is short;
    the tail still ends at the last record and holds exactly N."""
    msgs = [alert(f"fp-tail-{i:04d}", job=f"job-{i % 3}") for i in range(600)]
    send(st, "decisions", *msgs, batched=True)
    with TopicTail(st, "decisions") as tail:
        got = tail.tail(7)
        by_part: dict[int, list[int]] = {}
        for d in got:
            by_part.setdefault(d.partition, []).append(d.offset)
        ends = {tp.partition: tail.consumer.highwater(tp) for tp in tail.parts}
    for part, offsets in by_part.items():
        assert sorted(offsets) == list(range(ends[part] - 7, ends[part])), (part, offsets)
    assert sum(ends[p] or 0 for p in ends) == 600
    fps = {d.message.fingerprint for d in got}
    assert "fp-tail-0599" in fps or "fp-tail-0598" in fps or "fp-tail-0597" in fps


def test_status_shows_jobs_firing_incidents_and_held_actions(st):
    old = NOW - timedelta(minutes=10)

    def step(job: str, node: str, n: int, ago_s: float):
        end = NOW - timedelta(seconds=ago_s)
        msg = step_telemetry(job=job, node=node, step=n)
        return msg.model_copy(update={"ts_start": end - timedelta(seconds=1), "ts_end": end})

    send(st, "steps", step("job-1", "n0", 41, 30), step("job-1", "n1", 42, 5),
         step("job-2", "n0", 7, 600))  # fmt: skip
    send(
        st,
        "lifecycle",
        JobEvent(job_id="job-2", kind=JobEventKind.END, reason=EndReason.COMPLETED, ts=old),
    )
    send(
        st,
        "decisions",
        alert("fp-a-00000001"),
        alert("fp-b-00000001", node="node-4"),
        alert("fp-c-00000001", incident="inc-2", node="node-9", grade=Grade.WARNING),
        alert("fp-c-00000001", 1, incident="inc-2", node="node-9", state=AlertState.RESOLVED),
    )
    held = ActionRecord(action_id="act-held-1", state=ActionState.HELD, job_id="job-1",
                        mode=ActuatorMode.APPROVE, reason=("fp-a",), summary="isolate node-3",
                        ts=NOW)  # fmt: skip
    expired = held.model_copy(update={"action_id": "act-old-1", "ts": NOW - timedelta(days=1)})
    done = held.model_copy(update={"action_id": "act-done-1"})
    approved = done.model_copy(update={"state": ActionState.APPROVED})
    send(st, "actions", held, expired, done, approved)
    snap = collect_status(st, window=50, now=NOW)
    jobs = {j.job_id: j for j in snap.jobs}
    assert (jobs["job-1"].last_step, jobs["job-1"].nodes, jobs["job-1"].ended) == (42, 2, None)
    assert jobs["job-1"].age_s == pytest.approx(5, abs=0.01)
    assert jobs["job-2"].ended == "completed"
    assert [(i.incident, i.episodes, i.nodes) for i in snap.incidents] == [
        ("inc-1", 2, ["node-3", "node-4"])
    ]
    assert [h.action_id for h in snap.held] == ["act-held-1"]
    assert snap.services_from == "consumer groups" and snap.notes  # degraded, said so
    json.dumps(snap.to_json())  # --json


def test_alerts_marks_unsigned_ones_and_follows_new_ones(st):
    send(
        st,
        "decisions",
        sign(alert("fp-s-00000001"), WORKER_KEY),
        alert("fp-u-00000001", node="node-7"),
        alert("fp-o-00000001", job="job-other"),
    )
    buf = io.StringIO()
    console = Console(file=buf, width=200, color_system=None)
    stop = threading.Event()
    printed: list[int] = []
    t = threading.Thread(target=lambda: printed.append(follow_alerts(
        st, console, last=10, keep=AlertFilter(job="job-1"), follow=True, as_json=False,
        stop=stop.is_set)))  # fmt: skip
    t.start()
    try:
        for _ in range(300):  # bounded: until the first two lines are out
            if buf.getvalue().count("\n") >= 2:
                break
            stop.wait(0.05)
        send(st, "decisions", sign(alert("fp-n-00000001", node="node-8"), WORKER_KEY))
        for _ in range(300):  # ... and the new one followed
            if "node-8" in buf.getvalue():
                break
            stop.wait(0.05)
    finally:
        stop.set()
        t.join(timeout=30)
    lines = buf.getvalue().splitlines()
    assert len(lines) == 3 and printed == [3], lines
    assert "UNSIGNED" not in lines[0] and "node-3/r5 straggler: node-3 slow" in lines[0]
    assert "CRIT FIRING job-1" in lines[0] and "-> isolate" in lines[0]
    assert "node-7" in lines[1] and lines[1].endswith("UNSIGNED")
    assert "node-8" in lines[2] and "UNSIGNED" not in lines[2]


def test_status_and_alerts_commands_print_json_without_a_broker_traceback(st, tmp_path):
    """The CLI end to end: a stale up.json (up is gone) is shown as such."""
    state = Path(st.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    worker = {"state": "running", "pid": 1, "restarts": 2, "metrics_port": 1}
    up = {"pid": 2**22 + 12345, "services": {"worker-1": worker}}  # beyond pid_max: gone
    (state / "up.json").write_text(json.dumps(up))
    send(st, "decisions", sign(alert("fp-j-00000001"), WORKER_KEY))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPGUARD_")}
    env |= {
        "STEPGUARD_KAFKA_BOOTSTRAP": st.kafka_bootstrap,
        "STEPGUARD_BROKER_FLAVOR": st.broker_flavor,
        "STEPGUARD_TOPIC_PREFIX": st.topic_prefix, "STEPGUARD_STATE_DIR": str(state),
        "STEPGUARD_WORKER_PUBLIC_KEYS": st.worker_public_keys,
    }  # fmt: skip
    cmd = [sys.executable, "-m", "pipeline"]
    done = subprocess.run([*cmd, "status", "--json"], env=env, capture_output=True, text=True,
                          timeout=120, check=False, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["services"][0]["name"] == "worker-1" and doc["services"][0]["state"] == "gone"
    assert any("not running" in n for n in doc["notes"])
    assert [i["incident"] for i in doc["incidents"]] == ["inc-1"]
    done = subprocess.run([*cmd, "alerts", "--json", "--grade", "critical"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    assert json.loads(line)["fingerprint"] == "fp-j-00000001"
    bad = subprocess.run([*cmd, "alerts", "--since", "yesterday"], env=env, capture_output=True,
                         text=True, timeout=120, check=False)  # fmt: skip
    assert bad.returncode == 2 and "--since" in bad.stderr and "Traceback" not in bad.stderr
