"""A StepTelemetry of version 3 (columns) archives exactly the steps rows of its
version-1 or version-2 equivalent: on the fast path, on pydantic's (the records the
fast path leaves aside) and through ``rows_for``."""

from __future__ import annotations

import math
from datetime import timedelta

import numpy as np
import pytest

from pipeline.io.fastdecode import from_models
from pipeline.services.archive.rows import rows_for, step_rows, step_rows_of
from schemas import Phase, RankSample, StepTelemetry, encode
from tests.clock import day_start

T = day_start()  # event times the test controls, dated from the run


def _message(version: int, step: int) -> StepTelemetry:
    rack = version == 2
    samples = tuple(
        RankSample(
            rank=r, local_rank=r % 4, dp_group=r % 2, pp_stage=r // 4, tp_group=1,
            phase=Phase.EVAL if r == 3 else Phase.TRAIN, step_time_s=1.0 + r / 10,
            compute_s=0.8, comm_wait_s=0.15, data_wait_s=0.05,
            loss=[2.5, math.nan, None, math.inf, 1.0, 1.0, 1.0, 1.0][r],
            grad_norm=None if r % 3 else 0.5, tokens=4096 if r % 2 else None,
            flops=1e12 if r == 5 else None, max_seq_len=2048 if r == 6 else None,
            node=f"n{r // 4}" if rack else None,
        )
        for r in range(8)
    )  # fmt: skip
    return StepTelemetry(
        schema_version=version, job_id="job-a", node="rack-0" if rack else "n0", step=step,
        run="r1", ts_start=T + timedelta(seconds=step), ts_end=T + timedelta(seconds=step + 1),
        samples=samples,
    )  # fmt: skip


def _as_v3(m: StepTelemetry) -> StepTelemetry:
    return StepTelemetry.model_validate({**m.model_dump(), "schema_version": 3})


def _assert_same_table(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name, x in a.items():
        y = b[name]
        if isinstance(x, np.ndarray):
            assert np.array_equal(np.ma.getmaskarray(x), np.ma.getmaskarray(y)), name
            dx, dy = np.ma.getdata(x), np.ma.getdata(y)
            assert dx.dtype == dy.dtype, name
            assert np.array_equal(dx, dy, equal_nan=dx.dtype.kind == "f"), name
        else:
            assert list(x) == list(y), name


@pytest.mark.parametrize("version", [1, 2])
def test_v3_steps_rows_are_the_rows_of_the_same_v1_or_v2_message(version):
    old = [_message(version, s) for s in range(3)]
    new = [_as_v3(m) for m in old]
    assert all(b'"columns"' in encode(m) for m in new)
    a, b = step_rows([encode(m) for m in old]), step_rows([encode(m) for m in new])
    assert b.slow == [] and b.rejected == {} and b.stored == a.stored == [0, 1, 2]
    assert b.row_value.tolist() == a.row_value.tolist()
    _assert_same_table(a.columns, b.columns)


def test_a_batch_mixing_versions_archives_as_if_all_were_old():
    old = [_message(1, 0), _message(2, 1), _message(1, 2)]
    mixed = [encode(_as_v3(old[0])), encode(old[1]), encode(_as_v3(old[2]))]
    a, b = step_rows([encode(m) for m in old]), step_rows(mixed)
    assert b.stored == [0, 1, 2] and b.row_value.tolist() == a.row_value.tolist()
    _assert_same_table(a.columns, b.columns)


def test_v3_messages_left_to_pydantic_archive_the_same_rows():
    # what the archiver does with a record the fast path leaves aside: its model's rows
    old = [_message(2, 0), _message(1, 1)]
    a = step_rows_of(from_models(old))
    b = step_rows_of(from_models([_as_v3(m) for m in old]))
    _assert_same_table(a.columns, b.columns)
    _assert_same_table(
        rows_for([(m, 0) for m in old])["steps"], rows_for([(_as_v3(m), 0) for m in old])["steps"]
    )


def _spec(values) -> str:
    """The ClickHouse type a steps column's array goes to (Enum8 as its Int8 codes,
    DateTime as its UInt32 seconds: the same bytes)."""
    if values.dtype == object:
        return "String"
    base = {"u": "UInt", "i": "Int", "f": "Float"}[values.dtype.kind]
    spec = f"{base}{values.dtype.itemsize * 8}"
    return f"Nullable({spec})" if isinstance(values, np.ma.MaskedArray) else spec


@pytest.mark.parametrize("version", [1, 2])
def test_v3_columns_go_to_the_server_as_the_bytes_of_the_old_rows(version):
    # the server's column path (pipeline.services.archive.columns): every column of a v3
    # batch is written whole, and its bytes are those the driver writes for the v1/v2
    # batch's rows one Python value at a time
    from tests.unit.pipeline.services.archive.test_columns import as_rows, wire, zero_under_nulls

    old = [_message(version, s) for s in range(3)]
    rows = step_rows([encode(m) for m in old]).columns
    columns = step_rows([encode(_as_v3(m)) for m in old]).columns
    for name, values in columns.items():
        expected = wire(_spec(values), as_rows(rows[name]), numpy=False)
        assert wire(_spec(values), zero_under_nulls(values), numpy=True) == expected, name
