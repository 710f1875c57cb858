"""``stepguard score-series``: columns, formats, timestamps, progress, bad input."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from detectors.series.scorer import SeriesScorer
from pipeline.cli.app import app
from pipeline.tools.series import (
    SeriesInputError,
    SeriesOptions,
    count_lines,
    parse_time,
    score_csv,
)

runner = CliRunner()
START = 1767571200  # 2026-01-05 00:00 UTC


def write_csv(tmp_path, header, rows, name="s.csv"):
    path = tmp_path / name
    path.write_text("\n".join([",".join(header), *(",".join(map(str, r)) for r in rows)]) + "\n")
    return path


def noisy(n, seed=0):
    return np.random.default_rng(seed).standard_normal(n)


def test_plain_format_prints_one_full_precision_score_per_row(tmp_path):
    x = noisy(200)
    path = write_csv(tmp_path, ["ts", "a"], [(i, repr(float(v))) for i, v in enumerate(x)])
    result = runner.invoke(app, ["score-series", str(path), "--format", "plain"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 200
    expected = SeriesScorer().score_rows({"a": float(v)} for v in x)
    assert [float(line) for line in lines] == expected  # full precision: exact floats


def test_csv_output_explains_the_column_and_kind(tmp_path):
    a, b = noisy(300, 1), noisy(300, 2)
    b[250] += 30.0
    rows = [(START + 300 * i, repr(float(u)), repr(float(v))) for i, (u, v) in enumerate(zip(a, b))]
    path = write_csv(tmp_path, ["time", "a", "b"], rows)
    result = runner.invoke(app, ["score-series", str(path), "--explain"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0] == "time,score,column,kind,season_s"
    stamp, score, column, kind, season = lines[1 + 250].split(",")
    assert stamp == str(START + 300 * 250) and float(score) > 0.7
    assert (column, kind, season) == ("b", "spike", "")


def test_columns_option_selects_what_is_scored(tmp_path):
    a = noisy(200, 3)
    rows = [(i, repr(float(v)), 1e9 if i == 150 else 1.0) for i, v in enumerate(a)]
    path = write_csv(tmp_path, ["ts", "a", "junk"], rows)
    only_a = runner.invoke(app, ["score-series", str(path), "--columns", "a", "--format", "plain"])
    both = runner.invoke(app, ["score-series", str(path), "--format", "plain"])
    assert float(only_a.output.splitlines()[150]) < 0.5
    assert float(both.output.splitlines()[150]) > 0.9


def test_iso_timestamps_enable_the_daily_season():
    n = 288 * 6
    hours = np.arange(n) / 12.0
    x = 10 * np.sin(2 * np.pi * hours / 24) + noisy(n, 4)
    from datetime import UTC, datetime

    stamps = [datetime.fromtimestamp(START + 300 * i, UTC).isoformat() for i in range(n)]
    text = "when,load\n" + "".join(f"{t},{v!r}\n" for t, v in zip(stamps, x.tolist()))
    out = io.StringIO()
    score_csv(io.StringIO(text), out, SeriesOptions(explain=True))
    *_, last = out.getvalue().strip().splitlines()
    assert last.startswith(stamps[-1]) and last.endswith(",86400")
    out_none = io.StringIO()
    score_csv(io.StringIO(text), out_none, SeriesOptions(explain=True, season="none"))
    assert out_none.getvalue().strip().splitlines()[-1].endswith(",")


def test_parse_time_reads_iso_and_epoch_and_refuses_row_numbers():
    assert parse_time("2026-01-05T00:00:00+00:00") == START
    assert parse_time(str(START)) == START and parse_time(str(START * 1000)) == START
    assert parse_time("17") is None and parse_time("17", numbers_are_seconds=True) == 17.0
    assert parse_time("nan") is None and parse_time("") is None


def test_progress_reaches_the_end_of_the_file(tmp_path, monkeypatch):
    path = write_csv(tmp_path, ["ts", "a"], [(i, i % 7) for i in range(500)])
    from pipeline.tools import series

    seen = []
    monkeypatch.setattr(series, "count_lines", lambda lines, cb: (seen.append(1), lines)[1])
    result = runner.invoke(app, ["score-series", str(path), "--progress", "--format", "plain"])
    assert result.exit_code == 0, result.output
    assert seen == [1]


def test_count_lines_counts_every_character():
    lines, sizes = ["ts,a\n", "1,2\n", "2,3\n"], []
    assert list(count_lines(lines, sizes.append)) == lines
    assert sizes == [5, 4, 4]


@pytest.mark.parametrize(
    ("argv", "text", "needle"),
    [
        (["--columns", "nope"], "ts,a\n1,1\n", "nope"),
        (["--time-column", "when"], "ts,a\n1,1\n", "when"),
        ([], "", "empty CSV"),
        (["--season", "hourly"], "ts,a\n1,1\n", "--season"),
        (["--format", "xml"], "ts,a\n1,1\n", "format"),
        ([], "ts,a\n1,1.0\n2,oops\n", "line 3"),
    ],
)
def test_bad_input_is_a_clear_error(tmp_path, argv, text, needle):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    result = runner.invoke(app, ["score-series", str(path), *argv])
    assert result.exit_code == 2
    assert needle in result.output


def test_a_byte_order_mark_and_bad_bytes(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes("\ufeffts,a\n1,1.0\n2,1.0\n".encode())
    result = runner.invoke(app, ["score-series", str(path), "--time-column", "ts"])
    assert result.exit_code == 0 and result.output.splitlines()[0] == "ts,score"
    path.write_bytes(b"ts,a\n1,1.0\n2,\xff\xfe\n")
    result = runner.invoke(app, ["score-series", str(path)])
    assert result.exit_code == 2 and "UTF-8" in result.output


def test_a_missing_file_is_named(tmp_path):
    result = runner.invoke(app, ["score-series", str(tmp_path / "absent.csv")])
    assert result.exit_code == 2 and "absent.csv" in result.output


def test_missing_cells_are_skipped_not_zero():
    out = io.StringIO()
    text = "ts,a\n" + "".join(
        f"{i},{'' if i % 5 == 0 else 1.0 + 0.01 * (i % 3)}\n" for i in range(80)
    )
    rows = score_csv(io.StringIO(text), out, SeriesOptions(output="plain"))
    scores = [float(v) for v in out.getvalue().split()]
    assert rows == 80 and max(scores) < 0.5 and all(math.isfinite(s) for s in scores)


def test_score_csv_raises_its_own_error():
    with pytest.raises(SeriesInputError, match="column 'a'"):
        score_csv(io.StringIO("ts,a\n1,x\n"), io.StringIO(), SeriesOptions())
