"""``stepguard replay``: recorded telemetry played through the detection core, offline.

An analyst with last month's incident, or an SRE tuning thresholds on their own history
before deploying, gives a file of per-rank step timings; the replay plays it through
:class:`~detectors.job.JobDetection` (the one core every driver uses, driven by
:func:`~pipeline.tools.calibrate.replay.play`, as ``stepguard calibrate`` replays the
archive) in event time, with the clock ticked as the worker would, and returns the
alert updates and a summary. Optionally it writes the steps, health, lifecycle and
alerts into the archive, so ``stepguard report`` and ``calibrate`` work on the replayed
job.

Inputs (docs/replay.md):

- **JSONL**: one JSON object a line: StepTelemetry (one node's or rack's ranks for one
  step), and, mixed in or in files of their own (``health``, ``events``), NodeHealth and
  JobEvent, told apart by their fields.
- **CSV** or **Parquet**: one row per rank and step; :class:`ColumnSpec` maps the
  file's columns onto the fields (``node``, ``step``, ``rank``, ``step_time_s``,
  ``compute_s`` and ``ts_end`` are needed; the rest default as in StepTelemetry). Rows
  come in step order (any order within a step, a few steps out of order tolerated):
  :mod:`pipeline.tools.replay_tables`.

A row or line that is bad (not valid telemetry) or inconsistent (a rank twice in one
step, a step already played, another job) is refused with its row number and why; the
rest is played. Times are kept, or moved by one offset so the file ends now
(``redate``).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from detectors.config import DetectorConfig
from detectors.frame import StepFrame
from detectors.job import JobDetection
from pipeline.tools.calibrate.replay import FRAME, HEALTH, LIFECYCLE, play
from pipeline.tools.replay_frames import (
    PARALLEL_BYTES,
    Part,
    decode_file,
    decode_lines,
    frame_of,
)
from pipeline.tools.replay_tables import (
    TIME_UNITS,
    ColumnSpec,
    as_time,
    parquet_first_job,
    parquet_span,
    read_csv,
    read_parquet,
)
from schemas import Alert, JobEvent, NodeHealth

__all__ = [
    "ColumnSpec",
    "Refusal",
    "ReplayResult",
    "read_csv",
    "read_jsonl",
    "read_parquet",
    "replay",
]

#: Refusals kept with their row and reason (more are counted only).
MAX_REFUSALS_KEPT = 1000
#: Steps a step's messages may arrive after a later step's and still join its frame.
STEP_WINDOW = 2

Record = tuple[float, int, Any]  #: (event time, order code, record) as play() takes them


@dataclass(frozen=True, slots=True)
class Refusal:
    """A row (1-based line of its file) that was not played, and why."""

    source: str
    row: int
    reason: str

    def __str__(self) -> str:
        return f"{self.source}:{self.row}: {self.reason}"


@dataclass(slots=True)
class ReplayResult:
    """What one replay did."""

    job_id: str
    alerts: list[Alert] = field(default_factory=list)  #: every alert update, in order
    refused: list[Refusal] = field(default_factory=list)  #: the first MAX_REFUSALS_KEPT
    refused_count: int = 0
    messages: int = 0  #: step messages played
    health: int = 0
    events: int = 0
    steps: int = 0  #: frames played
    rank_steps: int = 0  #: rank samples played
    first_ts: float | None = None
    last_ts: float | None = None
    elapsed_s: float = 0.0
    shift_s: float = 0.0  #: what ``redate`` added to every time

    def refuse(self, source: str, row: int, reason: str) -> None:
        self.refused_count += 1
        if len(self.refused) < MAX_REFUSALS_KEPT:
            self.refused.append(Refusal(source, row, reason))

    @property
    def firing(self) -> list[Alert]:
        return [a for a in self.alerts if a.state.value == "firing"]

    def summary(self) -> dict[str, Any]:
        firing = self.firing
        named = Counter(a.node for a in firing if a.node is not None)
        return {
            "job_id": self.job_id,
            "messages": self.messages,
            "health": self.health,
            "events": self.events,
            "steps": self.steps,
            "rank_steps": self.rank_steps,
            "refused": self.refused_count,
            "first": _iso(self.first_ts),
            "last": _iso(self.last_ts),
            "shift_s": round(self.shift_s, 3),
            "alert_updates": len(self.alerts),
            "firing_by_kind": dict(Counter(a.kind.value for a in firing)),
            "nodes_named": dict(named.most_common()),
            "elapsed_s": round(self.elapsed_s, 3),
            "rank_steps_per_s": round(self.rank_steps / self.elapsed_s) if self.elapsed_s else None,
        }


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat()


# -- reading ---------------------------------------------------------------------------


def read_jsonl(
    lines: Iterable[bytes], source: str, result: ReplayResult
) -> Iterator[tuple[int, Part | NodeHealth | JobEvent]]:
    """Decode JSONL in batches: each accepted line as ``(row, Part | NodeHealth |
    JobEvent)`` (a :class:`~pipeline.tools.replay_frames.Part` is one step message);
    a bad line is refused in ``result`` with its number and the schema's error."""
    return decode_lines(lines, lambda row, why: result.refuse(source, row, why))


