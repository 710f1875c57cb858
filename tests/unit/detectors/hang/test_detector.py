"""Hangs and missing telemetry."""

import numpy as np
import pytest

from detectors.hang.detector import HangDetector, HealthPresence, MissingRanks


def test_hang_score_is_silence_in_median_step_times():
    h = HangDetector(min_steps=3)
    assert h.score(100.0) == 0.0  # warming up: neutral
    for i in range(10):
        h.learn_step(i, ts=10.0 + 2.0 * i)
    assert h.median_step_time == pytest.approx(2.0)
    assert h.score(28.0 + 6.0) == pytest.approx(3.0)


def test_redelivered_or_late_steps_do_not_count_as_progress():
    h = HangDetector(min_steps=1)
    h.learn_step(5, ts=10.0, ts_start=9.0)
    h.learn_step(5, ts=10.0)  # the same step delivered again
    h.learn_step(3, ts=8.0)  # a late report of an older step
    assert h.last_ts == 10.0 and h.last_step == 5


def test_a_repeated_step_number_at_a_later_time_is_a_relaunch():
    h = HangDetector(min_steps=1)
    h.learn_step(5, ts=10.0, ts_start=9.0)
    h.learn_step(3, ts=60.0, ts_start=59.0)  # resumed from a checkpoint at step 3
    assert h.last_step == 3 and h.last_ts == 60.0
    assert h.score(61.0) == pytest.approx(1.0)


def test_skipped_steps_give_per_step_intervals():
    h = HangDetector(min_steps=1)
    h.learn_step(0, ts=0.0)
    h.learn_step(4, ts=8.0)
    assert h.median_step_time == pytest.approx(2.0)


def test_missing_ranks_are_counted_until_forgotten():
    m = MissingRanks(forget_steps=3)
    all_ranks = np.arange(8)
    m.learn(all_ranks)
    some = np.arange(6)
    counts = []
    for _ in range(5):
        ranks, c = m.score(some)
        counts.append(dict(zip(ranks.tolist(), c.tolist(), strict=True)))
        m.learn(some)
    assert counts[0] == {6: 1, 7: 1}
    assert counts[2] == {6: 3, 7: 3}
    assert counts[3] == {} and counts[4] == {}
    assert m.expected().tolist() == list(range(6))


def test_a_returning_rank_is_no_longer_missing():
    m = MissingRanks()
    m.learn(np.arange(4))
    m.learn(np.arange(3))
    m.learn(np.arange(4))
    assert m.score(np.arange(4))[0].size == 0


def test_silent_node_is_flagged_only_while_others_report():
    p = HealthPresence()
    for t in range(5):
        p.learn("a", 10.0 * t, 10.0)
        if t < 2:
            p.learn("b", 10.0 * t, 10.0)
    assert p.score(45.0) == {"b": pytest.approx(3.5)}
    assert p.score(1000.0) == {}  # the whole feed stopped: not one node's fault


@pytest.mark.parametrize(
    ("cls", "kwargs", "name"),
    [
        (HangDetector, {"factor": 0}, "factor"),
        (HangDetector, {"window": 0}, "window"),
        (HangDetector, {"min_steps": 0}, "min_steps"),
        (MissingRanks, {"forget_steps": 0}, "forget_steps"),
        (HealthPresence, {"factor": -1}, "factor"),
    ],
)
def test_invalid_arguments_are_named(cls, kwargs, name):
    with pytest.raises(ValueError, match=name):
        cls(**kwargs)


def test_a_relaunch_is_not_a_hang_and_restarts_step_numbers():
    from detectors.hang.detector import HangDetector

    h = HangDetector(factor=2.5, window=10, min_steps=3)
    for step in range(10):
        h.learn_step(step, ts=100.0 + step)
    assert h.score(112.0) == pytest.approx(3.0)
    h.restart(112.0, grace_steps=5)
    assert h.score(116.0) == 0.0  # inside the relaunch grace
    h.learn_step(4, ts=118.0)  # resumes from a checkpoint: step numbers repeat
    assert h.last_step == 4 and h.score(119.0) == pytest.approx(1.0)
    assert h.score(126.0) > 2.5  # after the grace a stall is a hang again


def test_a_silent_node_is_named_only_while_most_of_the_fleet_reports():
    from detectors.hang.detector import HealthPresence

    p = HealthPresence(factor=1.5)
    for i in range(10):
        p.learn(f"n{i}", ts=0.0, interval_s=10.0)
    for i in range(1, 10):
        p.learn(f"n{i}", ts=20.0, interval_s=10.0)
    assert set(p.score(25.0)) == {"n0"}  # nine on time, one quiet
    q = HealthPresence(factor=1.5)
    for i in range(10):
        q.learn(f"n{i}", ts=0.0, interval_s=10.0)
    q.learn("n0", ts=20.0, interval_s=10.0)
    assert q.score(25.0) == {}  # nine quiet together: the feed lags, no node is named


def test_a_relaunch_is_relaunching_until_the_new_runs_first_step_however_long():
    """Issue 25 bug 2: 20 median step times (5 s at 0.25 s steps) is shorter than a
    real relaunch (12.6 s): the relaunch was scored as a hang. Issue 44: so was one
    longer than 1.5 x the job's longest recent relaunch (a scheduler, a container
    start). Until the new run's first step the job is relaunching, not hung (the
    suite bounds how long: ``relaunch_stuck``); the durations are still learned."""
    h = HangDetector(factor=2.5, min_steps=3)
    for step in range(20):
        h.learn_step(step, ts=100.0 + 0.25 * step, ts_start=99.75 + 0.25 * step)
    t = 105.0
    h.restart(t, grace_steps=20, min_s=10.0)
    assert h.score(t + 10.0) == 0.0  # 40 median step times: not a hang yet
    h.learn_step(5, ts=t + 9.0, ts_start=t + 8.75)  # the new run: it took 9 s
    assert h.relaunch_durations == (9.0,)
    for step in range(6, 20):
        h.learn_step(step, ts=t + 9.0 + 0.25 * (step - 5))
    t2 = t + 20.0
    h.restart(t2, grace_steps=20, min_s=10.0)
    assert h.score(t2 + 13.0) == 0.0
    assert h.score(t2 + 16.0) == 0.0  # past 1.5 x the 9 s learned: still relaunching
    assert h.score(t2 + 3600.0) == 0.0 and h.relaunching_since == t2
    h.learn_step(3, ts=t2 + 3600.0, ts_start=t2 + 3599.75)
    assert h.relaunching_since is None
    assert h.score(t2 + 3600.0 + 2.0) > 2.5  # from the new run's first step: a hang again
