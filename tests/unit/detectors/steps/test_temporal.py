"""Per-rank temporal baselines and the creep CUSUM."""

import numpy as np
import pytest
from river import stats

from detectors._stats import EWArrays
from detectors.steps.temporal import RankBaselines


def run(b, series, scale=0.01):
    """Feed ``series[t]`` (one value per rank) step by step; return the last scores."""
    ranks = np.arange(len(series[0]))
    s = None
    for row in series:
        v = np.asarray(row, dtype=float)[None, :]
        sc = np.full_like(v, scale)
        s = b.score(ranks, v, sc)
        b.learn(ranks, v, sc, np.ones(len(ranks), bool), s)
    return s


def test_warm_up_is_neutral():
    b = RankBaselines(n_metrics=1, warmup_steps=5)
    s = run(b, [[0.3, 0.0]] * 3)
    assert not s.warmed.any()
    assert np.all(s.excess == 0) and np.all(s.cusum == 0)


def test_persistent_offset_is_learned_as_normal():
    b = RankBaselines(n_metrics=1, warmup_steps=5)
    s = run(b, [[0.2, 0.0]] * 20)  # rank 0 always 20 % slower (imbalance)
    assert s.warmed.all()
    assert abs(s.excess[0, 0]) < 1e-9 and s.cusum[0] == 0


def test_anomalous_values_are_not_learned():
    b = RankBaselines(n_metrics=1, warmup_steps=5, learn_gate_z=3.0)
    run(b, [[0.0]] * 10)
    run(b, [[0.3]] * 50)  # a fault: z = 30, never learned
    s = b.score(np.array([0]), np.array([[0.3]]), np.array([[0.01]]))
    assert s.excess[0, 0] == pytest.approx(0.3)


def test_cusum_catches_creep_before_the_level_is_large():
    b = RankBaselines(n_metrics=1, warmup_steps=5)
    run(b, [[0.0]] * 10)
    level = 0.0
    for t in range(200):
        level = 0.0005 * t
        s = run(b, [[level]])
        if s.cusum[0] >= 15:
            break
    assert level < 0.05


def test_single_blip_adds_at_most_the_clip():
    b = RankBaselines(n_metrics=1, warmup_steps=5, cusum_clip=4.0, cusum_k=1.0)
    run(b, [[0.0]] * 10)
    s = b.score(np.array([0]), np.array([[5.0]]), np.array([[0.01]]))
    assert s.cusum[0] == pytest.approx(3.0)


def test_score_reads_state_only():
    b = RankBaselines(n_metrics=1, warmup_steps=2)
    run(b, [[0.0, 0.1]] * 5)
    before = (b._ew[0].mean.copy(), b._cusum.copy())
    b.score(np.array([0, 1, 7]), np.ones((1, 3)), np.full((1, 3), 0.01))
    assert np.array_equal(before[0], b._ew[0].mean) and np.array_equal(before[1], b._cusum)


def test_unknown_ranks_score_neutral_and_arrays_grow():
    b = RankBaselines(n_metrics=1, warmup_steps=1)
    s = b.score(np.array([1000]), np.ones((1, 1)), np.ones((1, 1)))
    assert not s.warmed[0]
    b.learn(np.array([1000]), np.ones((1, 1)), np.ones((1, 1)), np.ones(1, bool))
    assert b.n_slots >= 1001


def test_ew_arrays_match_river_with_warmup_one():
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(30, 3))
    ew = EWArrays(3, alpha=0.2, warmup=1)
    rivers = [(stats.EWMean(0.2), stats.EWVar(0.2)) for _ in range(3)]
    for row in xs:
        ew.update(np.arange(3), row)
        for j, (m, v) in enumerate(rivers):
            m.update(row[j])
            v.update(row[j])
            assert ew.mean[j] == pytest.approx(m.get())
            assert ew.var[j] == pytest.approx(v.get())


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"n_metrics": 0}, "n_metrics"),
        ({"warmup_steps": 0}, "warmup_steps"),
        ({"alpha": 0.0}, "alpha"),
        ({"alpha_up": 2.0}, "alpha_up"),
        ({"learn_gate_z": 0.0}, "learn_gate_z"),
        ({"cusum_k": -1.0}, "cusum_k"),
    ],
)
def test_invalid_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        RankBaselines(**kwargs)
