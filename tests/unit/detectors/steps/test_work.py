"""Step time read against work (issue 43): compute per unit of work, and the INFO that
explains persistent work imbalance."""

from __future__ import annotations

import re

import numpy as np
import pytest

from detectors.engine import DetectorSuite
from detectors.frame import StepFrame
from detectors.steps.work import MAX_FACTOR, WorkImbalance, per_work, work_of

N = 64


def _suite_alerts(frames):
    suite = DetectorSuite("j")
    out = []
    for f in frames:
        out += suite.process_step(f)
    return [a for a in out if a.state.value == "firing"]


def _frames(steps, *, slow_rank=None, per_token=1.0, heavy=None, say_work=True, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for step in range(steps):
        tokens = np.full(N, 4096.0)
        if heavy is not None and step >= 60:  # rank 9's shard: the long sequences
            tokens[9] *= heavy
        per = np.ones(N)
        if slow_rank is not None and step >= 60:
            per[slow_rank] = per_token
            tokens[slow_rank] = 3000.0  # its batches are short
        compute = 0.9 * tokens / 4096 * per * (1 + 0.01 * rng.standard_normal(N))
        out.append(StepFrame.from_arrays("j", step, 1000.0 + step, compute, 0.05 + 0 * compute,
                                         tokens=tokens if say_work else None))  # fmt: skip
    return out


def test_a_rank_slow_for_its_long_sequences_is_no_straggler_once_work_is_said():
    said = _suite_alerts(_frames(200, heavy=1.3))
    unsaid = _suite_alerts(_frames(200, heavy=1.3, say_work=False))
    assert not [a for a in said if a.node is not None]
    (info,) = {a.evidence.detail for a in said if a.kind.value == "imbalance"}
    assert re.search(
        r"rank 9 has (2\d|30)\.\d% more work \(tokens\) than the median rank "
        r"since step 60",
        info,
    )
    # the same timings without work: the heavy ranks read as slow (what work fixes)
    assert [a for a in unsaid if a.node is not None]


def test_a_rank_slow_per_token_is_a_straggler_even_with_short_batches():
    frames = _frames(200, slow_rank=21, per_token=1.35)
    assert frames[100].compute[21] < np.median(frames[100].compute) * 1.05  # not slower in time
    named = {(a.kind.value, a.rank) for a in _suite_alerts(frames) if a.node is not None}
    assert ("straggler", 21) in named
    # the same timings without work: nothing stands out in time alone
    unsaid = _frames(200, slow_rank=21, per_token=1.35, say_work=False)
    assert not [a for a in _suite_alerts(unsaid) if a.node is not None]


def test_per_work_prefers_flops_bounds_the_factor_and_leaves_unsaid_ranks():
    f = StepFrame.from_arrays("j", 0, 1.0, [1.0, 1.0, 1.0, 1.0],
                              tokens=[100, 100, np.nan, 1e9],
                              flops=[1.0, 2.0, 1.0, 1.0])  # fmt: skip
    assert work_of(f)[0] == "flops"
    assert per_work(f).compute.tolist() == [1.0, 0.5, 1.0, 1.0]
    g = StepFrame.from_arrays("j", 0, 1.0, [1.0, 1.0, 1.0, 1.0], tokens=[100, 100, np.nan, 1e9])
    assert work_of(g)[0] == "tokens"
    assert per_work(g).compute.tolist() == [1.0, 1.0, 1.0, 1.0 / MAX_FACTOR]  # 1e9 bounded
    zero = StepFrame.from_arrays("j", 0, 1.0, [1.0, 2.0], tokens=[0, 0])
    assert per_work(zero).compute.tolist() == [1.0, 2.0]


def _learn(det, steps, tokens_of, pp=None):
    for step in range(steps):
        tokens = tokens_of(step)
        f = StepFrame.from_arrays("j", step, float(step), np.ones(tokens.shape[0]),
                                  tokens=tokens, pp_stage=pp)  # fmt: skip
        det.learn(f, np.ones(tokens.shape[0], dtype=bool))


def test_persistent_work_imbalance_is_explained_moving_imbalance_is_not():
    pp = np.repeat(np.arange(4), 8)
    stage = WorkImbalance(warmup_steps=10)
    _learn(stage, 100, lambda s: np.where(pp == 2, 4096 * 1.2, 4096.0), pp)
    (f,) = stage.findings(floor=0.1)
    assert (f.signal, f.node, f.rank) == ("imbalance", None, None)
    assert f.score == pytest.approx(0.2)
    assert f.detail.startswith("work imbalance: pipeline stage 2 has 20.0% more work (tokens)")

    ranks = WorkImbalance(warmup_steps=10)
    _learn(ranks, 100, lambda s: np.where(np.arange(32) == 5, 6000.0, 4096.0))
    (f,) = ranks.findings(floor=0.1)
    assert "rank 5 has 46.5% more work (tokens) than the median rank" in f.detail

    rng = np.random.default_rng(3)
    moving = WorkImbalance(warmup_steps=10)
    _learn(moving, 300, lambda s: 4096 * np.exp(0.3 * rng.standard_normal(32)))
    hot = WorkImbalance(warmup_steps=10)  # MoE-like: hot ranks for 25 steps, then others
    _learn(hot, 300, lambda s: np.where(np.arange(32) % 8 == (s // 25) % 8, 6000.0, 4096.0))
    assert moving.findings(floor=0.1) == [] and hot.findings(floor=0.1) == []
