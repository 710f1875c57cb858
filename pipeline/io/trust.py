"""Ed25519 signatures: who wrote a command, an alert, an approval, a control message, an
action record or a command result.

Each kind of writer has its own key pair (:data:`~pipeline.io.settings.ROLES`): the actuator
signs commands, action records and its guardrail alerts, workers sign alerts,
operators sign approvals and control messages, executors sign their command results,
and a job controller (the training job's listener) signs the results of its own job's
commands. Whoever only verifies holds public keys only, so an executor or a training
process that can check a command cannot forge one; a training process never holds the
executor's key.

A job controller's key is bound to one job by its key id
(:func:`job_controller_key_id`: ``jc-`` and a hash of the job id, optionally
``.suffix`` for rotation), so :func:`result_problem` refuses a result of one job signed
by another job's controller.

The signed bytes are the canonical JSON of the model without its ``key_id`` and
``signature`` fields (keys sorted, no whitespace, the JSON-mode dump pydantic sends on
the wire), so a message signs the same before and after a trip through the broker.
A version-1 ``Approval`` is checked against the bytes it was signed as, with the
action id under its version-1 name ``command_id``.

Keys travel as ``key_id:base64`` (32 raw bytes): ``STEPGUARD_<ROLE>_PRIVATE_KEY`` signs,
every key of ``STEPGUARD_<ROLE>_PUBLIC_KEYS`` verifies (rotation: list the new and the
old key until nothing signed with the old one is in flight).

:func:`signature_problem` never raises: whatever a topic carries in ``key_id`` and
``signature`` (non-ASCII, the wrong length, a model built without validation) is a
reason to refuse, not an exception that stops a verifier.

Examples
--------
>>> from datetime import UTC, datetime, timedelta
>>> from schemas import ActuatorMode, Command, CommandKind
>>> t = datetime(2026, 1, 1, tzinfo=UTC)
>>> cmd = Command(command_id="cmd-1", kind=CommandKind.CHECKPOINT, job_id="j", reason=(),
...               mode=ActuatorMode.AUTO, issued_at=t, expires_at=t + timedelta(seconds=60))
>>> key = SigningKey.generate("k1")
>>> signed = sign(cmd, key)
>>> signed.key_id, len(signed.signature), check_command(signed, key.verifier(), now=t)
('k1', 128, None)
>>> check_command(signed, key.verifier(), now=t + timedelta(seconds=61))
'expired at 2026-01-01T00:01:00+00:00'
>>> check_command(signed.model_copy(update={"signature": "é" * 128}), key.verifier(), t)
'malformed signature'
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from pipeline.io.errors import ConfigError
from pipeline.io.settings import KeySettings, Role
from schemas import (
    Acknowledgement,
    ActionRecord,
    ActuatorMode,
    Alert,
    Approval,
    Command,
    CommandResult,
    ControlMessage,
)

__all__ = [
    "FinishedCommands",
    "PublicKeys",
    "SigningKey",
    "canonical",
    "check_command",
    "job_controller_key_id",
    "result_problem",
    "ephemeral_keys",
    "public_keys",
    "sign",
    "signature_problem",
    "signing_key",
]

Signable = (
    Command | Approval | ControlMessage | Alert | ActionRecord | CommandResult | Acknowledgement
)
Signed = TypeVar(
    "Signed", Command, Approval, ControlMessage, Alert, ActionRecord, CommandResult, Acknowledgement
)
#: key id -> public key: what a verifier holds
PublicKeys = Mapping[str, Ed25519PublicKey]
_UNSIGNED = {"key_id", "signature"}
#: optional fields added after signing began: signed only when set, so a signature made
#: before they existed still verifies
_SIGNED_WHEN_SET = (
    "job_nodes", "detector_settings", "cause", "incident", "grade", "node_in_steps", "held_at",
)  # fmt: skip
#: the same for the commands an action record carries (``job_nodes`` was signed there
#: as null before, so only fields added since)
_NESTED_SIGNED_WHEN_SET = ("cause", "incident", "grade")
_SIGNATURE = re.compile(r"[0-9a-f]{128}")  # schemas._base.SIGNATURE_PATTERN
_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")  # schemas._base.KEY_ID_PATTERN


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


@dataclass(frozen=True)
class SigningKey:
    """A private key and its id: what a role signs with."""

    key_id: str
    private: Ed25519PrivateKey

    @classmethod
    def generate(cls, key_id: str) -> SigningKey:
        if not _KEY_ID.fullmatch(key_id):
            raise ValueError(f"key_id must be 1-64 characters A-Z a-z 0-9 . _ -: {key_id!r}")
        return cls(key_id, Ed25519PrivateKey.generate())

    @property
    def public(self) -> Ed25519PublicKey:
        return self.private.public_key()

    def verifier(self) -> dict[str, Ed25519PublicKey]:
        """The public keys that verify this key's signatures (its own)."""
        return {self.key_id: self.public}

    def private_text(self) -> str:
        """``key_id:base64`` of the private key (a secret)."""
        raw = self.private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        return f"{self.key_id}:{_b64(raw)}"

    def public_text(self) -> str:
        """``key_id:base64`` of the public key."""
        return f"{self.key_id}:{_b64(self.public.public_bytes(Encoding.Raw, PublicFormat.Raw))}"


