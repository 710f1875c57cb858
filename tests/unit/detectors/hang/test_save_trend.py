"""Issue 44: a save longer than the last ones is judged by the trend of the job's own
saves (growing, doubling) and its announcement, not a fixed 1.5 x the longest."""

import pytest

from detectors.hang.detector import HangDetector
from detectors.hang.long_steps import MAX_GROWTH, trend_next

FACTOR = 2.5
STEP = 1.0


def warm(h: HangDetector, steps: int = 20) -> float:
    ts = 0.0
    for step in range(steps):
        ts += STEP
        h.learn_step(step, ts)
    return ts


def peak_during(h: HangDetector, ts: float, save_s: float) -> float:
    """The highest graded silence while an announced save of ``save_s`` runs, ticking
    every 0.5 s."""
    return max(h.graded(ts + 0.5 * k) for k in range(1, int(save_s / 0.5) + 1))


def saves(h: HangDetector, durations, *, announce: bool = True, every: int = 20):
    """Run saves of ``durations`` every ``every`` steps; the peak graded silence of each."""
    ts, step, peaks = warm(h), 20, []
    for d in durations:
        for _ in range(every - 1):
            ts += STEP
            h.learn_step(step, ts)
            step += 1
        if announce:
            h.announce("checkpoint", ts, after_step=step - 1)
        peaks.append(peak_during(h, ts, d))
        ts += d
        h.learn_step(step, ts)
        step += 1
    return peaks, ts, step


@pytest.mark.parametrize(
    "durations",
    [
        [4.0 * 2**k for k in range(6)],  # saves that double: 4 s to 128 s
        [10.0 + 3.0 * k for k in range(10)],  # saves that grow 3 s each time
        [10.0 * 1.3**k for k in range(10)],  # 30 % each time
    ],
    ids=["doubling", "growing", "30pct"],
)
def test_announced_saves_that_grow_are_never_a_hang(durations):
    """The old rule (1.5 x the longest recent save, then CRITICAL at once) called
    every doubled save a hang, a RESTART in auto mode."""
    h = HangDetector(FACTOR, critical_factor=8.0)
    peaks, _, _ = saves(h, durations)
    assert max(peaks) < FACTOR, peaks


def test_a_hang_in_a_save_of_a_steady_trend_is_flagged_at_its_margin():
    """The trend does not hide a hang: saves of a steady 10 s; the next one that
    never ends is flagged at 1.5 x 10 s and is CRITICAL at once (a known length)."""
    h = HangDetector(FACTOR, critical_factor=8.0)
    _, ts, step = saves(h, [10.0, 10.0, 10.0])
    for _ in range(19):
        ts += STEP
        h.learn_step(step, ts)
        step += 1
    h.announce("checkpoint", ts, after_step=step - 1)
    assert h.graded(ts + 14.5) < FACTOR
    assert h.graded(ts + 15.5) >= 8.0


def test_no_trend_grows_faster_than_max_growth_nor_past_the_operators_cap():
    """What a writer of the lifecycle topic could do: announce saves that seem to grow
    ever faster, to stretch the allowance of the next one (and hide a hang in it). The
    trend allows at most MAX_GROWTH x the last run, and no more than the operator's
    STEPGUARD_MAX_PHASE_S beyond the longest run."""
    assert trend_next([1.0, 1000.0]) == MAX_GROWTH * 1000.0
    h = HangDetector(FACTOR)
    _, ts, step = saves(h, [2.0, 20.0, 200.0])
    h.announce("checkpoint", ts, after_step=step - 1, max_s=300.0)
    assert h.expected_step_time == pytest.approx(1.5 * 300.0 / FACTOR)


def test_one_save_is_no_trend_the_second_may_take_the_unknown_length():
    """After one save of 4 s the second may be twice as long: it is allowed what a
    save of unknown length is (phase_floor_s), as the first was."""
    h = HangDetector(FACTOR, phase_floor_s=120.0)
    peaks, ts, step = saves(h, [4.0, 8.0])
    assert max(peaks) < FACTOR
    for _ in range(19):
        ts += STEP
        h.learn_step(step, ts)
        step += 1
    h.announce("checkpoint", ts, after_step=step - 1)
    assert h.expected_step_time == pytest.approx(1.5 * 16.0 / FACTOR)  # 4 -> 8: 16 next
