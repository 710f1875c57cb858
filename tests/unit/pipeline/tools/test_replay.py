"""``stepguard replay`` (issue 43): recorded telemetry through the detection core."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from pipeline.tools.replay import ColumnSpec, ReplayResult, read_csv, read_jsonl, replay
from pipeline.tools.replay_run import ReplayOptions, run_replay
from pipeline.tools.simulator import Scenario, simulate
from schemas import JobEvent, JobEventKind, RankSample, StepTelemetry, encode

SAMPLE = Path(__file__).resolve().parents[4] / "docs" / "samples" / "replay-straggler.jsonl"


def _scenario(**kw) -> Scenario:
    base = {"name": "rp", "job_id": "rp", "nodes": 8, "steps": 120, "seed": 5,
            "tokens_per_rank": 1024,
            "faults": [{"kind": "straggler", "node": 5, "gpu": 2, "onset_step": 50,
                        "magnitude": 0.3}]}  # fmt: skip
    return Scenario.model_validate({**base, **kw})


def _jsonl(sc: Scenario) -> list[bytes]:
    return [encode(m) for ev in simulate(sc) if ev.frame for m in ev.frame.to_messages()]


def _csv(sc: Scenario) -> str:
    out = io.StringIO()
    out.write("iteration,host,global_rank,gpu,t_end_ms,wall,fwd_bwd,comm,data,tokens\n")
    for ev in simulate(sc):
        f = ev.frame
        if f is None:
            continue
        for i in range(f.n_ranks):
            out.write(
                f"{f.step},{f.nodes[f.node_idx[i]]},{f.rank[i]},{f.local_rank[i]},"
                f"{f.ts * 1000:.3f},{f.step_time[i]},{f.compute[i]},{f.comm_wait[i]},"
                f"{f.data_wait[i]},{int(f.tokens[i])}\n"
            )
    return out.getvalue()


SPEC = "step=iteration,node=host,rank=global_rank,local_rank=gpu,ts_end=t_end_ms,"
SPEC += "step_time_s=wall,compute_s=fwd_bwd,comm_wait_s=comm,data_wait_s=data"


def _named(result: ReplayResult) -> set[str]:
    return {a.node for a in result.firing if a.node is not None}


def test_the_shipped_sample_replays_and_names_its_straggler(capsys):
    from pipeline.cli.util import console, err
    from pipeline.io.settings import load_settings

    result = run_replay(load_settings(), console, err, ReplayOptions(path=SAMPLE))
    assert result.refused_count == 0 and result.steps == 100
    assert _named(result) == {"node-0002"}
    assert {a.rank for a in result.firing} == {9}  # node 2, GPU 1, 4 GPUs a node
    printed = capsys.readouterr().out
    assert "straggler" in printed and "nodes named: node-0002" in printed


def test_a_csv_by_its_column_spec_plays_like_the_messages():
    sc = _scenario()
    by_json = replay(read_jsonl(_jsonl(sc), "j", r := ReplayResult("rp")), r)
    spec = ColumnSpec.parse(SPEC, "ms")
    by_csv = replay(read_csv(io.StringIO(_csv(sc)), "c", c := ReplayResult("rp"), spec, "rp"), c)
    assert c.refused_count == 0 and by_csv.rank_steps == by_json.rank_steps == 120 * 64
    assert _named(by_csv) == _named(by_json) == {"node-0005"}


def test_bad_and_inconsistent_rows_are_refused_with_their_row_and_the_rest_plays():
    sc = _scenario()
    lines = _csv(sc).splitlines()
    header, rows = lines[0], lines[1:]
    bad = list(rows)
    bad[3] = bad[3].replace(bad[3].split(",")[5], "-1", 1)  # a negative step time
    bad[10] = bad[0]  # rank 0 of step 0 again
    bad.insert(64 * 20, rows[0].replace(",0,", ",x,", 1))  # not a number
    bad.append(rows[0])  # step 0 again, long after it was played
    text = "\n".join([header, *bad]) + "\n"
    result = ReplayResult("rp")
    replay(read_csv(io.StringIO(text), "f.csv", result, ColumnSpec.parse(SPEC, "ms"), "rp"), result)
    got = {(r.row, r.reason.split(" ")[0]) for r in result.refused}
    assert [r.row for r in result.refused] == sorted(r.row for r in result.refused)
    assert {row for row, _ in got} == {5, 12, 64 * 20 + 2, len(bad) + 1}
    assert "step 0 already played" in result.refused[-1].reason
    assert "twice" in next(r.reason for r in result.refused if r.row == 12)
    assert result.rank_steps == 120 * 64 - 2  # everything else played
    assert _named(result) == {"node-0005"}


def test_a_bad_jsonl_line_is_refused_with_the_schemas_reason():
    sc = _scenario(steps=30, faults=[])
    lines = _jsonl(sc)
    doc = json.loads(lines[2])
    doc["samples"][0]["tokens"] = -5
    lines[2] = json.dumps(doc).encode()
    lines.insert(5, b"{not json")
    lines.insert(6, b'{"hello": 1}')
    result = ReplayResult("rp")
    replay(read_jsonl(lines, "f.jsonl", result), result)
    assert [(r.row, r.reason.split(":")[0]) for r in result.refused] == [
        (3, "StepTelemetry"),
        (6, "not JSON"),
        (7, "neither StepTelemetry, NodeHealth nor JobEvent"),
    ]
    assert "tokens" in result.refused[0].reason
    assert result.messages == len(lines) - 3


def test_redate_moves_every_time_by_one_offset_so_the_job_ends_now(tmp_path):
    from pipeline.cli.util import console, err
    from pipeline.io.settings import load_settings

    past = time.time() - 30 * 86400
    from datetime import UTC, datetime

    sc = _scenario(start_time=datetime.fromtimestamp(past, UTC).replace(microsecond=0))
    path = tmp_path / "old.jsonl"
    path.write_bytes(b"\n".join(_jsonl(sc)) + b"\n")
    kept = run_replay(load_settings(), console, err, ReplayOptions(path=path))
    now = time.time()
    moved = run_replay(load_settings(), console, err, ReplayOptions(path=path, redate=True))
    assert kept.first_ts == pytest.approx(past, abs=5)
    assert moved.last_ts == pytest.approx(now, abs=5)
    assert moved.shift_s == pytest.approx(moved.last_ts - kept.last_ts, abs=1e-3)
    assert all(a.ts.timestamp() > now - 3600 for a in moved.alerts)
    assert _named(moved) == _named(kept) == {"node-0005"}


def test_lifecycle_from_its_own_file_plays_in_event_time_and_other_jobs_are_refused(tmp_path):
    from pipeline.cli.util import console, err
    from pipeline.io.settings import load_settings

    sc = _scenario(steps=60, faults=[])
    steps = _jsonl(sc)
    other = StepTelemetry.model_validate_json(steps[0]).model_copy(update={"job_id": "other"})
    path = tmp_path / "steps.jsonl"
    path.write_bytes(b"\n".join([*steps, encode(other)]) + b"\n")
    last = StepTelemetry.model_validate_json(steps[-1])
    end = JobEvent(job_id="rp", kind=JobEventKind.END, ts=last.ts_end, step=last.step,
                   reason="completed")  # fmt: skip
    events = tmp_path / "events.jsonl"
    events.write_bytes(encode(end) + b"\n")
    result = run_replay(load_settings(), console, err,
                        ReplayOptions(path=path, events=events, json_stdout=True))  # fmt: skip
    assert result.events == 1 and result.refused_count == 1
    assert "replaying 'rp'" in result.refused[0].reason and result.refused[0].row == len(steps) + 1


def test_column_spec_and_arguments_fail_fast_naming_the_field(tmp_path):
    from pipeline.cli.util import console, err
    from pipeline.io.errors import ConfigError
    from pipeline.io.settings import load_settings

    with pytest.raises(ValueError, match="unknown field 'speed'"):
        ColumnSpec.parse("speed=x")
    with pytest.raises(ValueError, match="--time-unit"):
        ColumnSpec.parse(None, "hours")
    csv_path = tmp_path / "x.csv"
    csv_path.write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="no column node"):
        run_replay(load_settings(), console, err, ReplayOptions(path=csv_path, job="j"))
    with pytest.raises(ConfigError, match="not a file"):
        run_replay(load_settings(), console, err, ReplayOptions(path=tmp_path / "nope"))


def test_a_sample_without_work_reads_as_before():
    s = RankSample(rank=0, local_rank=0, step_time_s=1, compute_s=1, comm_wait_s=0,
                   data_wait_s=0)  # fmt: skip
    assert "tokens" not in s.model_dump_json()


def test_a_long_file_decoded_by_another_process_keeps_its_rows_and_order(tmp_path, monkeypatch):
    from pipeline.tools import replay_frames

    sc = _scenario(steps=40, faults=[])
    lines = _jsonl(sc)
    lines.insert(100, b'{"samples": "nope"}')
    path = tmp_path / "long.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    monkeypatch.setattr(replay_frames, "CHUNK_BYTES", 20_000)  # several chunks
    got: dict[int, list] = {}
    for procs in (0, 1):
        refused: list[tuple[int, str]] = []
        rows = replay_frames.decode_file(path, lambda r, w: refused.append((r, w)), procs)
        got[procs] = [(row, item.key) for row, item in rows]
        assert [r for r, _ in refused] == [101]
    assert got[1] == got[0] and len(got[0]) == len(lines) - 1
    assert [r for r, _ in got[0]] == [r for r in range(1, len(lines) + 1) if r != 101]


def test_a_step_seen_again_is_refused_as_late_and_out_of_order_nodes_join_their_step():
    sc = _scenario(steps=30, faults=[])
    lines = _jsonl(sc)
    lines[8], lines[9] = lines[9], lines[8]  # node 0 of step 1 before node 7 of step 0
    lines.append(lines[40])  # step 5 again, long after it was played, no newer
    result = ReplayResult("rp")
    replay(read_jsonl(lines, "f.jsonl", result), result)
    assert result.steps == 30 and result.rank_steps == 30 * 64
    assert [(r.row, r.reason) for r in result.refused] == [
        (len(lines), "step 5 already played (late)")
    ]


def _parquet(sc: Scenario, path: Path, *, timestamps: bool) -> None:
    """The CSV of :func:`_csv` as Parquet: ts_end a timestamp column, or epoch ms."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    import csv

    rows = list(csv.reader(io.StringIO(_csv(sc))))
    header, body = rows[0], rows[1:]
    cols: dict[str, list] = {h: [r[i] for r in body] for i, h in enumerate(header)}
    ints = ("iteration", "global_rank", "gpu", "tokens")
    typed: dict[str, list] = {"host": cols.pop("host")}
    typed |= {h: [int(v) if h in ints else float(v) for v in vs] for h, vs in cols.items()}
    arrays = {h: pa.array(vs) for h, vs in typed.items()}
    if timestamps:
        ms = pa.array([round(v) for v in typed["t_end_ms"]], pa.int64())
        arrays["t_end_ms"] = ms.cast(pa.timestamp("ms", tz="UTC"))
    pq.write_table(pa.table(arrays), path, row_group_size=1000)


