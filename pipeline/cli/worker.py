"""Subcommands of ``stepguard`` owned by the worker and the exporters.

:mod:`pipeline.cli.app` adds :data:`commands` to the ``stepguard`` command line.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pipeline.cli.options import alias_of, job_option, pick, scenario_option, speed_option
from pipeline.cli.util import err
from pipeline.io.settings import load_settings

if TYPE_CHECKING:
    from schemas import Command

__all__ = [
    "commands", "export_health", "export_node", "export_rack", "run_job_id", "simulate", "worker",
]  # fmt: skip

commands = typer.Typer()


@commands.command()
def worker(
    loglevel: Annotated[str, typer.Option(help="Faust/worker log level.")] = "warning",
) -> None:
    """Run the detection worker (Faust): steps + health in, graded alerts out.

    Start several in the same STEPGUARD_CONSUMER_GROUP to share partitions.
    """
    from pipeline.services.worker.runner import run_worker

    run_worker(load_settings(), loglevel=loglevel)


@commands.command()
def simulate(
    scenario: Annotated[str, scenario_option()],
    speed: Annotated[float, speed_option()] = 1.0,
    max_speed: Annotated[bool, typer.Option("--max", help="Publish as fast as possible.")] = False,
    truth: Annotated[bool, typer.Option(help="Also publish the ground truth.")] = True,
    lifecycle: Annotated[
        bool, typer.Option(help="Publish the job's start and end (lifecycle topic).")
    ] = True,
    announce_phases: Annotated[
        bool | None,
        typer.Option(
            help="Announce each checkpoint and eval step when it starts (default: as the "
            "scenario says, announce_phases)."
        ),
    ] = None,
    job: Annotated[
        str | None,
        job_option(
            "Job id (default: the scenario's with a random suffix, new every run, "
            "so runs never mix in the archive)."
        ),
    ] = None,
    job_id: Annotated[str | None, alias_of("--job-id")] = None,
    from_now: Annotated[
        bool,
        typer.Option(
            "--from-now/--scenario-time",
            help="Date events from now, the stack's clock (default; faster than real time "
            "an event is held back until it is no more than 80% of "
            "STEPGUARD_MAX_CLOCK_SKEW_S ahead of the wall clock), or by the scenario's "
            "own start time (reproducible runs).",
        ),
    ] = True,
    control: Annotated[
        bool,
        typer.Option(
            "--control",
            help="Act on the job's commands (a CommandListener as its job controller): "
            "isolations, checkpoints and restarts change what is played next. Needs "
            "STEPGUARD_ACTUATOR_PUBLIC_KEYS and STEPGUARD_JOB_CONTROLLER_PRIVATE_KEY (its "
            "results are signed with the job's controller key).",
        ),
    ] = False,
) -> None:
    """Play a scenario to the broker (steps, health, truth, lifecycle) in real time x
    SPEED."""
    from pipeline.tools.simulator import find_scenario, lead_budget_s, start_from_now
    from pipeline.tools.simulator.player import play

    job_id = pick("--job", job, job_id)
    settings = load_settings()
    sc = find_scenario(scenario)
    pace = None if max_speed else speed
    update: dict[str, object] = {"job_id": job_id or run_job_id(sc.job)}
    lead = None
    if from_now:
        update["start_time"] = start_from_now(sc, pace)
        lead = lead_budget_s(settings.max_clock_skew_s)
    sc = sc.model_copy(update=update)
    err.print(f"simulate {sc.name} as job {sc.job}: {sc.nodes} nodes, {sc.steps} steps -> "
              f"{settings.kafka_bootstrap}")  # fmt: skip
    if control:
        from pipeline.tools.simulator import SimulatedJob
        from pipeline.tools.simulator.closed_loop import play_with_controller
        from pipeline.tools.simulator.control import JobController

        controller = JobController(SimulatedJob(sc))
        stats = play_with_controller(
            settings, controller, speed=pace, truth=truth, lifecycle=lifecycle,
            announce_phases=announce_phases, on_command=_print_command, lead_s=lead,
        )  # fmt: skip
        for step, kind, detail in controller.applied:
            err.print(f"job applied at step {step}: {kind} {detail}".rstrip())
    else:
        stats = play(
            settings, sc, speed=pace, truth=truth, lifecycle=lifecycle,
            announce_phases=announce_phases, lead_s=lead,
        )  # fmt: skip
    err.print(
        f"published {stats.steps} steps: {stats.step_messages} step messages, "
        f"{stats.health_messages} health reports, {stats.truth_messages} truth; "
        f"{stats.wall_s:.1f} s"
    )


def _print_command(step: int, cmd: Command) -> None:
    err.print(f"step {step}: {cmd.kind.value} {list(cmd.targets)} ({cmd.command_id})")


def run_job_id(base: str) -> str:
    """A job id of its own for one run of a scenario: ``<base>-<6 hex digits>``.

    >>> import re
    >>> bool(re.fullmatch(r"ci_smoke-[0-9a-f]{6}", run_job_id("ci_smoke")))
    True
    """
    import secrets

    return f"{base[:240]}-{secrets.token_hex(3)}"


@commands.command("export-health")
def export_health(
    node: Annotated[str | None, typer.Option(help="Node name (default: hostname).")] = None,
    job: Annotated[str | None, job_option("Job running on this node.")] = None,
    job_id: Annotated[str | None, alias_of("--job-id")] = None,
    interval: Annotated[float, typer.Option(min=0.5, help="Seconds between reports.")] = 10.0,
    once: Annotated[bool, typer.Option(help="One report, then exit.")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print reports as JSON instead of sending.")
    ] = False,
    from_dcgm: Annotated[
        str | None,
        typer.Option(
            "--from-dcgm",
            metavar="URL",
            help="Scrape a running dcgm-exporter (e.g. http://localhost:9400/metrics) "
            "instead of reading NVML; nodes come from its Hostname label.",
        ),
    ] = None,
) -> None:
    """Read GPU health through NVML (or a dcgm-exporter) and publish NodeHealth reports."""
    import socket

    from pipeline.agents.dcgm import run_dcgm_exporter
    from pipeline.agents.health import run_health_exporter

    job_id = pick("--job", job, job_id)
    if from_dcgm is not None:
        code = run_dcgm_exporter(
            load_settings(), from_dcgm, node=node or socket.gethostname(), job_id=job_id,
            interval_s=interval, once=once, dry_run=dry_run,
        )  # fmt: skip
        raise typer.Exit(code)
    code = run_health_exporter(
        load_settings(), node=node, job_id=job_id, interval_s=interval, once=once,
        dry_run=dry_run,
    )  # fmt: skip
    raise typer.Exit(code)


@commands.command("export-node")
def export_node(
    socket_path: Annotated[Path, typer.Option("--socket", help="Unix socket to listen on.")],
    ranks_per_node: Annotated[int, typer.Option(min=1, help="Local ranks per step.")] = 8,
    node: Annotated[str | None, typer.Option(help="Node name (default: hostname).")] = None,
    rack: Annotated[
        str | None,
        typer.Option(
            help="HOST:PORT of this rack's aggregator (stepguard export-rack): "
            "steps go there instead of to Kafka."
        ),
    ] = None,
) -> None:
    """Node aggregator: local ranks send over a Unix socket, one message per step."""
    from pipeline.agents.node import run_node_aggregator

    run_node_aggregator(
        load_settings(), socket_path, ranks_per_node=ranks_per_node, node=node,
        rack=_address(rack) if rack else None,
    )  # fmt: skip


@commands.command("export-rack")
def export_rack(
    name: Annotated[str, typer.Option(help="This rack's sender name (not a node's name).")],
    nodes: Annotated[int, typer.Option(min=1, help="Nodes reporting to this rack.")] = 8,
    listen: Annotated[
        str, typer.Option(help="UDP HOST:PORT to receive node messages on.")
    ] = "127.0.0.1:9095",
) -> None:
    """Rack aggregator: node aggregators send here, one message per rack per step."""
    from pipeline.agents.rack import run_rack_aggregator

    run_rack_aggregator(load_settings(), _address(listen), name=name, nodes_per_rack=nodes)


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise typer.BadParameter(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)
