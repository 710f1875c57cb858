"""Commands from the actuator, their results, and human approvals.

A command id is derived from the alert episode and the action, so a replayed decision
or a restarted actuator produces the same id and executors can refuse duplicates. An
approval names an *action* (``ActionRecord.action_id``, what ``stepguard pending``
lists), whose commands the actuator issues once it is approved.

Examples
--------
>>> command_id(["a1b2c3d4e5f6a7b8"], "isolate", ["node-3"])
'cmd-...'

An approval of version 1 named the action ``command_id``; it still decodes:

>>> old = Approval.model_validate_json(
...     '{"schema_version": 1, "command_id": "act-1234", "decision": "approve",'
...     ' "by": "sre", "ts": "2026-01-01T00:00:00Z"}')
>>> old.action_id, old.schema_version
('act-1234', 1)
>>> new = Approval(action_id="act-1234", decision=ApprovalDecision.APPROVE, by="sre",
...                ts=old.ts)
>>> new.schema_version, sorted(new.model_dump())[:2]
(2, ['action_id', 'by'])
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from enum import StrEnum
from typing import Any, Literal

from pydantic import AwareDatetime, Field, NonNegativeInt, model_validator

from schemas._base import KeyId, Message, Signature
from schemas.alerts import Grade

__all__ = [
    "ActuatorMode",
    "Approval",
    "ApprovalDecision",
    "Command",
    "CommandKind",
    "CommandResult",
    "CommandStatus",
    "RELAUNCHING",
    "command_id",
]


class CommandKind(StrEnum):
    ISOLATE = "isolate"
    CHECKPOINT = "checkpoint"
    RESTART = "restart"
    ROLLBACK = "rollback"
    STOP = "stop"
    NOTIFY = "notify"


#: Commands after which a job goes quiet while it relaunches (detectors allow for it).
RELAUNCHING = frozenset({CommandKind.RESTART, CommandKind.ROLLBACK, CommandKind.ISOLATE})


class ActuatorMode(StrEnum):
    OBSERVE = "observe"
    APPROVE = "approve"
    AUTO = "auto"


class CommandStatus(StrEnum):
    ACCEPTED = "accepted"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    REFUSED = "refused"


class ApprovalDecision(StrEnum):
    APPROVE = "approve"
    REJECT = "reject"


def command_id(fingerprints: Sequence[str], kind: str, targets: Sequence[str]) -> str:
    """Deterministic id from the episode fingerprints, the action and its targets."""
    text = "\x1f".join([",".join(sorted(fingerprints)), kind, ",".join(sorted(targets))])
    return "cmd-" + hashlib.sha256(text.encode()).hexdigest()[:24]


class Command(Message):
    """An action for executors (topic key: job id)."""

    kind_name = "command"
    schema_version: Literal[1] = 1
    command_id: str = Field(min_length=4, max_length=64)
    kind: CommandKind
    job_id: str = Field(min_length=1, max_length=256)
    targets: tuple[str, ...] = Field(default=(), description="Nodes the action applies to.")
    replacements: tuple[str, ...] = Field(default=(), description="Spare nodes to bring in.")
    checkpoint_step: NonNegativeInt | None = Field(
        default=None, description="For ROLLBACK/RESTART: the checkpoint step to resume from."
    )
    reason: tuple[str, ...] = Field(description="Alert fingerprints that led here.")
    mode: ActuatorMode
    issued_at: AwareDatetime
    expires_at: AwareDatetime | None = None
    summary: str = ""
    job_nodes: tuple[str, ...] | None = Field(
        default=None,
        max_length=4096,
        description="Nodes of the job the actuator knows (named in worker-signed alerts of "
        "the job); signed with the command. When set, executors refuse any target "
        "outside it.",
    )
    cause: str | None = Field(
        default=None,
        max_length=500,
        description="What the alert behind it saw (its kind and evidence, e.g. 'hardware: "
        "GPU 2: fatal XID 79'), not the remedy: the Slurm executor's drain reason names "
        "it. Signed when set.",
    )
    incident: str | None = Field(
        default=None,
        max_length=64,
        description="The incident key of the alert behind it (Alert.incident). Signed when set.",
    )
    grade: Grade | None = Field(
        default=None,
        description="Grade of the alert that led here (a notification's severity); "
        "signed with the command when set.",
    )
    key_id: KeyId | None = None
    signature: Signature | None = None


class CommandResult(Message):
    """What an executor did with a command (topic key: job id)."""

    kind_name = "command_result"
    schema_version: Literal[1] = 1
    command_id: str = Field(min_length=4, max_length=64)
    job_id: str = Field(min_length=1, max_length=256)
    executor: str
    status: CommandStatus
    detail: str = ""
    ts: AwareDatetime
    #: signed by the executor (``STEPGUARD_EXECUTOR_PRIVATE_KEY``): a result read back
    #: counts only when an executor key signed it
    key_id: KeyId | None = None
    signature: Signature | None = None


class Approval(Message):
    """A human decision on a held action (topic key: action id).

    Version 2 renamed ``command_id`` to ``action_id`` (it always held an action id).
    A version-1 message (``command_id``, no ``action_id``) still decodes, with its
    ``schema_version`` 1 kept: its signature covers the version-1 fields.
    """

    kind_name = "approval"
    schema_version: Literal[1, 2] = 2
    action_id: str = Field(
        min_length=4, max_length=64, description="The held action (ActionRecord.action_id)."
    )
    decision: ApprovalDecision
    by: str = Field(min_length=1, max_length=256)
    reason: str = ""
    ts: AwareDatetime
    held_at: AwareDatetime | None = Field(
        default=None,
        description="When the hold it decides began (the HELD record's ts, as `stepguard "
        "pending` lists it): the approval decides that one hold only, so a replay cannot "
        "decide a later hold of the same action.",
    )
    key_id: KeyId | None = None
    signature: Signature | None = None

    @model_validator(mode="before")
    @classmethod
    def _read_version_1(cls, data: Any) -> Any:
        """Version 1 named the action id ``command_id``."""
        if isinstance(data, dict) and "action_id" not in data and "command_id" in data:
            data = {k: v for k, v in data.items() if k != "command_id"} | {
                "action_id": data["command_id"],
                "schema_version": data.get("schema_version", 1),
            }
        return data
