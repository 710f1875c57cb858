"""The ``stepguard`` command line: every service and tool is a subcommand.

The worker and actuator own their subcommands (:mod:`pipeline.cli.worker`,
:mod:`pipeline.cli.actuator`); this module adds them, and is the only one that imports
them. Helpers all of them share are in :mod:`pipeline.cli.util`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from pipeline.cli import actuator as actuator_cli
from pipeline.cli import alertmanager as alertmanager_cli
from pipeline.cli import archive as archive_cli
from pipeline.cli import replay as replay_cli
from pipeline.cli import worker as worker_cli
from pipeline.cli.options import (
    job_option,
    json_flag,
    old_spellings,
    out_option,
    scenario_option,
    speed_option,
    workers_option,
)
from pipeline.cli.util import (
    console,
    err,
    exit_code,
    fail_line,
    missing_extra,
    plain_help,
    print_version,
    quiet_library_logs,
    stop_event,
    verbose_first,
)
from pipeline.io.errors import StepguardError
from pipeline.io.settings import Settings, load_settings
from pipeline.services.actuator.kinds import kind_names

app = typer.Typer(
    name="stepguard",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # plain click help: paragraphs re-wrapped to the terminal, no `<bool>` type on flags
    rich_markup_mode=None,
)
schemas_app = typer.Typer(help="Message contracts: JSON Schemas.", rich_markup_mode=None)
app.add_typer(schemas_app, name="schemas")


def _settings() -> Settings:
    return load_settings()


#: Long-running services: their logs are read from files, library lines included.
SERVICE_COMMANDS = frozenset({
    "worker", "actuator", "executor", "archiver", "alertmanager", "broker",
    "export-health", "export-node", "export-rack",
})  # fmt: skip


@app.callback()
def _root(
    ctx: typer.Context,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help="Also show the client libraries' own log lines "
            "(kafka-python, aiokafka, clickhouse-driver).",
        ),
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Keeps large training jobs alive: detect slow/failing nodes, act safely, archive.

    Exit codes: 0 done (a follower stopped with Ctrl-C too), 1 failed, 2 bad argument
    or setting, 3 no broker, 4 no archive (docs/cli.md).
    """
    if ctx.invoked_subcommand not in SERVICE_COMMANDS:
        quiet_library_logs(verbose)


@app.command()
def demo(
    scenario: Annotated[str, scenario_option()] = "default",
    nodes: Annotated[
        int | None, typer.Option(min=1, help="Override the scenario's node count.")
    ] = None,
    steps: Annotated[int | None, typer.Option(min=10, help="Override the step count.")] = None,
    json_path: Annotated[Path | None, out_option("Write the summary as JSON here.")] = None,
    speed: Annotated[
        float,
        speed_option("Play event time x SPEED in real time (the demo: 8, so it ends in minutes)."),
    ] = 8.0,
    workers: Annotated[
        int, workers_option("Detection worker processes (the demo: 1, cores left for the job).")
    ] = 1,
) -> None:
    """Play a simulated job with injected faults against the production services
    (those `stepguard up` runs: embedded Tansu broker, worker, actuator in auto mode,
    dry-run executor, archiver on chDB) in accelerated real time, and summarise.

    Uses STEPGUARD_KAFKA_BOOTSTRAP / STEPGUARD_CLICKHOUSE_DSN instead when they are set.
    """
    from pipeline.tools.demo import run_demo
    from pipeline.tools.demo_summary import print_summary, write_json
    from pipeline.tools.simulator import find_scenario, resize_scenario

    settings = _settings()
    sc = find_scenario(scenario)
    if nodes is not None or steps is not None:
        sc = resize_scenario(sc, nodes, steps)
    err.print(
        f"[bold]stepguard demo[/]: {sc.name}: {sc.nodes} nodes x {sc.gpus_per_node} GPUs, "
        f"{sc.steps} steps, {len(sc.faults)} faults/traps"
    )
    summary = run_demo(settings, sc, console=err, speed=speed, workers=workers)
    print_summary(summary, console)
    if json_path is not None:
        write_json(summary, json_path)
        err.print(f"summary written to {json_path}")


