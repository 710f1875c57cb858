"""Loss / grad-norm divergence against a rolling baseline."""

import math

import pytest

from detectors.training.divergence import DivergenceDetector


def trained(n=30):
    d = DivergenceDetector(window=20, warmup=10)
    for i in range(n):
        d.learn_one(loss=3.0 - 0.001 * i + 0.01 * (i % 2), grad_norm=1.0 + 0.05 * (i % 3))
    return d


def test_warm_up_is_neutral():
    d = DivergenceDetector(window=20, warmup=10)
    for _ in range(5):
        d.learn_one(1.0, 1.0)
    s = d.score_one(100.0, 100.0)
    assert s.loss_z == 0 and s.grad_z == 0


def test_normal_values_score_low_and_spikes_high():
    d = trained()
    assert d.score_one(2.98, 1.05).score < 3
    s = d.score_one(6.0, 1.0)
    assert s.loss_z > 50 and s.score == s.loss_z
    assert d.score_one(2.98, 40.0).grad_z > 50


def test_decreasing_loss_is_not_a_spike():
    assert trained().score_one(1.0, 1.0).loss_z == 0


def test_non_finite_values_are_flagged():
    d = trained()
    assert d.score_one(math.inf, 1.0).nonfinite
    assert d.score_one(1.0, -math.inf).nonfinite
    assert d.score_one(math.nan, 1.0, nonfinite=True).nonfinite
    assert not d.score_one(math.nan, math.nan).nonfinite  # NaN here: not reported


def test_spikes_are_not_learned():
    d = trained()
    for _ in range(40):
        d.learn_one(30.0, 1.0)
    assert d.score_one(30.0, 1.0).loss_z > 50


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"window": 1}, "window"),
        ({"warmup": 0}, "warmup"),
        ({"window": 5, "warmup": 6}, "warmup"),
        ({"mad_floor_rel": -1}, "mad_floor_rel"),
        ({"learn_gate_z": 0}, "learn_gate_z"),
    ],
)
def test_invalid_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        DivergenceDetector(**kwargs)