def _event_time(msg: Any) -> float:
    if isinstance(msg, NodeHealth | JobEvent):
        return msg.ts.timestamp()
    if isinstance(msg, Part):
        return float(msg.cols.ts_end[msg.k].timestamp())
    return float(msg.ts_end.timestamp())


def _first_time(msg: Any) -> float:
    if isinstance(msg, NodeHealth | JobEvent):
        return msg.ts.timestamp()
    if isinstance(msg, Part):
        return float(msg.cols.ts_start[msg.k].timestamp())
    return float(msg.ts_start.timestamp())


def _key(msg: Any) -> tuple[str, str, int]:
    if isinstance(msg, Part):
        return msg.key
    return msg.job_id, msg.run, int(msg.step)


def _shifted(msg: Any, shift: float) -> Any:
    if not shift:
        return msg
    if isinstance(msg, StepFrame):
        return dataclasses.replace(msg, ts=msg.ts + shift, ts_start=msg.ts_start + shift)
    return msg.model_copy(update={"ts": msg.ts + timedelta(seconds=shift)})


def _ours(msg: Any, job_id: str) -> bool:
    """A record of the replayed job (a health report without a job counts: its node's)."""
    job = msg.key[0] if isinstance(msg, Part) else msg.job_id
    return bool(job == job_id or (isinstance(msg, NodeHealth) and not msg.job_id))


@dataclass(slots=True)
class _Open:
    row: int  #: the first row of the step
    items: list[Any]


