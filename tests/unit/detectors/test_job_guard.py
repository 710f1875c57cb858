"""Issue 22, the detection core: what a job's unsigned lifecycle events and health
reports may change, and no more (:mod:`detectors.job_guard`)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from detectors.job import JobDetection
from detectors.job_guard import MAX_OUTSIDERS, LifecycleLimits
from pipeline.io.errors import CapacityError
from schemas import (
    AlertKind,
    AlertState,
    EndReason,
    Grade,
    JobEventKind,
    NodeHealth,
    Phase,
    RankSample,
    RecommendedAction,
    StepTelemetry,
)
from tests.unit.detectors.test_job import STEP_S, firing, frame, health, lifecycle, warm


def _lifecycle_alerts(alerts):
    return [a for a in alerts if a.kind is AlertKind.LIFECYCLE]


def test_an_end_followed_by_steps_is_refused_and_the_job_stays_watched() -> None:
    """Item 1: one unsigned end while the job runs resolved its episodes and dropped its
    state; the job then hung unseen. Its next step refuses the end (a WARNING), and a
    hang after it is raised."""
    det = JobDetection("job")
    warm(det, 30)
    got = det.on_lifecycle(lifecycle(JobEventKind.END, det.now, reason=EndReason.COMPLETED,
                                     step=29))  # fmt: skip
    assert got == [] and det.ending == "completed" and det.ended is None
    refused = _lifecycle_alerts(det.on_frame(frame(30)))
    assert [(a.grade, a.state) for a in refused] == [(Grade.WARNING, AlertState.FIRING)]
    assert "after an end" in refused[0].summary and det.ending is None
    assert refused[0].recommended_action is RecommendedAction.INVESTIGATE
    assert firing(det.tick(det.now + 10 * STEP_S), AlertKind.HANG)  # still watched
    assert det.ended is None


def test_an_end_naming_a_step_the_job_passed_is_refused_at_once() -> None:
    det = JobDetection("job")
    warm(det, 30)
    got = det.on_lifecycle(lifecycle(JobEventKind.END, det.now, reason=EndReason.FAILED, step=3))
    assert [a.kind for a in got] == [AlertKind.LIFECYCLE] and det.ending is None
    assert firing(det.tick(det.now + 10 * STEP_S), AlertKind.HANG)


def test_an_end_dated_ahead_is_cut_to_the_jobs_time() -> None:
    """An end dated minutes ahead made the worker ignore every record before it."""
    det = JobDetection("job")
    warm(det, 30)
    ahead = det.now + 240.0
    got = det.on_lifecycle(lifecycle(JobEventKind.END, ahead, reason=EndReason.COMPLETED))
    assert "ahead" in _lifecycle_alerts(got)[0].summary
    assert det.guard.ending is not None and det.guard.ending.ts == det.now  # cut short
    # a step completing after the (cut) end refuses it
    assert _lifecycle_alerts(det.on_frame(frame(30)))
    assert det.ending is None


def test_a_phase_longer_than_the_maximum_is_cut_to_it() -> None:
    """Item 2: a phase of seven days gave the hang clock about ten days. The schema now
    takes a day at most, and the worker cuts even that to its configured maximum."""
    with pytest.raises(ValueError, match="less than or equal to 86400"):
        lifecycle(JobEventKind.PHASE, 0.0, phase=Phase.CHECKPOINT, expected_s=7 * 86400.0)
    limits = LifecycleLimits(max_phase_s=20 * STEP_S)
    det = JobDetection("job", limits=limits)
    warm(det, 30)
    day = lifecycle(JobEventKind.PHASE, det.now, phase=Phase.CHECKPOINT, expected_s=86400.0,
                    step=29)  # fmt: skip
    cut = _lifecycle_alerts(det.on_lifecycle(day))
    assert cut and "STEPGUARD_MAX_PHASE_S" in cut[0].summary
    start = det.now
    assert not firing(det.tick(start + 15 * STEP_S), AlertKind.HANG)  # within the allowance
    assert firing(det.tick(start + 60 * STEP_S), AlertKind.HANG)  # not ten days


def test_a_phase_far_beyond_the_jobs_progress_is_refused() -> None:
    det = JobDetection("job")
    warm(det, 30)
    far = lifecycle(JobEventKind.PHASE, det.now, phase=Phase.CHECKPOINT, expected_s=3000.0,
                    step=10**15)  # fmt: skip
    refused = _lifecycle_alerts(det.on_lifecycle(far))
    assert refused and "refused" in refused[0].summary
    assert firing(det.tick(det.now + 10 * STEP_S), AlertKind.HANG)  # no allowance given


def test_a_wait_for_input_gives_the_next_step_a_slower_pace_and_no_more() -> None:
    """Issue 23: the leader's ``wait`` (its data loader stalls) allows the step in
    progress 1.5 x 10 median steps from the wait's start, not a hang at 2.5."""
    det = JobDetection("job")
    warm(det, 30)
    start = det.now
    assert det.on_lifecycle(lifecycle(JobEventKind.WAIT, start, step=29)) == []
    assert not firing(det.tick(start + 10 * STEP_S), AlertKind.HANG)
    assert firing(det.tick(start + 16 * STEP_S), AlertKind.HANG)