@app.command()
def compare(
    scenario: Annotated[str, scenario_option()] = "default",
    nodes: Annotated[int | None, typer.Option(min=1, help="Resize the job.")] = None,
    approval_delay_s: Annotated[
        float, typer.Option(min=0, help="Hybrid: modelled human approval delay.")
    ] = 300.0,
    comm_timeout_steps: Annotated[
        float, typer.Option(min=1, help="Passive: collective timeout, in step times.")
    ] = 30.0,
    sweep_checkpoint: Annotated[
        str | None,
        typer.Option(help="Comma-separated checkpoint intervals (steps) to sweep."),
    ] = None,
    json_path: Annotated[Path | None, out_option("Write the results as JSON here.")] = None,
    plot_path: Annotated[Path | None, typer.Option("--plot", help="Save a PNG here.")] = None,
) -> None:
    """The same fault trace under passive, active and hybrid policies: goodput, lost
    GPU-hours, time to remedy, restarts, false isolations, checkpoint overhead."""
    from pipeline.tools import compare as cmp
    from pipeline.tools.simulator import find_scenario, resize_scenario

    sc = find_scenario(scenario)
    if nodes is not None:
        sc = resize_scenario(sc, nodes, None)
    intervals: list[int | None] = [None]
    if sweep_checkpoint:
        try:
            intervals = [int(x) for x in sweep_checkpoint.split(",") if x.strip()]
        except ValueError as exc:
            raise typer.BadParameter("expected integers, e.g. 50,100,200") from exc
    results: dict[str, dict[str, cmp.PolicyResult]] = {}
    for every in intervals:
        run = sc if every is None else sc.model_copy(update={"checkpoint_every": every})
        label = f"checkpoint every {run.checkpoint_every or 'never'}"
        err.print(f"{run.name}: {label} ...")
        results[label] = cmp.compare(
            run, approval_delay_s=approval_delay_s, comm_timeout_steps=comm_timeout_steps
        )
    columns = ("setting", "policy", "goodput", "lost GPU-h", "MTTR s", "unremedied",
               "restarts", "isol.", "false isol.", "ckpts", "ckpt s")  # fmt: skip
    table = Table(*columns)
    for label, by_policy in results.items():
        for r in by_policy.values():
            table.add_row(
                label, r.policy, f"{r.goodput:.3f}", f"{r.lost_gpu_hours:.2f}",
                "" if r.mttr_s is None else f"{r.mttr_s:.0f}", str(r.unremedied_faults),
                str(r.restarts), str(r.isolations), str(r.false_isolations),
                str(r.checkpoints), f"{r.checkpoint_overhead_s:.0f}",
            )  # fmt: skip
    console.print(table)
    if json_path is not None:
        first = next(iter(results.values()))
        payload = {p: r.to_json() for p, r in first.items()}
        payload["sweep"] = {k: {p: r.to_json() for p, r in v.items()} for k, v in results.items()}
        payload["scenario"] = sc.name
        json_path.write_text(json.dumps(payload, indent=2) + "\n")
        err.print(f"written {json_path}")
    if plot_path is not None:
        cmp.plot(results, plot_path)
        err.print(f"plot saved to {plot_path}")


