"""The steps fast path agrees with ``schemas.decode``: what it accepts pydantic accepts,
with the same values; everything else is left to pydantic (``slow``)."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.io.fastdecode import PHASE_CODES, StepColumns, decode_step, decode_steps, from_models
from schemas import Phase, RankSample, Rejected, StepTelemetry, decode, encode
from schemas.telemetry import (
    MAX_FLOPS,
    MAX_GROUP_ID,
    MAX_LOCAL_RANK,
    MAX_RANKS_PER_JOB,
    MAX_STEP,
    MAX_TOKENS,
)
from tests.factories import step_telemetry_st

_ascii = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12)
_float = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def ascii_steps(draw: st.DrawFn) -> StepTelemetry:
    """Valid telemetry the fast path is meant to take: ASCII names, int64 values."""
    n = draw(st.integers(1, 8))
    ranks = draw(
        st.lists(st.integers(0, MAX_RANKS_PER_JOB - 1), min_size=n, max_size=n, unique=True)
    )
    start = draw(st.datetimes(datetime(1960, 1, 1), datetime(2200, 1, 1), timezones=st.just(UTC)))
    signal = st.none() | st.floats(allow_nan=True, allow_infinity=True)
    version = draw(st.sampled_from([1, 2]))  # 2: a rack's message, every sample's node
    return StepTelemetry(
        schema_version=version,
        job_id=draw(_ascii),
        node=draw(_ascii),
        run=draw(st.just("") | _ascii),
        step=draw(st.integers(0, MAX_STEP)),
        ts_start=start,
        ts_end=start + timedelta(microseconds=draw(st.integers(0, 10**12))),
        samples=tuple(
            RankSample(
                rank=r,
                local_rank=draw(st.integers(0, MAX_LOCAL_RANK)),
                dp_group=draw(st.integers(0, MAX_GROUP_ID)),
                pp_stage=draw(st.integers(0, MAX_GROUP_ID)),
                tp_group=draw(st.integers(0, MAX_GROUP_ID)),
                phase=draw(st.sampled_from(Phase)),
                step_time_s=draw(_float),
                compute_s=draw(_float),
                comm_wait_s=draw(_float),
                data_wait_s=draw(_float),
                loss=draw(signal),
                grad_norm=draw(signal),
                tokens=draw(st.none() | st.integers(0, MAX_TOKENS)),
                flops=draw(st.none() | st.floats(0, MAX_FLOPS)),
                max_seq_len=draw(st.none() | st.integers(0, MAX_TOKENS)),
                node=draw(_ascii) if version == 2 else None,
            )
            for r in ranks
        ),
    )


def _time_text(draw: st.DrawFn) -> str:
    """A timestamp spelled in one of the many ways people (and parsers) write them."""
    t = draw(st.datetimes(datetime(1900, 1, 1), datetime(2300, 1, 1)))
    sep = draw(st.sampled_from(["T", "t", " ", "_"]))
    digits = draw(st.integers(0, 9))
    frac = (
        ""
        if digits == 0
        else draw(st.sampled_from([".", ","]))
        + (f"{t.microsecond:06d}{draw(st.integers(0, 999)):03d}"[:digits])
    )
    zone = draw(
        st.sampled_from(["Z", "z", "", "+00:00", "-00:00", "+05:30", "-0800", "+01", "+24:00"])
    )
    seconds = draw(st.sampled_from([f":{t.second:02d}", "", ":60"]))
    return f"{t:%Y-%m-%d}{sep}{t:%H:%M}{seconds}{frac}{zone}"


_json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | _ascii
    | st.sampled_from(["NaN", "Infinity", "-Infinity", "nan", "inf", "1", "1.5", "train", ""]),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(_ascii, c, max_size=3),
    max_leaves=6,
)  # fmt: skip


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid message's JSON with one or two fields changed, dropped or added, or its
    bytes damaged."""
    raw = encode(draw(ascii_steps() | step_telemetry_st()))
    if draw(st.booleans()):
        data = bytearray(raw)
        for _ in range(draw(st.integers(1, 3))):
            pos = draw(st.integers(0, len(data) - 1))
            data[pos : pos + draw(st.integers(0, 2))] = draw(st.binary(max_size=2))
        return bytes(data)
    doc = json.loads(raw)
    for _ in range(draw(st.integers(1, 2))):
        samples = doc.get("samples")
        targets = (
            [doc, *(x for x in samples if isinstance(x, dict))]
            if isinstance(samples, list)
            else [doc]
        )
        target = draw(st.sampled_from(targets))
        key = draw(st.sampled_from([*target, "extra", "tokens", "flops", "max_seq_len"]))
        action = draw(st.sampled_from(["set", "time", "drop", "duplicate_rank"]))
        if action == "drop":
            target.pop(key, None)
        elif action == "time":
            target[key] = _time_text(draw)
        elif action == "duplicate_rank" and len(targets) > 2 and "rank" in targets[1]:
            targets[2]["rank"] = targets[1]["rank"]
        else:
            target[key] = draw(_json_value)
    # bare NaN/Infinity literals (allow_nan) are not JSON, but parsers meet them
    return json.dumps(doc, allow_nan=True).encode()


def _same_float(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1, a) == math.copysign(1, b)


