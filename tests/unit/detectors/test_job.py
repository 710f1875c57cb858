"""The one detection core: its event-time ordering, relaunches, bounds and state."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from detectors.frame import StepFrame
from detectors.job import JobDetection
from pipeline.io import statecodec
from pipeline.io.errors import CapacityError
from pipeline.tools.simulator import Scenario, simulate
from schemas import (
    ActuatorMode,
    Alert,
    AlertKind,
    AlertState,
    Command,
    CommandKind,
    CommandResult,
    CommandStatus,
    EndReason,
    GpuHealth,
    Grade,
    JobEvent,
    JobEventKind,
    NodeHealth,
    Phase,
    RecommendedAction,
)
from tests.clock import day_start

T0 = day_start().timestamp()
STEP_S = 1.3
NODES = 8


def frame(step: int, ts_shift: float = 0.0) -> StepFrame:
    """A healthy step of 8 nodes x 8 ranks ending at T0 + 1.3 (step + 1)."""
    rng = np.random.default_rng(step)
    compute = 1.0 + 0.005 * rng.standard_normal(NODES * 8)
    return StepFrame.from_arrays(
        "job",
        step,
        ts=T0 + STEP_S * (step + 1) + ts_shift,
        compute=compute,
        comm_wait=compute.max() + 0.05 - compute,
    )


def health(node: int, ts: float, xid: tuple[int, ...] = ()) -> NodeHealth:
    gpu = GpuHealth(
        index=0, temperature_c=60, power_w=500, sm_clock_mhz=1800, utilization_pct=99,
        xid_codes=xid,
    )  # fmt: skip
    return NodeHealth(
        job_id="job", node=f"node-{node}", ts=datetime.fromtimestamp(ts, UTC), gpus=(gpu,)
    )


def command(kind: CommandKind, cid: str = "cmd-1", targets: tuple[str, ...] = ()) -> Command:
    return Command(
        command_id=cid, kind=kind, job_id="job", targets=targets, reason=("f",),
        mode=ActuatorMode.AUTO, issued_at=datetime.fromtimestamp(T0, UTC),
    )  # fmt: skip


def result(cid: str = "cmd-1", status: CommandStatus = CommandStatus.SUCCEEDED) -> CommandResult:
    return CommandResult(
        command_id=cid, job_id="job", executor="job", status=status,
        ts=datetime.fromtimestamp(T0, UTC),
    )  # fmt: skip


def warm(det: JobDetection, steps: int = 30) -> list[Alert]:
    out: list[Alert] = []
    for s in range(steps):
        out += det.on_frame(frame(s))
    return out


def firing(alerts: list[Alert], kind: AlertKind) -> list[Alert]:
    return [a for a in alerts if a.kind is kind and a.state is AlertState.FIRING]


def test_health_waits_until_the_steps_pass_its_event_time() -> None:
    det = JobDetection("job")
    warm(det, 10)
    ahead = det.now + 3 * STEP_S  # a report sent while three steps are still in flight
    assert det.on_health(health(1, ahead, xid=(79,))) == []
    assert det.held_health == 1
    assert det.on_frame(frame(10)) == [] and det.held_health == 1
    det.on_frame(frame(11))
    got = det.on_frame(frame(12))  # ends at or after the report: processed just before
    assert det.held_health == 0
    assert [(a.kind, a.grade, a.node) for a in firing(got, AlertKind.HARDWARE)] == [
        (AlertKind.HARDWARE, Grade.CRITICAL, "node-1")
    ]


def test_a_tick_releases_the_reports_of_a_stalled_job_at_their_own_time() -> None:
    det = JobDetection("job")
    warm(det, 30)
    last = det.now
    det.on_health(health(2, last + 0.5, xid=(79,)))
    got = det.tick(last + 0.6)  # 0.5 step times of silence: no hang yet, the XID is news
    assert det.held_health == 0
    assert [a.kind for a in firing(got, AlertKind.HARDWARE)] == [AlertKind.HARDWARE]
    assert firing(got, AlertKind.HANG) == []
    assert firing(det.tick(last + 4 * STEP_S), AlertKind.HANG)  # and the clock runs on


def test_a_report_ahead_of_the_steps_cannot_make_the_job_look_hung() -> None:
    """The job runs; its steps lag on their partition, health arrives 10 steps ahead."""
    det = JobDetection("job")
    alerts = warm(det, 30)
    for n in range(NODES):
        alerts += det.on_health(health(n, det.now + 10 * STEP_S))
    for s in range(30, 45):
        alerts += det.on_frame(frame(s))
    assert firing(alerts, AlertKind.HANG) == []


def test_ticks_never_go_back_and_a_tick_at_a_checked_time_does_nothing() -> None:
    det = JobDetection("job")
    warm(det, 30)
    assert firing(det.tick(det.now + 10 * STEP_S), AlertKind.HANG)
    now = det.now
    assert det.tick(now) == [] and det.tick(now - 5) == []
    assert det.now == now


def test_a_relaunching_command_gives_the_relaunch_grace() -> None:
    plain, commanded = JobDetection("job"), JobDetection("job")
    for det in (plain, commanded):
        warm(det, 30)
    commanded.on_command(command(CommandKind.RESTART))
    later = plain.now + 5 * STEP_S  # 5 step times of silence
    assert firing(plain.tick(later), AlertKind.HANG)
    assert firing(commanded.tick(later), AlertKind.HANG) == []
    assert commanded.relaunches == 0  # issued, not carried out yet
    assert commanded.on_command(command(CommandKind.CHECKPOINT, "cmd-2")) == []


def test_a_result_before_its_command_waits_for_it() -> None:
    det = JobDetection("job")
    warm(det, 30)
    det.on_result(result("cmd-9"))
    assert det.relaunches == 0
    det.on_command(command(CommandKind.ROLLBACK, "cmd-9"))
    assert det.relaunches == 1
    det.on_command(command(CommandKind.ISOLATE, "cmd-10", ("node-3",)))
    det.on_result(result("cmd-10"))  # an isolation is not a relaunch carried out
    det.on_result(result("cmd-11", CommandStatus.FAILED))
    assert det.relaunches == 1


def test_remembered_commands_and_held_reports_are_bounded() -> None:
    det = JobDetection("job", max_held_health=2, max_commands=3)
    warm(det, 10)
    for i in range(10):
        det.on_command(command(CommandKind.RESTART, f"cmd-{i}"))
        det.on_result(result(f"orphan-{i}"))
    assert len(det._commands) == 3 and len(det._orphans) == 3
    far = det.now + 1000.0
    got: list[Alert] = []
    for n in range(3):
        got += det.on_health(health(n, far + n, xid=(79,) if n == 0 else ()))
    assert det.held_health == 2  # the oldest went through at once
    assert [a.node for a in firing(got, AlertKind.HARDWARE)] == ["node-0"]


def test_records_of_another_job_are_refused() -> None:
    det = JobDetection("job")
    other = StepFrame.from_arrays("other", 0, ts=T0, compute=np.ones(8), comm_wait=np.zeros(8))
    with pytest.raises(ValueError, match="other"):
        det.on_frame(other)
    with pytest.raises(ValueError, match="config or suite"):
        JobDetection("job", config=det.suite.config, suite=det.suite)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="max_held_health"):
        JobDetection("job", max_held_health=-1)


def scenario() -> Scenario:
    return Scenario.model_validate(
        {
            "name": "core", "nodes": 16, "steps": 140, "seed": 5,
            "faults": [
                {"kind": "straggler", "node": 4, "gpu": 1, "onset_step": 50, "magnitude": 0.25},
                {"kind": "ecc_storm", "node": 9, "gpu": 3, "onset_step": 90},
            ],
        }
    )  # fmt: skip


def play(det: JobDetection, sc: Scenario, *, messages: bool, cut: int | None = None) -> list:
    out: list[Alert] = []
    for i, ev in enumerate(simulate(sc)):
        if cut is not None and i == cut:
            det = statecodec.loads(statecodec.dumps(det))  # a restart from the snapshot
        for h in ev.health:
            out += det.on_health(h)
        if ev.frame is not None:
            if messages:
                for m in ev.frame.to_messages():
                    out += det.on_step(m).alerts
            else:
                out += det.on_frame(ev.frame)
        out += det.tick(ev.ts)
    out += det.flush()
    return [(a.fingerprint, a.seq, a.kind.value, a.grade.value, a.state.value) for a in out]


def test_node_messages_and_whole_frames_give_the_same_alerts() -> None:
    sc = scenario()
    frames = play(JobDetection(sc.job), sc, messages=False)
    assert {k for _, _, k, _, s in frames if s == "firing"} >= {"straggler", "hardware"}
    assert play(JobDetection(sc.job), sc, messages=True) == frames


def test_state_survives_a_snapshot_round_trip_mid_run() -> None:
    sc = scenario()
    assert play(JobDetection(sc.job), sc, messages=True, cut=70) == play(
        JobDetection(sc.job), sc, messages=True
    )


def lifecycle(kind: JobEventKind, ts: float, **kw: object) -> JobEvent:
    return JobEvent(job_id="job", kind=kind, ts=datetime.fromtimestamp(ts, UTC), **kw)


def test_an_end_resolves_every_open_episode_once_when_no_step_contradicts_it() -> None:
    det = JobDetection("job")
    warm(det, 30)
    assert firing(det.tick(det.now + 10 * STEP_S), AlertKind.HANG)
    end = lifecycle(JobEventKind.END, det.now, reason=EndReason.FAILED)
    assert det.on_lifecycle(end) == [] and det.ending == "failed" and det.ended is None
    confirm = det.guard.limits.end_confirm_s
    assert det.tick(det.now + confirm / 2) == []  # pending: the clock is held
    got = det.tick(det.now + confirm)
    assert [(a.kind, a.state) for a in got] == [(AlertKind.HANG, AlertState.RESOLVED)]
    assert "job ended: failed" in got[0].summary and det.ended == "failed"
    assert det.on_lifecycle(lifecycle(JobEventKind.END, det.now, reason=EndReason.FAILED)) == []


def test_an_announced_phase_waits_for_its_expected_duration_then_hangs() -> None:
    plain, announced = JobDetection("job"), JobDetection("job")
    for det in (plain, announced):
        warm(det, 30)
    start = announced.now
    announced.on_lifecycle(
        lifecycle(JobEventKind.PHASE, start, phase=Phase.CHECKPOINT, expected_s=20 * STEP_S)
    )
    assert firing(plain.tick(start + 10 * STEP_S), AlertKind.HANG)
    assert firing(announced.tick(start + 10 * STEP_S), AlertKind.HANG) == []
    assert firing(announced.tick(start + 60 * STEP_S), AlertKind.HANG)  # 3x: a hang


def test_an_abandoned_job_gets_one_info_notice() -> None:
    det = JobDetection("job")
    warm(det, 30)
    got = det.abandon(det.now + 3600, 3600)
    assert [(a.kind, a.grade, a.state) for a in got] == [
        (AlertKind.MISSING, Grade.INFO, AlertState.RESOLVED)
    ]
    assert det.ended == "abandoned" and "job abandoned" in got[0].summary


def test_a_message_that_would_exceed_the_rank_cap_is_refused_before_anything_grows() -> None:
    det = JobDetection("job", max_ranks=16)
    msgs = frame(0).to_messages()
    for m in msgs[:2]:
        det.on_step(m)
    with pytest.raises(CapacityError, match="STEPGUARD_MAX_RANKS_PER_JOB=16"):
        det.on_step(msgs[2])
    det.on_step(frame(1).to_messages()[1])  # known ranks go on
    with pytest.raises(ValueError, match="max_ranks"):
        JobDetection("job", max_ranks=0)


def test_a_node_left_out_by_a_relaunch_has_its_episodes_resolved() -> None:
    det = JobDetection("job")
    warm(det, 30)
    slow: list[Alert] = []
    for s in range(30, 45):
        f = frame(s)
        f.compute[8:16] *= 1.3  # every rank of node-1
        f.comm_wait[:] = f.compute.max() + 0.05 - f.compute
        slow += det.on_frame(f)
    assert [a.node for a in firing(slow, AlertKind.STRAGGLER)][:1] == ["node-1"]
    det.on_command(command(CommandKind.RESTART, "cmd-5", ("node-1",)))
    got = det.on_result(result("cmd-5"))
    assert {(a.node, a.state) for a in got} == {("node-1", AlertState.RESOLVED)}
    assert all("node-1 left the job (restart cmd-5)" in a.summary for a in got)


def test_a_phase_announced_before_its_previous_step_completes_still_covers_the_phase() -> None:
    """The exporter announces the checkpoint right after step 29; the announcement
    overtakes step 29's last node message. Step 29 completing must not end it."""
    det = JobDetection("job")
    warm(det, 29)
    after = frame(29)
    det.on_lifecycle(
        lifecycle(JobEventKind.PHASE, after.ts, phase=Phase.CHECKPOINT,
                  expected_s=20 * STEP_S, step=29)
    )  # fmt: skip
    assert det.on_frame(after) == []
    assert firing(det.tick(after.ts + 10 * STEP_S), AlertKind.HANG) == []
    assert firing(det.tick(after.ts + 40 * STEP_S), AlertKind.HANG)  # 2x: a hang