@app.command()
def plan(
    gpus: Annotated[int, typer.Option(min=1, help="GPUs of the job.")] = 1024,
    days: Annotated[float, typer.Option(min=0.01, help="Job length (wall days).")] = 21.0,
    checkpoint_s: Annotated[
        float, typer.Option(min=1, help="Checkpoint interval today (wall seconds).")
    ] = 300.0,
    rates: Annotated[
        Path | None, typer.Option(help="JSON/TOML fault rates and delays (docs/proactive.md).")
    ] = None,
    sweep_gpus: Annotated[
        str | None, typer.Option(help="Comma-separated scales, e.g. 64,512,4096,16384.")
    ] = None,
    sweep_days: Annotated[
        str | None, typer.Option(help="Job lengths for the sweep (default: 7,DAYS,60).")
    ] = None,
    replicates: Annotated[int, typer.Option(min=2, help="Monte-Carlo replicates.")] = 1000,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    json_path: Annotated[Path | None, out_option("Write the results as JSON here.")] = None,
    plot_path: Annotated[Path | None, typer.Option("--plot", help="Save a PNG here.")] = None,
) -> None:
    """Monte-Carlo of a job's faults under passive, active and hybrid policies: lost
    GPU-hours and goodput with 95% CIs, the best checkpoint interval beside Young/Daly,
    the spare pool; --sweep-gpus says which policy wins at which scale."""
    from pipeline.tools.plan_run import run_plan

    def numbers(text: str | None, kind: type) -> list:
        try:
            return [kind(x) for x in (text or "").split(",") if x.strip()]
        except ValueError as exc:
            raise typer.BadParameter(f"expected comma-separated numbers, got {text!r}") from exc

    g = numbers(sweep_gpus, int)
    d = numbers(sweep_days, float) or (sorted({7.0, days, 60.0}) if g else [])
    if any(x < 1 for x in g) or any(x <= 0 for x in d):
        raise typer.BadParameter("sweep GPUs must be >= 1 and days > 0")
    try:
        run_plan(
            console, err, gpus=gpus, days=days, checkpoint_s=checkpoint_s, rates_path=rates,
            sweep_gpus=g, sweep_days=d, replicates=replicates, seed=seed,
            json_path=json_path, plot_path=plot_path,
        )  # fmt: skip
    except (StepguardError, ValueError) as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc


@app.command()
def calibrate(
    job: Annotated[list[str] | None, job_option("Job id (repeat for more).")] = None,
    since: Annotated[str | None, typer.Option(help="Every job with steps since, e.g. 30d.")] = None,
    grid: Annotated[
        Path | None, typer.Option(help="JSON/TOML grid: setting -> values (default grid).")
    ] = None,
    apply: Annotated[
        bool,
        typer.Option(
            "--apply",
            help="Publish the recommended settings as a control message signed with "
            "STEPGUARD_OPERATOR_PRIVATE_KEY: every worker builds new jobs' detectors "
            "with them, the actuator takes a changed confirmation.",
        ),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the difference from the running settings.")
    ] = False,
    write_config: Annotated[
        Path | None,
        typer.Option(
            "--write-config",
            help="Also write the recommended detector settings to this file (what "
            "STEPGUARD_DETECTOR_CONFIG names).",
        ),
    ] = None,
    plot_path: Annotated[
        Path | None, typer.Option("--plot", help="Pareto plot PNG (default STATE_DIR/...).")
    ] = None,
    json_path: Annotated[Path | None, out_option("Write every result as JSON here.")] = None,
    processes: Annotated[int | None, typer.Option(min=1, help="Worker processes.")] = None,
    labels: Annotated[
        str, typer.Option(help="Label sources: truth,label,approval,outcome.")
    ] = "truth,label,approval,outcome",
    max_rank_steps: Annotated[
        int, typer.Option(min=1, help="Most rank-steps loaded (~80 B each, per process).")
    ] = 10_000_000,
    actions: Annotated[
        bool,
        typer.Option(
            "--actions",
            help="Report approvals and outcomes per action kind and "
            "recommend the kinds ready for auto (no replay).",
        ),
    ] = False,
    min_approvals: Annotated[int, typer.Option(min=0, help="--actions: approvals needed.")] = 5,
    max_rejections: Annotated[int, typer.Option(min=0, help="--actions: rejections allowed.")] = 0,
    min_success: Annotated[
        float, typer.Option(min=0, max=1, help="--actions: share of commands that succeeded.")
    ] = 0.95,
) -> None:
    """Replay archived jobs through the detectors under a grid of settings; precision,
    recall, F1 and delay per setting and kind against the labels, the Pareto front and
    the recommended settings."""
    if actions:
        from pipeline.tools.calibrate.graduation import GraduationRules, run_graduation

        if apply or dry_run or grid is not None:
            raise typer.BadParameter("--actions reports the history of the actions; it "
                                     "takes no --apply, --dry-run or --grid")  # fmt: skip

        rules = GraduationRules(min_approvals=min_approvals, max_rejections=max_rejections,
                                min_success=min_success)  # fmt: skip
        run_graduation(_settings(), console, since=_since_arg(since), jobs=job or (),
                       rules=rules, json_path=json_path)  # fmt: skip
        return
    from pipeline.tools.calibrate.command import run_calibrate

    run_calibrate(
        _settings(), console, jobs=job or (), since=since, grid_path=grid, apply=apply,
        dry_run=dry_run, write_config=write_config, plot=plot_path, json_path=json_path,
        processes=processes,
        sources=[s.strip() for s in labels.split(",") if s.strip()],
        max_rank_steps=max_rank_steps,
    )  # fmt: skip


