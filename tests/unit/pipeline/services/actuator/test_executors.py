"""The executors that need no broker: dry-run, webhook (Slurm: test_actuator_slurm.py)."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from pipeline.io.trust import check_command, sign
from pipeline.services.actuator.executors import (
    DryRunExecutor,
    ExecutionError,
    WebhookExecutor,
)
from schemas import (
    ActuatorMode,
    Command,
    CommandKind,
)
from tests.clock import day_start
from tests.factories import ACTUATOR_KEY

T0 = day_start(hour=12)


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
            reply = state.pop("reply", b"")
            self.send_response(code)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

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
    assert a["labels"]["alertname"] == "stepguard_isolate" and a["labels"]["node"] == "node-3"
    assert a["labels"]["job"] == "job-1" and "job_id" not in a["labels"]
    assert a["labels"]["severity"] == "critical"  # no grade (an older actuator): critical
    assert a["fingerprint"] == "cmd-abc123/node-3" and a["annotations"]["summary"] == "node-3 slow"
    assert a["startsAt"].startswith(f"{T0:%Y-%m-%dT%H:%M:%S}") and a["status"] == "firing"
    assert a["endsAt"] == "0001-01-01T00:00:00Z"  # no end while firing


def test_webhook_severity_is_the_alerts_grade_and_one_alert_per_node(receiver):
    from schemas import Grade

    hook = WebhookExecutor([receiver["url"]], retries=0)
    hook.execute(command(grade=Grade.WARNING, targets=("node-3", "node-4")))
    hook.execute(command(kind=CommandKind.NOTIFY, grade=Grade.CRITICAL, targets=()))
    first, second = receiver["bodies"]
    assert [(a["labels"]["node"], a["labels"]["severity"]) for a in first["alerts"]] == [
        ("node-3", "warning"), ("node-4", "warning"),
    ]  # fmt: skip
    [notify] = second["alerts"]
    assert notify["labels"]["severity"] == "critical" and "node" not in notify["labels"]


def test_webhook_sends_the_resolved_message_once_the_command_expired(receiver):
    hook = WebhookExecutor([receiver["url"]], retries=0)
    hook.execute(command())
    hook.tick(T0 + timedelta(seconds=299))
    assert len(receiver["bodies"]) == 1
    hook.tick(T0 + timedelta(seconds=300))
    hook.tick(T0 + timedelta(seconds=900))  # once
    assert len(receiver["bodies"]) == 2
    resolved = receiver["bodies"][1]
    [a] = resolved["alerts"]
    assert resolved["status"] == "resolved" and a["status"] == "resolved"
    assert a["endsAt"] == (T0 + timedelta(seconds=300)).isoformat()
    assert a["labels"] == receiver["bodies"][0]["alerts"][0]["labels"]
    assert hook.open == {}


def test_webhook_keeps_the_receivers_reason_on_a_refusal(receiver):
    receiver["statuses"].append(400)
    receiver["reply"] = b"json: cannot unmarshal object into Go value of type models.PostableAlerts"
    with pytest.raises(ExecutionError, match="HTTP 400: json: cannot unmarshal object"):
        WebhookExecutor([receiver["url"]], retries=0).execute(command())


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
    assert a["labels"]["node"] == "node-3" and a["labels"]["severity"] == "critical"


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
