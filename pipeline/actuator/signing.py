"""HMAC-SHA256 signatures for commands, approvals and control messages.

The signed bytes are the canonical JSON of the model without its ``key_id`` and
``signature`` fields (keys sorted, no whitespace, the JSON-mode dump pydantic sends on
the wire), so a message signs the same before and after a trip through the broker.
A version-1 ``Approval`` is checked against the bytes it was signed as, with the
action id under its version-1 name ``command_id``.
The first key of ``Settings.signing_keys`` signs; every key verifies (rotation).

Examples
--------
>>> from datetime import UTC, datetime, timedelta
>>> from schemas import ActuatorMode, Command, CommandKind
>>> t = datetime(2026, 1, 1, tzinfo=UTC)
>>> cmd = Command(command_id="cmd-1", kind=CommandKind.CHECKPOINT, job_id="j", reason=(),
...               mode=ActuatorMode.AUTO, issued_at=t, expires_at=t + timedelta(seconds=60))
>>> keys = [("k1", b"0123456789abcdef")]
>>> signed = sign(cmd, keys)
>>> signed.key_id, check_command(signed, keys, now=t)
('k1', None)
>>> check_command(signed, keys, now=t + timedelta(seconds=61))
'expired at 2026-01-01T00:01:00+00:00'
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence
from datetime import datetime
from typing import TypeVar

from pipeline.errors import ConfigError
from schemas import ActuatorMode, Approval, Command, ControlMessage

__all__ = ["Keys", "canonical", "check_command", "sign", "signature_problem"]

Keys = Sequence[tuple[str, bytes]]
Signed = TypeVar("Signed", Command, Approval, ControlMessage)
_UNSIGNED = {"key_id", "signature"}


def canonical(message: Command | Approval | ControlMessage) -> bytes:
    """The bytes that are signed: sorted compact JSON without the signature fields."""
    data = message.model_dump(mode="json", exclude=_UNSIGNED)
    if isinstance(message, Approval) and message.schema_version == 1:
        data["command_id"] = data.pop("action_id")
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _mac(secret: bytes, message: Command | Approval | ControlMessage) -> str:
    return hmac.new(secret, canonical(message), hashlib.sha256).hexdigest()


def sign(message: Signed, keys: Keys) -> Signed:
    """A copy of ``message`` signed with the first key."""
    if not keys:
        raise ConfigError("STEPGUARD_COMMAND_KEYS is not set: cannot sign")
    key_id, secret = keys[0]
    return message.model_copy(update={"key_id": key_id, "signature": _mac(secret, message)})


def signature_problem(message: Command | Approval | ControlMessage, keys: Keys) -> str | None:
    """Why the signature is not acceptable, or ``None`` when a known key made it."""
    if message.signature is None or message.key_id is None:
        return "unsigned"
    secret = dict(keys).get(message.key_id)
    if secret is None:
        return f"unknown key id {message.key_id!r}"
    if not hmac.compare_digest(_mac(secret, message), message.signature):
        return "bad signature"
    return None


def check_command(command: Command, keys: Keys, now: datetime) -> str | None:
    """Why an executor must refuse ``command`` (signature, expiry, mode), or ``None``."""
    problem = signature_problem(command, keys)
    if problem is not None:
        return problem
    if command.expires_at is None:
        return "no expiry"
    if now >= command.expires_at:
        return f"expired at {command.expires_at.isoformat()}"
    if command.mode is ActuatorMode.OBSERVE:
        return "observe-mode commands are never executed"
    return None
