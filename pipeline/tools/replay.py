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
- **CSV**: one row per rank and step; :class:`ColumnSpec` maps the file's columns onto
  the fields (``node``, ``step``, ``rank``, ``step_time_s``, ``compute_s`` and
  ``ts_end`` are needed; the rest default as in StepTelemetry). Rows come in step order
  (any order within a step, a few steps out of order tolerated).

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
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec

from detectors.config import DetectorConfig
from detectors.frame import StepFrame
from detectors.job import JobDetection
from pipeline.io.fastdecode import StepView, sample_of
from pipeline.tools.calibrate.replay import FRAME, HEALTH, LIFECYCLE, play
from pipeline.tools.replay_frames import (
    PARALLEL_BYTES,
    Part,
    decode_file,
    decode_lines,
    frame_of,
)
from schemas import Alert, JobEvent, NodeHealth

__all__ = [
    "ColumnSpec",
    "Refusal",
    "ReplayResult",
    "read_csv",
    "read_jsonl",
    "replay",
]

#: Refusals kept with their row and reason (more are counted only).
MAX_REFUSALS_KEPT = 1000
#: Steps a CSV step may arrive after a later one and still be played.
CSV_STEP_WINDOW = 4
#: Steps a step's messages may arrive after a later step's and still join its frame.
STEP_WINDOW = 2
#: The fields of a CSV row (StepTelemetry's and RankSample's names).
CSV_FIELDS: tuple[str, ...] = (
    "job_id", "run", "node", "step", "ts_start", "ts_end", "rank", "local_rank",
    "dp_group", "pp_stage", "tp_group", "phase", "step_time_s", "compute_s",
    "comm_wait_s", "data_wait_s", "loss", "grad_norm", "tokens", "flops", "max_seq_len",
)  # fmt: skip
_CSV_NEEDED = ("node", "step", "rank", "step_time_s", "compute_s", "ts_end")
_MESSAGE_FIELDS = frozenset({"job_id", "run", "node", "step", "ts_start", "ts_end"})

Record = tuple[float, int, Any]  #: (event time, order code, record) as play() takes them


@dataclass(frozen=True, slots=True)
class Refusal:
    """A row (1-based line of its file) that was not played, and why."""

    source: str
    row: int
    reason: str

    def __str__(self) -> str:
        return f"{self.source}:{self.row}: {self.reason}"


@dataclass(frozen=True, slots=True)
class ColumnSpec:
    """Which CSV column holds each field: ``field=column`` pairs; a field not named is
    read from the column of its own name. ``time_unit`` scales numeric ``ts_start`` /
    ``ts_end`` (epoch seconds ``s``, ``ms``, ``us``, ``ns``); ISO 8601 times are read as
    they are (a time without a zone is UTC).

    >>> spec = ColumnSpec.parse("rank=global_rank, step=iteration, ts_end=t_ms", "ms")
    >>> spec.column("rank"), spec.column("node")
    ('global_rank', 'node')
    >>> ColumnSpec.parse("speed=x")
    Traceback (most recent call last):
    ...
    ValueError: --columns: unknown field 'speed' (fields: job_id, run, node, ...)
    """

    mapping: tuple[tuple[str, str], ...] = ()
    time_unit: str = "s"

    @classmethod
    def parse(cls, text: str | None, time_unit: str = "s") -> ColumnSpec:
        if time_unit not in _TIME_UNITS:
            raise ValueError(f"--time-unit: one of {', '.join(_TIME_UNITS)}, got {time_unit!r}")
        pairs: list[tuple[str, str]] = []
        for part in (text or "").split(","):
            if not part.strip():
                continue
            name, sep, column = (x.strip() for x in part.partition("="))
            if not sep or not column:
                raise ValueError(f"--columns: {part.strip()!r} is not field=column")
            if name not in CSV_FIELDS:
                raise ValueError(
                    f"--columns: unknown field {name!r} (fields: {', '.join(CSV_FIELDS[:3])}, ...)"
                )
            pairs.append((name, column))
        return cls(tuple(pairs), time_unit)

    def column(self, name: str) -> str:
        return dict(self.mapping).get(name, name)


_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


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


