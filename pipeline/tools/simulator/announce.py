"""What a simulated job says on its lifecycle topic, as training code's exporter does.

One definition for every player of a scenario: ``stepguard simulate`` publishes these
events to the broker (:mod:`pipeline.tools.simulator.player`), and the detection-quality
benchmark hands the same events to the detection core in event time, so the two modes
announce exactly the same phases.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from detectors.frame import PHASES, StepFrame
from pipeline.tools.simulator.scenario import Scenario
from schemas import JobEvent, JobEventKind, Phase

#: the phases a job announces when they start (``StepExporter.phase``, the client's hooks)
ANNOUNCED = (Phase.CHECKPOINT, Phase.EVAL)


def job_event(
    scenario: Scenario, kind: JobEventKind, ts: float, step: int | None = None, **fields: Any
) -> JobEvent:
    """A lifecycle event of the scenario's job at event time ``ts``."""
    return JobEvent(
        job_id=scenario.job, kind=kind, ts=datetime.fromtimestamp(ts, UTC), step=step,
        source="simulator", **fields,
    )  # fmt: skip


def phase_announcement(scenario: Scenario, frame: StepFrame, after_step: int) -> JobEvent | None:
    """The PHASE event announcing ``frame``'s step when it is a checkpoint or an eval
    (dated at the step's start, after ``after_step``), or None."""
    if not frame.n_ranks:
        return None
    phase = Phase(PHASES[int(frame.phase[0])])
    if phase not in ANNOUNCED:
        return None
    return job_event(scenario, JobEventKind.PHASE, frame.ts_start, after_step, phase=phase)
