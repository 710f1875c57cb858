"""A fetch decoded at once: spans survive a snapshot of the job's buffered steps, and one
job mixes versions 1, 2 and 3 in its steps (the frame as from the models)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np

from detectors.frame import StepFrame
from detectors.job import JobDetection
from pipeline.io import statecodec
from pipeline.io.fetchcolumns import SpanView, decode_fetch
from schemas import RankSample, StepTelemetry, encode

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def model(node: str, step: int, ranks: list[int], version: int = 3) -> StepTelemetry:
    named = version == 2 or (version == 3 and node.startswith("rack"))
    samples = tuple(
        RankSample(rank=r, local_rank=r % 2, step_time_s=1.0, compute_s=0.8 + 0.01 * r,
                   comm_wait_s=0.1, data_wait_s=0.1, node=f"n{r // 2}" if named else None)
        for r in ranks
    )  # fmt: skip
    end = T0 + timedelta(seconds=step + 1)
    start = end - timedelta(seconds=1)
    return StepTelemetry(schema_version=version, job_id="j", node=node, step=step,
                         ts_start=start, ts_end=end, samples=samples)  # fmt: skip


def test_a_jobs_buffered_spans_survive_its_snapshot():
    det = JobDetection("j")
    for step in range(3):
        for v in decode_fetch(
            [encode(model("n0", step, [0, 1])), encode(model("n1", step, [2, 3]))]
        ):
            det.on_step(v)
    det.on_step(decode_fetch([encode(model("n0", 3, [0, 1]))])[0])
    back = statecodec.loads(statecodec.dumps(det))
    held = back.assembler._jobs["j"].pending[3]
    assert [type(v) for v in held.values()] == [SpanView]
    out = back.on_step(decode_fetch([encode(model("n1", 3, [2, 3]))])[0])
    assert [f.nodes for f in out.frames] == [("n0", "n1")]
    assert out.frames[0].rank.tolist() == [0, 1, 2, 3]


def test_versions_one_to_three_mix_in_one_job_and_one_step():
    det, ref = JobDetection("j"), JobDetection("j")
    for step in range(4):
        models = [model("n0", step, [0, 1], 1), model("rack-a", step, [2, 3, 4, 5], 3),
                  model("n3", step, [6, 7], 3), model("rack-b", step, [8, 9], 2)]  # fmt: skip
        decoded = decode_fetch([encode(m) for m in models])
        assert [type(v).__name__ for v in decoded] == ["StepView", "SpanView", "SpanView",
                                                       "StepView"]  # fmt: skip
        got = [f for v in decoded for f in det.on_step(v).frames]
        want = [f for m in models for f in ref.on_step(m).frames]
        for a, b in zip(got, want, strict=True):
            _same(a, b)


def _same(a: StepFrame, b: StepFrame) -> None:
    assert (a.step, a.nodes, a.ts, a.ts_start) == (b.step, b.nodes, b.ts, b.ts_start)
    for name in ("rank", "node_idx", "local_rank", "compute", "loss", "has_loss", "phase"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