def test_a_wait_far_beyond_the_jobs_progress_or_naming_no_step_gives_nothing() -> None:
    det = JobDetection("job")
    warm(det, 30)
    far = lifecycle(JobEventKind.WAIT, det.now, step=10**15)
    refused = _lifecycle_alerts(det.on_lifecycle(far))
    assert refused and "refused" in refused[0].summary
    assert det.on_lifecycle(lifecycle(JobEventKind.WAIT, det.now)) == []  # no step
    assert firing(det.tick(det.now + 4 * STEP_S), AlertKind.HANG)


def test_anomalies_are_one_episode_per_kind_resolved_when_the_job_ends() -> None:
    det = JobDetection("job", limits=LifecycleLimits(max_phase_s=5.0, end_confirm_s=10.0))
    warm(det, 30)
    phase = lifecycle(JobEventKind.PHASE, det.now, phase=Phase.EVAL, expected_s=100.0, step=29)
    first, second = det.on_lifecycle(phase), det.on_lifecycle(phase)
    assert first[0].fingerprint == second[0].fingerprint and second[0].seq == first[0].seq + 1
    det.on_lifecycle(lifecycle(JobEventKind.END, det.now, reason=EndReason.COMPLETED, step=29))
    done = _lifecycle_alerts(det.tick(det.now + 11.0))
    assert det.ended == "completed"
    assert [(a.fingerprint, a.state) for a in done] == [(first[0].fingerprint,
                                                          AlertState.RESOLVED)]  # fmt: skip


def _ecc(node: str, ts: float) -> NodeHealth:
    report = health(0, ts)
    gpu = report.gpus[0].model_copy(update={"ecc_uncorrected": 1})
    return report.model_copy(update={"node": node, "gpus": (gpu,)})


def test_health_of_a_node_outside_the_job_is_never_graded_for_it() -> None:
    """Item 3: a drain XID naming a node that never sent a step of the job was graded
    (and the actuator isolated it). An outside node is one INFO, recommending nothing."""
    det = JobDetection("job")
    warm(det, 30)
    alerts = det.on_health(_ecc("node-99", det.now - 0.5)) + det.on_frame(frame(30))
    alerts += det.on_health(_ecc("node-99", det.now - 0.4)) + det.on_frame(frame(31))
    outside = [a for a in alerts if a.node == "node-99"]
    assert [(a.grade, a.state, a.recommended_action) for a in outside] == [
        (Grade.INFO, AlertState.RESOLVED, RecommendedAction.NONE)
    ]
    assert det.guard.outside_reports == 2
    # a member's report is graded as before
    member = det.on_health(_ecc("node-3", det.now - 0.5)) + det.on_frame(frame(32))
    assert [a.grade for a in member if a.node == "node-3"] == [Grade.CRITICAL]


def test_a_node_declared_by_the_jobs_start_is_a_member() -> None:
    det = JobDetection("job")
    start = lifecycle(JobEventKind.START, 0.0, nodes=("spare-7",))
    assert det.on_lifecycle(start) == []
    warm(det, 30)
    got = det.on_health(_ecc("spare-7", det.now - 0.5)) + det.on_frame(frame(30))
    assert [a.grade for a in got if a.node == "spare-7"] == [Grade.CRITICAL]


def test_outside_nodes_noticed_are_bounded() -> None:
    det = JobDetection("job")
    warm(det, 30)
    alerts = []
    for n in range(MAX_OUTSIDERS + 10):
        alerts += det.on_health(_ecc(f"stranger-{n}", det.now - 0.5))
    alerts += det.on_frame(frame(30))
    assert len([a for a in alerts if a.node and a.node.startswith("stranger")]) == MAX_OUTSIDERS


def test_nodes_per_job_are_bounded() -> None:
    """Also: nodes per job were unbounded (a node name per message; reusing one rank
    under many names is refused before that, see test_membership.py)."""
    det = JobDetection("job", max_nodes=2)
    t = datetime.fromtimestamp(0, UTC)

    def msg(node: str, rank: int) -> StepTelemetry:
        sample = RankSample(rank=rank, local_rank=0, step_time_s=1, compute_s=1, comm_wait_s=0,
                            data_wait_s=0)  # fmt: skip
        return StepTelemetry(job_id="job", node=node, step=0, ts_start=t, ts_end=t,
                             samples=(sample,))  # fmt: skip

    det.on_step(msg("a", 0))
    det.on_step(msg("b", 1))
    with pytest.raises(CapacityError, match="more than 2 nodes"):
        det.on_step(msg("c", 2))
    assert det.guard.members == {"a", "b"}
