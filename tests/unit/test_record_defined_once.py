"""A per-rank field is defined once: in the schema (issue 38 item 2).

A copy of the product tree (``schemas/``, ``detectors/``, ``pipeline/``) gets a new
optional field on :class:`~schemas.RankSample`, and a subprocess that imports the copy
checks that every reader and writer of the per-rank record carries it, with nothing
else edited: the batcher and the node aggregator's wire, the columnar encoding, the fast
decoders (rows and columns, batch and per record), the frame, the archive's rows, the
replay tables and frames, and calibration's query. Each place is a test of its own, so
a failure names the place that does not follow. What a new field still needs besides
the schema: one SQL migration (``schemas/sql/``: its column in the steps table), the
producer that fills it (e.g. a keyword of ``StepExporter.record_step``) and the detector
that reads it (``StepFrame.column(name)``).
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NEW_FIELD = "    queue_s: NonNegativeFloat | None = None  # added by test_record_defined_once\n"

#: Runs in the copy; prints {place: "" (it follows) or why not}.
CHECKS = r"""
import json, traceback
from datetime import UTC, datetime

results = {}


def check(place):
    def run(fn):
        try:
            fn()
            results[place] = ""
        except Exception as exc:  # each place reports, whatever breaks
            results[place] = f"{type(exc).__name__}: {exc}".strip()[:400] or traceback.format_exc()
    return run


from schemas import RankSample, StepTelemetry, encode

T = datetime.now(UTC).replace(microsecond=0)


def samples(node=None):
    return tuple(
        RankSample(rank=r, local_rank=r, step_time_s=1.0, compute_s=0.8, comm_wait_s=0.1,
                   data_wait_s=0.1, queue_s=0.25 * (r + 1), node=node)
        for r in range(3)
    )


def message(version=1, n=3):
    s = samples("n0" if version == 2 else None)[:n]
    return StepTelemetry(schema_version=version, job_id="j", node="n0", step=1,
                         ts_start=T, ts_end=T, samples=s)


WANT = [0.25, 0.5, 0.75]


def same(values, n=3):
    got = [None if v is None else float(v) for v in list(values)]
    assert got == WANT[:n], f"queue_s read as {got}, sent {WANT[:n]}"


@check("schema: SAMPLE_FIELDS")
def _():
    from schemas.telemetry import SAMPLE_FIELDS
    assert "queue_s" in SAMPLE_FIELDS, SAMPLE_FIELDS


@check("client: RankRecord and the batcher")
def _():
    from pipeline.client.batcher import RankRecord, StepBatcher
    assert "queue_s" in RankRecord._fields, RankRecord._fields
    b = StepBatcher(ranks_per_node=1)
    rec = RankRecord(job_id="j", node="n0", step=1, rank=0, local_rank=0, phase="train",
                     dp_group=0, pp_stage=0, tp_group=0, step_time_s=1.0, compute_s=0.8,
                     comm_wait_s=0.1, data_wait_s=0.1, loss=None, grad_norm=None,
                     ts_start=0.0, ts_end=1.0, arrived=0.0, queue_s=0.25)
    (msg,) = b.add(rec)
    assert msg.samples[0].queue_s == 0.25, msg.samples[0]


@check("client: the node aggregator's wire")
def _():
    from pipeline.client.aggregator import _record
    from pipeline.client.batcher import NAMED_FIELDS, WIRE_FIELDS
    assert "queue_s" in NAMED_FIELDS, NAMED_FIELDS
    head = ["j", "n0", 1, 0, 0, "train", 0, 0, 0, 1.0, 0.8, 0.1, 0.1, None, None, 0.0, 1.0]
    assert len(head) == WIRE_FIELDS
    assert _record([*head, "run", {"queue_s": 0.25}], 0.0).queue_s == 0.25


@check("schemas: columnar encoding (version 3)")
def _():
    from schemas.columnar import COLUMNS, SampleColumns
    assert "queue_s" in COLUMNS and "queue_s" in SampleColumns.model_fields
    m = StepTelemetry.model_validate_json(encode(message(3)))
    same(s.queue_s for s in m.samples)


@check("io: fastdecode rows, batch (decode_steps)")
def _():
    from pipeline.io.fastdecode import decode_steps
    cols = decode_steps([encode(message(1)), encode(message(2))])
    assert not cols.slow, f"left to pydantic: {cols.slow}"
    same(cols.queue_s[:3])


@check("io: fastdecode rows, per record (decode_step)")
def _():
    from pipeline.io.fastdecode import decode_step
    view = decode_step(encode(message(1)))
    assert view is not None, "left to pydantic"
    same(s.queue_s for s in view.samples)


@check("io: fastdecode from_models")
def _():
    from pipeline.io.fastdecode import from_models
    same(from_models([message(1)]).queue_s)


@check("io: fastcolumns, batch")
def _():
    from pipeline.io.fastdecode import decode_steps
    cols = decode_steps([encode(message(3))])
    assert not cols.slow, f"left to pydantic: {cols.slow}"
    same(cols.queue_s)


