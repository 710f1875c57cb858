"""What ``stepguard simulate --control`` and ``stepguard demo`` share: dating a job
played faster than real time by the wall clock, and taking the job's commands at step
boundaries (relaunches included)."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.tools.simulator import (
    LEAD_SHARE,
    RUN_MARGIN,
    SimulatedJob,
    find_scenario,
    lead_budget_s,
    lead_s,
    start_from_now,
)
from pipeline.tools.simulator.closed_loop import at_step_boundary
from pipeline.tools.simulator.control import JobController
from schemas import ActuatorMode, Command, CommandKind, CommandStatus
from tests.clock import day_start

NOW = day_start(hour=12)


@pytest.mark.parametrize("speed", [None, 0.25, 1.0, 8.0, 32.0])
def test_a_played_job_starts_on_the_stacks_clock_never_before_it(speed):
    """Issue 41 item 4: a job played at 8x was back-dated by what the speed-up gains
    (~14 minutes for the demo), so its first alert was older than the stack watching it
    and a relaunch was dated before the command that caused it."""
    sc = find_scenario("ci_smoke")
    assert start_from_now(sc, speed, now=NOW) == NOW


def test_the_lead_over_the_wall_clock_is_what_the_speed_up_gains_and_is_bounded():
    sc = find_scenario("ci_smoke")
    expected_s = sc.steps * sc.nominal_step_s * RUN_MARGIN
    assert lead_s(sc, 1.0) == lead_s(sc, 0.25) == 0.0
    assert lead_s(sc, 8.0) == pytest.approx(expected_s * 7 / 8)
    assert lead_s(sc, None) == expected_s
    assert lead_budget_s(300.0) == 300.0 * LEAD_SHARE < 300.0  # inside the services' skew
    with pytest.raises(ValueError, match="speed must be positive"):
        lead_s(sc, -1.0)


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