def test_a_parquet_table_plays_like_the_csv_and_bad_rows_are_refused_by_row(tmp_path):
    from pipeline.cli.util import console, err
    from pipeline.io.settings import load_settings

    sc = _scenario()
    by_csv = replay(
        read_csv(io.StringIO(_csv(sc)), "c", c := ReplayResult("rp"), ColumnSpec.parse(SPEC, "ms"),
                 "rp"), c)  # fmt: skip
    for timestamps in (False, True):
        path = tmp_path / f"t{timestamps}.parquet"
        _parquet(sc, path, timestamps=timestamps)
        opts = ReplayOptions(path=path, job="rp", columns=SPEC, time_unit="ms")
        got = run_replay(load_settings(), console, err, opts)
        assert got.refused_count == 0 and got.rank_steps == by_csv.rank_steps == 120 * 64
        assert got.first_ts == pytest.approx(c.first_ts, abs=1e-3)
        assert _named(got) == _named(by_csv) == {"node-0005"}
        assert [a.kind for a in got.firing] == [a.kind for a in by_csv.firing]
    # a negative step time on data row 4 (rows numbered from 1) and a step far beyond
    # the schema's bound: refused by row, the rest plays
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    table = pq.read_table(path)
    wall = table.column("wall").to_pylist()
    wall[3] = -1.0
    steps = table.column("iteration").to_pylist()
    steps[70] = 1 << 60
    table = table.set_column(table.schema.get_field_index("wall"), "wall", pa.array(wall))
    table = table.set_column(
        table.schema.get_field_index("iteration"), "iteration", pa.array(steps)
    )
    bad = tmp_path / "bad.parquet"
    pq.write_table(table, bad)
    got = run_replay(load_settings(), console, err,
                     ReplayOptions(path=bad, job="rp", columns=SPEC, time_unit="ms"))  # fmt: skip
    assert [r.row for r in got.refused] == [4, 71]
    assert "step_time_s" in got.refused[0].reason and "step" in got.refused[1].reason
    assert got.rank_steps == 120 * 64 - 2 and _named(got) == {"node-0005"}


