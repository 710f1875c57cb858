"""What a simulated job says on its lifecycle topic, as training code's exporter does:
its checkpoints and evals when they start (:func:`phase_announcement`), and its
leader's waits for input that last a step or more (:class:`InputWaits`, by the
client's own rule, :class:`~pipeline.client.waits.InputWait`).

One definition for every player of a scenario: ``stepguard simulate`` publishes these
events to the broker (:mod:`pipeline.tools.simulator.player`), and the detection-quality
benchmark hands the same events to the detection core in event time, so the two modes
announce exactly the same phases.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np

from detectors.frame import PHASES, StepFrame
from pipeline.client.waits import InputWait
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


class InputWaits:
    """The ``wait`` events of a simulated job's leader (rank 0), as the client says
    them: once its wait for a step's batch lasts its rule's threshold (a step time,
    :class:`~pipeline.client.waits.InputWait`). A simulated step waits for its data
    at its start."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.rule = InputWait()

    def during(self, frame: StepFrame, after_step: int) -> tuple[float, JobEvent] | None:
        """The wait said while ``frame``'s step ran (after ``after_step``): the event
        time it is said at and the event (dated at the wait's start), or None; learns
        the leader's step time."""
        at = np.flatnonzero(frame.rank == 0)
        if not len(at):
            return None
        i = int(at[0])
        limit = self.rule.threshold_s()
        said = limit is not None and bool(frame.data_wait[i] > limit)
        self.rule.learn(float(frame.step_time[i]), said=said)
        if limit is None or not said:
            return None
        start = frame.ts_start
        return start + limit, job_event(self.scenario, JobEventKind.WAIT, start, after_step)
