"""Signing and the executors that need no broker: dry-run, Slurm (fake scontrol), webhook."""

from __future__ import annotations

import hashlib
import hmac
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
from pipeline.actuator.signing import canonical, check_command, sign, signature_problem
from pipeline.errors import ConfigError
from schemas import (
    ActuatorMode,
    Approval,
    ApprovalDecision,
    Command,
    CommandKind,
    ControlMessage,
    decode,
    encode,
)

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
KEYS = [("k2", b"new-secret-0123456789"), ("k1", b"old-secret-0123456789")]


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


# -- signing -------------------------------------------------------------------------------
def test_signature_survives_the_wire_and_any_configured_key_verifies():
    signed = sign(command(), KEYS)
    assert signed.key_id == "k2" and len(signed.signature) == 64
    back = decode(Command, encode(signed))
    assert check_command(back, KEYS, T0) is None
    assert check_command(back, KEYS[:1], T0) is None
    old = sign(command(), KEYS[1:])  # signed before the rotation: still verifies
    assert check_command(old, KEYS, T0) is None
    assert signature_problem(old, KEYS[:1]) == "unknown key id 'k1'"


def test_forged_tampered_unsigned_and_expired_commands_are_refused():
    signed = sign(command(), KEYS)
    assert check_command(command(), KEYS, T0) == "unsigned"
    forged = sign(command(), [("k2", b"attacker-secret-0000")])
    assert check_command(forged, KEYS, T0) == "bad signature"
    tampered = signed.model_copy(update={"targets": ("node-4",)})
    assert check_command(tampered, KEYS, T0) == "bad signature"
    assert check_command(signed, KEYS, T0 + timedelta(seconds=300)).startswith("expired")
    no_expiry = sign(command(expires_at=None), KEYS)
    assert check_command(no_expiry, KEYS, T0) == "no expiry"
    observed = sign(command(mode=ActuatorMode.OBSERVE), KEYS)
    assert "observe" in check_command(observed, KEYS, T0)


def test_approvals_and_control_messages_sign_too():
    a = sign(Approval(action_id="act-1234", decision=ApprovalDecision.APPROVE, by="s", ts=T0), KEYS)
    c = sign(ControlMessage(change_id="c1", mode=ActuatorMode.AUTO, by="s", ts=T0), KEYS)
    assert signature_problem(a, KEYS) is None and signature_problem(c, KEYS) is None
    assert b"signature" not in canonical(a) and b'"mode":"auto"' in canonical(c)
    upgraded = c.model_copy(update={"guard_max_isolations": 100})
    assert signature_problem(upgraded, KEYS) == "bad signature"
    with pytest.raises(ConfigError, match="COMMAND_KEYS"):
        sign(c, [])


def test_an_approval_signed_as_version_1_still_verifies():
    # what `stepguard approve` sent before version 2: the MAC over the sorted compact
    # JSON of the version-1 fields, the action id named command_id
    fields = {"schema_version": 1, "command_id": "act-1234", "decision": "approve",
              "by": "sre", "reason": "", "ts": "2026-11-29T12:00:00Z"}  # fmt: skip
    signed_bytes = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    key_id, secret = KEYS[0]
    mac = hmac.new(secret, signed_bytes, hashlib.sha256).hexdigest()
    wire = json.dumps(fields | {"key_id": key_id, "signature": mac}).encode()
    old = decode(Approval, wire)
    assert isinstance(old, Approval) and old.action_id == "act-1234"
    assert canonical(old) == signed_bytes
    assert signature_problem(old, KEYS) is None
    assert signature_problem(old.model_copy(update={"action_id": "act-9999"}), KEYS) == (
        "bad signature"
    )
    # the same fields as version 2 are other bytes: a v1 signature does not carry over
    assert signature_problem(old.model_copy(update={"schema_version": 2}), KEYS) == (
        "bad signature"
    )


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
    from pipeline.actuator.policy import Policy, PolicyParams
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
    signed = sign(notice, KEYS)
    assert check_command(signed, KEYS, T0 + timedelta(seconds=95)) is None  # executors take it
    WebhookExecutor([receiver["url"]], retries=0).execute(signed)
    [a] = receiver["bodies"][0]["alerts"]
    summary = a["annotations"]["summary"]
    assert summary.startswith(f"waiting for approval: {held.action_id}")
    assert "hardware critical on node node-3 rank 5, firing for 90s" in summary
    assert f"stepguard approve {held.action_id}" in summary
    assert a["labels"]["nodes"] == "node-3" and a["endsAt"] > a["startsAt"]