def replay(
    main: Iterable[tuple[int, Any]],
    result: ReplayResult,
    *,
    side: Sequence[Any] = (),
    config: DetectorConfig | None = None,
    tick_s: float = 1.0,
    redate_to: float | None = None,
    span_s: float = 0.0,
    on_message: Callable[[int, Any], None] | None = None,
    on_frame: Callable[[int, str, StepFrame], None] | None = None,
    progress: Callable[[ReplayResult], None] | None = None,
    progress_every_s: float = 2.0,
) -> ReplayResult:
    """Play ``main`` (rows from :func:`read_jsonl` or :func:`read_csv`, in file order)
    merged on event time with ``side`` (health reports and lifecycle events from files
    of their own) through a fresh :class:`JobDetection` of ``result.job_id``.

    A step's messages become one frame for the core's ``on_frame`` once a message
    :data:`STEP_WINDOW` steps later arrives (or the file ends), so nodes written a
    little out of order still make whole steps; health and lifecycle records are held
    with them and go to the core in event-time order before the first frame that ends
    after them. A step played again with an event time no newer than the newest played
    is refused as late (a newer one is a relaunch, as the live assembler reads it).

    ``redate_to``: move every time by one offset so that the first record is dated
    ``redate_to - span_s`` (the caller's estimate of the file's span: it then ends about
    ``redate_to``). ``on_message`` sees each played health report and lifecycle event
    (re-dated) with its row, ``on_frame`` each played frame (re-dated) with the row of
    its first message and its run: the archive writer. ``progress`` is called every
    ``progress_every_s``.
    """
    det = JobDetection(result.job_id, config)
    started = time.perf_counter()
    last_progress = started
    shift: float | None = None if redate_to is not None else 0.0
    held: list[tuple[float, int, Any]] = [
        (_event_time(m), 0, m) for m in side if _ours(m, result.job_id)
    ]
    held.sort(key=lambda x: x[:2])
    open_steps: dict[tuple[str, int], _Open] = {}
    newest: list[float] = [float("-inf"), -1.0]  # newest frame's end, its step

    def keep(alerts: Sequence[Alert]) -> None:
        result.alerts.extend(alerts)

    def release_side(until: float) -> Iterator[Record]:
        while held and held[0][0] <= until:
            _, row, msg = held.pop(0)
            msg = _shifted(msg, shift or 0.0)
            if on_message is not None:
                on_message(row, msg)
            if isinstance(msg, NodeHealth):
                result.health += 1
                yield msg.ts.timestamp(), HEALTH, msg
            else:
                result.events += 1
                yield msg.ts.timestamp(), LIFECYCLE, msg

    def release(keys: list[tuple[str, int]]) -> Iterator[Record]:
        for key in sorted(keys, key=lambda k: (k[1], k[0])):
            got = open_steps.pop(key)
            items = got.items
            frame = frame_of(items) if isinstance(items[0], Part) else None
            if frame is None:
                frame = StepFrame.from_messages(items)
            if frame.step <= newest[1] and frame.ts <= newest[0]:
                result.refuse("input", got.row, f"step {frame.step} already played (late)")
                continue
            yield from release_side(frame.ts)
            frame = _shifted(frame, shift or 0.0)
            newest[0], newest[1] = max(newest[0], frame.ts), frame.step
            result.steps += 1
            result.rank_steps += frame.n_ranks
            first, last = result.first_ts, result.last_ts
            result.first_ts = frame.ts if first is None else min(first, frame.ts)
            result.last_ts = frame.ts if last is None else max(last, frame.ts)
            if on_frame is not None:
                on_frame(got.row, key[0], frame)
            yield frame.ts, FRAME, frame

    def records() -> Iterator[Record]:
        nonlocal shift, last_progress
        run = None
        top = -1
        for row, read in main:
            if not _ours(read, result.job_id):
                job = read.key[0] if isinstance(read, Part) else read.job_id
                result.refuse("input", row, f"job {job!r}, replaying {result.job_id!r}")
                continue
            if shift is None:  # the first record: the offset that re-dates the file
                shift = (redate_to or 0.0) - span_s - _first_time(read)
                result.shift_s = shift
            if isinstance(read, NodeHealth | JobEvent):
                held.append((_event_time(read), row, read))
                held.sort(key=lambda x: x[:2])
                continue
            result.messages += 1
            _, r, step = _key(read)
            if run is not None and r != run:  # a relaunch under a new run id
                yield from release(list(open_steps))
                top = -1
            run = r
            got = open_steps.get((r, step))
            if got is None:
                open_steps[(r, step)] = _Open(row, [read])
            else:
                got.items.append(read)
            if step > top:
                top = step
                due = [k for k in open_steps if k[1] <= top - STEP_WINDOW]
                if due:
                    yield from release(due)
            if progress is not None and result.messages % 256 == 0:
                now = time.perf_counter()
                if now - last_progress >= progress_every_s:
                    last_progress = now
                    result.elapsed_s = now - started
                    progress(result)
        yield from release(list(open_steps))
        yield from release_side(float("inf"))

    play(det, records(), keep, tick_s=tick_s)
    result.elapsed_s = time.perf_counter() - started
    return result


# -- files -----------------------------------------------------------------------------


