"""Hangs and long phases: periodic checkpoints and evals, announced phases (issue 15)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detectors.hang.detector import HangDetector

FACTOR = 2.5  # the engine's hang_factor
BASE = 0.4  # ordinary step time (s)
TICK = 0.5 * BASE  # the worker ticks every 0.5 s of wall time: 0.5 step time here


def play(
    h: HangDetector, intervals, *, step0: int = 0, ts0: float = 0.0
) -> tuple[np.ndarray, float]:
    """Complete one step per interval, ticking every ``TICK`` seconds of the silence
    before each completion; the highest score seen while each step was in progress,
    and the event time of the last completion."""
    peaks = np.zeros(len(intervals))
    ts = ts0
    for i, iv in enumerate(intervals):
        ticks = ts + TICK * np.arange(1, int(iv / TICK) + 1)
        peaks[i] = max((h.score(float(t)) for t in ticks if t < ts + iv), default=0.0)
        ts += float(iv)
        h.learn_step(step0 + i, ts)
    return peaks, ts


def first_flag(h: HangDetector, ts: float, horizon: float) -> float | None:
    """Seconds after ``ts`` of the first tick scoring ``FACTOR`` or more, within ``horizon``."""
    for k in range(1, int(horizon / TICK) + 1):
        if h.score(ts + k * TICK) >= FACTOR:
            return k * TICK
    return None


def checkpoint_job(
    seed: int, n: int, period: int, lo: float, hi: float
) -> tuple[np.ndarray, np.ndarray]:
    """Step intervals with 5 % noise and a checkpoint of ``lo``-``hi`` step times every
    ``period`` steps (at steps ``period - 1``, ``2 * period - 1``, ...)."""
    rng = np.random.default_rng(seed)
    intervals = BASE * (1.0 + 0.05 * rng.standard_normal(n))
    ckpt = np.arange(period - 1, n, period)
    intervals[ckpt] = (
        BASE * rng.uniform(lo, hi, ckpt.size) * (1.0 + 0.05 * rng.standard_normal(ckpt.size))
    )
    return intervals, ckpt


def flagged_at(flagged: float | None, allowed: float) -> bool:
    """Whether the first flagged tick is the first one at or after ``allowed`` seconds
    (give or take rounding)."""
    return flagged is not None and allowed - 1e-9 <= flagged <= allowed + TICK + 1e-9


# -- (a) periodic checkpoints ------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize(
    ("period", "lo", "hi"),
    [(50, 15.0, 20.0), (100, 7.9 / BASE, 7.9 / BASE)],  # the two cases
)
def test_periodic_checkpoints_are_not_hangs_after_the_first(seed, period, lo, hi):
    intervals, ckpt = checkpoint_job(seed, 20 * period, period, lo, hi)
    h = HangDetector(FACTOR)
    peaks, _ = play(h, intervals)
    assert peaks[ckpt[0]] >= FACTOR  # unannounced and never seen: a hang while it lasts
    # the job's start and the first save make the period: the second one is due
    assert peaks[ckpt[1:]].max() < FACTOR
    ordinary = np.setdiff1d(np.arange(intervals.size), ckpt)
    assert peaks[ordinary].max() < FACTOR
    assert set(h.learned_periods) == {period}
    assert h.median_step_time == pytest.approx(BASE, rel=0.05)


def test_interleaved_evals_and_checkpoints_are_learned_side_by_side():
    # evals every 25 steps (3 step times), checkpoints every 60 (30 step times)
    rng = np.random.default_rng(7)
    n = 600
    intervals = BASE * (1.0 + 0.05 * rng.standard_normal(n))
    evals = np.arange(24, n, 25)
    ckpt = np.arange(59, n, 60)
    intervals[evals] = 3.0 * BASE
    intervals[ckpt] = 30.0 * BASE * (1.0 + 0.05 * rng.standard_normal(ckpt.size))
    h = HangDetector(FACTOR)
    peaks, _ = play(h, intervals)
    assert peaks[np.setdiff1d(evals, ckpt)[2:]].max() < FACTOR
    assert peaks[ckpt[2:]].max() < FACTOR
    assert set(h.learned_periods) == {25, 60}
    # a checkpoint that is also an eval step does not stretch the evals' duration
    assert h.learned_periods[25] == pytest.approx(3.0 * BASE)


# -- (b) a hang inside a checkpoint ------------------------------------------------------


def test_a_checkpoint_lasting_three_times_its_duration_is_a_hang():
    intervals, ckpt = checkpoint_job(5, 299, 50, 15.0, 20.0)  # steps 0..298
    h = HangDetector(FACTOR)
    _, ts = play(h, intervals)
    learned = h.learned_periods[50]
    assert learned == pytest.approx(intervals[ckpt].max())  # the longest one seen
    # step 299 saves a checkpoint and hangs inside it, for 3 x its learned duration
    assert h.score(ts + learned) < FACTOR
    flagged = first_flag(h, ts, 3.0 * learned)
    assert flagged is not None
    # flagged once the silence passes long_margin (1.5) x the learned duration:
    # half-way through the 3 x checkpoint
    assert flagged_at(flagged, 1.5 * learned)
    assert h.score(ts + 3.0 * learned) == pytest.approx(2.0 * FACTOR)


# -- (c) announced phases ----------------------------------------------------------------


def warm(h: HangDetector, n: int = 100) -> float:
    _, ts = play(h, np.full(n, BASE))
    return ts


def test_an_announced_checkpoint_is_not_a_hang_even_the_first_time():
    h = HangDetector(FACTOR)
    ts = warm(h)
    h.announce("checkpoint", ts)
    assert h.phase == "checkpoint"
    assert first_flag(h, ts, 20.0 * BASE) is None  # 20 step times: not a hang
    h.learn_step(100, ts + 16.0 * BASE)  # the next step ends the announcement
    assert h.phase is None
    assert h.expected_step_time == h.median_step_time == pytest.approx(BASE)
    assert h.median_step_time == pytest.approx(BASE)  # the checkpoint is not learned into it


def test_an_announced_phase_that_never_ends_is_a_hang():
    h = HangDetector(FACTOR, phase_floor_s=0.0)
    ts = warm(h)
    h.announce("eval", ts)
    # neither announced nor learned: 1.5 x 20 median step times (no floor in seconds)
    assert flagged_at(first_flag(h, ts, 100.0 * BASE), 30.0 * BASE)
    for step in (100, 101):  # two runs of 4 step times: a trend
        h.learn_step(step, ts + 4.0 * BASE)
        ts += 4.0 * BASE
        h.announce("eval", ts)
    assert flagged_at(first_flag(h, ts, 100.0 * BASE), 6.0 * BASE)  # 1.5 x 4 step times


def test_an_announced_duration_is_allowed_with_the_margin():
    h = HangDetector(FACTOR)
    ts = warm(h)
    h.announce("checkpoint", ts, expected_s=8.0)
    assert flagged_at(first_flag(h, ts, 60.0), 12.0)
    with pytest.raises(ValueError, match="expected_s"):
        h.announce("checkpoint", ts, expected_s=0.0)


def test_an_announcement_older_than_the_last_step_is_ignored():
    h = HangDetector(FACTOR)
    ts = warm(h)
    h.announce("checkpoint", ts - 1.0)
    assert h.phase is None
    assert h.score(ts + 3.0 * BASE) == pytest.approx(3.0)


def test_a_relaunch_ends_an_announcement():
    h = HangDetector(FACTOR)
    ts = warm(h)
    h.announce("checkpoint", ts)
    h.restart(ts + 1.0, grace_steps=5)
    assert h.phase is None and h.last_step is None


# -- (d) ordinary hangs ------------------------------------------------------------------


def test_an_ordinary_hang_is_flagged_as_before_between_learned_checkpoints():
    intervals, _ = checkpoint_job(3, 320, 50, 15.0, 20.0)  # steps 0..319; 349 is due next
    h = HangDetector(FACTOR)
    _, ts = play(h, intervals)
    assert set(h.learned_periods) == {50}
    med = h.median_step_time
    assert med is not None
    assert h.expected_step_time == med
    assert h.last_ts is not None
    for t in (0.1, 1.0, 2.0, 5.0):
        assert h.score(ts + t) == (ts + t - h.last_ts) / med  # exactly the old score
    assert flagged_at(first_flag(h, ts, 10.0), FACTOR * med)
    # the old median included the checkpoints: it is not smaller than the new one, so
    # the hang is flagged no later than before
    assert med <= float(np.median(intervals[-50:])) * (1 + 1e-9)


def test_without_long_steps_the_score_is_the_old_one():
    h = HangDetector(factor=FACTOR, window=10, min_steps=3)
    for step in range(30):
        h.learn_step(step, ts=100.0 + 2.0 * step)
    assert h.learned_periods == {}
    assert h.score(158.0 + 5.0) == 5.0 / 2.0


# -- (e) one-off long steps --------------------------------------------------------------


def test_a_one_off_long_step_learns_no_period():
    intervals = np.full(300, BASE)
    intervals[60] = 15.0 * BASE
    h = HangDetector(FACTOR)
    due = []
    for step, ts in enumerate(np.cumsum(intervals)):
        h.learn_step(step, float(ts))
        if h.expected_step_time not in (None, h.median_step_time):
            due.append(step + 1)
    # paired with the job's start (a schedule every 61 steps?): due once, then dropped
    assert due == [120, 121, 122]
    assert h.learned_periods == {}


def test_two_unrelated_long_steps_make_a_candidate_that_dies_at_its_first_miss():
    intervals = np.full(300, BASE)
    intervals[[60, 130]] = 15.0 * BASE  # a storage hiccup, then a resolved hang
    h = HangDetector(FACTOR)
    due = []
    ts = 0.0
    for step, iv in enumerate(intervals):
        ts += float(iv)
        h.learn_step(step, ts)
        if h.expected_step_time not in (None, h.median_step_time):
            due.append(step + 1)
    # 60 + 61 with the job's start, then 130 + 70 and 130 + 131 (+- 1); nothing more
    assert due == [120, 121, 122, 199, 200, 201, 260, 261, 262]
    assert h.learned_periods == {}


# -- slower jobs, relaunches -------------------------------------------------------------


def test_a_job_that_becomes_slower_moves_the_median_and_learns_no_period():
    intervals = np.concatenate((np.full(100, BASE), np.full(100, 3.0 * BASE)))
    h = HangDetector(FACTOR)
    play(h, intervals)
    assert h.median_step_time == pytest.approx(3.0 * BASE)
    assert h.learned_periods == {}


def test_learned_periods_survive_a_relaunch_from_a_checkpoint():
    intervals, _ = checkpoint_job(4, 220, 50, 15.0, 20.0)  # steps 0..219
    h = HangDetector(FACTOR)
    _, ts = play(h, intervals)
    h.restart(ts + 1.0, grace_steps=5)  # resumes from the checkpoint saved at step 199
    assert h.last_step is None
    _, ts = play(h, np.full(49, BASE), step0=200, ts0=ts + 10.0)  # steps 200..248
    assert h.last_step == 248
    assert h.expected_step_time is not None and h.median_step_time is not None
    assert h.expected_step_time > h.median_step_time  # step 249 saves a checkpoint
    assert h.score(ts + 20.0 * BASE) < FACTOR


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"long_ratio": 1.0}, "long_ratio"),
        ({"long_margin": 0.5}, "long_margin"),
        ({"tolerance": -1}, "tolerance"),
        ({"phase_steps": 0.0}, "phase_steps"),
        ({"phase_floor_s": -1.0}, "phase_floor_s"),
        ({"phase_floor_s": float("nan")}, "phase_floor_s"),
        ({"max_periods": 0}, "max_periods"),
    ],
)
def test_invalid_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        HangDetector(**kwargs)


# -- property ----------------------------------------------------------------------------

event = st.one_of(
    st.tuples(st.just("step"), st.integers(-3, 60), st.floats(-5.0, 50.0)),
    st.tuples(st.just("announce"), st.sampled_from(["checkpoint", "eval"]), st.floats(-5.0, 50.0)),
    st.tuples(st.just("restart"), st.floats(0.0, 5.0), st.floats(0.0, 50.0)),
)


@settings(max_examples=150, deadline=None)
@given(events=st.lists(event, max_size=200), later=st.floats(0.0, 1e4))
def test_the_score_is_finite_non_negative_and_reading_it_changes_nothing(events, later):
    h = HangDetector(FACTOR, window=8, min_steps=2, max_periods=3)
    step, ts = 0, 0.0
    for kind, a, b in events:
        if kind == "step":
            step, ts = step + a, ts + b
            h.learn_step(step, ts)
        elif kind == "announce":
            h.announce(a, ts + b, expected_s=None if b <= 0 else b)
        else:
            h.restart(ts + a, grace_steps=b)
        s1 = h.score(ts + later)
        assert math.isfinite(s1) and s1 >= 0.0
        assert h.score(ts + later) == s1


def test_state_written_before_the_phase_floor_and_the_slow_step_reads_their_defaults():
    # a snapshot is restored without __init__ (pipeline.io.statecodec): attributes added
    # since must read class defaults, not raise
    h = HangDetector(FACTOR)
    ts = warm(h)
    for name in ("phase_floor_s", "_slow_s"):
        vars(h).pop(name, None)
    h.announce("checkpoint", ts)
    baseline, why = h.explain(ts + 10.0)
    assert baseline == pytest.approx(max(HangDetector.phase_floor_s, 20 * BASE))
    assert "unknown length" in why