@check("io: fastcolumns, per record (small and large views)")
def _():
    from pipeline.io import fastcolumns
    from pipeline.io.fastdecode import decode_step
    small = decode_step(encode(message(3)))
    assert small is not None, "left to pydantic"
    same(s.queue_s for s in small.samples)
    big = StepTelemetry(schema_version=3, job_id="j", node="n0", step=1, ts_start=T, ts_end=T,
                        samples=tuple(s.model_copy(update={"queue_s": 0.25 * (s.rank + 1)})
                                      for s in (RankSample(rank=r, local_rank=0, step_time_s=1,
                                                           compute_s=1, comm_wait_s=0,
                                                           data_wait_s=0)
                                                for r in range(fastcolumns.SMALL + 1))))
    view = decode_step(encode(big))
    assert view is not None and view.frame_columns() is not None, "no columns"
    assert view.frame_columns().get("queue_s") is not None, "no queue_s column"
    assert [s.queue_s for s in view.samples][:3] == WANT


@check("detectors: StepFrame (from_messages, to_messages, from_arrays)")
def _():
    from detectors.frame import ROW_FIELDS, StepFrame
    from pipeline.io.fastdecode import decode_step
    assert "queue_s" in ROW_FIELDS, ROW_FIELDS
    same(StepFrame.from_messages([message(1)]).column("queue_s"))
    same(StepFrame.from_messages([message(2)]).column("queue_s"))
    same(StepFrame.from_messages([decode_step(encode(message(1)))]).column("queue_s"))
    frame = StepFrame.from_messages([decode_step(encode(message(3))), message(1)])
    same(frame.column("queue_s"))
    back = StepFrame.from_messages([message(1)]).to_messages()
    same(s.queue_s for s in back[0].samples)
    same(StepFrame.from_arrays("j", 0, 1.0, [1.0] * 3, queue_s=WANT).column("queue_s"))


@check("io: fetchcolumns, a fetch decoded at once (spans, their frame)")
def _():
    from detectors.frame import StepFrame
    from pipeline.io.fetchcolumns import SpanView, decode_fetch
    (view,) = decode_fetch([encode(message(3))])
    assert isinstance(view, SpanView), type(view)
    same(s.queue_s for s in view.samples)
    same(StepFrame.from_messages([view]).column("queue_s"))


@check("archive: the steps table's rows")
def _():
    from pipeline.services.archive.rows import step_rows
    for version in (1, 3):
        rows = step_rows([encode(message(version))])
        assert "queue_s" in rows.columns, sorted(rows.columns)
        same(rows.columns["queue_s"])


@check("tools: replay tables (CSV, Parquet)")
def _():
    from pipeline.tools.replay_tables import CSV_FIELDS
    assert "queue_s" in CSV_FIELDS, CSV_FIELDS


@check("tools: replay frames (JSONL)")
def _():
    from pipeline.tools.replay_frames import decode_lines, frame_of
    parts = [p for _, p in decode_lines([encode(message(1))], lambda *a: None)]
    same(frame_of(parts).column("queue_s"))


@check("tools: calibrate's archive query")
def _():
    from pipeline.tools.calibrate import archive
    assert "queue_s" in archive._STEP_ARRAYS, archive._STEP_ARRAYS


print(json.dumps(results))
"""

PLACES = (
    "schema: SAMPLE_FIELDS",
    "client: RankRecord and the batcher",
    "client: the node aggregator's wire",
    "schemas: columnar encoding (version 3)",
    "io: fastdecode rows, batch (decode_steps)",
    "io: fastdecode rows, per record (decode_step)",
    "io: fastdecode from_models",
    "io: fastcolumns, batch",
    "io: fastcolumns, per record (small and large views)",
    "io: fetchcolumns, a fetch decoded at once (spans, their frame)",
    "detectors: StepFrame (from_messages, to_messages, from_arrays)",
    "archive: the steps table's rows",
    "tools: replay tables (CSV, Parquet)",
    "tools: replay frames (JSONL)",
    "tools: calibrate's archive query",
)


def _add_field(source: str) -> str:
    """``source`` with NEW_FIELD after RankSample's last field."""
    tree = ast.parse(source)
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RankSample"]
    last = [n for n in cls.body if isinstance(n, ast.AnnAssign)][-1]
    lines = source.splitlines(keepends=True)
    assert last.end_lineno is not None
    return "".join([*lines[: last.end_lineno], NEW_FIELD, *lines[last.end_lineno :]])


@pytest.fixture(scope="module")
def followed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Each place -> "" where it carries the new field, else what went wrong there."""
    tree = tmp_path_factory.mktemp("tree")
    for package in ("schemas", "detectors", "pipeline"):
        shutil.copytree(
            ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    (home,) = [p for p in (tree / "schemas").glob("*.py") if "class RankSample(" in p.read_text()]
    home.write_text(_add_field(home.read_text()))
    done = subprocess.run(
        [sys.executable, "-c", CHECKS],
        check=False,
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"the copy did not import:\n{done.stderr[-3000:]}"
    results: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


def test_every_place_is_checked(followed: dict[str, str]) -> None:
    assert sorted(followed) == sorted(PLACES)


@pytest.mark.parametrize("place", PLACES)
def test_place_follows_the_schema(followed: dict[str, str], place: str) -> None:
    why = followed[place]
    assert why == "", f"{place} does not follow a new RankSample field: {why}"


def test_the_field_is_added_after_the_last_one() -> None:
    source = (
        "class RankSample(Message):\n    a: int\n    b: int = Field(\n        default=0,\n"
        "    )\n\n    def f(self): ...\n"
    )
    assert _add_field(source).splitlines()[5] == NEW_FIELD.rstrip("\n")
