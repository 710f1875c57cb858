"""``stepguard score-series``: read a CSV of metrics, score each row causally, write scores.

The maths is :class:`detectors.series.scorer.SeriesScorer`; this module is the edge around
it: choosing columns, parsing cells and timestamps, writing each row's score as the
row is read (streaming: memory does not grow with the file), and progress on big files.

Timestamps. A cell of the time column is a time in seconds when it is an ISO 8601
date-time (a naive one is taken as UTC) or a number of epoch seconds (at least 1e8,
i.e. after 1973; numbers of 1e11 and more are taken as epoch milliseconds). With an
explicit ``--season SECONDS`` any number counts as seconds. Anything else (row
numbers with ``--season auto``, free text) leaves the row without a time: it is still
scored, without seasonal baselines.

Output. ``csv`` writes ``<time column>,score`` (plus ``column,kind,season_s`` with
``explain``: the column and kind of change behind the score, and the period of the
seasonal baseline that scored it, empty for none), ``plain`` one score per line;
scores are printed at full precision (the shortest text that reads back as the same
float).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

from detectors.series.scorer import SeriesScorer
from pipeline.io.errors import StepguardError

__all__ = [
    "FORMATS",
    "SeriesInputError",
    "SeriesOptions",
    "count_lines",
    "parse_time",
    "score_csv",
]

FORMATS = ("csv", "plain")
_MISSING = ("", "nan", "null", "none", "na", "n/a")
_EPOCH_S_MIN = 1e8
_EPOCH_MS_MIN = 1e11


class SeriesInputError(StepguardError):
    """The CSV cannot be scored as asked (no header, unknown column, a cell that is
    not a number); the message names the line and column."""


@dataclass(frozen=True, slots=True)
class SeriesOptions:
    """What to score and how to print it (see ``stepguard score-series --help``)."""

    time_column: str | None = None
    columns: Sequence[str] | None = None
    season: str | float = "auto"
    output: str = "csv"
    explain: bool = False
    warmup: int = 10
    rarity: float = 1e4

    def __post_init__(self) -> None:
        if self.output not in FORMATS:
            raise SeriesInputError(f"format must be one of {FORMATS}, got {self.output!r}")


def parse_time(cell: str, numbers_are_seconds: bool = False) -> float | None:
    """Seconds since the epoch of a timestamp cell, or None when it is not a time.

    Examples
    --------
    >>> parse_time("2026-01-05T00:05:00Z"), parse_time("2026-01-05 00:05:00")
    (1767571500.0, 1767571500.0)
    >>> parse_time("1767571500"), parse_time("1767571500000"), parse_time("42")
    (1767571500.0, 1767571500.0, None)
    >>> parse_time("42", numbers_are_seconds=True), parse_time("monday")
    (42.0, None)
    """
    text = cell.strip()
    if not text:
        return None
    try:
        number = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(number):
            return None
        if numbers_are_seconds:
            return number
        if number >= _EPOCH_MS_MIN:
            return number / 1000.0
        return number if number >= _EPOCH_S_MIN else None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def count_lines(lines: Iterable[str], on_chars: Callable[[int], None]) -> Iterator[str]:
    """The lines, calling ``on_chars`` with each line's length (for progress)."""
    for line in lines:
        on_chars(len(line))
        yield line


def _pick_columns(header: list[str], opts: SeriesOptions) -> tuple[int, dict[str, int]]:
    if not header:
        raise SeriesInputError("empty CSV (no header row)")
    t_col = opts.time_column or header[0]
    if t_col not in header:
        raise SeriesInputError(f"no time column {t_col!r} in {header}")
    wanted = list(opts.columns) if opts.columns else [c for c in header if c != t_col]
    missing = [c for c in wanted if c not in header]
    if missing:
        raise SeriesInputError(f"no column(s) {missing} in {header}")
    if not wanted:
        raise SeriesInputError(f"no column to score besides the time column {t_col!r}")
    return header.index(t_col), {c: header.index(c) for c in wanted}


def _value(cell: str, line_no: int, name: str) -> float | None:
    text = cell.strip()
    if text.lower() in _MISSING:
        return None
    try:
        value = float(text)
    except ValueError:
        raise SeriesInputError(f"line {line_no}, column {name!r}: not a number: {cell!r}") from None
    return value if math.isfinite(value) else None


