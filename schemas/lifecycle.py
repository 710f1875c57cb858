"""A job's lifecycle: it starts, announces long phases, and ends.

Training code publishes these through its exporter (``StepExporter``: start on the
first record, ``phase()`` around a checkpoint save or an evaluation, ``close()`` at
the end) and the command listener (around the checkpoints it is asked for); the
simulator publishes them for the jobs it plays. The worker reads them so that a job
that ended raises no hang and its state is dropped, and so that an announced long
phase is not taken for a hang; the archive keeps them for a job's runs and end
reasons.

Examples
--------
>>> from datetime import UTC, datetime
>>> ev = JobEvent(job_id="llm-7b", kind=JobEventKind.END, reason=EndReason.COMPLETED,
...               ts=datetime(2026, 1, 1, tzinfo=UTC), step=999, source="node-0001")
>>> ev.event_id == JobEvent.model_validate(ev.model_dump()).event_id
True
>>> JobEvent(job_id="j", kind=JobEventKind.PHASE, ts=ev.ts)
Traceback (most recent call last):
...
pydantic_core._pydantic_core.ValidationError: 1 validation error for JobEvent
  Value error, a phase event names its phase ...
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AwareDatetime, Field, NonNegativeInt, PositiveFloat, model_validator

from schemas._base import Message
from schemas.telemetry import MAX_STEP, Phase

__all__ = ["MAX_NODES_PER_JOB", "MAX_PHASE_S", "EndReason", "JobEvent", "JobEventKind"]

#: Nodes a job may declare (and the worker keeps per job): a million ranks at sixteen
#: per node.
MAX_NODES_PER_JOB = 65_536
#: The longest phase an event may announce: a day. The worker allows less
#: (``STEPGUARD_MAX_PHASE_S``): this bound is what the schema takes at all.
MAX_PHASE_S = 86_400.0

NodeName = Annotated[str, Field(min_length=1, max_length=256)]


class JobEventKind(StrEnum):
    START = "start"  #: the job (or one of its processes) started
    PHASE = "phase"  #: a long phase begins now (checkpoint save, evaluation)
    #: the job's leader has waited for its next batch since ``ts`` (the data loader, the
    #: storage behind it), after completing ``step``: the job is slower, not hung
    WAIT = "wait"
    END = "end"  #: the job ended, for ``reason``


class EndReason(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class JobEvent(Message):
    """One lifecycle event of a job (topic key: job id).

    ``event_id`` is derived from the other fields unless given, so the same event
    published twice (a retry, a replay) is archived once.
    """

    kind_name = "job_event"
    schema_version: Literal[1] = 1
    event_id: str = Field(default="", max_length=64)
    job_id: str = Field(min_length=1, max_length=256)
    kind: JobEventKind
    ts: AwareDatetime = Field(description="Event time (the publisher's clock).")
    step: NonNegativeInt | None = Field(
        default=None, le=MAX_STEP, description="Last step completed when the event happened."
    )
    phase: Phase | None = Field(default=None, description="PHASE: which long phase begins.")
    expected_s: PositiveFloat | None = Field(
        default=None, le=MAX_PHASE_S, description="PHASE: how long it is expected to last."
    )
    reason: EndReason | None = Field(default=None, description="END: why the job ended.")
    run: str = Field(default="", max_length=256, description="Run or attempt id, if known.")
    source: str = Field(default="", max_length=256, description="Publisher (node, listener).")
    detail: str = Field(default="", max_length=1000)
    nodes: tuple[NodeName, ...] = Field(
        default=(),
        max_length=MAX_NODES_PER_JOB,
        description="START: the nodes the job runs on, if the launcher knows them (a "
        "health report can lead to isolating only a node of the job: one seen in its "
        "steps or declared here).",
    )

    @model_validator(mode="after")
    def _complete(self) -> JobEvent:
        if self.kind is JobEventKind.PHASE and self.phase is None:
            raise ValueError("a phase event names its phase")
        if self.kind is JobEventKind.END and self.reason is None:
            raise ValueError("an end event gives its reason")
        if not self.event_id:
            text = "\x1f".join(
                str(v)
                for v in (
                    self.job_id, self.kind.value, self.ts.isoformat(), self.step, self.phase,
                    self.reason, self.run, self.source,
                )
            )  # fmt: skip
            object.__setattr__(self, "event_id", hashlib.sha256(text.encode()).hexdigest()[:32])
        return self
