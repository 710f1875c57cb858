"""No single record moves the job's clock or its steps (issue 39, finding 3).

One step record dated +290 s (inside the 300 s skew the worker accepts) moved the tick
clock ahead of the job's frames: CRITICAL hang updates recommending RESTART while the
job kept stepping. Driven as the worker drives the core: its tick clock follows the
newest step record (bounded by ``JobDetection.clock_at``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import pytest

from detectors.frame import NodeStep
from pipeline.tools.simulator import Scenario
from tests.adversary import play

JOB = {"name": "clock", "nodes": 8, "gpus_per_node": 2, "tp": 2, "steps": 160, "seed": 9,
       "base_compute_s": 0.2}  # fmt: skip


def ahead(seconds: float, at_step: int = 60):
    def inject(step: int, msgs: Sequence[NodeStep]) -> list[NodeStep]:
        out = list(msgs)
        if step == at_step:
            m = out[4]
            out[4] = m.model_copy(  # type: ignore[attr-defined]
                update={"ts_end": m.ts_end + timedelta(seconds=seconds),
                        "ts_start": m.ts_start + timedelta(seconds=seconds)}
            )  # fmt: skip
        return out

    return inject


@pytest.mark.parametrize("seconds", [290.0, 30.0, -290.0])
def test_one_record_dated_ahead_does_not_make_the_job_hang(seconds):
    out = play(Scenario.model_validate(JOB), ahead(seconds))
    assert out.job_hangs() == []
    assert out.condemned() == set()


def test_a_step_jump_is_refused_and_forces_nothing_out():
    def jump(step: int, msgs: Sequence[NodeStep]) -> list[NodeStep]:
        out = list(msgs)
        if step == 60:
            out.append(msgs[3].model_copy(update={"step": step + 100_000}))  # type: ignore[attr-defined]
        return out

    out = play(Scenario.model_validate(JOB), jump)
    assert out.refused == 1
    assert out.firing("missing") == [] and out.job_hangs() == []
    assert [a.node for a in out.firing("guardrail")] == ["node-0003"]


def test_a_node_whose_records_are_all_refused_is_its_problem_not_a_job_hang():
    def impostor(step: int, msgs: Sequence[NodeStep]) -> list[NodeStep]:
        # node-0005 claims node-0004's ranks on every step: all its records refused
        return [m.model_copy(update={"samples": msgs[4].samples}) if m.node == "node-0005"  # type: ignore[attr-defined]
                else m for m in msgs]  # fmt: skip

    out = play(Scenario.model_validate(JOB), impostor)
    assert out.job_hangs() == []
    assert "node-0005" in {a.node for a in out.firing("guardrail")}
    assert out.condemned() <= {"node-0005"}


def test_a_lifecycle_event_before_the_jobs_first_step_is_held_until_a_step_confirms_it():
    from detectors.job import JobDetection
    from pipeline.tools.simulator import simulate
    from schemas import EndReason, JobEvent, JobEventKind

    sc = Scenario.model_validate(JOB)
    det = JobDetection(sc.job)
    events = [ev for ev in simulate(sc) if ev.frame is not None][:10]
    end = JobEvent(job_id=sc.job, kind=JobEventKind.END, ts=events[5].frame.to_messages()[0].ts_end,
                   reason=EndReason.COMPLETED)  # fmt: skip
    assert det.on_lifecycle(end) == [] and det.ending is None  # held: no step yet
    for ev in events:
        for m in ev.frame.to_messages():
            det.on_step(m)
    assert det.ended is None


def test_a_health_report_dated_ahead_moves_no_clock():
    """Released at the end of input, a report dated +290 s checked the job for a hang
    290 s after its last step."""
    from tests.adversary import CATALOGUE, SCENARIOS

    sc = Scenario.model_validate(SCENARIOS["trap_blip_8n"])
    out = play(sc, CATALOGUE["health_ahead_290s"][2](60))
    assert out.job_hangs() == []


def test_one_report_with_a_tiny_interval_condemns_no_honest_node():
    """An honest node whose one report said 0.001 s was judged missing (CRITICAL) while
    the job hung: a report interval counts within bounds of the fleet's."""
    from tests.adversary import CATALOGUE, SCENARIOS

    sc = Scenario.model_validate(SCENARIOS["hang_8n"])
    out = play(sc, CATALOGUE["health_tiny_interval"][2](149))
    assert "node-0002" not in out.condemned()
    assert out.job_hangs()  # the hang is still named


def test_a_node_whose_records_stop_being_accepted_mid_job_is_no_job_hang():
    """Its records dead-lettered at the intake from step 50 on (a group id the schema
    refuses): the job keeps stepping, so the node is missing, the job is not hung."""

    def refused_from_50(step: int, msgs: Sequence[NodeStep]) -> list[NodeStep]:
        return [m for m in msgs if m.node != "node-0005" or step < 50]

    out = play(Scenario.model_validate(JOB), refused_from_50)
    assert out.job_hangs() == []
    assert ("missing", "node-0005") in out.named()


def test_the_whole_job_jumping_ahead_is_followed():
    """One node's word is refused; the job's nodes moving on together are the job."""
    from detectors.errors import RefusedRecord
    from detectors.job import JobDetection
    from pipeline.tools.simulator import simulate

    sc = Scenario.model_validate(JOB)
    steps = [list(ev.frame.to_messages()) for ev in simulate(sc) if ev.frame is not None]
    det = JobDetection(sc.job)
    for msgs in steps[:10]:
        for m in msgs:
            det.on_step(m)
    refused = 0
    for msgs in steps[10:20]:  # the job relaunched from a checkpoint 5000 steps on
        for m in msgs:
            later = m.model_copy(  # type: ignore[attr-defined]
                update={"step": m.step + 5000, "ts_end": m.ts_end + timedelta(seconds=30),
                        "ts_start": m.ts_start + timedelta(seconds=30)}
            )  # fmt: skip
            try:
                det.on_step(later)
            except RefusedRecord:
                refused += 1
    assert refused < len(steps[10])  # only until half of the job's nodes had moved on
    assert det.last_step >= 5010