def _since_arg(since: str | None) -> datetime | None:
    from pipeline.io.duration import parse_duration

    if since is None:
        return None
    try:
        return datetime.now(UTC) - parse_duration(since)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--since") from exc


@app.command()
def label(
    incident: Annotated[str, typer.Argument(help="Incident id (stepguard query incidents).")],
    verdict: Annotated[
        bool, typer.Option("--true/--false", help="A real fault, or a false alarm.")
    ],
    note: Annotated[str, typer.Option(help="Why.")] = "",
    by: Annotated[str | None, typer.Option(help="Who (default: the login name).")] = None,
) -> None:
    """Archive a verdict on an incident; stepguard calibrate learns from it."""
    import getpass

    from pipeline.tools.calibrate.command import label_command

    label_command(
        _settings(), incident, verdict, by=by or getpass.getuser(), note=note, console=console
    )


@app.command()
def broker(
    port: Annotated[int | None, typer.Option(help="Port; default: a free one.")] = None,
) -> None:
    """Run the embedded Tansu broker in the foreground (development; Ctrl-C stops it)."""
    from pipeline.io.embedded import TansuBroker

    settings = _settings()
    with TansuBroker(log_dir=settings.state_dir / "tansu", port=port) as b:
        console.print(f"STEPGUARD_KAFKA_BOOTSTRAP={b.bootstrap}")
        console.print("STEPGUARD_BROKER_FLAVOR=tansu")
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()


@app.command()
def topics() -> None:
    """Create every stepguard topic with its partition count (idempotent)."""
    from pipeline.io.kafka import create_topics

    created = create_topics(_settings())
    table = Table("logical", "topic")
    for logical, name in created.items():
        table.add_row(logical, name)
    console.print(table)


@app.command()
def up(
    scenario: Annotated[
        str | None,
        scenario_option("Also play this scenario as a job (own job id, times from now)."),
    ] = None,
    workers: Annotated[int, workers_option()] = 2,
    speed: Annotated[float, speed_option("The scenario's event time x SPEED in real time.")] = 1.0,
    durable: Annotated[
        bool,
        typer.Option(help="Run Apache Kafka (scripts/kafka.sh, data kept), not in-memory Tansu."),
    ] = False,
    base_port: Annotated[
        int | None,
        typer.Option(
            min=1024, max=65503, help="Broker and metrics ports from here on (default: free ones)."
        ),
    ] = None,
    job: Annotated[
        str | None, job_option("Watch this real job (its id: STEPGUARD_JOB_ID in up.env).")
    ] = None,
    nodes: Annotated[
        str | None,
        typer.Option(help="The job's nodes: a count, or names a,b,c (node-index order)."),
    ] = None,
    spares: Annotated[
        str | None, typer.Option(help="Spare nodes: a count (spare-0, ...), or names.")
    ] = None,
    mode: Annotated[
        str | None, typer.Option(help="Actuator mode for the job: auto, approve or observe.")
    ] = None,
    prometheus: Annotated[
        bool | None,
        typer.Option(
            "--prometheus/--no-prometheus",
            help="Run Prometheus (Debian's `prometheus` on PATH) with stepguard's alerting "
            "rules, scraping every service (default: with --durable when installed).",
            show_default=False,
        ),
    ] = None,
    executor: Annotated[
        str, typer.Option(help=f"The executor it runs: {kind_names()} (docs/actuator.md).")
    ] = "dry-run",
) -> None:
    """Start and supervise the production services as child processes (docker-compose
    without Docker): broker, topics, workers, actuator, executor, archiver.

    A table shows each service; logs go to .stepguard/logs/<service>.log and
    .stepguard/up.json; Ctrl-C stops everything (the broker last). A crashed service
    is restarted with backoff (1 s doubling to 30 s). With --job, the stack watches that
    real job (docs/pytorch.md): the actuator knows its nodes, spares and
    mode, up.env names them, job-controller.env (0600) holds the job's signing key.
    """
    import os

    from pipeline.tools.up import UpOptions, run_up

    if mode not in (None, "auto", "approve", "observe"):
        raise typer.BadParameter("auto, approve or observe", param_hint="--mode")
    try:
        options = UpOptions(
            scenario=scenario,
            workers=workers,
            speed=speed,
            durable=durable,
            base_port=base_port,
            job=job,
            nodes=nodes,
            spares=spares,
            mode=mode,  # type: ignore[arg-type]
            prometheus=prometheus,
            executor=executor,
        )
    except ValueError as exc:  # which options do not go together, an unknown executor
        raise typer.BadParameter(str(exc)) from exc
    raise typer.Exit(run_up(_settings(), options, os.environ, err, stop_event()))


