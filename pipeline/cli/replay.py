"""``stepguard replay``: recorded telemetry through the detection core, offline
(:mod:`pipeline.tools.replay`; :mod:`pipeline.cli.app` adds :data:`commands`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipeline.cli.options import job_option, json_flag, out_option
from pipeline.cli.util import console, err
from pipeline.io.settings import load_settings

__all__ = ["commands"]

commands = typer.Typer()


@commands.command()
def replay(
    file: Annotated[Path, typer.Argument(help="Recorded telemetry: JSONL, CSV or Parquet.")],
    job: Annotated[str | None, job_option("The job to replay (default: the file's first).")] = None,
    fmt: Annotated[
        str | None,
        typer.Option("--format", help="jsonl, csv or parquet (default: from the suffix)."),
    ] = None,
    columns: Annotated[
        str | None,
        typer.Option(help="CSV, Parquet: field=column pairs, e.g. 'rank=global_rank,step=iter'."),
    ] = None,
    time_unit: Annotated[
        str, typer.Option(help="CSV, Parquet: unit of numeric times (s, ms, us, ns since 1970).")
    ] = "s",
    health: Annotated[Path | None, typer.Option(help="NodeHealth JSONL to play along.")] = None,
    events: Annotated[Path | None, typer.Option(help="JobEvent JSONL to play along.")] = None,
    redate: Annotated[
        bool, typer.Option("--redate", help="Move every time so the job ends now.")
    ] = False,
    tick: Annotated[
        float, typer.Option(min=0.001, help="Event seconds between the core's clock ticks.")
    ] = 1.0,
    config: Annotated[
        Path | None,
        typer.Option(help="Detector settings file (default: STEPGUARD_DETECTOR_CONFIG)."),
    ] = None,
    archive: Annotated[
        bool,
        typer.Option("--archive", help="Write the job and its alerts into the archive."),
    ] = False,
    as_json: Annotated[
        bool, json_flag("Alerts, refusals and summary as JSON on standard output.")
    ] = False,
    out: Annotated[Path | None, out_option("Also write that JSON to this file.")] = None,
) -> None:
    """Play recorded per-rank step telemetry through the detection core in event time:
    the alerts, the rows refused and a summary (docs/replay.md)."""
    from pipeline.tools.replay_run import ReplayOptions, run_replay

    opts = ReplayOptions(
        path=file, job=job, fmt=fmt, columns=columns, time_unit=time_unit, health=health,
        events=events, redate=redate, tick_s=tick, config=config, archive=archive,
        json_stdout=as_json, out=out,
    )  # fmt: skip
    run_replay(load_settings(), console, err, opts)