def _assert_same(cols: StepColumns, k: int, model: StepTelemetry) -> None:
    assert (cols.job_id[k], cols.node[k], cols.run[k], int(cols.step[k])) == (
        model.job_id, model.node, model.run, model.step,
    )  # fmt: skip
    for got, want in ((cols.ts_start[k], model.ts_start), (cols.ts_end[k], model.ts_end)):
        assert got == want and got.utcoffset() == want.utcoffset()
    rows = (cols.sample_message == k).nonzero()[0]
    assert len(rows) == len(model.samples)
    for row, s in zip(rows.tolist(), model.samples, strict=True):
        ints = ("rank", "local_rank", "dp_group", "pp_stage", "tp_group")
        assert [int(getattr(cols, f)[row]) for f in ints] == [getattr(s, f) for f in ints]
        assert int(cols.phase[row]) == PHASE_CODES[s.phase.value]
        for f in ("step_time_s", "compute_s", "comm_wait_s", "data_wait_s"):
            assert _same_float(float(getattr(cols, f)[row]), getattr(s, f)), f
        assert cols.sample_node[row] == (s.node or model.node)
        for f in ("tokens", "flops", "max_seq_len"):  # NaN: not said
            value = float(getattr(cols, f)[row])
            said = getattr(s, f)
            assert (math.isnan(value) and said is None) or value == said, f
        for f in ("loss", "grad_norm"):
            null = bool(getattr(cols, f + "_null")[row])
            assert _same_float(None if null else float(getattr(cols, f)[row]), getattr(s, f)), f


def _check(values: list[bytes]) -> StepColumns:
    cols = decode_steps(values)
    accepted = cols.messages.tolist()
    assert sorted(accepted + cols.slow) == list(range(len(values)))
    for k, i in enumerate(accepted):
        model = decode(StepTelemetry, values[i])
        assert not isinstance(model, Rejected), (values[i], model.error)
        _assert_same(cols, k, model)
    return cols


@settings(max_examples=200, deadline=None)
@given(st.lists(ascii_steps(), min_size=1, max_size=5))
def test_valid_ascii_messages_take_the_fast_path_with_pydantics_values(models):
    values = [encode(m) for m in models]
    cols = _check(values)
    assert cols.slow == []
    for k, m in enumerate(models):
        _assert_same(cols, k, m)


@settings(max_examples=150, deadline=None)
@given(st.lists(step_telemetry_st(), min_size=1, max_size=4))
def test_any_valid_message_is_accepted_by_one_path(models):
    cols = _check([encode(m) for m in models])
    for i in cols.slow:  # left aside only for a reason the docs give
        m = models[i]
        assert not (m.job_id.isascii() and m.node.isascii() and m.run.isascii())


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutated(), min_size=1, max_size=4))
def test_mutated_messages_are_accepted_only_when_pydantic_accepts_them(values):
    _check(values)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=300) | st.none(), min_size=1, max_size=4))
def test_garbage_never_passes_the_fast_path(values):
    cols = decode_steps(values)
    assert cols.messages.size == 0
    assert cols.slow == list(range(len(values)))


@given(st.data())
@settings(max_examples=300, deadline=None)
def test_timestamps_agree_with_pydantic_however_they_are_spelled(data):
    model = data.draw(ascii_steps())
    doc = json.loads(encode(model))
    doc["ts_start"] = _time_text(data.draw)
    doc["ts_end"] = data.draw(st.sampled_from([doc["ts_start"], _time_text(data.draw)]))
    _check([json.dumps(doc).encode()])


def test_sub_microsecond_digits_are_left_to_pydantic():
    t = datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=1)))
    s = RankSample(rank=0, local_rank=0, step_time_s=1, compute_s=1, comm_wait_s=0, data_wait_s=0)
    doc = json.loads(encode(StepTelemetry(job_id="j", node="n", step=1, ts_start=t, ts_end=t,
                                          samples=(s,))))  # fmt: skip
    doc["ts_end"] = "2026-01-01T00:00:00.9999999+01:00"  # msgspec would round up a second
    cols = _check([json.dumps(doc).encode(), encode(StepTelemetry.model_validate(doc))])
    assert cols.slow == [0] and cols.messages.tolist() == [1]


@settings(max_examples=100, deadline=None)
@given(st.lists(step_telemetry_st(), min_size=1, max_size=4))
def test_from_models_gives_the_columns_of_the_models(models):
    cols = from_models(models)
    assert cols.slow == [] and cols.messages.tolist() == list(range(len(models)))
    for k, m in enumerate(models):
        _assert_same(cols, k, m)


#: every integer field with the schema's bound: the largest value it takes
_INT_BOUNDS = {"step": MAX_STEP, "local_rank": MAX_LOCAL_RANK, "dp_group": MAX_GROUP_ID,
               "pp_stage": MAX_GROUP_ID, "tp_group": MAX_GROUP_ID}  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_integers_at_and_beyond_their_bounds_are_judged_alike_by_both_paths(data):
    """Issue 22 item 5: a group id or local rank of 2**31 passed the schema and
    overflowed the frame's int32 column, dropping the whole step. Both decoders refuse
    a value beyond its bound, and take one at the bound, with the same value."""
    model = data.draw(ascii_steps())
    doc = json.loads(encode(model))
    field = data.draw(st.sampled_from(sorted(_INT_BOUNDS)))
    bound = _INT_BOUNDS[field]
    value = data.draw(st.sampled_from([bound, bound + 1, 2**31, 2**63, 2**70]))
    target = doc if field == "step" else data.draw(st.sampled_from(doc["samples"]))
    target[field] = value
    raw = json.dumps(doc).encode()
    cols = _check([raw])
    refused = isinstance(decode(StepTelemetry, raw), Rejected)
    assert refused == (value > bound)
    assert (cols.slow == [0]) == refused  # refused by the fast path too, never accepted
    assert decode_step(raw) is None or not refused  # nor by the per-message fast path