def score_csv(lines: Iterable[str], out: TextIO, opts: SeriesOptions) -> int:
    """Score every row of a CSV (header first) and write one score per row to ``out``.

    Returns the number of rows scored. Raises :class:`SeriesInputError` naming the
    line and column of the first cell that is not a number (rows before it are
    already written).
    """
    reader = csv.reader(lines)
    try:
        return _score_rows(reader, out, opts)
    except csv.Error as exc:
        raise SeriesInputError(f"line {reader.line_num}: not CSV: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise SeriesInputError(
            f"line {reader.line_num + 1}: not UTF-8 text ({exc.reason})"
        ) from exc


def _score_rows(reader: Any, out: TextIO, opts: SeriesOptions) -> int:
    header = next(reader, None)
    if header:
        header[0] = header[0].removeprefix("\ufeff")  # a byte-order mark from a spreadsheet
    t_idx, idx = _pick_columns(header or [], opts)
    assert header is not None
    scorer = SeriesScorer(warmup=opts.warmup, rarity=opts.rarity, season=opts.season)
    numbers_are_seconds = not isinstance(opts.season, str) or opts.season not in ("auto", "none")
    writer = csv.writer(out, lineterminator="\n")
    plain = opts.output == "plain"
    if not plain:
        extra = ("column", "kind", "season_s") if opts.explain else ()
        writer.writerow([header[t_idx], "score", *extra])
    rows = 0
    for row in reader:
        line_no = reader.line_num
        if not row:
            continue
        values = {
            name: _value(row[i] if i < len(row) else "", line_no, name) for name, i in idx.items()
        }
        stamp = row[t_idx] if t_idx < len(row) else ""
        result = scorer.step_one(values, parse_time(stamp, numbers_are_seconds))
        rows += 1
        if plain:
            out.write(f"{result.score!r}\n")
        elif opts.explain:
            season = "" if result.seasonal is None else f"{result.seasonal:g}"
            writer.writerow(
                [stamp, repr(result.score), result.column or "", result.kind or "", season]
            )
        else:
            writer.writerow([stamp, repr(result.score)])
    return rows


def _season(text: str) -> str | float:
    value = text.strip().lower()
    if value in ("auto", "none"):
        return value
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise SeriesInputError(f"--season must be auto, none or SECONDS > 0, got {text!r}")
    return seconds


_PROGRESS_MIN_BYTES = 1 << 20


def run_score_series(
    file: str,
    *,
    time_column: str | None = None,
    columns: str | None = None,
    season: str = "auto",
    output: str = "csv",
    explain: bool = False,
    warmup: int = 10,
    rarity: float = 1e4,
    progress: bool | None = None,
    out: TextIO | None = None,
) -> int:
    """``stepguard score-series``: score ``file`` (a path, or ``-`` for stdin) to ``out``
    (default: standard output); progress on standard error for big files.

    Returns the number of rows scored; raises :class:`SeriesInputError` on bad input.
    """
    import os
    import sys

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    err = Console(stderr=True)  # progress goes to standard error, as every command's does

    opts = SeriesOptions(
        time_column=time_column,
        columns=[c.strip() for c in columns.split(",") if c.strip()] if columns else None,
        season=_season(season),
        output=output,
        explain=explain,
        warmup=warmup,
        rarity=rarity,
    )
    target = out if out is not None else sys.stdout
    if file == "-":
        return score_csv(sys.stdin, target, opts)
    try:
        handle = open(file, newline="")  # noqa: SIM115 - closed below
        size = os.fstat(handle.fileno()).st_size
    except OSError as exc:
        raise SeriesInputError(f"cannot read {file!r}: {exc.strerror or exc}") from exc
    with handle:
        show = progress if progress is not None else size >= _PROGRESS_MIN_BYTES and err.is_terminal
        if not show:
            return score_csv(handle, target, opts)
        with Progress(
            TextColumn("score-series"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeRemainingColumn(),
            console=err,
            transient=True,
        ) as bar:
            task = bar.add_task("rows", total=max(size, 1))
            return score_csv(count_lines(handle, lambda n: bar.advance(task, n)), target, opts)
