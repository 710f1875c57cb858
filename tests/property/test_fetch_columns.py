"""A fetch decoded at once (:func:`pipeline.io.fetchcolumns.decode_fetch`: a job step's
version-3 messages as one block of arrays) means what each record decoded alone means:
it takes only what pydantic takes, with pydantic's values; the frame of its spans, mixed
with messages of other versions and across fetches, equals the row-by-row reference;
and the detection core refuses exactly the records it refuses from the models (rank
ownership and membership, issue 39), with the same frames and alerts."""

from __future__ import annotations

import math
from datetime import timedelta

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detectors.errors import CapacityError, RefusedRecord
from detectors.frame import StepFrame
from detectors.job import JobDetection
from pipeline.io.fetchcolumns import SpanView, decode_fetch
from schemas import RankSample, Rejected, StepTelemetry, decode, encode
from tests.property.test_fastcolumns_properties import (
    _BAD,
    _v3,
    ascii_steps,
    columnar,
    decode_step_rows,
    mutated_v3,
)
from tests.property.test_frame_from_messages import T0, assert_frame, reference, steps


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=st.lists(mutated_v3(), min_size=1, max_size=4),
       whole=st.lists(ascii_steps(), min_size=1, max_size=3))  # fmt: skip
def test_a_fetch_takes_only_what_pydantic_takes_with_its_values(drawn, whole):
    good = [encode(columnar(m)) for m in whole]
    values = [*drawn, *good]
    out = decode_fetch(values)
    for raw, view in zip(drawn, out, strict=False):
        if view is not None:
            assert not isinstance(decode(StepTelemetry, raw), Rejected)
    for m, view in zip(whole, out[len(drawn) :], strict=True):
        assert isinstance(view, SpanView)
        assert [tuple(map(repr, r)) for r in view.rows()] == [
            tuple(map(repr, r)) for r in decode_step_rows(m)
        ]
        assert (view.job_id, view.node, view.step, view.ts_end) == (m.job_id, m.node, m.step,
                                                                    m.ts_end)  # fmt: skip


@pytest.mark.parametrize("case", sorted(_BAD))
def test_a_bad_v3_message_in_a_fetch_goes_to_pydantic_and_its_neighbours_stay(case):
    import json

    column, value, _ = _BAD[case]
    doc = _v3(rack=column in ("node_idx", "nodes"))
    if value is None:
        doc["columns"].pop(column)
    else:
        doc["columns"][column] = value
    good = json.dumps(_v3(rack=True)).encode()
    out = decode_fetch([good, json.dumps(doc).encode(), good])
    assert out[1] is None
    assert isinstance(out[0], SpanView) and isinstance(out[2], SpanView)
    assert [s.node for s in out[2].samples] == ["n0", "n1", "n0", "n1"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps(), st.lists(st.booleans(), min_size=5, max_size=5), st.integers(0, 5))
def test_a_frame_of_spans_mixed_with_others_and_across_fetches_equals_the_reference(
    msgs: list[StepTelemetry], new: list[bool], cut: int
) -> None:
    mixed = [columnar(m) if v3 else m for m, v3 in zip(msgs, new, strict=False)]
    raws = [encode(m) for m in mixed]
    other = encode(columnar(msgs[0]).model_copy(update={"step": 4}))  # another step's
    decoded = decode_fetch([*raws[:cut], other]) + decode_fetch(raws[cut:])  # two fetches
    decoded.pop(min(cut, len(raws)))
    got = [v if v is not None else m for v, m in zip(decoded, mixed, strict=True)]
    assert all(isinstance(v, SpanView) for v, m in zip(got, mixed, strict=True)
               if m.schema_version == 3)  # fmt: skip
    frame = StepFrame.from_messages(got)  # type: ignore[arg-type]
    assert_frame(frame, reference(msgs))
    for name in ("rank", "compute", "loss", "node_idx"):
        assert getattr(frame, name).flags.writeable, name


# -- the core's trust rules on spans ---------------------------------------------------------
NODES = ["n0", "n1", "n2", "intruder"]


@st.composite
def hostile_job(draw: st.DrawFn) -> list[list[StepTelemetry]]:
    """Steps of a job of three nodes (two ranks each), with records that carry another
    node's ranks, name other nodes (a rack's), come from an intruder, or jump ahead;
    each inner list one fetch."""
    fetches: list[list[StepTelemetry]] = []
    for step in range(draw(st.integers(3, 7))):
        fetch = []
        for k in range(3):
            if draw(st.integers(0, 9)) == 0:
                continue  # a node silent this step
            fetch.append(_msg(f"n{k}", step, [2 * k, 2 * k + 1], None))
        for _ in range(draw(st.integers(0, 2))):
            ranks = draw(st.lists(st.integers(0, 9), min_size=1, max_size=3, unique=True))
            named = draw(st.none() | st.lists(st.sampled_from(NODES), min_size=len(ranks),
                                              max_size=len(ranks)))  # fmt: skip
            jump = draw(st.sampled_from([0, 0, 0, 200]))
            fetch.insert(draw(st.integers(0, len(fetch))),
                         _msg(draw(st.sampled_from(NODES)), step + jump, ranks, named))  # fmt: skip
        fetches.append(fetch)
    return fetches


def _msg(node: str, step: int, ranks: list[int], named: list[str] | None) -> StepTelemetry:
    samples = tuple(
        RankSample(rank=r, local_rank=r % 8, step_time_s=1.0, compute_s=0.8 + 0.01 * r,
                   comm_wait_s=0.1, data_wait_s=0.1, loss=2.0,
                   node=None if named is None else named[i])
        for i, r in enumerate(ranks)
    )  # fmt: skip
    end = T0 + timedelta(seconds=step + 1)
    return StepTelemetry(schema_version=1 if named is None else 2, job_id="j", node=node,
                         step=step, ts_start=end - timedelta(seconds=1), ts_end=end,
                         samples=samples)  # fmt: skip


def _run(fetches: list[list[object]]) -> list[object]:
    det = JobDetection("j")
    seen: list[object] = []
    for fetch in fetches:
        for m in fetch:
            try:
                out = det.on_step(m)  # type: ignore[arg-type]
            except (RefusedRecord, CapacityError) as exc:
                seen.append((type(exc).__name__, str(exc)))
                continue
            seen += [(a.fingerprint, a.kind, a.node, a.state) for a in out.alerts]
            seen += [_frame_key(f) for f in out.frames]
    seen += [(a.fingerprint, a.kind, a.node) for a in det.flush()]
    owners = det._rank_owners()
    seen.append([owners.names[k] if k >= 0 else None for k in owners.owner[:10].tolist()])
    return seen


def _frame_key(f: StepFrame) -> tuple[object, ...]:
    cols = tuple(tuple(np.where(np.isnan(a), math.inf, a).tolist())
                 for a in (f.rank, f.node_idx, f.compute, f.loss))  # fmt: skip
    return (f.step, f.nodes, cols)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_job())
def test_the_core_refuses_the_same_records_of_spans_as_of_models(fetches) -> None:
    spans = []
    for fetch in fetches:
        decoded = decode_fetch([encode(columnar(m)) for m in fetch])
        assert all(isinstance(v, SpanView) for v in decoded)
        spans.append(decoded)
    assert _run(spans) == _run(fetches)  # type: ignore[arg-type]