def _variable(role: Role, kind: str) -> str:
    return f"STEPGUARD_{role.upper()}_{kind}"


def signing_key(settings: KeySettings, role: Role, needed_by: str) -> SigningKey:
    """The key ``role`` signs with; :class:`ConfigError` naming the variable if unset."""
    pair = settings.private_key(role)
    if pair is None:
        raise ConfigError(
            f"{_variable(role, 'PRIVATE_KEY')} is required by {needed_by} "
            "(`stepguard keys generate --role " + role + "` makes one)"
        )
    return SigningKey(pair[0], Ed25519PrivateKey.from_private_bytes(pair[1]))


def public_keys(
    settings: KeySettings, role: Role, needed_by: str | None = None
) -> dict[str, Ed25519PublicKey]:
    """The keys that verify what ``role`` signed. With ``needed_by``, none configured is
    a :class:`ConfigError` naming the variable; a role's own private key always counts."""
    keys: dict[str, Ed25519PublicKey] = {}
    for key_id, raw in settings.public_keys(role):
        try:
            keys[key_id] = Ed25519PublicKey.from_public_bytes(raw)
        except ValueError as exc:
            raise ConfigError(
                f"{_variable(role, 'PUBLIC_KEYS')}: key {key_id!r} is not an Ed25519 public key"
            ) from exc
    own = settings.private_key(role)
    if own is not None:
        keys.setdefault(own[0], Ed25519PrivateKey.from_private_bytes(own[1]).public_key())
    if not keys and needed_by is not None:
        raise ConfigError(f"{_variable(role, 'PUBLIC_KEYS')} is required by {needed_by}")
    return keys


def ephemeral_keys(settings: KeySettings, key_id: str, roles: Sequence[Role]) -> dict[str, Any]:
    """Settings updates that give each of ``roles`` without a private key a fresh key
    pair (the demo: nothing to configure, nothing that outlives the run)."""
    from pydantic import SecretStr

    update: dict[str, Any] = {}
    for role in roles:
        if settings.private_key(role) is not None:
            continue
        key = SigningKey.generate(f"{key_id}-{role}")
        update[f"{role}_private_key"] = SecretStr(key.private_text())
        old = getattr(settings, f"{role}_public_keys")
        update[f"{role}_public_keys"] = ",".join(x for x in (key.public_text(), old) if x)
    return update


def canonical(message: Signable) -> bytes:
    """The bytes that are signed: sorted compact JSON without the signature fields."""
    data = message.model_dump(mode="json", exclude=_UNSIGNED)
    for name in _SIGNED_WHEN_SET:
        if name in data and data[name] is None:
            del data[name]
    if isinstance(message, ActionRecord):
        for cmd in data.get("commands", ()):
            for name in _NESTED_SIGNED_WHEN_SET:
                if name in cmd and cmd[name] is None:
                    del cmd[name]
        alert = data.get("alert")
        if isinstance(alert, dict) and alert.get("node_in_steps", False) is None:
            del alert["node_in_steps"]  # added since: a record signed before still verifies
    if isinstance(message, Approval) and message.schema_version == 1:
        data["command_id"] = data.pop("action_id")
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sign(message: Signed, key: SigningKey) -> Signed:
    """A copy of ``message`` signed with ``key``."""
    signature = key.private.sign(canonical(message)).hex()
    return message.model_copy(update={"key_id": key.key_id, "signature": signature})


def signature_problem(message: Signable, keys: PublicKeys) -> str | None:
    """Why the signature is not acceptable, or ``None`` when one of ``keys`` made it.

    Never raises, whatever ``key_id`` and ``signature`` hold.
    """
    key_id, signature = message.key_id, message.signature
    if signature is None or key_id is None:
        return "unsigned"
    if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
        return "malformed key id"
    if not isinstance(signature, str) or not _SIGNATURE.fullmatch(signature):
        return "malformed signature"
    public = keys.get(key_id)
    if public is None:
        return f"unknown key id {key_id!r}"
    try:
        public.verify(bytes.fromhex(signature), canonical(message))
    except InvalidSignature:
        return "bad signature"
    return None


