"""Intermittent stragglers (one slow step in k) and noisier-not-slower ranks (issue 23)."""

import numpy as np
import pytest

from detectors.engine import DetectorSuite
from detectors.frame import StepFrame
from detectors.steps.intermittent import IntermittentSlowdown
from detectors.steps.temporal import RankBaselines


def _run(slow_of, steps=160, n=64, noise=0.01, seed=0, noisy_rank=None):
    """A job of ``n`` ranks (8 per node); ``slow_of(step)`` is rank 13's slowdown."""
    mon = DetectorSuite("job")
    rng = np.random.default_rng(seed)
    alerts = []
    for step in range(steps):
        compute = 1.0 + noise * rng.standard_normal(n)
        compute[13] *= 1.0 + slow_of(step)
        if noisy_rank is not None and step >= 30:
            compute[noisy_rank] = 1.0 + 4 * noise * rng.standard_normal()
        comm = compute.max() + 0.05 - compute
        frame = StepFrame.from_arrays("job", step, ts=1.2 * step, compute=compute, comm_wait=comm)
        alerts += mon.process_step(frame)
    return [a for a in alerts if a.state.value == "firing"]


@pytest.mark.parametrize("k", [2, 5])
def test_one_slow_step_in_k_is_named_with_its_pattern(k):
    firing = _run(lambda s: 0.6 if s >= 40 and s % k == 0 else 0.0)
    assert {(a.node, a.rank) for a in firing} == {("node-1", 13)}
    assert f"one step in {k}" in firing[0].evidence.detail


def test_a_random_fraction_of_slow_steps_is_named_with_the_fraction():
    rng = np.random.default_rng(3)
    slow = rng.random(400) < 0.25
    firing = _run(lambda s: 0.5 if s >= 40 and slow[s] else 0.0, steps=200)
    assert {(a.node, a.rank) for a in firing} == {("node-1", 13)}
    assert "% of steps" in firing[0].evidence.detail or "one step in" in firing[0].evidence.detail


def test_a_healthy_job_and_a_noisier_rank_raise_nothing():
    assert _run(lambda s: 0.0, seed=1) == []
    assert _run(lambda s: 0.0, seed=2, noisy_rank=40) == []


def test_a_steady_straggler_stays_one_straggler_episode():
    firing = _run(lambda s: 0.3 if s >= 40 else 0.0)
    assert {a.fingerprint for a in firing} == {firing[0].fingerprint}


def test_counts_scores_and_forget():
    det = IntermittentSlowdown(window=10, min_slow=2)
    slots = np.arange(2)
    for i in range(10):
        det.learn(slots, np.array([False, i % 3 == 0]), np.full(2, 0.5), np.ones(2, bool))
    assert det.counts(slots).tolist() == [0, 4]
    assert det.score(slots)[1] == pytest.approx(0.4 * 0.5)
    det.forget(np.array([1]))
    assert det.counts(slots).tolist() == [0, 0]
    assert det.score(np.array([5])).tolist() == [0.0]  # unknown slot: neutral


@pytest.mark.parametrize(
    ("kwargs", "name"), [({"window": 65}, "window"), ({"min_slow": 0}, "min_slow"),
                         ({"alpha": 0.0}, "alpha"), ({"min_pulses": 3}, "min_pulses")],
)  # fmt: skip
def test_invalid_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        IntermittentSlowdown(**kwargs)


def test_a_noisier_rank_is_judged_against_its_own_fast_side_spread():
    b = RankBaselines(n_metrics=1, warmup_steps=5)
    rng = np.random.default_rng(0)
    slots = np.arange(2)
    scale = np.full((1, 2), 0.01)
    for _ in range(300):
        v = np.array([[0.01 * rng.standard_normal(), 0.05 * rng.standard_normal()]])
        b.learn(slots, v, scale, np.ones(2, bool))
    s = b.score(slots, np.array([[0.08, 0.08]]), scale)
    assert s.z[0, 0] > 5.0  # the quiet rank: 8 % is far out
    assert s.z[0, 1] < 3.0  # the noisy one: within its own spread


