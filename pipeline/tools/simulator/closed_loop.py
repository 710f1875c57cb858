"""A simulated job played to the broker with its job controller: the closed loop.

``stepguard simulate --control`` (and so ``stepguard up --scenario``) and ``stepguard
demo`` play a job this one way, so that they cannot drift: a
:class:`~pipeline.client.listener.CommandListener` reads the actuator's commands, and at every
step boundary the :class:`~pipeline.tools.simulator.control.JobController` takes what arrived
(checkpoints and isolations at once, RESTART/ROLLBACK queued) and runs the queued
relaunches whose checkpoint is saved, so what is played next shows their effect.

Clocks: the listener dates its results and lifecycle announcements by the job's event
time (back-dated at SPEED > 1, :mod:`pipeline.tools.simulator.timing`), so they agree with its
steps, and judges commands on the wall clock, as the actuator dates them (a command is
refused when issued beyond the wall clock + ``STEPGUARD_MAX_CLOCK_SKEW_S``).

Not imported by :mod:`pipeline.tools.simulator` itself (that package stays pure, no broker).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from pipeline.client.listener import CommandListener
from pipeline.io.settings import Settings
from pipeline.tools.simulator.control import JobController
from pipeline.tools.simulator.job import SimulatedJob
from pipeline.tools.simulator.player import PlayStats, play
from schemas import Command

__all__ = ["at_step_boundary", "play_with_controller"]

#: ``on_command(step, command)``: told of every command taken at a step boundary
OnCommand = Callable[[int, Command], None]


def at_step_boundary(
    listener: CommandListener, controller: JobController, on_command: OnCommand | None = None
) -> Callable[[SimulatedJob], None]:
    """The player's ``on_event``: after each event, take the commands that arrived and
    run the relaunches that are due.

    Checkpoints and isolations are applied by the listener's callbacks as it hands them
    over; RESTART/ROLLBACK are queued on the controller, which relaunches once their
    requested checkpoint is saved (:meth:`JobController.at_boundary`) and reports them.
    """

    def on_event(job: SimulatedJob) -> None:
        pending = listener.poll_step_boundary(job.step)
        if on_command is not None:
            for cmd in pending:
                on_command(job.step, cmd)
        controller.queue(pending)
        controller.at_boundary()

    return on_event


def play_with_controller(
    settings: Settings,
    controller: JobController,
    *,
    speed: float | None,
    truth: bool = True,
    lifecycle: bool = True,
    announce_phases: bool | None = None,
    on_command: OnCommand | None = None,
    name: str = "simulated-job",
    lead_s: float | None = None,
) -> PlayStats:
    """Play ``controller.job`` to the broker with a command listener as its job
    controller, and close the listener when the job ends.

    Parameters
    ----------
    settings
        Broker, topics and keys: ``STEPGUARD_ACTUATOR_PUBLIC_KEYS`` verify commands,
        ``STEPGUARD_JOB_CONTROLLER_PRIVATE_KEY`` (this job's) signs the results (never the
        executors' key).
    controller
        Applies commands to its job; its ``applied`` list says what the job did.
    speed
        Event time x this in real time (``None``: as fast as possible).
    on_command
        Called with ``(step, command)`` for each command taken at a step boundary.
    name
        The executor name on the listener's results.
    lead_s
        The most an event may be dated ahead of the wall clock (:func:`.player.play`).
    """
    job = controller.job
    listener = CommandListener(
        settings, job.scenario.job, name=name, on_checkpoint=controller.checkpoint,
        on_isolate=controller.isolate, clock=lambda: datetime.fromtimestamp(job.ts, UTC),
    ).start()  # fmt: skip
    controller.listener = listener
    try:
        return play(
            settings, job.scenario, speed=speed, truth=truth, lifecycle=lifecycle,
            announce_phases=announce_phases, job=job,
            on_event=at_step_boundary(listener, controller, on_command), lead_s=lead_s,
        )  # fmt: skip
    finally:
        listener.close()
