"""``StepFrame.from_messages`` (samples transposed at once, numpy per column) equals a
row-by-row reference on any mix of node and rack messages, ranks out of order or sent
twice, losses reported, missing or NaN, phases mixed; and a frame built from the fast
decoder's views (``rows()``) equals one built from pydantic's models."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detectors.frame import PHASE_CODES, WORK_FIELDS, StepFrame, step_times
from pipeline.io import fastcolumns
from pipeline.io.fastdecode import decode_step
from schemas import Phase, RankSample, StepTelemetry, encode

T0 = datetime(2026, 1, 1, tzinfo=UTC)
FIELDS = [
    "rank",
    "node_idx",
    "local_rank",
    "dp_group",
    "pp_stage",
    "tp_group",
    "phase",
    "step_time",
    "compute",
    "comm_wait",
    "data_wait",
    "loss",
    "grad_norm",
    "has_loss",
    "has_grad_norm",
]


def reference(messages: list[StepTelemetry]) -> dict[str, object]:
    """The frame's columns one rank at a time: rank order, the first sample of a rank
    sent twice kept."""
    nodes: list[str] = []
    seen: dict[int, tuple] = {}
    for m in messages:
        for s in m.samples:
            node = s.node or m.node
            if node not in nodes:
                nodes.append(node)
            if s.rank in seen:
                continue
            seen[s.rank] = (
                s.rank, nodes.index(node), s.local_rank, s.dp_group, s.pp_stage, s.tp_group,
                PHASE_CODES[s.phase], s.step_time_s, s.compute_s, s.comm_wait_s,
                s.data_wait_s, math.nan if s.loss is None else s.loss,
                math.nan if s.grad_norm is None else s.grad_norm, s.loss is not None,
                s.grad_norm is not None,
                *(math.nan if getattr(s, w) is None else getattr(s, w) for w in WORK_FIELDS),
            )  # fmt: skip
    rows = [seen[r] for r in sorted(seen)]
    names = [*FIELDS, *WORK_FIELDS]
    cols = {f: np.array([row[i] for row in rows]) for i, f in enumerate(names)}
    cols["nodes"] = tuple(nodes)
    return cols


signal = st.none() | st.floats(-1e6, 1e6) | st.just(math.nan)
sample = st.builds(
    RankSample,
    rank=st.integers(0, 40),
    local_rank=st.integers(0, 7),
    dp_group=st.integers(0, 3),
    pp_stage=st.integers(0, 3),
    tp_group=st.integers(0, 3),
    phase=st.sampled_from(list(Phase)),
    step_time_s=st.floats(0, 10),
    compute_s=st.floats(0, 10),
    comm_wait_s=st.floats(0, 10),
    data_wait_s=st.floats(0, 10),
    loss=signal,
    grad_norm=signal,
    tokens=st.none() | st.integers(0, 10**9),
    flops=st.none() | st.floats(0, 1e18),
    max_seq_len=st.none() | st.integers(0, 10**6),
)


@st.composite
def steps(draw: st.DrawFn) -> list[StepTelemetry]:
    out = []
    for i in range(draw(st.integers(1, 5))):
        samples = draw(st.lists(sample, min_size=1, max_size=6, unique_by=lambda s: s.rank))
        rack = draw(st.booleans())
        if rack:  # a rack's message: each sample names its node
            samples = [
                s.model_copy(update={"node": f"n{draw(st.integers(0, 6))}"}) for s in samples
            ]
        out.append(
            StepTelemetry(
                schema_version=2 if rack else 1, job_id="j", node=f"n{i}", step=3,
                ts_start=T0, ts_end=T0 + timedelta(seconds=draw(st.integers(0, 9))),
                samples=tuple(samples),
            )
        )  # fmt: skip
    return out


def assert_frame(frame: StepFrame, want: dict[str, object]) -> None:
    assert frame.nodes == want["nodes"]
    for f in FIELDS:
        got, exp = getattr(frame, f), want[f]
        assert got.shape == exp.shape, f  # type: ignore[attr-defined]
        np.testing.assert_array_equal(got, exp, err_msg=f)
    for f in WORK_FIELDS:  # None: no rank said it; else NaN where one did not
        got, exp = getattr(frame, f), want[f]
        if got is None:
            assert np.isnan(exp.astype(np.float64)).all(), f  # type: ignore[attr-defined]
        else:
            np.testing.assert_array_equal(got, exp.astype(np.float64), err_msg=f)  # type: ignore[attr-defined]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps())
def test_a_frame_equals_the_row_by_row_reference(msgs: list[StepTelemetry]) -> None:
    frame = StepFrame.from_messages(msgs)
    assert_frame(frame, reference(msgs))
    ends = [m.ts_end.timestamp() for m in msgs]
    assert frame.ts == step_times(ends, [m.ts_start.timestamp() for m in msgs])[0]
    assert min(ends) <= frame.ts <= max(ends)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps())
def test_a_frame_of_fast_views_equals_one_of_models(msgs: list[StepTelemetry]) -> None:
    views = [decode_step(encode(m)) for m in msgs]
    if any(v is None for v in views):  # a NaN loss travels as a string: pydantic's
        return
    assert_frame(StepFrame.from_messages(views), reference(msgs))  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps(), st.lists(st.booleans(), min_size=5, max_size=5))
def test_a_frame_of_columnar_views_mixed_with_others_equals_the_reference(
    msgs: list[StepTelemetry], columnar: list[bool]
) -> None:
    # version 3 for some senders (arrays concatenated), versions 1/2 for the others
    mixed = [
        StepTelemetry.model_validate({**m.model_dump(), "schema_version": 3}) if new else m
        for m, new in zip(msgs, columnar, strict=False)
    ]
    for small in (16, 0):  # a small message's rows, and any message's arrays
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(fastcolumns, "SMALL", small)
            views = [decode_step(encode(m)) for m in mixed]
        got = [v if v is not None else m for v, m in zip(views, mixed, strict=True)]
        assert all(
            v is not None for v, m in zip(views, mixed, strict=True) if m.schema_version == 3
        )
        assert_frame(StepFrame.from_messages(got), reference(msgs))  # type: ignore[arg-type]
    assert_frame(StepFrame.from_messages(mixed), reference(msgs))  # the models' samples