def check_command(command: Command, keys: PublicKeys, now: datetime) -> str | None:
    """Why a command must not be obeyed (signature, expiry, mode, a target outside the
    job's known nodes), or ``None``."""
    problem = signature_problem(command, keys)
    if problem is not None:
        return problem
    if command.expires_at is None:
        return "no expiry"
    if now >= command.expires_at:
        return f"expired at {command.expires_at.isoformat()}"
    if command.mode is ActuatorMode.OBSERVE:
        return "observe-mode commands are never executed"
    if command.job_nodes is not None:
        known = set(command.job_nodes)
        outside = [t for t in command.targets if t not in known]
        if outside:
            return f"targets {outside[:5]} are not nodes of job {command.job_id}"[:300]
    return None


def job_controller_key_id(job_id: str, suffix: str = "") -> str:
    """The key id of ``job_id``'s controller key (``suffix``: a rotation tag).

    >>> job_controller_key_id("llm-7")
    'jc-...'
    >>> job_controller_key_id("llm-7", "2") == job_controller_key_id("llm-7") + ".2"
    True
    """
    digest = hashlib.sha256(job_id.encode()).hexdigest()[:24]
    return f"jc-{digest}" + (f".{suffix}" if suffix else "")


def result_problem(result: CommandResult, keys: PublicKeys, role: Role) -> str | None:
    """Why a command result must not be acted on as ``role``'s, or ``None``: signed by
    one of ``keys`` and, for a job controller, by the controller key of the result's
    own job. Freshness and once-per-command are the caller's (it knows the clock and
    what it already acted on). Never raises.

    >>> from datetime import UTC, datetime
    >>> from schemas import CommandResult, CommandStatus
    >>> res = CommandResult(command_id="cmd-1", job_id="a", executor="job-controller",
    ...                     status=CommandStatus.SUCCEEDED, ts=datetime(2026, 1, 1, tzinfo=UTC))
    >>> a, b = (SigningKey.generate(job_controller_key_id(j)) for j in "ab")
    >>> keys = a.verifier() | b.verifier()
    >>> result_problem(sign(res, a), keys, "job_controller") is None
    True
    >>> result_problem(sign(res, b), keys, "job_controller")
    "key jc-... is not job 'a''s controller key"
    """
    problem = signature_problem(result, keys)
    if problem is not None or role != "job_controller":
        return problem
    key_id = str(result.key_id)
    if key_id.split(".", 1)[0] != job_controller_key_id(result.job_id):
        return f"key {key_id} is not job {result.job_id[:100]!r}'s controller key"
    return None


class FinishedCommands:
    """The ids of commands already carried out (or answered), each forgotten once its
    command can no longer be obeyed anyway (expired, plus the clock skew), and at most
    ``max_size`` of them (oldest first out, counted in :attr:`evicted`).

    >>> from datetime import UTC, datetime, timedelta
    >>> t = datetime(2026, 1, 1, tzinfo=UTC)
    >>> done = FinishedCommands(max_size=2)
    >>> done.add("cmd-1", t + timedelta(seconds=60))
    >>> "cmd-1" in done, len(done)
    (True, 1)
    >>> done.expire(t + timedelta(seconds=61)); "cmd-1" in done
    False
    """

    def __init__(self, max_size: int = 65_536) -> None:
        if max_size < 1:
            raise ValueError("max_size must be >= 1")
        self.max_size = max_size
        self.evicted = 0
        self._until: OrderedDict[str, datetime] = OrderedDict()

    def add(self, command_id: str, until: datetime) -> None:
        """Remember ``command_id`` until ``until`` (when its command has expired)."""
        self._until[command_id] = max(until, self._until.get(command_id, until))
        self._until.move_to_end(command_id)
        while len(self._until) > self.max_size:
            self._until.popitem(last=False)
            self.evicted += 1

    def add_command(self, cmd: Command, skew_s: float, now: datetime) -> None:
        """Remember ``cmd`` until it expires (plus ``skew_s``)."""
        self.add(cmd.command_id, (cmd.expires_at or now) + timedelta(seconds=skew_s))

    def expire(self, now: datetime) -> None:
        """Forget every id whose command has expired by ``now``."""
        for cid in [c for c, until in self._until.items() if until <= now]:
            del self._until[cid]

    def __contains__(self, command_id: object) -> bool:
        return command_id in self._until

    def __len__(self) -> int:
        return len(self._until)
