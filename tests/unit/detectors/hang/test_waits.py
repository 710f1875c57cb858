"""Waits for input: a job whose data loader stalls is slower, not hung (issue 23)."""

import pytest

from detectors.hang.detector import HangDetector

FACTOR, CRITICAL = 2.5, 8.0


def steady(n: int = 20, step_s: float = 1.0) -> HangDetector:
    """A detector that has seen ``n`` steps of ``step_s`` (steps 0 .. n-1, ending at n-1 s)."""
    h = HangDetector(factor=FACTOR, min_steps=3, critical_factor=CRITICAL)
    for step in range(n):
        h.learn_step(step, ts=step * step_s)
    return h


def first_flag(h: HangDetector, ts: float, horizon: float, tick: float = 0.25) -> float | None:
    """Seconds after ``ts`` of the first tick the graded silence reaches FACTOR."""
    for k in range(1, int(horizon / tick) + 1):
        if h.graded(ts + k * tick) >= FACTOR:
            return k * tick
    return None


def test_a_step_whose_input_is_late_is_allowed_wait_steps_from_the_waits_start():
    h = steady()
    assert first_flag(h, 19.0, 60) == 2.5  # unsaid: 2.5 median steps
    h.waiting(19.3, after_step=19)
    # 1.5 x 10 median steps from the wait's start, 0.3 s after the last step
    assert first_flag(h, 19.0, 60) == pytest.approx(15.5, abs=0.25)
    assert "input the job waits for" in h.explain(19.0 + 16)[1]


def test_the_waited_step_is_explained_so_the_next_is_judged_at_the_old_pace():
    h = steady()
    h.waiting(19.1, after_step=19)
    h.learn_step(20, ts=23.5)  # 4.5 s: slow, but its input was late
    assert h.median_step_time == pytest.approx(1.0)
    assert first_flag(h, 23.5, 60) == 2.5  # no slow-step allowance: the wait explained it


def test_an_overrun_wait_climbs_rather_than_jumping_to_critical():
    h = steady()
    h.waiting(19.0, after_step=19)
    just_past = h.graded(19.0 + 15.5)
    assert FACTOR <= just_past < 3.0  # a storage that never answers still gets to CRITICAL
    assert h.graded(19.0 + 15.0 * CRITICAL / FACTOR + 1) >= CRITICAL


def test_a_wait_for_a_completed_step_is_ignored():
    h = steady()
    h.waiting(17.5, after_step=17)  # step 18 came long ago
    assert first_flag(h, 19.0, 60) == 2.5


def test_a_wait_for_a_later_step_gives_the_step_in_progress_nothing():
    h = steady()
    h.waiting(19.2, after_step=21)  # the leader's count runs ahead of the steps here
    assert first_flag(h, 19.0, 60) == 2.5
    h.learn_step(20, ts=20.0)
    h.learn_step(21, ts=21.0)
    assert first_flag(h, 21.0, 60) == pytest.approx(13.25, abs=0.25)  # 19.2 + 15 - 21


def test_a_wait_said_again_and_again_never_moves_its_start():
    h = steady()
    for k in range(200):  # a writer of the topic wants a hang hidden
        h.waiting(19.0 + 0.5 * k, after_step=19)
    assert first_flag(h, 19.0, 200) == 15.0


def test_waits_far_ahead_are_refused_and_the_map_stays_bounded():
    h = steady()
    for step in range(19, 19 + 1000):
        h.waiting(19.0, after_step=step)
    assert len(h._waits) == HangDetector.WAIT_LEAD_STEPS + 1


def test_the_operators_max_phase_caps_a_wait():
    h = steady(step_s=10.0)  # 10 s steps: 10 median steps would be 100 s
    h.waiting(190.0, after_step=19)
    assert h.expected_step_time == pytest.approx(100.0 * 1.5 / FACTOR)
    h.waiting(190.0, after_step=19, max_s=20.0)
    assert h.expected_step_time == pytest.approx(20.0 * 1.5 / FACTOR)


def test_a_relaunch_forgets_the_waits():
    h = steady()
    h.waiting(19.1, after_step=19)
    h.restart(19.5, grace_steps=5)
    assert h._waits == {}


def test_state_written_before_waits_existed_reads_the_class_defaults():
    h = steady()
    del h.__dict__["wait_steps"]
    assert h._waits == {} and h.wait_steps == 10.0
    h.waiting(19.1, after_step=19)
    assert "_waits" in h.__dict__ and HangDetector._waits == {}
