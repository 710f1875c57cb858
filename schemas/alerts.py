"""Graded alerts on the decision topic.

An alert episode has a stable ``fingerprint``; every update of the episode carries an
increasing ``seq`` so that ``(fingerprint, seq)`` identifies one message (the archive
deduplicates on it and the actuator ignores replays).

Examples
--------
>>> fp = episode_fingerprint("job-1", "straggler", "node-7", 3, 120)
>>> fp == episode_fingerprint("job-1", "straggler", "node-7", 3, 120)
True
>>> len(fp)
24
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from typing import Literal

from pydantic import AwareDatetime, Field, NonNegativeInt

from schemas._base import KeyId, Message, Signature

__all__ = [
    "Alert",
    "AlertKind",
    "AlertState",
    "Evidence",
    "Grade",
    "RecommendedAction",
    "episode_fingerprint",
    "incident_key",
]


class Grade(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def level(self) -> int:
        return {"info": 0, "warning": 1, "critical": 2}[self.value]


class AlertState(StrEnum):
    FIRING = "firing"
    RESOLVED = "resolved"


class AlertKind(StrEnum):
    STRAGGLER = "straggler"
    DEGRADATION = "degradation"
    HARDWARE = "hardware"
    THERMAL = "thermal"
    NETWORK = "network"
    DATA_STALL = "data_stall"
    HANG = "hang"
    MISSING = "missing"
    DIVERGENCE = "divergence"
    GUARDRAIL = "guardrail"
    #: a lifecycle event the job's own records contradict (an end followed by steps, a
    #: phase too long or too far ahead): refused or cut short, the job stays watched
    LIFECYCLE = "lifecycle"
    #: structural: a pipeline stage slower as a whole than the others (no node at fault)
    IMBALANCE = "imbalance"
    #: several nodes that began to slow together (a rack, switch, power shelf, NIC):
    #: one incident for the group, its nodes in the evidence, never N node isolations
    GROUP = "group"


class RecommendedAction(StrEnum):
    NONE = "none"
    INVESTIGATE = "investigate"
    ISOLATE = "isolate"
    REPLACE_AT_CHECKPOINT = "replace_at_checkpoint"
    RESTART = "restart"
    ROLLBACK = "rollback"
    #: advice to the job owner (move layers between pipeline stages): the actuator never
    #: acts on it, no node is isolated for it
    REBALANCE = "rebalance"


class Evidence(Message):
    """Why an alert fired: the numbers an SRE checks first."""

    metric: str = Field(description="Signal scored, e.g. 'compute_s' or 'ecc_corrected_rate'.")
    value: float
    peer_median: float | None = None
    baseline: float | None = None
    deviation: float = Field(description="Robust deviation score (MAD units or ratio).")
    trend: float | None = Field(default=None, description="Slope per step, when tracked.")
    detail: str = ""


class Alert(Message):
    """One update of an alert episode (topic key: job id)."""

    kind_name = "alert"
    schema_version: Literal[1] = 1
    fingerprint: str = Field(min_length=8, max_length=64)
    seq: NonNegativeInt = Field(description="Update number within the episode, from 0.")
    kind: AlertKind
    grade: Grade
    state: AlertState
    job_id: str = Field(min_length=1, max_length=256)
    node: str | None = None
    rank: NonNegativeInt | None = None
    step: NonNegativeInt | None = Field(default=None, description="Job step of this update.")
    started_at: AwareDatetime = Field(description="Event time the episode began.")
    ts: AwareDatetime = Field(description="Event time of this update.")
    evidence: Evidence
    recommended_action: RecommendedAction = RecommendedAction.INVESTIGATE
    summary: str = ""
    incident: str = Field(
        default="",
        max_length=64,
        description=(
            "Group key of the incident: every episode of one culprit (the node, or the "
            "job for job-wide causes) and one cause (straggler and degradation are one: "
            "a slow node) while any of them is open; group pages on it (Alertmanager's "
            "group_by), the ranks are listed inside."
        ),
    )
    node_in_steps: bool | None = Field(
        default=None,
        description="Whether the worker saw ``node`` in the job's step records (None: not "
        "said). Signed with the alert: the actuator isolates only nodes it knows as members "
        "of the job from its steps.",
    )
    key_id: KeyId | None = Field(default=None, description="The worker key that signed.")
    signature: Signature | None = None


def incident_key(job_id: str, node: str | None, kind: str, start: int) -> str:
    """The group key of an incident: its job, culprit (node, or the whole job), kind
    and the start (event time, ms) of its first episode.

    >>> incident_key("j", "node-3", "straggler", 1000) == incident_key("j", "node-3",
    ...                                                               "straggler", 1000)
    True
    """
    text = f"incident\x1f{job_id}\x1f{node or ''}\x1f{kind}\x1f{start}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def episode_fingerprint(
    job_id: str, kind: str, node: str | None, rank: int | None, start: int
) -> str:
    """A stable id for one episode: same subject and start, same fingerprint.

    ``start`` identifies when the episode began; the detectors use its event time in
    milliseconds (a step number can repeat after a restart from a checkpoint).
    """
    text = f"{job_id}\x1f{kind}\x1f{node or ''}\x1f{'' if rank is None else rank}\x1f{start}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]
