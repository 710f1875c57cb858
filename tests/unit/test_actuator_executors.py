"""The executors that need no broker: dry-run, Slurm (fake scontrol), webhook."""

from __future__ import annotations

import json
import os
import stat
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from pipeline.actuator.executors import (
    DryRunExecutor,
    ExecutionError,
    InvalidNodeName,
    SlurmExecutor,
    WebhookExecutor,
    validate_node_name,
)
from pipeline.actuator.signing import check_command, sign
from schemas import (
    ActuatorMode,
    Command,
    CommandKind,
)
from tests.factories import ACTUATOR_KEY

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def command(kind=CommandKind.ISOLATE, targets=("node-3",), **kw) -> Command:
    base = dict(
        command_id="cmd-abc123",
        kind=kind,
        job_id="job-1",
        targets=targets,
        replacements=("spare-0",),
        reason=("fp-1",),
        mode=ActuatorMode.AUTO,
        issued_at=T0,
        expires_at=T0 + timedelta(seconds=300),
        summary="node-3 slow",
    )
    base.update(kw)
    return Command(**base)  # fmt: skip


# -- dry-run -----------------------------------------------------------------------------
def test_dry_run_only_describes():
    detail = DryRunExecutor().execute(command())
    assert detail.startswith("dry-run: would isolate") and "node-3" in detail


# -- Slurm -------------------------------------------------------------------------------
@pytest.fixture
def fake_scontrol(tmp_path, monkeypatch):
    """A ``scontrol`` on PATH that records its argv (one JSON list per line)."""
    log = tmp_path / "argv.jsonl"
    exe = tmp_path / "bin" / "scontrol"
    exe.parent.mkdir()
    exe.write_text(
        "#!/usr/bin/env python3\nimport json, sys\n"
        f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "sys.exit(3 if any('fail' in a for a in sys.argv) else 0)\n"
    )
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ['PATH']}")

    def calls():
        return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []

    return calls


def test_slurm_drains_with_an_argument_list(fake_scontrol):
    slurm = SlurmExecutor()
    assert slurm.execute(command(summary="slow; `reboot` $(id)")) == "drained node-3"
    [argv] = fake_scontrol()
    assert argv[:3] == ["update", "NodeName=node-3", "State=DRAIN"]
    assert argv[3].startswith("Reason=stepguard cmd-abc123: slow_ _reboot_ __id_")
    assert slurm.resume("node-3") == "resumed node-3"
    assert fake_scontrol()[1] == ["update", "NodeName=node-3", "State=RESUME"]


@pytest.mark.parametrize(
    "name", ["node1; rm -rf /", "-rf", "", "a" * 64, "node 1", "n$(id)", "../etc", "nöde"]
)
def test_malicious_or_odd_node_names_run_nothing(fake_scontrol, name):
    with pytest.raises(InvalidNodeName):
        SlurmExecutor().execute(command(targets=("node-1", name)))
    with pytest.raises(InvalidNodeName):
        SlurmExecutor().resume(name)
    assert fake_scontrol() == []  # all or nothing: not even the valid node-1


def test_node_name_rule():
    assert validate_node_name("gpu-a100.rack-3_n017") == "gpu-a100.rack-3_n017"
    assert validate_node_name("a" * 63) == "a" * 63


def test_slurm_failure_is_an_execution_error(fake_scontrol, tmp_path):
    with pytest.raises(ExecutionError, match="exited 3"):
        SlurmExecutor().execute(command(targets=("fail-node",)))
    with pytest.raises(ExecutionError, match="failed"):
        SlurmExecutor(scontrol=str(tmp_path / "missing")).execute(command())


# -- webhook -----------------------------------------------------------------------------
@pytest.fixture
def receiver():
    """A local HTTP server; ``statuses`` are answered in order, then 200."""
    state = {"bodies": [], "statuses": []}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state["bodies"].append(json.loads(body))
            code = state["statuses"].pop(0) if state["statuses"] else 200
            self.send_response(code)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}/hook"
    yield state
    server.shutdown()
    server.server_close()


