"""Runtime control of the actuator and the record of what it decided.

``ControlMessage`` (topic ``control``) changes the actuator's mode and thresholds at
runtime; the topic is the archive of every change. ``ActionRecord`` (topic
``actions``, latest record per ``action_id`` wins) records every confirmed action that
did not simply become commands: observed (observe mode), held for approval, approved,
rejected, cancelled (episode resolved while held) or refused by a guardrail. The held
set (``stepguard pending``) is rebuilt by reading this topic from the beginning.

Examples
--------
>>> from datetime import datetime, timezone
>>> t = datetime(2026, 1, 1, tzinfo=timezone.utc)
>>> ControlMessage(change_id="c1", mode=ActuatorMode.APPROVE, by="sre", ts=t).scope
'actuator'
>>> ControlMessage(change_id="c2", action_modes={"replace_at_checkpoint": "auto"},
...                by="sre", ts=t).action_modes
{<RecommendedAction.REPLACE_AT_CHECKPOINT: 'replace_at_checkpoint'>: 'auto'}
>>> ControlMessage(change_id="c3", scope="detector", by="sre", ts=t,
...                detector_settings={"straggler_warning": 0.06, "hang_factor": 3}
...                ).detector_settings
{'straggler_warning': 0.06, 'hang_factor': 3}

``Acknowledgement`` (topic ``acks``) is the actuator's answer to each approval and
control message it consumes (applied or refused, and why; the commands an approval
issued) and its status at start; every one carries the mode it runs in after it, so
``stepguard approve``/``reject``/``control`` wait for it and ``stepguard pending`` shows
the running actuator's mode.

>>> ack = Acknowledgement(subject="act-1234", request="approval", source_topic="t",
...                       partition=0, offset=7, outcome=AckOutcome.REFUSED,
...                       detail="unknown key id 'op-1'", mode=ActuatorMode.APPROVE, ts=t)
>>> ack.took_effect
False

``detector_settings`` is for the workers (``scope`` ``detector``): every worker reads
the control topic and builds new jobs' detectors from the latest signed set
(``stepguard calibrate --apply``); the actuator's fields leave it alone.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AwareDatetime, Field, NonNegativeInt, PositiveFloat, PositiveInt

from schemas._base import KeyId, Message, Signature
from schemas.alerts import Alert, RecommendedAction
from schemas.commands import ActuatorMode, Command

__all__ = [
    "AckOutcome",
    "Acknowledgement",
    "ActionRecord",
    "ActionState",
    "ControlMessage",
    "DetectorValue",
    "ModeOverride",
]

#: ``ControlMessage.action_modes`` value: a mode for the kind, or ``default`` (follow
#: the global mode again)
ModeOverride = Literal["observe", "approve", "auto", "default"]
#: a detector setting's name (a field of ``detectors.config.DetectorConfig``)
SettingName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
#: ``ControlMessage.detector_settings`` value: a number, a switch, or a set of integers
#: (``fatal_xids``); the worker checks names and values against its DetectorConfig
DetectorValue = bool | int | float | Annotated[tuple[int, ...], Field(max_length=256)]


class ActionState(StrEnum):
    OBSERVED = "observed"
    HELD = "held"
    APPROVED = "approved"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    REFUSED = "refused"


class ControlMessage(Message):
    """A runtime change of actuator settings (topic key: scope). ``None``: unchanged."""

    kind_name = "control"
    schema_version: Literal[1] = 1
    scope: str = Field(default="actuator", min_length=1, max_length=64)
    change_id: str = Field(min_length=1, max_length=64)
    mode: ActuatorMode | None = None
    warning_confirm_steps: PositiveInt | None = None
    warning_confirm_s: PositiveFloat | None = None
    stale_alert_s: PositiveFloat | None = None
    guard_max_isolations: NonNegativeInt | None = None
    guard_max_isolation_pct: float | None = Field(default=None, ge=0, le=100)
    guard_window_s: PositiveFloat | None = None
    guard_node_cooldown_s: float | None = Field(default=None, ge=0)
    no_spare_policy: Literal["checkpoint", "alert"] | None = None
    spare_nodes: tuple[str, ...] | None = Field(
        default=None, description="Replaces the spare pool (nodes marked for repair excluded)."
    )
    job_id: str | None = Field(default=None, description="Job whose size job_nodes gives.")
    job_nodes: PositiveInt | None = Field(
        default=None, description="Node count of job_id, for the percentage guardrail."
    )
    reset_breaker: bool = Field(default=False, description="Close open circuit breakers.")
    action_modes: dict[RecommendedAction, ModeOverride] | None = Field(
        default=None,
        max_length=len(RecommendedAction),
        description="Per action kind, a mode that overrides the global one ('default' "
        "removes the override); kinds not named keep theirs.",
    )
    detector_settings: dict[SettingName, DetectorValue] | None = Field(
        default=None,
        max_length=256,
        description="For the workers: the detector settings new jobs get, as the "
        "settings that differ from the defaults (replaces the previous set; {} = the "
        "defaults). Running jobs keep theirs.",
    )
    by: str = Field(min_length=1, max_length=256)
    reason: str = ""
    ts: AwareDatetime
    key_id: KeyId | None = None
    signature: Signature | None = None


class ActionRecord(Message):
    """What the actuator decided for one confirmed action (topic key: action_id)."""

    kind_name = "action_record"
    schema_version: Literal[1] = 1
    action_id: str = Field(min_length=4, max_length=64, description="Id to approve/reject.")
    state: ActionState
    job_id: str = Field(min_length=1, max_length=256)
    mode: ActuatorMode
    commands: tuple[Command, ...] = Field(
        default=(), description="The commands proposed (unsigned)."
    )
    reason: tuple[str, ...] = Field(description="Alert fingerprints that led here.")
    alert: Alert | None = Field(default=None, description="The alert update that confirmed.")
    summary: str = ""
    detail: str = ""
    by: str | None = None
    ts: AwareDatetime
    #: signed by the actuator (its start-up rebuild restores only what it signed)
    key_id: KeyId | None = None
    signature: Signature | None = None


class AckOutcome(StrEnum):
    """Whether an operator's message took effect."""

    APPLIED = "applied"
    REFUSED = "refused"


