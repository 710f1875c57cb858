"""Who signs and how telemetry proves its writer: :class:`KeySettings` (an Ed25519 key
pair per role) and :class:`TelemetryAuthSettings` (the cluster telemetry secret, node
keys), read by every role that signs or verifies (:mod:`pipeline.io.trust`,
:mod:`pipeline.io.telemetry_auth`)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import re
from typing import Literal

from pydantic import SecretStr, field_validator
from pydantic_settings import BaseSettings

from pipeline.io.settings._base import MODEL_CONFIG

__all__ = [
    "ROLES",
    "KeySettings",
    "Role",
    "TelemetryAuthSettings",
    "parse_keys",
    "parse_node_keys",
]

_KEY_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")  # schemas._base.KEY_ID_PATTERN

#: Who signs: the actuator (commands, action records), workers (alerts), operators
#: (approvals, control), executors (command results), job controllers (the training
#: job's CommandListener: the results of its own job's commands; a job controller's key
#: is bound to one job by its key id, :func:`pipeline.io.trust.job_controller_key_id`).
Role = Literal["actuator", "worker", "operator", "executor", "job_controller"]
ROLES: tuple[Role, ...] = ("actuator", "worker", "operator", "executor", "job_controller")


def parse_keys(text: str) -> list[tuple[str, bytes]]:
    """``key_id:base64[,key_id:base64]`` to (key_id, 32 raw key bytes) pairs.

    >>> parse_keys("k1:" + "A" * 43 + "=")[0][0]
    'k1'
    >>> parse_keys("k1:secret")
    Traceback (most recent call last):
    ...
    ValueError: key 'k1': expected 32 bytes of standard base64 (44 characters)
    """
    pairs = []
    for part in text.split(","):
        key_id, sep, b64 = part.strip().partition(":")
        if not sep or not _KEY_ID.match(key_id):
            raise ValueError("expected key_id:base64[,key_id:base64] with key ids of "
                             "1-64 characters A-Z a-z 0-9 . _ -")  # fmt: skip
        try:
            raw = base64.b64decode(b64.strip(), validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != 32:
            raise ValueError(
                f"key {key_id!r}: expected 32 bytes of standard base64 (44 characters)"
            )
        pairs.append((key_id, raw))
    return pairs


def parse_node_keys(text: str) -> dict[str, bytes]:
    """``node=base64[,node=base64]`` to node -> 32-byte key.

    >>> parse_node_keys("n1=" + base64.b64encode(bytes(32)).decode())["n1"] == bytes(32)
    True
    >>> parse_node_keys("n1=xyz")
    Traceback (most recent call last):
    ...
    ValueError: node key of 'n1': expected 32 bytes of standard base64
    """
    out: dict[str, bytes] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        node, sep, b64 = part.strip().partition("=")
        if not sep or not node or ":" in node:
            raise ValueError("expected node=base64[,node=base64] (node names without ':')")
        try:
            raw = base64.b64decode(b64.strip(), validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != 32:
            raise ValueError(f"node key of {node[:64]!r}: expected 32 bytes of standard base64")
        out[node] = raw
    return out


class KeySettings(BaseSettings):
    """Signing keys per role: a role's private key signs, the others' public keys verify."""

    model_config = MODEL_CONFIG

    #: Ed25519 keys, ``key_id:base64`` (``stepguard keys generate``): a role's private
    #: key signs what it publishes, its public keys verify (all listed: rotation)
    actuator_private_key: SecretStr | None = None
    actuator_public_keys: str = ""
    worker_private_key: SecretStr | None = None
    worker_public_keys: str = ""
    operator_private_key: SecretStr | None = None
    operator_public_keys: str = ""
    executor_private_key: SecretStr | None = None
    executor_public_keys: str = ""
    job_controller_private_key: SecretStr | None = None
    job_controller_public_keys: str = ""

    @field_validator(
        "actuator_private_key", "worker_private_key", "operator_private_key",
        "executor_private_key", "job_controller_private_key",
    )  # fmt: skip
    @classmethod
    def _check_private_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        try:
            pairs = parse_keys(value.get_secret_value())
        except ValueError:  # the message could quote the secret
            raise ValueError(
                "expected key_id:base64 (32 bytes; see `stepguard keys generate`)"
            ) from None
        if len(pairs) != 1:
            raise ValueError("expected exactly one key_id:base64 (the key that signs)")
        return value

    @field_validator(
        "actuator_public_keys", "worker_public_keys", "operator_public_keys",
        "executor_public_keys", "job_controller_public_keys",
    )  # fmt: skip
    @classmethod
    def _check_public_keys(cls, value: str) -> str:
        value = value.strip()
        if value:
            parse_keys(value)
        return value

    def private_key(self, role: Role) -> tuple[str, bytes] | None:
        """(key_id, raw Ed25519 private key) of ``role``, or ``None`` when not set."""
        secret: SecretStr | None = getattr(self, f"{role}_private_key")
        return None if secret is None else parse_keys(secret.get_secret_value())[0]

    def public_keys(self, role: Role) -> list[tuple[str, bytes]]:
        """(key_id, raw Ed25519 public key) pairs that verify what ``role`` signed."""
        text: str = getattr(self, f"{role}_public_keys")
        return parse_keys(text) if text else []


class TelemetryAuthSettings(BaseSettings):
    """How telemetry proves its writer (:mod:`pipeline.io.telemetry_auth`)."""

    model_config = MODEL_CONFIG

    #: ``on``: every steps, health and lifecycle record carries its writer's proof and
    #: the worker refuses the rest; ``off``: an explicit opt-out, logged as a warning
    telemetry_auth: Literal["on", "off"] = "on"
    #: the cluster telemetry secret (base64, >= 32 bytes; ``stepguard keys telemetry``):
    #: the worker's, from which every node's key is derived (HKDF-SHA256)
    telemetry_secret: SecretStr | None = None
    #: ``node=base64[,node=base64]``: the keys of the nodes this process speaks for (a
    #: node's agent and training processes: its own; a rack aggregator: its nodes';
    #: ``stepguard keys node --node N``)
    telemetry_node_keys: SecretStr | None = None

    @field_validator("telemetry_secret")
    @classmethod
    def _check_telemetry_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        raw = b""
        with _suppress_decode():
            raw = base64.b64decode(value.get_secret_value().strip(), validate=True)
        if len(raw) < 32:  # never quote the secret
            raise ValueError("expected at least 32 bytes of standard base64 "
                             "(`stepguard keys telemetry` makes one)")  # fmt: skip
        return value

    @field_validator("telemetry_node_keys")
    @classmethod
    def _check_node_keys(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        try:
            parse_node_keys(value.get_secret_value())
        except ValueError as exc:
            raise ValueError(str(exc)) from None
        return value


def _suppress_decode() -> contextlib.AbstractContextManager[None]:
    return contextlib.suppress(binascii.Error, ValueError)
