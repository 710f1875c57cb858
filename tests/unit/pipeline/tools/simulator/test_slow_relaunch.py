"""Issue 44: a relaunch is not a hang. The closed loop in process (the simulated job,
its controller, the detection core and the actuator's policy in auto mode, as
``stepguard compare`` plays it): a straggler is replaced with one relaunch, and the
relaunch, however slow (a scheduler queue, a container start), raises no hang."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from detectors.job import JobDetection
from pipeline.policy import Policy, PolicyParams
from pipeline.tools.simulator import Scenario
from pipeline.tools.simulator.control import JobController
from pipeline.tools.simulator.job import SimulatedJob
from schemas import ActuatorMode, Alert, AlertKind, AlertState, CommandKind


def closed_loop(scenario: Scenario) -> tuple[JobController, list[Alert], set[str]]:
    """Every alert of the run, and the states the job was seen in."""
    job = SimulatedJob(scenario)
    controller = JobController(job)
    det = JobDetection(scenario.job)
    policy = Policy(
        PolicyParams(
            mode=ActuatorMode.AUTO, spare_nodes=tuple(job.spare_pool),
            default_job_nodes=scenario.nodes,
        )
    )  # fmt: skip
    alerts: list[Alert] = []
    states: set[str] = set()
    relaunches = 0
    for ev in job.events():
        now = datetime.fromtimestamp(ev.ts, UTC)
        out = [a for h in ev.health for a in det.on_health(h)]
        if ev.frame is not None:
            out += det.on_frame(ev.frame)
        out += det.tick(ev.ts)
        alerts += out
        states.add(det.state)
        commands = [c for a in out for c in policy.on_alert(a, now).commands]
        for cmd in commands:
            if cmd.kind is CommandKind.CHECKPOINT:
                controller.checkpoint(cmd, job.step)
            elif cmd.kind is CommandKind.ISOLATE:
                controller.isolate(cmd, job.step)
        controller.queue(commands)
        controller.at_boundary()
        if controller.relaunches > relaunches:
            relaunches = controller.relaunches
            det.relaunched(removed_nodes=job.isolated)
    return controller, alerts, states


@pytest.mark.parametrize("relaunch_s", [90.0, 400.0])
def test_a_slow_relaunch_is_relaunching_never_a_hang(relaunch_s):
    """Issue 44 2c: a relaunch longer than the old grace (30 s, or 20 step times) was
    a WARNING hang, then a CRITICAL one recommending a second RESTART."""
    scenario = Scenario.model_validate(
        {"name": "slow-relaunch", "nodes": 16, "pp": 2, "steps": 200, "warmup_steps": 10,
         "seed": 11, "checkpoint_every": 50, "relaunch_s": relaunch_s,
         "faults": [{"kind": "straggler", "node": 5, "gpu": 3, "onset_step": 60,
                     "magnitude": 0.3}]}
    )  # fmt: skip
    controller, alerts, states = closed_loop(scenario)
    assert controller.relaunches == 1, controller.applied
    assert "relaunching" in states and "relaunch_stuck" not in states
    firing = [(a.kind, a.grade, a.node) for a in alerts if a.state is AlertState.FIRING]
    assert firing and all(kind is AlertKind.STRAGGLER and node == "node-0005"
                          for kind, _, node in firing), firing  # fmt: skip