class Acknowledgement(Message):
    """The actuator's answer to one operator message, or its status at start (topic
    key: subject).

    An answer names the message it answers by its topic, partition and offset (what the
    sender's broker acknowledgement told it), so the sender waits for exactly its own.
    """

    kind_name = "acknowledgement"
    schema_version: Literal[1] = 1
    subject: str = Field(
        min_length=1, max_length=64,
        description="The action id (approval), change id (control) or 'actuator' (start).",
    )  # fmt: skip
    request: Literal["approval", "control", "start"]
    source_topic: str = Field(default="", max_length=256, description="Where it was read.")
    partition: NonNegativeInt = 0
    offset: int = Field(default=-1, ge=-1, description="-1: answers no message (start).")
    outcome: AckOutcome
    state: ActionState | None = Field(
        default=None, description="The action's state after an approval or rejection."
    )
    detail: str = Field(default="", max_length=2000, description="Why it was refused.")
    by: str = Field(default="", max_length=256, description="Who the message says sent it.")
    commands: tuple[str, ...] = Field(
        default=(), max_length=64, description="Ids of the commands it issued."
    )
    mode: ActuatorMode = Field(description="The actuator's global mode after it.")
    action_modes: dict[RecommendedAction, ActuatorMode] = Field(
        default_factory=dict,
        max_length=len(RecommendedAction),
        description="Per-kind mode overrides after it.",
    )
    ts: AwareDatetime
    #: signed by the actuator: a reader counts only what an actuator key signed
    key_id: KeyId | None = None
    signature: Signature | None = None

    @property
    def took_effect(self) -> bool:
        return self.outcome is AckOutcome.APPLIED