@app.command()
def status(
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Refresh in place.")] = False,
    every: Annotated[float, typer.Option(min=0.5, help="Seconds between refreshes.")] = 2.0,
    window: Annotated[
        int, typer.Option(min=1, max=100_000, help="Records read from the end of each partition.")
    ] = 500,
    as_json: Annotated[bool, json_flag("One JSON document instead of the tables.")] = False,
) -> None:
    """Services, jobs (last step and its age), firing incidents and held actions, read
    from the broker (up.json too while `stepguard up` runs); no archive access needed."""
    from pipeline.tools.status import run_status

    run_status(_settings(), console, follow=follow, every_s=every, window=window,
               as_json=as_json, stop=stop_event())  # fmt: skip


@app.command()
def alerts(
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new ones.")] = False,
    last: Annotated[int, typer.Option(min=0, max=100_000, help="Start with the last N.")] = 20,
    since: Annotated[
        str | None, typer.Option(help="Only alerts dated within this age (30s, 10m, 2h, 1d).")
    ] = None,
    job: Annotated[str | None, job_option("Only this job.")] = None,
    grade: Annotated[
        str | None, typer.Option(help="Least grade: info | warning | critical.")
    ] = None,
    window: Annotated[
        int, typer.Option(min=1, max=100_000, help="Records read from the end of each partition.")
    ] = 500,
    as_json: Annotated[bool, json_flag("The messages as JSON lines.")] = False,
) -> None:
    """The decision stream, readable: time, grade, state, job, node/rank, kind, summary,
    evidence, recommended action, incident. Alerts no worker key signed are marked."""
    from pipeline.tools.alerts import alerts_filter, follow_alerts

    try:
        keep = alerts_filter(job=job, grade=grade, since=since)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    follow_alerts(_settings(), console, last=last, keep=keep, follow=follow, as_json=as_json,
                  stop=stop_event().is_set, window=window)  # fmt: skip


@app.command("score-series")
def score_series_cmd(
    file: Annotated[str, typer.Argument(help="CSV path, or - for stdin.")],
    time_column: Annotated[
        str | None, typer.Option(help="Timestamp column; default: the first column.")
    ] = None,
    columns: Annotated[
        str | None, typer.Option(help="Comma-separated columns to score; default: all others.")
    ] = None,
    season: Annotated[
        str,
        typer.Option(help="auto (a day and a week, when timestamps allow), none, or SECONDS."),
    ] = "auto",
    output: Annotated[
        str, typer.Option("--format", help="csv (time,score) or plain (one score per line).")
    ] = "csv",
    explain: Annotated[
        bool,
        typer.Option(help="csv: add the column, kind (spike/shift/drift/variance), season."),
    ] = False,
    warmup: Annotated[int, typer.Option(min=3, help="Values a column needs first.")] = 10,
    rarity: Annotated[
        float, typer.Option(min=1.0001, help="A score of 0.5 means as rare as 1 row in this.")
    ] = 1e4,
    progress: Annotated[
        bool | None,
        typer.Option(help="Progress on stderr; default: for files over 1 MiB on a terminal."),
    ] = None,
) -> None:
    """Score an exported metric series, strictly causally: one calibrated anomaly score
    in [0, 1] per row (0.5 = as rare as 1 row in --rarity on any series), printed as
    each row is read. Spikes, level shifts, drifts and variance changes, per column."""
    from pipeline.tools.series import SeriesInputError, run_score_series

    try:
        run_score_series(
            file,
            time_column=time_column,
            columns=columns,
            season=season,
            output=output,
            explain=explain,
            warmup=warmup,
            rarity=rarity,
            progress=progress,
        )
    except SeriesInputError as exc:
        err.print(f"score-series: {exc}", markup=False, highlight=False)
        raise typer.Exit(2) from None


