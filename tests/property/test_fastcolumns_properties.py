"""StepTelemetry version 3 (columns on the wire) means what versions 1 and 2 mean: the
fast path gives a v3 message exactly the columns of its v1/v2 equivalent, mixed batches
too, and whatever it refuses pydantic refuses with an error naming the column."""

from __future__ import annotations

import base64
import json
import math
import struct
from dataclasses import fields

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.io.fastdecode import StepColumns, decode_step, decode_steps
from schemas import RankSample, Rejected, StepTelemetry, decode, encode
from schemas.codec import MAX_MESSAGE_BYTES
from schemas.telemetry import MAX_RANKS_PER_JOB
from tests.factories import step_telemetry_st
from tests.property.test_fastdecode_properties import (
    _assert_same,
    _check,
    _json_value,
    _same_float,
    ascii_steps,
)


def columnar(m: StepTelemetry) -> StepTelemetry:
    """``m`` as a version-3 message (its samples packed into columns)."""
    return StepTelemetry.model_validate({**m.model_dump(), "schema_version": 3})


def _assert_columns_equal(a: StepColumns, b: StepColumns) -> None:
    for f in fields(StepColumns):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype, f.name
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), f.name
        else:
            assert x == y, f.name


@settings(max_examples=200, deadline=None)
@given(st.lists(ascii_steps(), min_size=1, max_size=5))
def test_a_v3_message_decodes_to_the_columns_of_its_v1_or_v2_equivalent(models):
    old = [encode(m) for m in models]
    new = [encode(columnar(m)) for m in models]
    cols = _check(new)  # accepted only with pydantic's values
    assert cols.slow == []
    for k, m in enumerate(models):
        _assert_same(cols, k, m)
    _assert_columns_equal(cols, decode_steps(old))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(ascii_steps(), st.booleans()), min_size=1, max_size=6))
def test_a_batch_mixing_versions_decodes_as_if_it_were_all_v1_and_v2(drawn):
    old = [encode(m) for m, _ in drawn]
    mixed = [encode(columnar(m)) if new else encode(m) for m, new in drawn]
    _assert_columns_equal(decode_steps(mixed), decode_steps(old))


@settings(max_examples=150, deadline=None)
@given(st.lists(step_telemetry_st(), min_size=1, max_size=4))
def test_any_valid_v3_message_is_accepted_by_one_path(models):
    _check([encode(columnar(m)) for m in models])


@settings(max_examples=200, deadline=None)
@given(ascii_steps())
def test_the_per_record_view_of_a_v3_message_has_the_models_samples(m):
    view = decode_step(encode(columnar(m)))
    assert view is not None
    assert (view.job_id, view.node, view.step, view.run) == (m.job_id, m.node, m.step, m.run)
    assert (view.ts_start, view.ts_end) == (m.ts_start, m.ts_end)
    for got, want in zip(view.samples, m.samples, strict=True):
        for f in ("rank", "local_rank", "dp_group", "pp_stage", "tp_group", "tokens",
                  "max_seq_len", "node"):  # fmt: skip
            assert getattr(got, f) == getattr(want, f), f
        assert got.phase == want.phase.value
        for f in ("step_time_s", "compute_s", "comm_wait_s", "data_wait_s", "flops",
                  "loss", "grad_norm"):  # fmt: skip
            assert _same_float(getattr(got, f), getattr(want, f)), f


@st.composite
def mutated_v3(draw: st.DrawFn) -> bytes:
    """A valid v3 message with its columns damaged: a column replaced by other bytes
    (of any length), dropped, nulled, set to any JSON value, ``n`` changed."""
    doc = json.loads(encode(columnar(draw(ascii_steps() | step_telemetry_st()))))
    cols = doc["columns"]
    for _ in range(draw(st.integers(1, 2))):
        key = draw(st.sampled_from([*cols, "loss", "loss_null", "tokens", "node_idx", "nodes",
                                    "extra"]))  # fmt: skip
        action = draw(st.sampled_from(["bytes", "drop", "json", "n"]))
        if action == "bytes":
            raw = draw(st.binary(max_size=80))
            cols[key] = base64.b64encode(raw).decode()
        elif action == "drop":
            cols.pop(key, None)
        elif action == "json":
            cols[key] = draw(_json_value)
        else:
            cols["n"] = draw(st.integers(-1, 12))
    return json.dumps(doc).encode()


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutated_v3(), min_size=1, max_size=4))
def test_damaged_v3_messages_are_accepted_only_when_pydantic_accepts_them(values):
    _check(values)
    for raw in values:
        view = decode_step(raw)
        if view is not None:
            assert not isinstance(decode(StepTelemetry, raw), Rejected)


def _v3(n: int = 4, rack: bool = False) -> dict:
    s = [
        RankSample(rank=r, local_rank=r, step_time_s=1.0, compute_s=0.5, comm_wait_s=0.5,
                   data_wait_s=0.0, loss=1.0, node=f"n{r % 2}" if rack else None)
        for r in range(n)
    ]  # fmt: skip
    m = StepTelemetry(schema_version=3, job_id="j", node="rack-0" if rack else "n0", step=1,
                      ts_start="2026-01-01T00:00:00Z", ts_end="2026-01-01T00:00:01Z",
                      samples=tuple(s))  # fmt: skip
    return json.loads(encode(m))


