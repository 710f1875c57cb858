"""Subcommands of ``stepguard`` owned by the worker and the exporters.

:mod:`pipeline.cli` adds :data:`commands` to the ``stepguard`` command line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipeline.cliutil import err
from pipeline.settings import load_settings

__all__ = ["commands", "export_health", "export_node", "simulate", "worker"]

commands = typer.Typer()


@commands.command()
def worker(
    loglevel: Annotated[str, typer.Option(help="Faust/worker log level.")] = "warning",
) -> None:
    """Run the detection worker (Faust): steps + health in, graded alerts out.

    Start several in the same STEPGUARD_CONSUMER_GROUP to share partitions.
    """
    from pipeline.worker.runner import run_worker

    run_worker(load_settings(), loglevel=loglevel)


@commands.command()
def simulate(
    scenario: Annotated[str, typer.Argument(help="Scenario name (suite/demo) or YAML path.")],
    speed: Annotated[
        float, typer.Option(min=0.001, help="Play event time x SPEED in real time.")
    ] = 1.0,
    max_speed: Annotated[bool, typer.Option("--max", help="Publish as fast as possible.")] = False,
    truth: Annotated[bool, typer.Option(help="Also publish the ground truth.")] = True,
    lifecycle: Annotated[
        bool, typer.Option(help="Publish the job's start and end (lifecycle topic).")
    ] = True,
    announce_phases: Annotated[
        bool, typer.Option(help="Announce each checkpoint and eval step when it starts.")
    ] = False,
) -> None:
    """Play a scenario to the broker (steps, health, truth, lifecycle) in real time x
    SPEED."""
    from pipeline.exporters.player import play
    from pipeline.simulator import find_scenario

    settings = load_settings()
    sc = find_scenario(scenario)
    err.print(f"simulate {sc.name}: {sc.nodes} nodes, {sc.steps} steps -> "
              f"{settings.kafka_bootstrap}")  # fmt: skip
    stats = play(
        settings, sc, speed=None if max_speed else speed, truth=truth, lifecycle=lifecycle,
        announce_phases=announce_phases,
    )  # fmt: skip
    err.print(
        f"published {stats.steps} steps: {stats.step_messages} step messages, "
        f"{stats.health_messages} health reports, {stats.truth_messages} truth; "
        f"{stats.wall_s:.1f} s"
    )


@commands.command("export-health")
def export_health(
    node: Annotated[str | None, typer.Option(help="Node name (default: hostname).")] = None,
    job_id: Annotated[str | None, typer.Option(help="Job running on this node.")] = None,
    interval: Annotated[float, typer.Option(min=0.5, help="Seconds between reports.")] = 10.0,
    once: Annotated[bool, typer.Option(help="One report, then exit.")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print reports as JSON instead of sending.")
    ] = False,
) -> None:
    """Read GPU health through NVML and publish NodeHealth reports."""
    from pipeline.exporters.health import run_health_exporter

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
) -> None:
    """Node aggregator: local ranks send over a Unix socket, one message per step."""
    from pipeline.exporters.node import run_node_aggregator

    run_node_aggregator(load_settings(), socket_path, ranks_per_node=ranks_per_node, node=node)
