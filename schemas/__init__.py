"""stepguard message contracts: models, topic registry, codec, JSON Schemas and DDL.

Imports only pydantic and the standard library.
"""

from schemas._base import Message
from schemas.alerts import (
    Alert,
    AlertKind,
    AlertState,
    Evidence,
    Grade,
    RecommendedAction,
    episode_fingerprint,
    incident_key,
)
from schemas.codec import MAX_MESSAGE_BYTES, Rejected, decode, encode, key_of
from schemas.commands import (
    ActuatorMode,
    Approval,
    ApprovalDecision,
    Command,
    CommandKind,
    CommandResult,
    CommandStatus,
    command_id,
)
from schemas.control import Acknowledgement, AckOutcome, ActionRecord, ActionState, ControlMessage
from schemas.deadletter import DeadLetter
from schemas.lifecycle import EndReason, JobEvent, JobEventKind
from schemas.telemetry import GpuHealth, NodeHealth, Phase, RankSample, StepTelemetry
from schemas.topics import TOPICS, TopicRegistry, TopicSpec
from schemas.truth import FaultKind, FaultTruth

#: Every top-level message model; each has a committed JSON Schema.
MESSAGE_MODELS: tuple[type[Message], ...] = (
    StepTelemetry,
    NodeHealth,
    Alert,
    Command,
    CommandResult,
    Approval,
    DeadLetter,
    FaultTruth,
    ControlMessage,
    ActionRecord,
    JobEvent,
    Acknowledgement,
)

__all__ = [
    "MAX_MESSAGE_BYTES",
    "MESSAGE_MODELS",
    "TOPICS",
    "AckOutcome",
    "Acknowledgement",
    "ActionRecord",
    "ActionState",
    "ActuatorMode",
    "Alert",
    "AlertKind",
    "AlertState",
    "Approval",
    "ApprovalDecision",
    "Command",
    "CommandKind",
    "CommandResult",
    "CommandStatus",
    "ControlMessage",
    "DeadLetter",
    "EndReason",
    "Evidence",
    "FaultKind",
    "FaultTruth",
    "GpuHealth",
    "Grade",
    "JobEvent",
    "JobEventKind",
    "Message",
    "NodeHealth",
    "Phase",
    "RankSample",
    "RecommendedAction",
    "Rejected",
    "StepTelemetry",
    "TopicRegistry",
    "TopicSpec",
    "command_id",
    "decode",
    "encode",
    "episode_fingerprint",
    "incident_key",
    "key_of",
]
