"""The topic registry: every topic's name, key and partition count in one place.

Names carry a configurable prefix so that several deployments (or tests) can share a
broker without seeing each other's data.

Examples
--------
>>> reg = TopicRegistry(prefix="t1.")
>>> reg.name("steps")
't1.stepguard.steps'
>>> TOPICS["health"].key
'node'
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas._base import Message
from schemas.alerts import Alert
from schemas.commands import Approval, Command, CommandResult
from schemas.control import Acknowledgement, ActionRecord, ControlMessage
from schemas.deadletter import DeadLetter
from schemas.lifecycle import JobEvent
from schemas.telemetry import NodeHealth, StepTelemetry
from schemas.truth import FaultTruth

__all__ = ["TOPICS", "TopicRegistry", "TopicSpec"]


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One topic: logical name, the field its messages are keyed by, partitions, model."""

    logical: str
    key: str
    partitions: int
    model: type[Message]
    description: str


TOPICS: dict[str, TopicSpec] = {
    spec.logical: spec
    for spec in (
        TopicSpec("steps", "job_id", 8, StepTelemetry, "Per-node per-step rank timings."),
        TopicSpec("health", "node", 8, NodeHealth, "Per-node hardware readings."),
        TopicSpec("truth", "job_id", 1, FaultTruth, "Simulator ground truth (scoring only)."),
        TopicSpec("decisions", "job_id", 4, Alert, "Graded alerts, one per episode update."),
        TopicSpec("commands", "job_id", 4, Command, "Actuator commands for executors."),
        TopicSpec("results", "job_id", 4, CommandResult, "Executor results per command."),
        TopicSpec("lifecycle", "job_id", 4, JobEvent, "Job start, long phases, end."),
        TopicSpec("approvals", "action_id", 1, Approval, "Human approve/reject decisions."),
        TopicSpec("control", "scope", 1, ControlMessage, "Runtime actuator changes (archived)."),
        TopicSpec("actions", "action_id", 1, ActionRecord, "Actuator action records (held ...)."),
        TopicSpec("acks", "subject", 1, Acknowledgement, "The actuator's answers and status."),
        TopicSpec("deadletter", "source_topic", 1, DeadLetter, "Undecodable or unstorable input."),
    )
}


@dataclass(frozen=True, slots=True)
class TopicRegistry:
    """Topic names for one deployment: ``{prefix}stepguard.{logical}``."""

    prefix: str = ""

    def name(self, logical: str) -> str:
        if logical not in TOPICS:
            raise KeyError(f"unknown topic {logical!r}; known: {sorted(TOPICS)}")
        return f"{self.prefix}stepguard.{logical}"

    def spec(self, logical: str) -> TopicSpec:
        return TOPICS[logical]

    def all(self) -> dict[str, str]:
        """Logical name -> full topic name, for every topic."""
        return {logical: self.name(logical) for logical in TOPICS}

    def logical_of(self, topic: str) -> str | None:
        for logical in TOPICS:
            if self.name(logical) == topic:
                return logical
        return None