def _b64(fmt: str, *values: object) -> str:
    return base64.b64encode(struct.pack("<" + fmt, *values)).decode()


_NAN = math.nan
_BAD: dict[str, tuple[str, object, str]] = {
    # case: (column, value, what pydantic's error names)
    "length mismatch": ("rank", _b64("3i", 0, 1, 2), "rank: 12 bytes, not 4 values"),
    "truncated buffer": ("compute_s", _b64("3d", 1, 1, 1)[:-4], "compute_s"),
    "wrong dtype size": ("step_time_s", _b64("4f", 1, 1, 1, 1), "step_time_s: 16 bytes"),
    "not base64": ("rank", "!!!!", "rank"),
    "rank out of range": ("rank", _b64("4i", 0, 1, 2, MAX_RANKS_PER_JOB), "rank"),
    "negative local rank": ("local_rank", _b64("4i", 0, -1, 2, 3), "local_rank"),
    "negative group": ("pp_stage", _b64("4i", 0, 0, -5, 0), "pp_stage"),
    "NaN step time": ("step_time_s", _b64("4d", 1, _NAN, 1, 1), "step_time_s"),
    "infinite compute": ("compute_s", _b64("4d", 1, math.inf, 1, 1), "compute_s"),
    "timing out of range": ("comm_wait_s", _b64("4d", 1, 2e6, 1, 1), "comm_wait_s"),
    "unknown phase": ("phase", _b64("4B", 1, 1, 9, 1), "phase"),
    "mask not 0 or 1": ("loss_null", _b64("4B", 0, 2, 0, 0), "loss_null"),
    "duplicate rank": ("rank", _b64("4i", 0, 1, 1, 3), "duplicate rank"),
    "fractional tokens": ("tokens", _b64("4d", 1, 2.5, 3, 4), "tokens"),
    "negative flops": ("flops", _b64("4d", 1, -2, 3, 4), "flops"),
    "mask without values": ("grad_norm_null", _b64("4B", 0, 0, 0, 1), "grad_norm_null"),
    "node index out of range": ("node_idx", _b64("4i", 0, 1, 2, 1), "node_idx[2]"),
    "node index without nodes": ("nodes", None, "nodes and node_idx"),
}


@pytest.mark.parametrize("case", sorted(_BAD))
def test_a_bad_v3_message_goes_to_pydantic_and_gets_a_clear_error(case):
    column, value, named = _BAD[case]
    doc = _v3(rack=column in ("node_idx", "nodes"))
    if value is None:
        doc["columns"].pop(column)
    else:
        doc["columns"][column] = value
    raw = json.dumps(doc).encode()
    cols = decode_steps([raw])
    assert cols.slow == [0] and cols.messages.size == 0 and cols.rank.size == 0
    assert decode_step(raw) is None
    out = decode(StepTelemetry, raw, topic="steps", partition=2, offset=41)
    assert isinstance(out, Rejected)
    assert named in out.error and out.letter.offset == 41 and out.letter.raw == raw


def test_an_oversized_v3_message_is_left_to_pydantic_which_refuses_it():
    doc = _v3()
    doc["run"] = "x" * MAX_MESSAGE_BYTES
    raw = json.dumps(doc).encode()
    assert decode_steps([raw]).slow == [0] and decode_step(raw) is None
    out = decode(StepTelemetry, raw)
    assert isinstance(out, Rejected) and "exceeds the limit" in out.error


def test_a_good_message_beside_a_bad_one_in_a_batch_is_kept():
    good, bad = _v3(rack=True), _v3()
    bad["columns"]["rank"] = _b64("4i", 0, 0, 1, 2)
    cols = decode_steps([json.dumps(bad).encode(), json.dumps(good).encode()])
    assert cols.slow == [0] and cols.messages.tolist() == [1]
    assert cols.sample_node == ["n0", "n1", "n0", "n1"]


@pytest.mark.parametrize("small", [16, 0])  # the Python path of small messages, numpy's
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    drawn=st.lists(mutated_v3(), min_size=1, max_size=3),
    whole=st.lists(ascii_steps(), min_size=1, max_size=3),
)
def test_both_per_record_paths_take_only_what_pydantic_takes_with_its_values(small, drawn, whole):
    from pipeline.io import fastcolumns

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fastcolumns, "SMALL", small)
        for raw in drawn:
            if decode_step(raw) is not None:
                assert not isinstance(decode(StepTelemetry, raw), Rejected)
        for m in whole:
            view = decode_step(encode(columnar(m)))
            assert view is not None
            assert [tuple(map(repr, r)) for r in view.rows()] == [
                tuple(map(repr, r)) for r in decode_step_rows(m)
            ]


def decode_step_rows(m: StepTelemetry) -> list[tuple]:
    """The model's samples as the frame's rows (a phase by its value)."""
    from detectors.frame import ROW_FIELDS

    return [
        tuple(getattr(s, f).value if f == "phase" else getattr(s, f) for f in ROW_FIELDS)
        for s in m.samples
    ]