def test_webhook_posts_an_alertmanager_payload(receiver):
    hook = WebhookExecutor([receiver["url"]], timeout_s=5, retries=0)
    assert hook.execute(command()) == "posted to 1 webhook(s)"
    [body] = receiver["bodies"]
    assert body["version"] == "4" and body["status"] == "firing"
    [a] = body["alerts"]
    assert a["labels"]["alertname"] == "stepguard_isolate" and a["labels"]["nodes"] == "node-3"
    assert a["fingerprint"] == "cmd-abc123" and a["annotations"]["summary"] == "node-3 slow"
    assert a["startsAt"].startswith("2026-11-29T12:00:00") and a["endsAt"] > a["startsAt"]


def test_webhook_retries_server_errors_then_gives_up(receiver):
    sleeps = []
    hook = WebhookExecutor([receiver["url"]], retries=2, sleep=sleeps.append)
    receiver["statuses"] += [500, 503]
    hook.execute(command())
    assert len(receiver["bodies"]) == 3 and sleeps == [0.2, 0.4]
    receiver["statuses"] += [500, 500, 500]
    with pytest.raises(ExecutionError, match="HTTP 500"):
        hook.execute(command())
    receiver["statuses"] += [400]
    with pytest.raises(ExecutionError, match="HTTP 400"):  # a 4xx is not retried
        hook.execute(command())
    assert len(receiver["bodies"]) == 7


def test_webhook_unreachable_fails_and_urls_are_checked():
    with pytest.raises(ExecutionError):
        WebhookExecutor(["http://127.0.0.1:9/x"], timeout_s=1, retries=0).execute(command())
    with pytest.raises(ValueError, match="http"):
        WebhookExecutor(["file:///etc/passwd"])


def test_webhook_posts_a_held_action_as_waiting_for_approval(receiver):
    from pipeline.policy import Policy, PolicyParams
    from schemas import Alert, AlertKind, AlertState, Evidence, Grade, RecommendedAction

    fired = Alert(
        fingerprint="fp-node3-0001", seq=0, kind=AlertKind.HARDWARE, grade=Grade.CRITICAL,
        state=AlertState.FIRING, job_id="job-1", node="node-3", rank=5, step=100,
        started_at=T0, ts=T0 + timedelta(seconds=90),
        evidence=Evidence(metric="ecc_uncorrected", value=1, deviation=1),
        recommended_action=RecommendedAction.ISOLATE,
    )  # fmt: skip
    policy = Policy(PolicyParams(mode=ActuatorMode.APPROVE, spare_nodes=("spare-0",)))
    out = policy.on_alert(fired, T0 + timedelta(seconds=95))
    [held], [notice] = out.records, out.commands
    signed = sign(notice, ACTUATOR_KEY)
    assert (
        check_command(signed, ACTUATOR_KEY.verifier(), T0 + timedelta(seconds=95)) is None
    )  # executors take it
    WebhookExecutor([receiver["url"]], retries=0).execute(signed)
    [a] = receiver["bodies"][0]["alerts"]
    summary = a["annotations"]["summary"]
    assert summary.startswith(f"waiting for approval: {held.action_id}")
    assert "hardware critical on node node-3 rank 5, firing for 90s" in summary
    assert f"stepguard approve {held.action_id}" in summary
    assert a["labels"]["nodes"] == "node-3" and a["endsAt"] > a["startsAt"]


@pytest.fixture
def bad_status_receiver():
    """A receiver that answers every request with a malformed HTTP status line."""
    import socket

    server = socket.create_server(("127.0.0.1", 31510))
    server.settimeout(10)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"garbage\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield "http://127.0.0.1:31510/hook"
    stop.set()
    server.close()
    thread.join(timeout=10)


def test_a_malformed_status_line_is_a_failed_post_not_an_exception(bad_status_receiver):
    """Issue 22 item 10: http.client.BadStatusLine escaped the webhook executor and
    killed `stepguard executor webhook` on every restart."""
    hook = WebhookExecutor([bad_status_receiver], timeout_s=5, retries=1, sleep=lambda s: None)
    with pytest.raises(ExecutionError, match="BadStatusLine"):
        hook.execute(command())
