"""Ed25519 signing: sign/verify, rotation, role separation, malformed input, key settings."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from typer.testing import CliRunner

from pipeline.io.errors import ConfigError
from pipeline.io.settings import ROLES, load_settings
from pipeline.io.trust import (
    SigningKey,
    canonical,
    check_command,
    ephemeral_keys,
    public_keys,
    sign,
    signature_problem,
    signing_key,
)
from schemas import (
    ActuatorMode,
    Approval,
    ApprovalDecision,
    Command,
    CommandKind,
    ControlMessage,
    Rejected,
    decode,
    encode,
)
from tests.clock import day_start
from tests.factories import ACTUATOR_KEY, OPERATOR_KEY, WORKER_KEY, key_settings, samples, test_key

T0 = day_start(hour=12)
NEW, OLD = test_key("k2"), test_key("k1")
BOTH = NEW.verifier() | OLD.verifier()


def command(**kw) -> Command:
    base = dict(
        command_id="cmd-abc123", kind=CommandKind.ISOLATE, job_id="job-1", targets=("node-3",),
        replacements=("spare-0",), reason=("fp-1",), mode=ActuatorMode.AUTO, issued_at=T0,
        expires_at=T0 + timedelta(seconds=300), summary="node-3 slow",
    )  # fmt: skip
    return Command(**(base | kw))


def test_signature_survives_the_wire_and_every_listed_key_verifies():
    signed = sign(command(), NEW)
    assert signed.key_id == "k2" and len(signed.signature) == 128
    back = decode(Command, encode(signed))
    assert check_command(back, BOTH, T0) is None
    assert check_command(back, NEW.verifier(), T0) is None
    old = sign(command(), OLD)  # signed before the rotation: verifies while listed
    assert check_command(old, BOTH, T0) is None
    assert signature_problem(old, NEW.verifier()) == "unknown key id 'k1'"


def test_forged_tampered_unsigned_and_expired_commands_are_refused():
    signed = sign(command(), NEW)
    assert check_command(command(), BOTH, T0) == "unsigned"
    forged = sign(command(), SigningKey("k2", test_key("attacker").private))
    assert check_command(forged, BOTH, T0) == "bad signature"
    tampered = signed.model_copy(update={"targets": ("node-4",)})
    assert check_command(tampered, BOTH, T0) == "bad signature"
    assert check_command(signed, BOTH, T0 + timedelta(seconds=300)).startswith("expired")
    assert check_command(sign(command(expires_at=None), NEW), BOTH, T0) == "no expiry"
    observed = sign(command(mode=ActuatorMode.OBSERVE), NEW)
    assert "observe" in check_command(observed, BOTH, T0)


def test_a_role_cannot_sign_for_another():
    """A worker's key verifies alerts, never commands; an actuator's never approvals."""
    actuator_keys = ACTUATOR_KEY.verifier()
    assert check_command(sign(command(), WORKER_KEY), actuator_keys, T0) == (
        "unknown key id 'wrk-1'"
    )
    approval = Approval(action_id="act-1234", decision=ApprovalDecision.APPROVE, by="s", ts=T0)
    assert signature_problem(sign(approval, ACTUATOR_KEY), OPERATOR_KEY.verifier()) == (
        "unknown key id 'act-1'"
    )
    alert = samples()["decisions"]
    assert signature_problem(sign(alert, WORKER_KEY), WORKER_KEY.verifier()) is None
    assert signature_problem(alert, WORKER_KEY.verifier()) == "unsigned"


def test_approvals_control_messages_and_alerts_sign_too():
    a = sign(Approval(action_id="act-1234", decision=ApprovalDecision.APPROVE, by="s", ts=T0),
             OPERATOR_KEY)  # fmt: skip
    c = sign(ControlMessage(change_id="c1", mode=ActuatorMode.AUTO, by="s", ts=T0), OPERATOR_KEY)
    ops = OPERATOR_KEY.verifier()
    assert signature_problem(a, ops) is None and signature_problem(c, ops) is None
    assert b"signature" not in canonical(a) and b'"mode":"auto"' in canonical(c)
    upgraded = c.model_copy(update={"guard_max_isolations": 100})
    assert signature_problem(upgraded, ops) == "bad signature"


def test_an_approval_of_version_1_verifies_over_its_version_1_bytes():
    fields = {"schema_version": 1, "command_id": "act-1234", "decision": "approve",
              "by": "sre", "reason": "", "ts": "2026-11-29T12:00:00Z"}  # fmt: skip
    signed_bytes = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    sig = OPERATOR_KEY.private.sign(signed_bytes).hex()
    old = decode(Approval, json.dumps(fields | {"key_id": "op-1", "signature": sig}).encode())
    assert isinstance(old, Approval) and old.action_id == "act-1234"
    ops = OPERATOR_KEY.verifier()
    assert canonical(old) == signed_bytes and signature_problem(old, ops) is None
    assert signature_problem(old.model_copy(update={"schema_version": 2}), ops) == ("bad signature")


@pytest.mark.parametrize(
    ("key_id", "signature", "problem"),
    [
        ("k2", "é" * 128, "malformed signature"),  # non-ASCII: hmac.compare_digest raised
        ("k2", "ab" * 32, "malformed signature"),  # an old HMAC-SHA256 signature
        ("k2", "AB" * 64, "malformed signature"),
        ("k2", "zz" * 64, "malformed signature"),
        ("k2", "ab" * 64 + "\n", "malformed signature"),
        ("k2", 12345, "malformed signature"),
        ("k2", "", "malformed signature"),
        ("ключ", "ab" * 64, "malformed key id"),
        ("k" * 65, "ab" * 64, "malformed key id"),
        ("k9", "ab" * 64, "unknown key id 'k9'"),
        ("k2", "ab" * 64, "bad signature"),
    ],
)
def test_malformed_signatures_are_a_reason_never_an_exception(key_id, signature, problem):
    # model_construct skips validation: what a verifier must survive even past the schema
    cmd = command().model_construct(**(command().__dict__ | {"key_id": key_id,
                                                             "signature": signature}))  # fmt: skip
    assert signature_problem(cmd, BOTH) == problem
    assert check_command(cmd, BOTH, T0) == problem


@pytest.mark.parametrize("signature", ["é" * 128, "ab" * 32, "AB" * 64, "ab" * 64 + "x"])
def test_the_schema_refuses_a_malformed_signature_as_a_dead_letter(signature):
    wire = json.loads(encode(sign(command(), NEW)))
    out = decode(Command, json.dumps(wire | {"signature": signature}).encode(), topic="c")
    assert isinstance(out, Rejected) and "signature" in out.error
    bad_id = decode(Command, json.dumps(wire | {"key_id": "a b"}).encode(), topic="c")
    assert isinstance(bad_id, Rejected)


def test_a_command_is_refused_for_a_target_outside_its_jobs_known_nodes():
    inside = sign(command(job_nodes=("node-1", "node-3")), NEW)
    assert check_command(inside, BOTH, T0) is None
    outside = sign(command(targets=("prod-node-7",), job_nodes=("node-1", "node-3")), NEW)
    assert check_command(outside, BOTH, T0) == "targets ['prod-node-7'] are not nodes of job job-1"
    # the hint is signed: adding, changing or stripping it breaks the signature
    assert check_command(inside.model_copy(update={"job_nodes": ("prod-node-7",)}), BOTH, T0)
    assert check_command(inside.model_copy(update={"job_nodes": None}), BOTH, T0)
    # unknown node set: no hint, no check
    assert check_command(sign(command(targets=("x",)), NEW), BOTH, T0) is None


def test_a_signature_made_before_job_nodes_existed_still_verifies():
    import json as _json

    signed = sign(command(), NEW)
    wire = _json.loads(encode(signed))
    wire.pop("job_nodes", None)  # what an older actuator sent
    back = decode(Command, _json.dumps(wire).encode())
    assert check_command(back, BOTH, T0) is None


def test_the_grade_is_signed_when_set_and_older_signatures_still_verify():
    from schemas import ActionRecord, ActionState, Grade

    graded = sign(command(grade=Grade.WARNING), NEW)
    assert check_command(graded, BOTH, T0) is None
    forged = graded.model_copy(update={"grade": Grade.INFO})
    assert check_command(forged, BOTH, T0) == "bad signature"
    # signed before the field existed: neither the command nor the commands an action
    # record carries had a "grade" key in their signed bytes
    assert b'"grade"' not in canonical(command())
    record = ActionRecord(action_id="act-0001", state=ActionState.HELD, job_id="job-1",
                          mode=ActuatorMode.APPROVE, commands=(command(),), reason=("fp-1",),
                          ts=T0)  # fmt: skip
    assert b'"grade"' not in canonical(record) and b'"job_nodes":null' in canonical(record)


# -- keys in settings ------------------------------------------------------------------------
def test_keys_load_from_settings_by_role():
    s = load_settings({}, **key_settings())
    for role in ROLES:
        key = signing_key(s, role, "a test")
        assert set(public_keys(s, role, "a test")) == {key.key_id}
    rotated = load_settings({}, actuator_public_keys=f"{NEW.public_text()},{OLD.public_text()}")
    assert set(public_keys(rotated, "actuator")) == {"k2", "k1"}


def test_missing_and_malformed_keys_name_their_variable():
    empty = load_settings({})
    with pytest.raises(ConfigError, match="STEPGUARD_ACTUATOR_PRIVATE_KEY is required by x"):
        signing_key(empty, "actuator", "x")
    with pytest.raises(ConfigError, match="STEPGUARD_WORKER_PUBLIC_KEYS is required by y"):
        public_keys(empty, "worker", "y")
    assert public_keys(empty, "operator") == {}
    secret = "k1:not-a-key-but-a-secret-0123456789"
    with pytest.raises(ConfigError, match="STEPGUARD_OPERATOR_PRIVATE_KEY") as exc:
        load_settings({"STEPGUARD_OPERATOR_PRIVATE_KEY": secret})
    assert "not-a-key" not in str(exc.value)  # a malformed secret is not echoed
    with pytest.raises(ConfigError, match="STEPGUARD_WORKER_PUBLIC_KEYS"):
        load_settings({"STEPGUARD_WORKER_PUBLIC_KEYS": "wrk 1:" + "A" * 43 + "="})
    two = f"{NEW.private_text()},{OLD.private_text()}"
    with pytest.raises(ConfigError, match="STEPGUARD_ACTUATOR_PRIVATE_KEY"):
        load_settings({"STEPGUARD_ACTUATOR_PRIVATE_KEY": two})


def test_ephemeral_keys_fill_only_the_roles_without_a_key():
    s = load_settings({}, **key_settings(("operator",)))
    s = s.model_copy(update=ephemeral_keys(s, "demo-1", ROLES))
    assert signing_key(s, "operator", "t").key_id == "op-1"
    assert signing_key(s, "worker", "t").key_id == "demo-1-worker"
    cmd = sign(command(), signing_key(s, "actuator", "t"))
    assert check_command(cmd, public_keys(s, "actuator"), T0) is None


def test_keys_generate_prints_a_pair_that_loads_and_verifies():
    from pipeline.cli.app import app

    res = CliRunner().invoke(app, ["keys", "generate", "--role", "worker", "--key-id", "w-7"])
    assert res.exit_code == 0, res.output
    env = dict(line.split("=", 1) for line in res.output.splitlines())
    assert set(env) == {"STEPGUARD_WORKER_PRIVATE_KEY", "STEPGUARD_WORKER_PUBLIC_KEYS"}
    s = load_settings(env)
    alert = sign(samples()["decisions"], signing_key(s, "worker", "t"))
    assert alert.key_id == "w-7"
    assert signature_problem(alert, public_keys(s, "worker")) is None
    bad = CliRunner().invoke(app, ["keys", "generate", "--key-id", "a b"])
    assert bad.exit_code != 0
