"""What a hang finding says it measures: the median step time, or the long step due."""

import numpy as np
import pytest

from detectors.engine import DetectorSuite
from detectors.frame import StepFrame
from detectors.hang.detector import HangDetector
from schemas import AlertKind

STEP = 0.25  # ordinary step time (s)


def steady(mon: DetectorSuite, steps: int, ts0: float = 1_000.0) -> float:
    """``steps`` ordinary steps of ``STEP`` seconds; the event time of the last one."""
    ts = ts0
    for step in range(steps):
        ts += STEP
        mon.process_step(StepFrame.from_arrays("job", step, ts, np.ones(8)))
    return ts


def hang_at(mon: DetectorSuite, now: float):
    (a,) = [a for a in mon.tick(now) if a.kind is AlertKind.HANG]
    return a


def test_an_ordinary_hang_says_median_step_times_as_before():
    mon = DetectorSuite("job")
    last = steady(mon, 40)
    a = hang_at(mon, last + 3.0)
    assert a.summary.endswith("no step completed for 12.0 median step times (0.250s); last step 39")
    assert a.evidence.baseline == pytest.approx(STEP)


def test_a_hang_during_an_announced_checkpoint_is_measured_against_the_checkpoint():
    mon = DetectorSuite("job")
    last = steady(mon, 40)
    mon.announce_phase("checkpoint", last, expected_s=20.8)
    assert mon.tick(last + 30.0) == []  # within 1.5 x the checkpoint's 20.8 s
    a = hang_at(mon, last + 32.0)
    assert a.summary.endswith(
        "no step completed for 32.0s, 1.5 x the 20.8s a checkpoint takes here "
        "(median step 0.250s); last step 39"
    )
    assert a.evidence.baseline == pytest.approx(20.8)
    assert a.evidence.value == pytest.approx(32.0)


def test_a_phase_of_unknown_length_says_what_it_was_allowed():
    h = HangDetector(factor=2.5, min_steps=3, phase_floor_s=0.0)
    for step in range(10):
        h.learn_step(step, ts=float(step))
    h.announce("eval", 9.0)
    baseline, why = h.explain(40.0)
    assert baseline == pytest.approx(20.0)  # phase_steps x the 1 s median
    assert why == (
        "no step completed for 31.0s, 1.6 x the 20.0s allowed for an eval of unknown "
        "length (median step 1.000s)"
    )


def test_a_learned_periodic_long_step_is_named_by_its_period():
    h = HangDetector(factor=2.5, min_steps=3)
    ts = 0.0
    for step in range(79):
        ts += 10.0 if step % 20 == 19 else 1.0
        h.learn_step(step, ts)
    baseline, why = h.explain(ts + 16.0)  # step 79 saves a checkpoint
    assert baseline == pytest.approx(10.0)
    assert why == (
        "no step completed for 16.0s, 1.6 x the 10.0s a long step every 20 steps takes "
        "here (median step 1.000s)"
    )
    assert h.explain(ts + 16.0) == (baseline, why)  # reading it changes nothing


def test_nothing_long_due_keeps_the_median_text():
    h = HangDetector(factor=2.5, min_steps=3)
    for step in range(10):
        h.learn_step(step, ts=float(step))
    assert h.explain(12.0) == (1.0, "no step completed for 3.0 median step times (1.000s)")
    assert HangDetector().explain(5.0) == (
        0.0,
        "no step completed for 0.0 median step times (0.000s)",
    )


def test_a_phase_of_unknown_length_is_allowed_the_floor_and_then_climbs():
    h = HangDetector(factor=2.5, min_steps=3, critical_factor=8.0)
    for step in range(10):
        h.learn_step(step, ts=float(step))
    h.announce("checkpoint", 9.0)  # a fast job's first save: minutes, not 20 steps
    baseline, why = h.explain(9.0 + 90.0)
    assert baseline == pytest.approx(120.0)
    assert "allowed for a checkpoint of unknown length" in why
    assert h.graded(9.0 + 90.0) < 2.5  # a 90 s save raises nothing
    assert h.graded(9.0 + 181.0) == pytest.approx(2.5, abs=0.1)  # 1.5 x 120 s: WARNING
    assert 2.5 < h.graded(9.0 + 400.0) < 8.0  # unsure of its length: still climbing
    assert h.graded(9.0 + 576.0) >= 8.0  # 8 / 2.5 x its allowance: CRITICAL