def test_parquet_without_pyarrow_fails_at_once_naming_the_extra(tmp_path, monkeypatch):
    import sys

    from pipeline.cli.util import console, err
    from pipeline.io.errors import ConfigError
    from pipeline.io.settings import load_settings

    path = tmp_path / "steps.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # import fails
    with pytest.raises(ConfigError, match=r"needs pyarrow: pip install 'stepguard\[parquet\]'"):
        run_replay(load_settings(), console, err, ReplayOptions(path=path, job="rp"))
    with pytest.raises(ConfigError, match="--format: one of jsonl, csv, parquet"):
        run_replay(load_settings(), console, err, ReplayOptions(path=path, job="rp", fmt="xls"))


def test_blank_lines_and_crlf_keep_every_rows_number_across_read_blocks(tmp_path, monkeypatch):
    from pipeline.tools import replay_frames

    sc = _scenario(steps=12, faults=[])
    lines = _jsonl(sc)
    text = b""
    expect: list[int] = []
    row = 0
    for i, line in enumerate(lines):
        if i % 7 == 3:
            text += b"\r\n"  # a blank line (CRLF)
            row += 1
        text += line + (b"\r\n" if i % 2 else b"\n")
        row += 1
        expect.append(row)
    path = tmp_path / "blank.jsonl"
    path.write_bytes(text.rstrip(b"\n"))  # no newline after the last line
    monkeypatch.setattr(replay_frames, "CHUNK_BYTES", 5_000)  # many blocks, lines cut
    refused: list[tuple[int, str]] = []
    got = list(replay_frames.decode_file(path, lambda r, w: refused.append((r, w))))
    assert refused == [] and [r for r, _ in got] == expect
    assert [item.key[2] for _, item in got] == [m.step for m in map(
        StepTelemetry.model_validate_json, lines)]  # fmt: skip


def test_columnar_jsonl_plays_like_the_messages_it_packs_and_a_bad_one_is_refused():
    sc = _scenario()
    old = _jsonl(sc)
    new = [
        encode(StepTelemetry.model_validate({**json.loads(x), "schema_version": 3})) for x in old
    ]
    assert all(b'"columns"' in x and b'"samples"' not in x for x in new)
    by_old = replay(read_jsonl(old, "j", r := ReplayResult("rp")), r)
    doc = json.loads(new[2])
    doc["columns"]["rank"] = doc["columns"]["rank"][:-4]  # a rank short: lengths disagree
    new[2] = json.dumps(doc).encode()
    by_new = replay(read_jsonl(new, "j", n := ReplayResult("rp")), n)
    assert [(x.row, x.reason.split(":")[0]) for x in n.refused] == [(3, "StepTelemetry")]
    assert "rank" in n.refused[0].reason
    assert by_new.rank_steps == by_old.rank_steps - 8  # that node's ranks of one step
    assert _named(by_new) == _named(by_old) == {"node-0005"}
