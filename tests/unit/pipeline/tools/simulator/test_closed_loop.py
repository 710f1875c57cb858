"""What ``stepguard simulate --control`` and ``stepguard demo`` share: dating a job
played faster than real time by the wall clock, and taking the job's commands at step
boundaries (relaunches included)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pipeline.tools.simulator import (
    RUN_MARGIN,
    SimulatedJob,
    back_dating_s,
    find_scenario,
    start_from_now,
)
from pipeline.tools.simulator.closed_loop import at_step_boundary
from pipeline.tools.simulator.control import JobController
from schemas import ActuatorMode, Command, CommandKind, CommandStatus

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize("speed", [2.0, 8.0, 32.0])
def test_a_job_faster_than_real_time_is_never_ahead_of_the_wall_clock(speed):
    sc = find_scenario("ci_smoke")
    start = start_from_now(sc, speed, now=NOW)
    expected_s = sc.steps * sc.nominal_step_s * RUN_MARGIN
    for elapsed in (0.0, expected_s / 2, expected_s):  # event seconds into the job
        event_time = start + timedelta(seconds=elapsed)
        wall = NOW + timedelta(seconds=elapsed / speed)  # when it is played
        assert event_time <= wall
    # and its last expected event is dated when it is played, not long before
    last = start + timedelta(seconds=expected_s)
    assert abs((last - (NOW + timedelta(seconds=expected_s / speed))).total_seconds()) < 1e-6


def test_at_or_below_real_time_the_job_starts_now_and_max_speed_gains_it_all():
    sc = find_scenario("ci_smoke")
    assert start_from_now(sc, 1.0, now=NOW) == NOW
    assert start_from_now(sc, 0.25, now=NOW) == NOW
    whole = timedelta(seconds=sc.steps * sc.nominal_step_s * RUN_MARGIN)
    assert start_from_now(sc, None, now=NOW) == NOW - whole
    with pytest.raises(ValueError, match="speed must be positive"):
        back_dating_s(sc, -1.0)


class FakeListener:
    """The listener's side of the loop: hands over commands, records reports."""

    def __init__(self, controller: JobController) -> None:
        self.controller = controller
        self.inbox: list[Command] = []
        self.reports: list[tuple[str, CommandStatus, str]] = []

    def poll_step_boundary(self, step: int, wait_s: float = 0.0) -> list[Command]:
        out, self.inbox = self.inbox, []
        for cmd in out:  # checkpoints and isolations run as the real listener's callbacks
            if cmd.kind is CommandKind.CHECKPOINT:
                self.controller.checkpoint(cmd, step)
            elif cmd.kind is CommandKind.ISOLATE:
                self.controller.isolate(cmd, step)
        return out

    def report(self, cmd: Command, status: CommandStatus, detail: str = "") -> None:
        self.reports.append((cmd.command_id, status, detail))


def _cmd(kind: CommandKind, **kw: Any) -> Command:
    return Command(command_id=f"c-{kind.value}", kind=kind, job_id="ci_smoke", reason=("fp",),
                   mode=ActuatorMode.AUTO, issued_at=NOW, **kw)  # fmt: skip


def test_a_restart_taken_at_a_boundary_relaunches_the_job_once_its_checkpoint_is_saved():
    job = SimulatedJob(find_scenario("ci_smoke"))
    controller = JobController(job)
    listener = FakeListener(controller)
    controller.listener = listener
    seen: list[tuple[int, str]] = []
    on_event = at_step_boundary(listener, controller, lambda s, c: seen.append((s, c.kind.value)))
    while job.step < 40:
        job.advance()
        on_event(job)
    listener.inbox = [
        _cmd(CommandKind.CHECKPOINT),
        _cmd(CommandKind.ISOLATE, targets=("node-0005",), replacements=("spare-000",)),
        _cmd(CommandKind.RESTART, targets=("node-0005",), replacements=("spare-000",)),
    ]
    on_event(job)  # taken now; the restart waits for the checkpoint it asked for
    assert [k for _, k in seen] == ["checkpoint", "isolate", "restart"]
    assert controller.relaunches == 0 and not listener.reports
    steps_before = job.step
    while controller.relaunches == 0 and job.step < steps_before + 5:
        job.advance()
        on_event(job)
    assert controller.relaunches == 1, controller.applied
    assert job.checkpoints and job.step == job.checkpoints[-1] + 1  # resumes after it
    assert job.stall_kind == "restart"
    assert "node-0005" not in job.node_names and "spare-000" in job.node_names
    assert listener.reports == [("c-restart", CommandStatus.SUCCEEDED, listener.reports[0][2])]
    assert listener.reports[0][2].startswith("restarted from step")
    assert [kind for _, kind, _ in controller.applied] == ["checkpoint", "isolate", "restart"]
