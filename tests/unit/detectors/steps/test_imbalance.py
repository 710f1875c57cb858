"""A pipeline stage slower as a whole: measured, dated, never a node."""

import numpy as np
import pytest

from detectors.frame import StepFrame
from detectors.steps.imbalance import StageImbalance


def play(imb, steps, factor, n=64, pp=4, seed=0, rows=None):
    rng = np.random.default_rng(seed)
    stage = np.repeat(np.arange(pp), n // pp)
    for step in range(steps):
        compute = (1.0 + 0.01 * rng.standard_normal(n)) * factor(step, stage)
        frame = StepFrame.from_arrays("j", step, float(step), compute, pp_stage=stage)
        mask = np.ones(n, dtype=bool) if rows is None else rows(step, n)
        gaps = imb.score(frame, mask)
        imb.learn(gaps, step)
    return imb.findings(floor=0.1)


def test_a_balanced_job_and_a_cluster_wide_shift_say_nothing():
    assert play(StageImbalance(), 200, lambda s, st: np.ones(st.shape)) == []
    surge = lambda s, st: np.full(st.shape, 1.6 if 80 <= s < 160 else 1.0)  # noqa: E731
    assert play(StageImbalance(), 200, surge) == []


def test_the_gap_and_its_start_are_in_the_finding():
    mid = lambda s, st: np.where((st == 2) & (s >= 90), 1.2, 1.0)  # noqa: E731
    (f,) = play(StageImbalance(), 200, mid)
    assert (f.signal, f.node, f.rank) == ("imbalance", None, None)
    assert f.score == pytest.approx(0.2, abs=0.01)
    assert "stage 2 is" in f.detail and "since step 90" in f.detail


def test_two_slow_stages_are_named_in_one_finding_worst_first():
    two = lambda s, st: np.select([st == 0, st == 3], [1.15, 1.3], 1.0)  # noqa: E731
    (f,) = play(StageImbalance(), 100, two)
    assert "stages 3, 0 are" in f.detail and "since step 0" in f.detail


def test_a_gap_that_closes_ends_its_streak():
    temp = lambda s, st: np.where((st == 1) & (s < 60), 1.3, 1.0)  # noqa: E731
    imb = StageImbalance()
    assert play(imb, 200, temp) == []
    assert imb._since[1] == -1  # the streak ended with the gap


def test_scoring_reads_state_only_and_a_job_without_stages_scores_nothing():
    imb = StageImbalance()
    frame = StepFrame.from_arrays("j", 0, 0.0, np.ones(8), pp_stage=np.zeros(8, np.int32))
    gaps = imb.score(frame, np.ones(8, dtype=bool))
    assert np.isnan(gaps).all() and imb.steps == 0
    imb.learn(gaps, 0)
    assert imb.steps == 0


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="alpha"):
        StageImbalance(alpha=0)
    with pytest.raises(ValueError, match="warmup_steps"):
        StageImbalance(warmup_steps=0)
