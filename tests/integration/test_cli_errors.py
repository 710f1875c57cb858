"""Operator commands fail in one line, and followers outlive the broker (issue 41 item 2).

Real processes: ``python -m pipeline`` (the ``stepguard`` entry point) against no broker,
and ``alerts --follow`` across a stop and a restart of a real embedded broker that the
test owns. Waits are bounded by subprocess timeouts and line deadlines, never sleeps.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pipeline.io.embedded import TansuBroker, free_port
from pipeline.io.kafka import control_producer, create_topics, publish, registry_of
from pipeline.io.settings import load_settings
from schemas import Alert, AlertKind, AlertState, Evidence, Grade, RecommendedAction

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
CMD = [sys.executable, "-m", "pipeline"]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPGUARD_")}
    return env | {"STEPGUARD_STATE_DIR": str(tmp_path / "state"), **extra}


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The command failed with the broker's exit code and one clean error line, last (a
    command may have said what it was about to do first: one line of its own, no log)."""
    lines = done.stderr.splitlines()
    assert done.returncode == 3, (done.returncode, done.stderr[-2000:])
    assert 1 <= len(lines) <= 2, done.stderr[-2000:]
    assert lines[-1].startswith("error: ") and "Traceback" not in done.stderr
    assert not any(" WARNING " in line or " ERROR " in line for line in lines), lines
    assert sum(line.startswith("error: ") for line in lines) == 1
    assert done.stdout == ""
    return lines[-1]


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["status", "--json"],
        ["alerts"],
        ["alerts", "--follow"],
        ["topics"],
        ["pending"],
        ["simulate", "--scenario", "ci_smoke"],
    ],
)
def test_no_broker_is_one_line_naming_it_and_how_to_get_one(tmp_path, args):
    port = free_port()  # nothing listens there
    env = _env(tmp_path, STEPGUARD_KAFKA_BOOTSTRAP=f"127.0.0.1:{port}")
    done = subprocess.run([*CMD, *args], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    line = _one_error_line(done)
    assert f"no broker answers at 127.0.0.1:{port}" in line
    assert "STEPGUARD_KAFKA_BOOTSTRAP" in line and "stepguard up" in line


def test_an_unset_bootstrap_says_what_it_is_and_where_up_writes_it(tmp_path):
    done = subprocess.run([*CMD, "alerts"], env=_env(tmp_path), cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    line = _one_error_line(done)
    assert "STEPGUARD_KAFKA_BOOTSTRAP is not set" in line and "host:port" in line
    assert "stepguard up" in line and "up.env" in line


def test_a_stack_that_is_gone_is_named(tmp_path):
    """up.env names a broker that no longer answers: the stack `up` started is gone."""
    port = free_port()
    state = tmp_path / "state"
    state.mkdir()
    (state / "up.env").write_text(f"STEPGUARD_KAFKA_BOOTSTRAP=127.0.0.1:{port}\n")
    env = _env(tmp_path, STEPGUARD_KAFKA_BOOTSTRAP=f"127.0.0.1:{port}")
    done = subprocess.run([*CMD, "status"], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert "is gone: run `stepguard up`" in _one_error_line(done)


def _alert(fp: str) -> Alert:
    now = datetime.now(UTC)
    return Alert(
        fingerprint=fp, seq=0, kind=AlertKind.STRAGGLER, grade=Grade.CRITICAL,
        state=AlertState.FIRING, job_id="job-1", node="node-3", rank=5, step=100,
        started_at=now - timedelta(minutes=1), ts=now,
        evidence=Evidence(metric="compute_s", value=1.3, peer_median=1.0, deviation=9),
        recommended_action=RecommendedAction.ISOLATE, summary="node-3 slow", incident="inc-1",
    )  # fmt: skip


def _publish(settings, *alerts: Alert) -> None:
    producer = control_producer(settings)
    try:
        for a in alerts:
            publish(producer, registry_of(settings), "decisions", a).get(timeout=30)
    finally:
        producer.close()


def _lines(stream) -> tuple[queue.Queue[str], threading.Thread]:
    q: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stream:
            q.put(line.rstrip("\n"))

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    return q, t


def _wait_for(q: queue.Queue[str], needle: str, seen: list[str], timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = q.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        seen.append(line)
        if needle in line:
            return line
    raise AssertionError(f"no line with {needle!r} within {timeout_s} s; saw {seen[-20:]}")


def test_alerts_follow_survives_a_broker_restart_and_ends_on_ctrl_c(tmp_path):
    port = free_port()
    broker = TansuBroker(log_dir=tmp_path / "tansu-1", port=port).start()
    settings = load_settings({}, kafka_bootstrap=broker.bootstrap, broker_flavor="tansu",
                             topic_prefix="restart.")  # fmt: skip
    create_topics(settings, ["decisions"])
    env = _env(tmp_path, STEPGUARD_KAFKA_BOOTSTRAP=broker.bootstrap,
               STEPGUARD_BROKER_FLAVOR="tansu", STEPGUARD_TOPIC_PREFIX="restart.")  # fmt: skip
    proc = subprocess.Popen([*CMD, "alerts", "--follow", "--json"], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    (out, out_pump), (err, err_pump) = _lines(proc.stdout), _lines(proc.stderr)
    seen_out: list[str] = []
    seen_err: list[str] = []
    try:
        _publish(settings, _alert("fp-before-restart"))
        _wait_for(out, "fp-before-restart", seen_out)
        broker.stop()
        lost = _wait_for(err, "broker lost", seen_err)
        assert "reconnecting" in lost
        broker = TansuBroker(log_dir=tmp_path / "tansu-2", port=port).start()
        create_topics(settings, ["decisions"])  # in-memory Tansu: the topics are gone
        _wait_for(err, "reconnected to the broker", seen_err)
        _publish(settings, _alert("fp-after-restart"))
        _wait_for(out, "fp-after-restart", seen_out)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) in (0, 130)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        broker.stop()
    err_pump.join(timeout=30)  # the process is gone: its pipes end
    out_pump.join(timeout=30)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    while not err.empty():
        seen_err.append(err.get())
    text = "\n".join(seen_err)
    assert "Traceback" not in text and "WARNING" not in text and "ERROR" not in text, text
    # one notice when it was lost, one when it was back: no line per retry
    assert sum("broker lost" in line for line in seen_err) == 1, seen_err


@pytest.mark.parametrize("args", [["query", "incidents", "--job", "j"], ["sql", "SELECT 1"]])
def test_no_archive_is_one_line_with_its_own_exit_code(tmp_path, args):
    port = free_port()  # no ClickHouse there
    env = _env(tmp_path, STEPGUARD_CLICKHOUSE_DSN=f"clickhouse://default@127.0.0.1:{port}/default")
    done = subprocess.run([*CMD, *args], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    lines = done.stderr.splitlines()
    assert done.returncode == 4, (done.returncode, done.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: ") and f"127.0.0.1:{port}" in lines[0]


def test_status_follow_says_the_broker_is_lost_and_comes_back_with_it(tmp_path):
    """`status --follow` across a broker stop and restart: a line that says the broker
    is lost (no traceback, no client log lines), the tables again once it is back, and
    Ctrl-C ends it with 0. Rich is told the pipe is an interactive terminal, so every
    refresh is written as it happens."""
    port = free_port()
    broker = TansuBroker(log_dir=tmp_path / "tansu-1", port=port).start()
    settings = load_settings({}, kafka_bootstrap=broker.bootstrap, broker_flavor="tansu",
                             topic_prefix="sfollow.")  # fmt: skip
    create_topics(settings)
    env = _env(tmp_path, STEPGUARD_KAFKA_BOOTSTRAP=broker.bootstrap,
               STEPGUARD_BROKER_FLAVOR="tansu", STEPGUARD_TOPIC_PREFIX="sfollow.",
               TTY_INTERACTIVE="1", TTY_COMPATIBLE="1", COLUMNS="200")  # fmt: skip
    proc = subprocess.Popen([*CMD, "status", "--follow", "--every", "0.5"], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    (out, out_pump), (err, err_pump) = _lines(proc.stdout), _lines(proc.stderr)
    seen: list[str] = []
    try:
        _wait_for(out, "firing incidents", seen)
        broker.stop()
        _wait_for(out, "broker lost", seen)
        broker = TansuBroker(log_dir=tmp_path / "tansu-2", port=port).start()
        create_topics(settings)  # in-memory Tansu: the topics are gone
        _wait_for(out, "firing incidents", seen)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        broker.stop()
    err_pump.join(timeout=30)
    out_pump.join(timeout=30)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    errors = []
    while not err.empty():
        errors.append(err.get())
    text = "\n".join(seen + errors)
    assert "Traceback" not in text and " WARNING " not in text and " ERROR " not in text, text
