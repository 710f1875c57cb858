"""Tables of per-rank step timings for ``stepguard replay``: CSV and Parquet, one row
per rank and step, read through a :class:`ColumnSpec` into one
:class:`~pipeline.io.fastdecode.StepView` per node and step (docs/replay.md).

Both formats go through one reader (:func:`read_table`): every row is checked with the
schema's own bounds (the sample by :func:`~pipeline.io.fastdecode.sample_of`, the
message's job, node, run, step and times here), and a bad or inconsistent row is
refused with its row number while the rest is played. Parquet needs ``pyarrow`` (the
``parquet`` extra); without it the command fails at once, naming the extra.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import msgspec

from pipeline.io.fastdecode import StepView, sample_of
from schemas.telemetry import MAX_STEP, SAMPLE_FIELDS

__all__ = [
    "CSV_FIELDS",
    "CSV_STEP_WINDOW",
    "PARQUET_EXTRA",
    "ColumnSpec",
    "need_pyarrow",
    "parquet_first_job",
    "parquet_span",
    "read_csv",
    "read_parquet",
    "read_table",
]

#: Steps a table's step may arrive after a later one and still be played.
CSV_STEP_WINDOW = 4
#: The fields of a table's row: StepTelemetry's, then RankSample's
#: (:data:`~schemas.telemetry.SAMPLE_FIELDS`; the row's ``node`` is its message's).
CSV_FIELDS: tuple[str, ...] = (
    "job_id", "run", "node", "step", "ts_start", "ts_end",
    *(f for f in SAMPLE_FIELDS if f != "node"),
)  # fmt: skip
_CSV_NEEDED = ("node", "step", "rank", "step_time_s", "compute_s", "ts_end")
_MESSAGE_FIELDS = frozenset({"job_id", "run", "node", "step", "ts_start", "ts_end"})
_TIME_FIELDS = ("ts_start", "ts_end")
#: StepTelemetry's bound on a job, node or run name.
_MAX_NAME = 256
#: Rows of a Parquet file converted to Python values at once.
PARQUET_BATCH_ROWS = 65536
#: What a Parquet replay without pyarrow is told to install.
PARQUET_EXTRA = "pip install 'stepguard[parquet]'"


class Refuser(Protocol):
    def refuse(self, source: str, row: int, reason: str) -> None: ...


@dataclass(frozen=True, slots=True)
class ColumnSpec:
    """Which column holds each field: ``field=column`` pairs; a field not named is
    read from the column of its own name. ``time_unit`` scales numeric ``ts_start`` /
    ``ts_end`` (epoch seconds ``s``, ``ms``, ``us``, ``ns``); ISO 8601 times are read as
    they are (a time without a zone is UTC), and so are a Parquet file's timestamp
    columns (whatever ``time_unit`` says).

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
        if time_unit not in TIME_UNITS:
            raise ValueError(f"--time-unit: one of {', '.join(TIME_UNITS)}, got {time_unit!r}")
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

    def wanted(self, header: Sequence[str]) -> list[str]:
        """The columns of ``header`` that hold a field, in field order."""
        return [self.column(f) for f in CSV_FIELDS if self.column(f) in header]


TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def as_time(value: object, scale: float) -> datetime:
    """A time from a table: epoch (a number, or its text) times ``scale``, or ISO 8601
    (no zone: UTC). ValueError (or OverflowError) when it is neither."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(float(value) * scale, UTC)
    text = str(value)
    try:
        return datetime.fromtimestamp(float(text) * scale, UTC)
    except ValueError:
        pass
    t = datetime.fromisoformat(text)
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def _integer(value: object, name: str) -> int:
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{name} {value} is not an integer")
    return int(value)  # type: ignore[call-overload]


def _name(value: object, name: str, empty: bool = False) -> str:
    text = value if isinstance(value, str) else str(value)
    if len(text) > _MAX_NAME or (not text and not empty):
        raise ValueError(f"{name}: 1 to {_MAX_NAME} characters, got {len(text)}")
    return text


def read_table(
    header: Sequence[str],
    rows: Iterable[tuple[int, Sequence[object]]],
    source: str,
    result: Refuser,
    spec: ColumnSpec,
    job_id: str,
    scales: dict[str, float] | None = None,
) -> Iterator[tuple[int, StepView]]:
    """Rows ``(row number, values in header order)`` (one per rank and step) as one
    StepView per node and step, a step released once a row :data:`CSV_STEP_WINDOW`
    steps later arrives (or at the end). A value that is None or empty is absent. A
    row that is bad, repeats a rank of its step, or comes for a step already released
    is refused in ``result`` with its row number. ``scales``: a time field's own
    scale (a Parquet timestamp column's, in seconds), else ``spec.time_unit``'s."""
    where = {name: i for i, name in enumerate(header)}
    missing = [spec.column(f) for f in _CSV_NEEDED if spec.column(f) not in where]
    if missing:
        raise ValueError(f"{source}: no column {', '.join(missing)} (see --columns)")
    cols = [(f, where[spec.column(f)]) for f in CSV_FIELDS if spec.column(f) in where]
    scale = {f: (scales or {}).get(f, TIME_UNITS[spec.time_unit]) for f in _TIME_FIELDS}
    open_steps: dict[int, dict[str, _NodeRows]] = defaultdict(dict)
    released = -1  # every step up to here is played

    def release(upto: int) -> Iterator[tuple[int, StepView]]:
        nonlocal released
        for s in sorted(k for k in open_steps if k <= upto):
            for node, group in open_steps.pop(s).items():
                view = StepView(job_id, node, s, group.start, group.end, group.samples, group.run)
                yield group.row, view
        released = max(released, upto)

    for row, values in rows:
        if not values:
            continue
        try:
            got = {f: v for f, i in cols if i < len(values) and (v := values[i]) not in ("", None)}
            step, node = _integer(got["step"], "step"), _name(got["node"], "node")
            if not 0 <= step <= MAX_STEP:
                raise ValueError(f"step {step} is not in 0..{MAX_STEP}")
            end = as_time(got["ts_end"], scale["ts_end"])
            start = as_time(got["ts_start"], scale["ts_start"]) if "ts_start" in got else None
            if start is not None and end < start:
                raise ValueError("ts_end is before ts_start")
            if _name(got.get("job_id", job_id), "job_id") != job_id:
                raise ValueError(f"job {got['job_id']!r}, replaying {job_id!r}")
            run = _name(got.get("run", ""), "run", empty=True)
            fields = {k: v for k, v in got.items() if k not in _MESSAGE_FIELDS}
            for name in ("local_rank", "comm_wait_s", "data_wait_s"):
                fields.setdefault(name, 0)
            sample = sample_of(fields)
        except (KeyError, ValueError, TypeError, OverflowError, msgspec.ValidationError) as exc:
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
            group = open_steps[step][node] = _NodeRows(row, start, end, run)
        if sample.rank in group.ranks:
            result.refuse(source, row, f"rank {sample.rank} twice in step {step}")
            continue
        group.add(sample, start, end)
        if step - CSV_STEP_WINDOW > released:
            yield from release(step - CSV_STEP_WINDOW)
    if open_steps:
        yield from release(max(open_steps))


def read_csv(
    stream: Iterable[str], source: str, result: Refuser, spec: ColumnSpec, job_id: str
) -> Iterator[tuple[int, StepView]]:
    """A CSV with a header as :func:`read_table` reads it (the header is row 1)."""
    reader = csv.reader(stream)
    header = next(reader, None)
    if header is None:
        return
    yield from read_table(header, enumerate(reader, start=2), source, result, spec, job_id)


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


# -- Parquet ---------------------------------------------------------------------------


def _pyarrow() -> Any:
    """``pyarrow.parquet`` and ``pyarrow.compute``, or ValueError naming the extra."""
    try:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ValueError(f"--format parquet needs pyarrow: {PARQUET_EXTRA}") from exc
    return pq, pc


def need_pyarrow() -> None:
    """ValueError naming the ``parquet`` extra when pyarrow cannot be imported."""
    _pyarrow()


def _seconds(column: Any, pc: Any) -> tuple[Any, float | None]:
    """A timestamp column as epoch time in its own unit (int64) and that unit's scale
    to seconds; any other column as it is (scale None)."""
    import pyarrow as pa

    if pa.types.is_timestamp(column.type):
        return pc.cast(column, pa.int64()), TIME_UNITS[column.type.unit]
    return column, None


def read_parquet(
    path: Path, source: str, result: Refuser, spec: ColumnSpec, job_id: str
) -> Iterator[tuple[int, StepView]]:
    """A Parquet file as :func:`read_table` reads it: the columns a field maps to
    only, :data:`PARQUET_BATCH_ROWS` rows at a time (rows numbered from 1); timestamp
    columns are read in their own unit, numbers as ``spec.time_unit`` says."""
    import pyarrow as pa

    pq, pc = _pyarrow()
    f = pq.ParquetFile(path)
    schema = f.schema_arrow
    header = spec.wanted(schema.names)
    types = {x: schema.field(spec.column(x)).type for x in _TIME_FIELDS if spec.column(x) in header}
    scales = {x: TIME_UNITS[t.unit] for x, t in types.items() if pa.types.is_timestamp(t)}

    def rows() -> Iterator[tuple[int, Sequence[object]]]:
        row = 1
        for batch in f.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=header):
            cols = [_seconds(c, pc)[0].to_pylist() for c in batch.columns]
            for values in zip(*cols, strict=True):
                yield row, values
                row += 1

    yield from read_table(header, rows(), source, result, spec, job_id, scales)


def parquet_first_job(path: Path, spec: ColumnSpec) -> str | None:
    """The job of a Parquet file's first row (None when it has no job column)."""
    pq, _ = _pyarrow()
    f = pq.ParquetFile(path)
    col = spec.column("job_id")
    if col not in f.schema_arrow.names:
        return None
    for batch in f.iter_batches(batch_size=1, columns=[col]):
        first = batch.column(0).to_pylist()
        return str(first[0]) if first and first[0] not in ("", None) else None
    return None


def parquet_span(path: Path, spec: ColumnSpec) -> float:
    """Seconds between a Parquet file's earliest and latest ``ts_end`` (0 when it
    cannot tell)."""
    pq, pc = _pyarrow()
    col = spec.column("ts_end")
    f = pq.ParquetFile(path)
    if col not in f.schema_arrow.names:
        return 0.0
    column, unit = _seconds(f.read(columns=[col]).column(0), pc)
    try:
        bounds = pc.min_max(column).as_py()
        scale = unit if unit is not None else TIME_UNITS[spec.time_unit]
        first, last = (as_time(bounds[k], scale).timestamp() for k in ("min", "max"))
    except (ValueError, TypeError, OverflowError, KeyError):
        return 0.0
    return max(0.0, last - first)