@schemas_app.command("export")
def schemas_export() -> None:
    """Rewrite the committed JSON Schemas from the models (after a model change)."""
    from schemas.jsonschemas import write_all

    for path in write_all():
        console.print(str(path))


@schemas_app.command("check")
def schemas_check() -> None:
    """Fail when a committed JSON Schema differs from its model."""
    from schemas import MESSAGE_MODELS
    from schemas.jsonschemas import SCHEMA_DIR, render

    stale = [
        m.kind_name
        for m in MESSAGE_MODELS
        if not (SCHEMA_DIR / f"{m.kind_name}.json").exists()
        or (SCHEMA_DIR / f"{m.kind_name}.json").read_text() != render(m)
    ]
    if stale:
        err.print(f"stale schemas: {stale}; run `stepguard schemas export`")
        raise typer.Exit(1)
    console.print("schemas up to date")


@app.command()
def scenarios() -> None:
    """Every scenario name --scenario accepts (demo and suite: faults, traps, sizes);
    a YAML path is accepted too."""
    from pipeline.tools.simulator import DEMO_DIR, find_scenario, load_suite

    demos = [(p.stem, find_scenario(p.stem)) for p in sorted(DEMO_DIR.glob("*.yaml"))]
    suite = [(s.name, s) for s in load_suite()]
    table = Table("name", "set", "nodes", "steps", "faults and traps")
    table.columns[0].no_wrap = True  # a name is typed back: never cut
    for group, items in (("demo", demos), ("suite", suite)):
        for name, s in items:
            faults = ", ".join(f.kind.value for f in s.faults)
            table.add_row(name, group, str(s.nodes), str(s.steps), faults)
    console.print(table)


# The services own their subcommands; they sit at the top level beside these.
for _service in (
    worker_cli.commands,
    actuator_cli.commands,
    alertmanager_cli.commands,
    archive_cli.commands,
    replay_cli.commands,
):
    app.registered_commands.extend(_service.registered_commands)
    app.registered_groups.extend(_service.registered_groups)


plain_help(app)


def main() -> None:
    sys.argv[1:] = verbose_first(old_spellings(sys.argv[1:]))
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # kafka-python 3 warns whenever one of its own tasks holds its I/O loop > 100 ms:
    # advice to its developers, noise in a busy 2-core demo; errors still show
    logging.getLogger("kafka.net.selector").setLevel(logging.ERROR)
    # secrets of the settings (DSN, passwords, keys, webhook URLs) never reach a log
    # line or an error this process prints
    from pipeline.io.redact import RedactingFilter, redact, settings_secrets

    def secrets() -> list[str]:
        try:
            return settings_secrets(load_settings())
        except StepguardError:  # invalid settings: their errors quote no values
            return []

    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactingFilter(secrets))
    try:
        app()  # a usage error: click's lines and exit 2; Ctrl-C: "Aborted!" and exit 1
    except StepguardError as exc:  # one line, the code of its kind (docs/cli.md)
        fail_line(redact(str(exc), secrets()))
        sys.exit(exit_code(exc))
    except ModuleNotFoundError as exc:  # a command whose extra is not installed: one line
        line = missing_extra(exc)
        if line is None:
            raise
        fail_line(line)
        sys.exit(2)
    except Exception:  # an unexpected failure: its traceback, with secrets masked
        import traceback

        sys.stderr.write(redact(traceback.format_exc(), secrets()))
        sys.exit(1)


if __name__ == "__main__":
    main()
