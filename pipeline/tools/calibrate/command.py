"""The bodies of ``stepguard calibrate`` and ``stepguard label`` (the CLI functions in
:mod:`pipeline.cli.app` only parse options and call these)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pipeline.io.detector_config import (
    config_from_overrides,
    load_detector_config,
    overrides_of,
    write_detector_config,
)
from pipeline.io.errors import ConfigError
from pipeline.io.settings import Settings
from pipeline.services.archive.backend import ArchiveBackend
from pipeline.tools.calibrate.archive import LABEL_SOURCES, archived_jobs
from pipeline.tools.calibrate.grid import (
    ACTUATOR_SETTINGS,
    CalibrationResult,
    calibrate,
    diff_settings,
    load_grid,
    plot_front,
)

__all__ = ["default_processes", "label_command", "publish_calibration", "run_calibrate",
           "running_detector"]  # fmt: skip


def default_processes() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _settings_text(overrides: dict[str, Any]) -> str:
    return "\n".join(f"{k}={_fmt(v)}" for k, v in overrides.items()) or "(running)"


def front_table(result: CalibrationResult, top: int) -> Table:
    """The Pareto front, best F1 first (at most ``top`` rows), with the running settings
    and the recommendation marked."""
    rows = sorted(
        {*result.front, 0, result.recommended},
        key=lambda i: (-result.points[i].f1, result.points[i].delay_median or 0.0, i),
    )[:top]
    table = Table(
        title="Pareto front of the alerts (precision, recall, delay in steps) and the "
        "actions the actuator would confirm; best = recommended",
        title_justify="left",
    )
    table.add_column("#", justify="right")
    table.add_column("settings changed", min_width=18, overflow="fold")
    for col in ("prec.", "recall", "F1", "delay", "TP/FP", "action F1/delay"):
        table.add_column(col, justify="right")
    table.add_column("", min_width=9, overflow="fold")
    for i in rows:
        p = result.points[i]
        mark = []
        if i == result.recommended:
            mark.append("best")
        if i == 0:
            mark.append("running")
        if i not in result.front:
            mark.append("dominated")
        table.add_row(
            str(i), _settings_text(p.overrides), f"{p.precision:.3f}", f"{p.recall:.3f}",
            f"{p.f1:.3f}", _fmt(p.delay_median), f"{p.tp}/{p.fp}",
            f"{p.action_f1:.2f}/{_fmt(p.action_delay_median)}", " ".join(mark),
        )  # fmt: skip
    return table


def kind_table(result: CalibrationResult) -> Table:
    """Per kind: the running settings against the recommendation."""
    run, best = result.points[0], result.best
    table = Table(title="Per kind: running -> recommended", title_justify="left")
    for col in ("kind", "labels", "precision", "recall", "F1", "delay (steps)"):
        table.add_column(col, justify="left" if col == "kind" else "right")
    for kind in sorted(set(run.per_kind) | set(best.per_kind)):
        a, b = run.per_kind.get(kind, {}), best.per_kind.get(kind, {})

        def pair(key: str, a: dict[str, Any] = a, b: dict[str, Any] = b) -> str:
            return f"{_fmt(a.get(key))} -> {_fmt(b.get(key))}"

        table.add_row(
            kind, str(b.get("labels", a.get("labels", 0))), pair("precision"), pair("recall"),
            pair("f1"), pair("delay_median"),
        )  # fmt: skip
    return table


def running_actuator(settings: Settings, backend: ArchiveBackend) -> dict[str, Any]:
    """The actuator's confirmation settings as they run: its settings, then every signed
    control change archived since (in order), as the actuator itself applies them."""
    values: dict[str, Any] = {k: getattr(settings, k) for k in ACTUATOR_SETTINGS}
    _, rows = backend.query(
        f"SELECT change FROM {backend.database}.control_changes FINAL WHERE signed = 1 "
        "ORDER BY ts_ms, change_id"
    )
    for (change,) in rows:
        try:
            data = json.loads(change)
        except ValueError:
            continue  # an unreadable record changes nothing, as for the actuator
        if not isinstance(data, dict):
            continue
        for k in ACTUATOR_SETTINGS:
            v = data.get(k)
            if isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
                values[k] = v
    return values


def running_detector(backend: ArchiveBackend, base: Any) -> Any:
    """The detector settings new jobs get: the latest signed detector change archived
    (``stepguard calibrate --apply``; the workers apply it over their settings file),
    else ``base`` (the STEPGUARD_DETECTOR_CONFIG file's). A change the workers would
    refuse as invalid changes nothing here either."""
    _, rows = backend.query(
        f"SELECT change FROM {backend.database}.control_changes FINAL WHERE signed != 0 "
        "ORDER BY ts_ms DESC, change_id DESC"
    )
    for (change,) in rows:
        try:
            data = json.loads(change)
            settings = data.get("detector_settings") if isinstance(data, dict) else None
            if isinstance(settings, dict):
                return config_from_overrides(settings)
        except (ValueError, ConfigError):
            continue
    return base


def publish_calibration(
    settings: Settings,
    reason: str,
    *,
    detector: dict[str, Any] | None = None,
    actuator: dict[str, Any] | None = None,
) -> str:
    """Publish one control message signed by the operator key (as ``stepguard control``):
    ``detector`` the detector settings every worker builds new jobs' detectors from,
    ``actuator`` the actuator's changed confirmation settings; returns its change id."""
    import uuid

    from pipeline.io.kafka import control_producer, create_topics, publish, registry_of
    from pipeline.io.trust import sign, signing_key
    from schemas import ControlMessage

    msg = ControlMessage(
        change_id=uuid.uuid4().hex, by="stepguard calibrate", reason=reason,
        ts=datetime.now(UTC), scope="actuator" if actuator else "detector",
        detector_settings=detector, **(actuator or {}),
    )  # fmt: skip
    signed = sign(msg, signing_key(settings, "operator", "`stepguard calibrate --apply`"))
    create_topics(settings, ["control"])
    producer = control_producer(settings)
    try:
        publish(producer, registry_of(settings), "control", signed).get(timeout=30)
    finally:
        producer.close()
    return msg.change_id


def run_calibrate(
    settings: Settings,
    console: Console,
    *,
    jobs: Sequence[str] = (),
    since: str | None = None,
    grid_path: Path | None = None,
    apply: bool = False,
    dry_run: bool = False,
    write_config: Path | None = None,
    plot: Path | None = None,
    json_path: Path | None = None,
    processes: int | None = None,
    sources: Sequence[str] = LABEL_SOURCES,
    max_rank_steps: int = 10_000_000,
    top: int = 15,
) -> CalibrationResult:
    """Load, replay, report; ``apply`` publishes the recommended settings as a signed
    control message (workers apply the detector settings to new jobs, the actuator its
    confirmation), ``write_config`` writes the detector settings to that file."""
    from pipeline.io.duration import parse_duration
    from pipeline.services.archive import migrate, open_backend

    if apply and dry_run:
        raise ConfigError("give --apply or --dry-run, not both")
    if apply:  # before the replay: it publishes a change signed by the operator key
        from pipeline.io.trust import signing_key

        if not settings.kafka_bootstrap:
            raise ConfigError("--apply publishes on the control topic: "
                              "STEPGUARD_KAFKA_BOOTSTRAP is not set")  # fmt: skip
        signing_key(settings, "operator", "`stepguard calibrate --apply`")
    if bool(jobs) == bool(since):
        raise ConfigError("give --job J (one or more) or --since AGE (e.g. 30d), not both")
    try:
        since_at = datetime.now(UTC) - parse_duration(since) if since else None
    except ValueError as exc:
        raise ConfigError(f"--since: {exc}") from exc
    grid = load_grid(grid_path)
    running = load_detector_config(settings.detector_config)
    backend = open_backend(settings)
    try:
        migrate(backend)
        actuator_now = running_actuator(settings, backend)
        running = running_detector(backend, running)
        with console.status("reading the archive") as status:
            loaded = archived_jobs(
                backend, list(jobs) or None, since_at, sources=sources,
                max_rank_steps=max_rank_steps,
                progress=lambda name: status.update(f"reading job {name}"),
            )  # fmt: skip
    finally:
        backend.close()
    procs = processes or default_processes()
    with Progress(
        TextColumn("replaying settings"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=console, transient=True,
    ) as bar:  # fmt: skip
        task = bar.add_task("grid", total=None)

        def tick(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        result = calibrate(
            loaded, grid, running=running, running_actuator=actuator_now, processes=procs,
            progress=tick,
        )  # fmt: skip
    labels = ", ".join(f"{n} {k}" for k, n in result.labels.items()) or "none"
    console.print(
        f"{result.jobs} job(s), {result.rank_steps:,} rank-steps each replay; labels: "
        f"{labels}; {len(result.points)} settings in {result.wall_s:.1f} s on {procs} "
        f"process(es): {result.replay_rank_steps_per_s:,.0f} rank-steps/s"
    )
    if result.best.true_labels == 0 and result.best.tp + result.best.fp == 0:
        console.print(
            "[yellow]no labelled fault or false alarm in these jobs: label incidents "
            "(stepguard label), approve or reject actions, or replay simulated jobs first[/]"
        )
    refused = [p for p in result.points if p.error]
    if refused:
        console.print(f"[yellow]{len(refused)} setting(s) refused:[/] {refused[0].error}")
    console.print(front_table(result, top))
    console.print(kind_table(result))
    proposed = result.settings_of(result.recommended)
    changes = diff_settings(running, proposed)
    act = result.actuator_of(result.recommended)
    act_changes = {k: v for k, v in act.items() if actuator_now.get(k) != v}
    changes += [(k, actuator_now.get(k), v) for k, v in act_changes.items()]
    console.print(
        "recommended: "
        + (", ".join(f"{n}={_fmt(b)}" for n, _, b in changes) or "keep the running settings")
    )
    plot = plot or settings.state_dir / "calibration-front.png"
    console.print(f"Pareto plot: {plot_front(result, plot)}")
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result.to_json(), indent=2, default=str) + "\n")
        console.print(f"json: {json_path}")
    if dry_run:
        table = Table("setting", "running", "recommended", title="--dry-run: the difference")
        for name, a, b in changes:
            table.add_row(name, _fmt(a), _fmt(b))
        console.print(table if changes else "--dry-run: the running settings are recommended")
    if apply:
        detector = overrides_of(proposed)
        change = publish_calibration(
            settings, f"stepguard calibrate: recommended setting #{result.recommended}",
            detector=detector, actuator=act_changes,
        )  # fmt: skip
        console.print(
            f"signed control change {change} sent: workers build new jobs' detectors with "
            f"{detector or 'the default settings'} (running jobs keep theirs)"
            + (f"; actuator confirmation {act_changes}" if act_changes else "")
        )
    if write_config is not None:
        write_detector_config(write_config, proposed)
        console.print(
            f"wrote {write_config}: workers started with "
            f"STEPGUARD_DETECTOR_CONFIG={write_config} start from it (a signed change on "
            "the control topic wins over it)"
        )
    return result


def label_command(
    settings: Settings, incident: str, verdict: bool, *, by: str, note: str, console: Console
) -> None:
    from pipeline.services.archive import migrate, open_backend
    from pipeline.tools.calibrate.labels import label_incident

    backend = open_backend(settings)
    try:
        migrate(backend)
        label = label_incident(backend, incident, verdict, by=by, note=note)
    finally:
        backend.close()
    word = "a real fault" if label.verdict else "a false alarm"
    console.print(f"incident {label.incident} of job {label.job_id}: {word} (by {label.by})")
