"""``stepguard replay`` as a command: options in, alerts and a summary out, and the
replayed job written into the archive when asked (:mod:`pipeline.tools.replay` does the
reading and the playing)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from detectors.frame import StepFrame
from pipeline.io.detector_config import load_detector_config
from pipeline.io.errors import ConfigError
from pipeline.io.settings import Settings
from pipeline.tools.replay import (
    ColumnSpec,
    ReplayResult,
    first_job,
    format_of,
    open_rows,
    read_jsonl,
    replay,
    span_of,
)
from pipeline.tools.replay_tables import need_pyarrow
from schemas import Alert, JobEvent, NodeHealth

__all__ = ["ReplayOptions", "ArchiveWriter", "run_replay"]

#: Rows (rank-steps, reports) gathered before an insert.
ARCHIVE_BATCH = 65536


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    path: Path
    job: str | None = None
    fmt: str | None = None
    columns: str | None = None
    time_unit: str = "s"
    health: Path | None = None
    events: Path | None = None
    redate: bool = False
    tick_s: float = 1.0
    config: Path | None = None
    archive: bool = False
    json_stdout: bool = False
    out: Path | None = None


class ArchiveWriter:
    """Writes what a replay played into the archive, in batches, as the archiver
    stores it (:func:`~pipeline.services.archive.rows.rows_for`): each step's frame as
    the per-node StepTelemetry it was (its run, its work), health and lifecycle as
    they came, and the alerts, signed with the worker's key when the settings hold one
    (``report`` reads signed alerts only). Each record's ``ver`` comes from its row in
    the file, so writing the same file again replaces rather than repeats."""

    def __init__(self, backend: Any, sign: Any = None) -> None:
        self.backend = backend
        self.sign = sign
        self._pending: list[tuple[int, Any]] = []
        self._size = 0
        self.written: dict[str, int] = {}

    def add(self, row: int, msg: Any) -> None:
        """A health report or lifecycle event played at ``row``."""
        self._pending.append((row, msg))
        self._size += 1
        self._maybe_flush()

    def add_frame(self, row: int, run: str, frame: StepFrame) -> None:
        """A step played (its first message at ``row``)."""
        for m in frame.to_messages():
            self._pending.append((row, m.model_copy(update={"run": run}) if run else m))
        self._size += frame.n_ranks
        self._maybe_flush()

    def alerts(self, alerts: Sequence[Alert]) -> None:
        signed = [self.sign(a) if self.sign is not None else a for a in alerts]
        self._insert(list(enumerate(signed)))

    def _maybe_flush(self) -> None:
        if self._size >= ARCHIVE_BATCH:
            self.flush()

    def flush(self) -> None:
        self._insert(self._pending)
        self._pending, self._size = [], 0

    def _insert(self, pairs: list[tuple[int, Any]]) -> None:
        from pipeline.services.archive.rows import rows_for

        if not pairs:
            return
        now_ms = int(time.time() * 1000)
        tables = rows_for([(m, now_ms) for _, m in pairs], [r for r, _ in pairs])
        for table, cols in tables.items():
            n = self.backend.insert(table, cols)
            self.written[table] = self.written.get(table, 0) + n


def _side_file(path: Path, result: ReplayResult) -> list[Any]:
    with path.open("rb") as f:
        rows = read_jsonl(f, path.name, result)
        return [m for _, m in rows if isinstance(m, NodeHealth | JobEvent)]


def run_replay(
    settings: Settings,
    out: Console,
    err: Console,
    opts: ReplayOptions,
    *,
    backend: Any = None,
) -> ReplayResult:
    """The command: replay ``opts.path``, print the alerts and the summary (or JSON),
    write the archive when asked (``backend``, else the one the settings name, as
    every tool opens it: chDB at ``chdb_path`` unless a server DSN is set). Bad
    arguments raise :class:`ConfigError`."""
    if not opts.path.is_file():
        raise ConfigError(f"FILE: {opts.path} is not a file")
    if opts.tick_s <= 0:
        raise ConfigError(f"--tick: must be > 0, got {opts.tick_s}")
    try:
        spec = ColumnSpec.parse(opts.columns, opts.time_unit)
        if format_of(opts.path, opts.fmt) == "parquet":
            need_pyarrow()  # before anything is read or written
        job = opts.job or first_job(opts.path, spec, opts.fmt)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if not job:
        raise ConfigError(f"--job: {opts.path} names no job in its first record; give --job")
    config = load_detector_config(opts.config or settings.detector_config)
    result = ReplayResult(job_id=job)
    side = [m for p in (opts.health, opts.events) if p is not None for m in _side_file(p, result)]
    writer = None
    owned = None
    if opts.archive:
        from pipeline.io.trust import sign, signing_key
        from pipeline.services.archive import migrate, open_backend

        if backend is None:
            backend = owned = open_backend(settings)
        migrate(backend)
        key = (
            signing_key(settings, "worker", "replay")
            if settings.private_key("worker") is not None
            else None
        )
        if key is None:
            err.print("[yellow]replay:[/] no STEPGUARD_WORKER_PRIVATE_KEY: alerts are archived "
                      "unsigned, and `stepguard report` reads signed alerts only")  # fmt: skip
        writer = ArchiveWriter(backend, (lambda a: sign(a, key)) if key is not None else None)

    def progress(r: ReplayResult) -> None:
        err.print(f"replay: {r.messages} step messages, {r.steps} steps, "
                  f"{r.refused_count} refused, {r.elapsed_s:.0f}s")  # fmt: skip

    try:
        try:
            rows = open_rows(opts.path, result, spec, opts.fmt)
            replay(
                rows, result, side=side, config=config, tick_s=opts.tick_s,
                redate_to=time.time() if opts.redate else None,
                span_s=span_of(opts.path, spec, opts.fmt) if opts.redate else 0.0,
                on_message=writer.add if writer is not None else None,
                on_frame=writer.add_frame if writer is not None else None, progress=progress,
            )  # fmt: skip
        except ValueError as exc:  # a table without the columns it needs
            raise ConfigError(str(exc)) from exc
        if writer is not None:
            writer.flush()
            writer.alerts(result.alerts)
    finally:
        if owned is not None:
            owned.close()
    report = {
        "summary": result.summary(),
        "alerts": [a.model_dump(mode="json") for a in result.alerts],
        "refused": [{"source": r.source, "row": r.row, "reason": r.reason} for r in result.refused],
        "archived": writer.written if writer is not None else None,
    }
    if opts.out is not None:
        opts.out.write_text(json.dumps(report, indent=1))
    if opts.json_stdout:
        out.print_json(json.dumps(report))
        return result
    _print(out, err, result, writer)
    return result


def _print(out: Console, err: Console, result: ReplayResult, writer: ArchiveWriter | None) -> None:
    for r in result.refused[:20]:
        err.print(f"[yellow]refused[/] {escape(str(r))}")
    if result.refused_count > 20:
        err.print(f"[yellow]refused[/] ... {result.refused_count - 20} more (--out for all)")
    for a in result.alerts:
        where = a.node or "job"
        if a.rank is not None:
            where += f" rank {a.rank}"
        out.print(
            f"{a.ts:%Y-%m-%d %H:%M:%S} step {a.step if a.step is not None else '-'} "
            f"{a.state.value:8} {a.grade.value:8} {a.kind.value:12} {escape(where)}: "
            f"{escape(a.summary)}"
        )
    s = result.summary()
    named = ", ".join(f"{n} ({k})" for n, k in s["nodes_named"].items()) or "none"
    kinds = ", ".join(f"{k} {n}" for k, n in s["firing_by_kind"].items()) or "none"
    out.print(
        f"\njob {escape(s['job_id'])}: {s['steps']} steps ({s['rank_steps']} rank-steps) "
        f"from {s['messages']} step messages, {s['health']} health reports, "
        f"{s['events']} lifecycle events; {s['refused']} rows refused\n"
        f"firing: {kinds}\nnodes named: {escape(named)}\n"
        f"event time {s['first']} .. {s['last']}"
        + (f" (re-dated by {s['shift_s']:+.0f}s)" if s["shift_s"] else "")
        + f"\nplayed in {s['elapsed_s']:.2f}s ({s['rank_steps_per_s'] or 0} rank-steps/s)"
    )
    if writer is not None:
        out.print(f"archived: {writer.written}; try `stepguard report --job {result.job_id}`")