def _time(text: str, scale: float) -> datetime:
    try:
        return datetime.fromtimestamp(float(text) * scale, UTC)
    except ValueError:
        pass
    t = datetime.fromisoformat(text)
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def read_csv(
    stream: Iterable[str],
    source: str,
    result: ReplayResult,
    spec: ColumnSpec,
    job_id: str,
) -> Iterator[tuple[int, StepView]]:
    """CSV rows (one per rank and step) as one StepView per node and step, a step
    released once a row :data:`CSV_STEP_WINDOW` steps later arrives (or at the end).
    A row that is bad, repeats a rank of its step, or comes for a step already
    released is refused with its row number (the header is row 1)."""
    reader = csv.reader(stream)
    try:
        header = next(reader)
    except StopIteration:
        return
    where = {name: i for i, name in enumerate(header)}
    missing = [spec.column(f) for f in _CSV_NEEDED if spec.column(f) not in where]
    if missing:
        raise ValueError(f"{source}: no column {', '.join(missing)} (see --columns)")
    cols = [(f, where[spec.column(f)]) for f in CSV_FIELDS if spec.column(f) in where]
    scale = _TIME_UNITS[spec.time_unit]
    # step -> node -> (rows by rank, ts_start, ts_end, run, first row number)
    open_steps: dict[int, dict[str, _NodeRows]] = defaultdict(dict)
    released = -1  # every step up to here is played

    def release(upto: int) -> Iterator[tuple[int, StepView]]:
        nonlocal released
        for s in sorted(k for k in open_steps if k <= upto):
            for node, group in open_steps.pop(s).items():
                view = StepView(job_id, node, s, group.start, group.end, group.samples, group.run)
                yield group.row, view
        released = max(released, upto)

    for row, values in enumerate(reader, start=2):
        if not values:
            continue
        try:
            got = {f: values[i] for f, i in cols if i < len(values) and values[i] != ""}
            step, node, end = int(got["step"]), got["node"], _time(got["ts_end"], scale)
            start = _time(got["ts_start"], scale) if "ts_start" in got else None
            if got.get("job_id", job_id) != job_id:
                raise ValueError(f"job {got['job_id']!r}, replaying {job_id!r}")
            fields = {k: v for k, v in got.items() if k not in _MESSAGE_FIELDS}
            for name in ("local_rank", "comm_wait_s", "data_wait_s"):
                fields.setdefault(name, "0")
            sample = sample_of(fields)
        except (KeyError, ValueError, OverflowError, msgspec.ValidationError) as exc:
            what = f"no {exc}" if isinstance(exc, KeyError) else str(exc)
            result.refuse(source, row, what)
            continue
        if step <= released:
            result.refuse(source, row, f"step {step} already played (rows in step order)")
            continue
        if start is None:
            start = end - timedelta(seconds=sample.step_time_s)
        group = open_steps[step].get(node)
        if group is None:
            group = open_steps[step][node] = _NodeRows(row, start, end, got.get("run", ""))
        if sample.rank in group.ranks:
            result.refuse(source, row, f"rank {sample.rank} twice in step {step}")
            continue
        group.add(sample, start, end)
        if step - CSV_STEP_WINDOW > released:
            yield from release(step - CSV_STEP_WINDOW)
    if open_steps:
        yield from release(max(open_steps))


@dataclass(slots=True)
class _NodeRows:
    row: int
    start: datetime
    end: datetime
    run: str
    samples: list[Any] = field(default_factory=list)
    ranks: set[int] = field(default_factory=set)

    def add(self, sample: Any, start: datetime, end: datetime) -> None:
        self.samples.append(sample)
        self.ranks.add(sample.rank)
        self.start, self.end = min(self.start, start), max(self.end, end)


# -- playing ---------------------------------------------------------------------------


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
    """The rows of ``path`` (format from ``fmt``, else its suffix: .jsonl/.json/.ndjson or
    .csv), decoded; bad ones refused into ``result``."""
    kind = fmt or ("csv" if path.suffix.lower() == ".csv" else "jsonl")
    if kind == "csv":
        with path.open(newline="", encoding="utf-8") as f:
            yield from read_csv(f, path.name, result, spec, result.job_id)
    elif kind == "jsonl":
        # another process decodes ahead where there are cores to spare: on two (one
        # for detection, one for everything else) it only added its transfer cost
        big = path.stat().st_size >= PARALLEL_BYTES and _cores() >= 4
        refuse = lambda row, why: result.refuse(path.name, row, why)  # noqa: E731
        yield from decode_file(path, refuse, processes=1 if big else 0)
    else:
        raise ValueError(f"--format: csv or jsonl, got {fmt!r}")


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # a container's cpuset, not the host's
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def first_job(path: Path, spec: ColumnSpec, fmt: str | None = None) -> str | None:
    """The job of the first step record of ``path`` (what ``--job`` defaults to)."""
    probe = ReplayResult(job_id="?")
    if (fmt or ("csv" if path.suffix.lower() == ".csv" else "jsonl")) == "csv":
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
    kind = fmt or ("csv" if path.suffix.lower() == ".csv" else "jsonl")
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
            scale = _TIME_UNITS[spec.time_unit]
            first = _time(next(csv.reader([head[1]]))[i], scale).timestamp()
            last = _time(next(csv.reader([tail[-1]]))[i], scale).timestamp()
        else:
            first = _json_time(head[0])
            last = _json_time(next(x for x in reversed(tail) if x.strip()))
    except (ValueError, IndexError, KeyError, StopIteration, TypeError):
        return 0.0
    return max(0.0, last - first)


def _json_time(line: str) -> float:
    obj = json.loads(line)
    text = obj.get("ts_end") or obj["ts"]
    return _time(text, 1.0).timestamp()