def test_one_glitched_slow_step_counts_as_a_bounded_cost():
    """Issue 39: a 10^6 s compute (excess ~5e6) set the rank's slow-step cost for good."""
    import numpy as np

    from detectors.steps.intermittent import IntermittentSlowdown

    det = IntermittentSlowdown()
    slots, mask = np.arange(2), np.ones(2, dtype=bool)
    for step in range(48):
        slow = step % 8 == 0
        excess = 5e6 if step == 0 else 0.3
        det.learn(slots, np.array([slow, False]), np.array([excess, 0.0]), mask)
    score = det.score(slots)
    assert 0 < score[0] <= 6 / 48 * IntermittentSlowdown.MAX_EXCESS


@pytest.mark.parametrize("k", [15, 40])
def test_one_slow_step_in_a_long_period_is_named_after_eight_pulses(k):
    """Issue 44: with a 48-step window and 5 slow steps needed, a period above 9 steps
    could never be named. Eight evenly spaced pulses name it at any period."""
    onset, pulses = 40, 10
    firing = _run(lambda s: 0.6 if s >= onset and (s - onset) % k == 0 else 0.0,
                  steps=onset + pulses * k)  # fmt: skip
    assert {(a.node, a.rank) for a in firing} == {("node-1", 13)}
    assert firing[0].step >= onset + 7 * k  # the eighth pulse, not before
    assert f"slow once every {k} steps" in firing[0].evidence.detail


def test_a_period_the_window_shows_is_judged_by_its_cost_not_lifted_by_its_pulses():
    """Slow by 8 % on one step in 6 costs about 1 % on average: below the WARNING
    score. The window shows that period, so its cost decides; steady pulses lift only
    periods too long for the window (a straggler of 8 % whose slow steps fall a few
    steps apart by chance was named as a periodic one)."""
    assert _run(lambda s: 0.08 if s >= 40 and s % 6 == 0 else 0.0, steps=200) == []


def test_rare_slow_steps_at_random_are_no_intermittent_straggler():
    """A rank clearly slow now and then, 13 to 60 steps apart at random (a noisy host;
    never the 5 in 48 steps of the window rule): as many pulses as the periodic ones
    above, but no steady spacing."""
    rng = np.random.default_rng(5)
    at = 40 + np.cumsum(rng.integers(13, 60, 20))
    spikes = set(at[at < 600].tolist())
    assert len(spikes) >= 12
    assert _run(lambda s: 0.6 if s in spikes else 0.0, steps=600) == []


def test_a_long_period_episode_resolves_once_its_pulses_stop():
    k, onset, stop = 20, 40, 260
    mon = DetectorSuite("job")
    rng = np.random.default_rng(0)
    alerts = []
    for step in range(360):
        compute = 1.0 + 0.01 * rng.standard_normal(64)
        if onset <= step < stop and (step - onset) % k == 0:
            compute[13] *= 1.6
        comm = compute.max() + 0.05 - compute
        frame = StepFrame.from_arrays("job", step, ts=1.2 * step, compute=compute, comm_wait=comm)
        alerts += mon.process_step(frame)
    states = [(a.state.value, a.rank) for a in alerts]
    assert states[0] == ("firing", 13) and states[-1] == ("resolved", 13), states
    assert alerts[-1].step <= stop + 2 * k


def test_state_written_before_pulses_learns_on():
    """A snapshot of the detector from before pulses were kept lacks their arrays: it
    reads the class defaults and keeps learning."""
    det = IntermittentSlowdown()
    slots = np.arange(3)
    det.learn(slots, np.zeros(3, bool), np.zeros(3), np.ones(3, bool))
    for name in ("min_pulses", "_steps", "_pulse_at", "_n_pulses", "_pulse_excess"):
        del det.__dict__[name]
    for step in range(200):
        det.learn(slots, np.array([False, step % 20 == 0, False]), np.full(3, 0.5),
                  np.ones(3, bool))  # fmt: skip
    assert det.periods(slots).tolist() == [0.0, 20.0, 0.0]
