"""The worker's per-message fast path (``decode_step``) agrees with ``schemas.decode``:
what it accepts pydantic accepts with the same values, and the frame built from its
views equals the frame built from pydantic's models."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detectors.frame import StepFrame
from pipeline.io.fastdecode import StepView, decode_step
from schemas import Rejected, StepTelemetry, decode, encode
from tests.factories import step_telemetry, step_telemetry_st
from tests.property.test_fastdecode_properties import ascii_steps, mutated


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return (math.isnan(a) and math.isnan(b)) or (
        a == b and math.copysign(1, a) == math.copysign(1, b)
    )


def _assert_same(view: StepView, model: StepTelemetry) -> None:
    assert (view.job_id, view.node, view.run, view.step) == (
        model.job_id, model.node, model.run, model.step,
    )  # fmt: skip
    assert view.ts_start == model.ts_start and view.ts_end == model.ts_end
    assert view.ts_end.utcoffset() == model.ts_end.utcoffset()
    assert len(view.samples) == len(model.samples)
    for got, want in zip(view.samples, model.samples, strict=True):
        for f in ("rank", "local_rank", "dp_group", "pp_stage", "tp_group"):
            assert getattr(got, f) == getattr(want, f), f
        assert got.phase == want.phase.value
        for f in ("step_time_s", "compute_s", "comm_wait_s", "data_wait_s", "loss", "grad_norm"):
            assert _same(getattr(got, f), getattr(want, f)), f


def _check(raw: bytes) -> StepView | None:
    view = decode_step(raw)
    if view is not None:
        model = decode(StepTelemetry, raw)
        assert not isinstance(model, Rejected), (raw, model.letter.error)
        _assert_same(view, model)
    return view


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ascii_steps())
def test_valid_ascii_messages_agree(msg: StepTelemetry) -> None:
    _check(encode(msg))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated() | step_telemetry_st().map(encode) | st.binary(max_size=300))
def test_mutated_and_arbitrary_input_is_accepted_only_when_pydantic_agrees(raw: bytes) -> None:
    _check(raw)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ascii_steps(), min_size=1, max_size=4))
def test_frames_from_views_equal_frames_from_models(msgs: list[StepTelemetry]) -> None:
    # one step of one job: give every message the same job, step and distinct ranks
    first = msgs[0]
    fixed, base = [], 0
    for i, m in enumerate(msgs):
        samples = tuple(
            s.model_copy(  # frames hold group ids as int32
                update={
                    "rank": base + k,
                    "loss": 1.0,
                    "grad_norm": None,
                    "local_rank": s.local_rank % 2**31,
                    "dp_group": s.dp_group % 2**31,
                }
            )
            for k, s in enumerate(m.samples)
        )
        base += len(samples)
        fixed.append(
            m.model_copy(
                update={"job_id": first.job_id, "step": first.step, "node": f"n{i}",
                        "samples": samples}
            )
        )  # fmt: skip
    views = [decode_step(encode(m)) for m in fixed]
    assert all(v is not None for v in views)
    a = StepFrame.from_messages(fixed)
    b = StepFrame.from_messages([v for v in views if v is not None])
    fields = "rank node_idx local_rank dp_group phase step_time compute comm_wait data_wait"
    for f in [*fields.split(), "loss", "grad_norm", "has_loss", "has_grad_norm"]:
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
    assert (a.ts, a.ts_start, a.nodes) == (b.ts, b.ts_start, b.nodes)


def test_common_telemetry_takes_the_fast_path() -> None:
    assert decode_step(encode(step_telemetry())) is not None
