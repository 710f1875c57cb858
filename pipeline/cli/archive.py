"""The archive's commands: ``archiver``, ``archive migrate|prune``, ``query``, ``report``,
``sql`` (:mod:`pipeline.cli.app` adds :data:`commands` to the ``stepguard`` command line)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from pipeline.cli.options import job_option
from pipeline.cli.util import console, err, stop_event
from pipeline.io.settings import load_settings

__all__ = ["commands"]

commands = typer.Typer()
archive_app = typer.Typer(help="The ClickHouse archive: migrations and maintenance.")
commands.add_typer(archive_app, name="archive")


@commands.command()
def archiver(
    max_batch: Annotated[int, typer.Option(min=1, help="Messages per batch, at most.")] = 20000,
    max_wait_s: Annotated[float, typer.Option(min=0.05, help="Seconds per batch, at most.")] = 1.0,
    decode_processes: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Processes decoding the steps topic (0: in this process). "
            "Default: one per core but one, at most 4.",
        ),
    ] = None,
    progress_s: Annotated[
        float, typer.Option(min=0, help="Seconds between progress lines (0: none).")
    ] = 30.0,
) -> None:
    """Archive every topic into ClickHouse; offsets are committed after each insert."""
    from pipeline.io.metrics import ArchiverMetrics, serve_metrics
    from pipeline.services.archive import migrate, open_backend
    from pipeline.services.archive.archiver import Archiver, ArchiverStats
    from pipeline.services.archive.decode_pool import default_decode_processes
    from pipeline.services.archive.serve import query_socket_path

    settings = load_settings()
    metrics = ArchiverMetrics()
    serve_metrics(metrics.registry, settings, "archiver_metrics_port", metrics.readiness)
    backend = open_backend(settings)
    migrate(backend)
    stop = stop_event()
    if decode_processes is None:
        decode_processes = default_decode_processes()
    # on chDB the archiver owns the directory: it answers `stepguard sql/query/report`
    query_socket = None if settings.clickhouse_dsn else query_socket_path(settings.chdb_path)
    service = Archiver(
        settings, backend, max_batch=max_batch, max_wait_s=max_wait_s,
        decode_processes=decode_processes, metrics=metrics, query_socket=query_socket,
    )  # fmt: skip
    err.print(
        f"archiving {settings.kafka_bootstrap} -> {backend.name}:{backend.database} "
        f"({decode_processes} decode processes)"
    )
    if query_socket is not None:
        err.print(f"read-only queries (stepguard sql/query/report) answered on {query_socket}")
    last = (time.monotonic(), 0)

    def progress(stats: ArchiverStats) -> None:
        nonlocal last
        now = time.monotonic()
        rate = (stats.rows - last[1]) / max(now - last[0], 1e-9)
        last = (now, stats.rows)
        err.print(
            f"{time.strftime('%H:%M:%S')} archived {stats.messages:,} messages as "
            f"{stats.rows:,} rows ({rate:,.0f} rows/s), {stats.dead_letters:,} dead letters",
            soft_wrap=True,
        )

    try:
        stats = service.run(stop.is_set, progress if progress_s else None, progress_s or 30.0)
    finally:
        service.close()
        backend.close()
    err.print(f"archived {stats.messages} messages as {stats.rows} rows in {stats.batches} batches")


@archive_app.command("migrate")
def archive_migrate() -> None:
    """Apply the numbered SQL migrations not yet recorded in the archive."""
    from pipeline.services.archive import migrate, open_backend

    backend = open_backend(load_settings())
    try:
        applied = migrate(backend)
    finally:
        backend.close()
    console.print(f"{backend.name}:{backend.database}: applied {applied or 'nothing (up to date)'}")


@archive_app.command("prune")
def archive_prune(
    older_than: Annotated[str, typer.Option(help="Age such as 30d or 12h.")] = "30d",
    dry_run: Annotated[bool, typer.Option(help="Only list what would be dropped.")] = False,
) -> None:
    """Drop whole daily partitions older than the given age from every archive table."""
    from pipeline.io.duration import parse_duration
    from pipeline.services.archive import open_backend
    from pipeline.services.archive.retention import prune

    try:
        age = parse_duration(older_than)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--older-than") from exc
    backend = open_backend(load_settings())
    try:
        dropped = prune(backend, age, dry_run=dry_run)
    finally:
        backend.close()
    verb = "would drop" if dry_run else "dropped"
    console.print(f"{verb} {len(dropped)} partition(s): {dropped}")


@commands.command()
def query(
    name: Annotated[str, typer.Argument(help="Query name; see --help for the list.")],
    job: Annotated[str, job_option("Job id.")] = "",
    limit: Annotated[int, typer.Option(min=1)] = 50,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per row (JSON lines), no table.")
    ] = False,
) -> None:
    """Run a named analyst query: rank_slowdown, incident_timeline, detection_delay,
    lost_gpu_hours, top_nodes, incidents, job_runs, command_outcomes.

    On chDB it reads through the archiver while one runs. The table fits the terminal
    (long cells wrap); --json prints JSON lines for scripts."""
    from pipeline.services.archive.client import open_reader, print_rows
    from pipeline.services.archive.queries import QUERIES, run_query

    if name not in QUERIES:
        raise typer.BadParameter(f"unknown query; known: {sorted(QUERIES)}", param_hint="NAME")
    backend = open_reader(load_settings())
    try:
        cols, rows = run_query(backend, name, job=job or "none", limit=limit)
    finally:
        backend.close()
    if not as_json:
        err.print(QUERIES[name].answers)
    print_rows(cols, rows, console, as_json=as_json)


@commands.command()
def report(
    job: Annotated[str, typer.Option(help="Job id.")],
    incident: Annotated[
        str | None, typer.Option(help="One incident: its id or an episode fingerprint.")
    ] = None,
    out: Annotated[Path, typer.Option(help="HTML file to write.")] = Path("report.html"),
) -> None:
    """A post-mortem of a job from the archive in one self-contained HTML file (a panel
    per incident kind, images inline, causes, timeline, commands and executor results),
    on chDB through the archiver while one runs. A job the archive has nothing of is
    an error."""
    from pipeline.services.archive.client import open_reader
    from pipeline.tools.report import render_report

    backend = open_reader(load_settings())
    try:
        result = render_report(backend, job, out, incident)
    finally:
        backend.close()
    console.print(result.text)


@commands.command()
def sql(
    query: Annotated[str, typer.Argument(help="A SQL query for the archive.")],
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per row (JSON lines), no table.")
    ] = False,
) -> None:
    """Run one read-only query on the configured archive (server or chDB), print a table
    that fits the terminal, or JSON lines with --json.

    The server runs it with ``readonly=1``; on chDB only one SELECT, SHOW, DESCRIBE,
    EXPLAIN or WITH statement is accepted, and while an archiver runs it goes through
    the archiver (chDB allows one process per directory)."""
    from pipeline.services.archive.client import open_reader, print_rows

    backend = open_reader(load_settings())
    try:
        cols, rows = backend.query(query, readonly=True)
    finally:
        backend.close()
    print_rows(cols, rows, console, as_json=as_json)
    err.print(f"{len(rows)} rows")