def open_rows(
    path: Path, result: ReplayResult, spec: ColumnSpec, fmt: str | None = None
) -> Iterator[tuple[int, Any]]:
    """The rows of ``path`` (format from ``fmt``, else its suffix: :func:`format_of`),
    decoded; bad ones refused into ``result``. ValueError for an unknown format, a
    table without the columns it needs, or Parquet without pyarrow."""
    kind = format_of(path, fmt)
    if kind == "csv":
        with path.open(newline="", encoding="utf-8") as f:
            yield from read_csv(f, path.name, result, spec, result.job_id)
    elif kind == "parquet":
        yield from read_parquet(path, path.name, result, spec, result.job_id)
    elif kind == "jsonl":
        # another process decodes ahead where there are cores to spare: on two (one
        # for detection, one for everything else) it only added its transfer cost
        big = path.stat().st_size >= PARALLEL_BYTES and _cores() >= 4
        refuse = lambda row, why: result.refuse(path.name, row, why)  # noqa: E731
        yield from decode_file(path, refuse, processes=1 if big else 0)


#: What each --format reads, and the suffixes that name it.
FORMATS = {
    "jsonl": (".jsonl", ".ndjson", ".json"),
    "csv": (".csv",),
    "parquet": (".parquet", ".pq"),
}


def format_of(path: Path, fmt: str | None = None) -> str:
    """``fmt`` when given (one of :data:`FORMATS`, else ValueError), else the one the
    suffix names (JSONL when none does)."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise ValueError(f"--format: one of {', '.join(FORMATS)}, got {fmt!r}")
        return fmt
    suffix = path.suffix.lower()
    return next((k for k, ends in FORMATS.items() if suffix in ends), "jsonl")


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # a container's cpuset, not the host's
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def first_job(path: Path, spec: ColumnSpec, fmt: str | None = None) -> str | None:
    """The job of the first step record of ``path`` (what ``--job`` defaults to)."""
    probe = ReplayResult(job_id="?")
    kind = format_of(path, fmt)
    if kind == "parquet":
        return parquet_first_job(path, spec)
    if kind == "csv":
        with path.open(newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), [])
            row = next(csv.reader(f), None)
        col = spec.column("job_id")
        if row is not None and col in header and header.index(col) < len(row):
            return row[header.index(col)] or None
        return None
    with path.open("rb") as fb:
        for _, msg in read_jsonl(itertools.islice(fb, 1000), path.name, probe):
            if isinstance(msg, Part):
                return msg.key[0]
            if not isinstance(msg, NodeHealth) or msg.job_id:
                return str(msg.job_id)
    return None


def span_of(path: Path, spec: ColumnSpec, fmt: str | None = None) -> float:
    """Seconds between the first and the last record of ``path``, read from its first
    and last lines (0 when they cannot tell): what ``--redate`` needs so the replayed
    job ends about now."""
    kind = format_of(path, fmt)
    if kind == "parquet":
        return parquet_span(path, spec)
    with path.open("rb") as fb:
        head = fb.read(1 << 16).decode("utf-8", "replace").splitlines()
        fb.seek(0, io.SEEK_END)
        size = fb.tell()
        fb.seek(max(0, size - (1 << 16)))
        tail = fb.read().decode("utf-8", "replace").splitlines()
    try:
        if kind == "csv":
            header = next(csv.reader([head[0]]))
            i = header.index(spec.column("ts_end"))
            scale = TIME_UNITS[spec.time_unit]
            first = as_time(next(csv.reader([head[1]]))[i], scale).timestamp()
            last = as_time(next(csv.reader([tail[-1]]))[i], scale).timestamp()
        else:
            first = _json_time(head[0])
            last = _json_time(next(x for x in reversed(tail) if x.strip()))
    except (ValueError, IndexError, KeyError, StopIteration, TypeError):
        return 0.0
    return max(0.0, last - first)


def _json_time(line: str) -> float:
    obj = json.loads(line)
    text = obj.get("ts_end") or obj["ts"]
    return as_time(text, 1.0).timestamp()