def test_alerts_say_whether_their_node_sent_steps_of_the_job() -> None:
    """A health report can name any node; the alert says whether the job's steps showed
    it (signed with the alert, the actuator isolates only such members)."""
    det = JobDetection("job")
    warm(det, 30)
    det.on_health(health(2, det.now + 0.5, xid=(79,)))
    det.on_health(health(99, det.now + 0.5, xid=(79,)))  # never sent a step of the job
    alerts = det.tick(det.now + 0.6)
    got = firing(alerts, AlertKind.HARDWARE)
    assert {(a.node, a.node_in_steps) for a in got} == {("node-2", True)}
    # the outsider's report reaches no detector (it is not a member): what it raises
    # says so and recommends nothing the actuator could act on
    outside = [a for a in alerts if a.node == "node-99"]
    assert outside and all(a.node_in_steps is False for a in outside)
    assert all(a.recommended_action is RecommendedAction.NONE for a in outside)
    assert det.in_steps("node-2") and not det.in_steps("node-99")
    back = statecodec.loads(statecodec.dumps(det))
    assert back.in_steps("node-2")


def test_the_step_in_flight_at_a_restart_does_not_end_the_relaunch_grace() -> None:
    """Issue 25 bug 1: the step that completed right after the RESTART still belonged to
    the old run, ended the grace, and the save-and-relaunch was then scored as a hang
    (answered with a second RESTART)."""
    det = JobDetection("job")
    warm(det, 30)
    restart_at = det.now + 0.5  # step 30 is in flight (it started before this)
    det.on_command(command(CommandKind.RESTART), now=restart_at)
    assert det.on_frame(frame(30)) == []  # the old run's last step completes
    assert firing(det.tick(det.now + 8 * STEP_S), AlertKind.HANG) == []  # still relaunching


def test_a_result_is_acted_on_once_and_only_while_fresh() -> None:
    """Issue 22 item 4: replaying one genuine SUCCEEDED result restarted the relaunch
    grace each time (a hung job stayed "relaunching"); results had no freshness."""
    det = JobDetection("job")
    warm(det, 30)
    det.on_command(command(CommandKind.RESTART, "cmd-r"))
    done = result("cmd-r").model_copy(update={"ts": datetime.fromtimestamp(det.now, UTC)})
    det.on_result(done)
    assert det.relaunches == 1
    det.on_result(done)  # replayed
    assert det.relaunches == 1
    det.on_command(command(CommandKind.RESTART, "cmd-s"))
    old = done.model_copy(update={"command_id": "cmd-s",
                                  "ts": datetime.fromtimestamp(det.now - 601, UTC)})  # fmt: skip
    det.on_result(old)  # dated 10 minutes before the job's time: stale
    assert det.relaunches == 1
