"""A loss that climbs slowly away from its best."""

import math

import numpy as np
import pytest

from detectors.training.drift import LossDrift, drift_findings


def curve(steps, drift_from=None, rate=0.003, seed=0):
    rng = np.random.default_rng(seed)
    for s in range(steps):
        base = 2.0 + 1.5 * math.exp(-s / 60)
        if drift_from is not None and s >= drift_from:
            base *= 1 + rate * (s - drift_from)
        yield base * (1 + 0.01 * rng.standard_normal())


def first_alarm(d, losses, floor=0.05):
    for i, x in enumerate(losses):
        if drift_findings(d, x, floor):
            return i
        d.learn_one(x)
    return None


def test_a_falling_or_flat_noisy_loss_never_scores():
    assert first_alarm(LossDrift(), curve(600)) is None


def test_a_slow_drift_is_found_before_it_has_cost_much():
    at = first_alarm(LossDrift(), curve(400, drift_from=200))
    assert at is not None and 200 < at < 200 + 30  # about 5 % above the best


def test_non_finite_losses_are_not_learned_and_reset_forgets():
    d = LossDrift(short=3, warmup=3)
    for x in (2.0, 2.0, float("nan"), 2.0):
        d.learn_one(x)
    assert d.best() == pytest.approx(2.0)
    assert d.score_one(float("inf")) == 0.0
    d.reset()
    assert d.best() == math.inf and d.score_one(5.0) == 0.0


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="warmup"):
        LossDrift(short=10, warmup=5)
