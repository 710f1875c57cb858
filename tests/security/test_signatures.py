"""Threats against whatever verifies a signature: one malformed message that crashes
every verifier, and a key that verifies being the key that signs.

Control: Ed25519 per writer (:mod:`pipeline.io.trust`); the signature is a
fixed-format schema field, so a malformed one does not decode (a dead letter) and a
verifier handed one anyway gets a reason, never an exception; every service holds
only the private key of its own role and public keys of the others.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from pipeline.io.errors import ConfigError
from pipeline.io.settings import ROLES, load_settings
from pipeline.io.trust import (
    SigningKey,
    check_command,
    public_keys,
    sign,
    signature_problem,
    signing_key,
)
from pipeline.tools.up import signing_env
from schemas import Rejected, decode, encode
from tests.factories import ROLE_KEYS, samples

#: each signed kind of message, the topic it travels on and the role that signs it
SIGNED = {"commands": "actuator", "decisions": "worker", "approvals": "operator",
          "control": "operator", "actions": "actuator", "results": "executor"}  # fmt: skip
GARBAGE = {"non-ascii": "é" * 128, "short": "ab" * 32, "upper-case": "AB" * 64,
           "nul": "\x00" * 128, "number": 12345, "list": ["ab"] * 64}  # fmt: skip


@pytest.mark.parametrize("topic", sorted(SIGNED))
@pytest.mark.parametrize("garbage", GARBAGE.values(), ids=list(GARBAGE))
def test_a_malformed_signature_is_a_dead_letter_or_a_reason_never_an_exception(topic, garbage):
    """Threat: a non-ASCII signature made ``hmac.compare_digest`` raise; executors
    crash-looped on it, the actuator could not finish its rebuild, the listener died."""
    message = samples()[topic]
    key = ROLE_KEYS[SIGNED[topic]]
    wire = json.loads(encode(sign(message, key))) | {"signature": garbage}
    out = decode(type(message), json.dumps(wire).encode(), topic=topic, offset=7)
    assert isinstance(out, Rejected) and "signature" in out.error
    assert out.letter.offset == 7  # the dead letter names where it came from
    # past the schema (a model built without validation): a reason, not an exception
    built = type(message).model_construct(
        **(message.__dict__ | {"key_id": key.key_id, "signature": garbage})
    )
    assert signature_problem(built, key.verifier()) == "malformed signature"
    if topic == "commands":
        now = message.issued_at + timedelta(seconds=1)
        assert check_command(built, key.verifier(), now) == "malformed signature"


def test_no_service_holds_a_key_that_signs_for_another_role():
    """Threat: executors and the listener needed the HMAC key that signs commands, so
    whoever ran one could sign commands, approvals and control messages."""
    settings = load_settings({}, operator_public_keys=ROLE_KEYS["operator"].public_text())
    by_kind, _ = signing_env(settings, "sec")
    for kind, env in by_kind.items():
        private = {k for k in env if k.endswith("_PRIVATE_KEY")}
        assert len(private) <= 1, (kind, private)
        if kind != "actuator":
            assert "STEPGUARD_ACTUATOR_PRIVATE_KEY" not in private, kind
    executor = load_settings(by_kind["executor"])
    with pytest.raises(ConfigError, match="STEPGUARD_ACTUATOR_PRIVATE_KEY"):
        signing_key(executor, "actuator", "an executor trying to sign a command")
    commands = public_keys(executor, "actuator")
    command = samples()["commands"]
    now = command.issued_at + timedelta(seconds=1)
    # whatever private key another service holds, its command is refused
    for role in ROLES:
        if role == "actuator":
            continue
        # the worker's and executors' keys as up hands them out; an operator's own
        key = (
            signing_key(load_settings(by_kind[role]), role, "t")
            if role in by_kind
            else (ROLE_KEYS[role])
        )
        forged = sign(command, key)
        assert check_command(forged, commands, now) is not None, role
        impostor = sign(command, SigningKey(next(iter(commands)), key.private))
        assert check_command(impostor, commands, now) == "bad signature", role
    assert (
        check_command(
            sign(command, signing_key(load_settings(by_kind["actuator"]), "actuator", "t")),
            commands,
            now,
        )
        is None
    )
