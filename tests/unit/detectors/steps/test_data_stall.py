"""Issue 44: a data stall's remedy fits its cause (investigate the input path, never
replace the node) and its episode stays firing while the stall lasts, bursts and all."""

import numpy as np

from detectors.engine import DetectorSuite
from detectors.frame import StepFrame
from schemas import AlertKind, AlertState, Grade, RecommendedAction


def run(stalled, steps: int = 400, mag: float = 0.5):
    """64 ranks; rank 13's loader waits ``mag`` seconds on the steps ``stalled(step)``."""
    mon = DetectorSuite("job")
    rng = np.random.default_rng(0)
    ts, alerts = 0.0, []
    for step in range(steps):
        compute = 1.0 + 0.01 * rng.standard_normal(64)
        data = 0.01 + 0.001 * rng.random(64)
        if stalled(step):
            data[13] += mag
        busy = compute + data
        ts += busy.max() + 0.05
        frame = StepFrame.from_arrays("job", step, ts, compute, busy.max() + 0.05 - busy, data)
        alerts += mon.process_step(frame)
    return alerts


def test_a_loader_stalling_in_bursts_is_one_episode_to_investigate_while_it_lasts():
    """Stalled 10 steps in 18 (a prefetch queue that drains and refills): the episode
    resolved in every pause and re-opened, and each CRITICAL recommended replacing the
    node, whose hardware was fine."""
    alerts = run(lambda s: 60 <= s < 300 and s % 18 < 10)
    assert [(a.kind, a.state, a.grade) for a in alerts] == [
        (AlertKind.DATA_STALL, AlertState.FIRING, Grade.WARNING),
        (AlertKind.DATA_STALL, AlertState.FIRING, Grade.CRITICAL),
        (AlertKind.DATA_STALL, AlertState.RESOLVED, Grade.CRITICAL),
    ]
    assert {a.rank for a in alerts} == {13}
    firing = [a for a in alerts if a.state is AlertState.FIRING]
    assert all(a.recommended_action is RecommendedAction.INVESTIGATE for a in firing)
    assert "investigate the input path" in firing[-1].evidence.detail
    assert alerts[-1].step >= 300  # resolved once it ended, not in a pause


def test_a_stall_that_ends_resolves():
    alerts = run(lambda s: 60 <= s < 150)
    assert alerts[-1].state is AlertState.RESOLVED and 150 <= alerts[-1].step <= 150 + 40
