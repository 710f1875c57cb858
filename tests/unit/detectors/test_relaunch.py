"""Issue 44: a relaunch is not a hang. From a RESTART (or an ISOLATE that relaunches)
until the new run's first step the job is ``relaunching``, for at most
``relaunch_max_s``; past it ``relaunch_stuck`` (investigate), never a second RESTART."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from detectors.engine import DetectorConfig, DetectorSuite
from detectors.frame import StepFrame
from detectors.job import JobDetection
from schemas import (
    ActuatorMode,
    AlertKind,
    AlertState,
    Command,
    CommandKind,
    Grade,
    RecommendedAction,
)

STEP_S = 1.0  # a relaunch is many step times: the old grace allowed max(20 steps, 30 s)
T0 = 1_000_000.0


def frame(step: int, ts: float, seed: int) -> StepFrame:
    rng = np.random.default_rng(seed)
    compute = STEP_S * (1.0 + 0.005 * rng.standard_normal(32))
    return StepFrame.from_arrays(
        "job", step, ts, compute=compute, comm_wait=compute.max() + 0.05 - compute
    )


def warm(mon: DetectorSuite | JobDetection, steps: int = 20) -> float:
    """``steps`` healthy steps; returns the last one's end."""
    ts = T0
    for step in range(steps):
        ts += STEP_S
        f = frame(step, ts, step)
        out = mon.process_step(f) if isinstance(mon, DetectorSuite) else mon.on_frame(f)
        assert out == []
    return ts


def ticks(mon: DetectorSuite | JobDetection, start: float, stop: float, every: float = 5.0):
    out = []
    for t in np.arange(start, stop, every):
        out += mon.tick(float(t))
    return out


def test_a_relaunch_slower_than_any_step_allowance_raises_nothing():
    """Issue 44 2c: a 90 s relaunch (a scheduler, a container start) was a WARNING
    hang at +30 s and a CRITICAL recommending RESTART at +31 s."""
    mon = DetectorSuite("job")
    last = warm(mon)
    at = last + 1.0
    mon.restarted(at)
    assert ticks(mon, at, at + 90.0) == []
    assert mon.state(at + 90.0) == "relaunching"
    # the new run's first step (from the checkpoint: the numbers go back)
    assert mon.process_step(frame(10, at + 90.0 + STEP_S, 99)) == []
    assert mon.state(at + 90.0 + STEP_S) == "running"
    # and from there a silence is a hang again
    hangs = ticks(mon, at + 90.0 + STEP_S, at + 90.0 + 12 * STEP_S)
    assert [a.kind for a in hangs][:1] == [AlertKind.HANG]


def test_a_relaunch_past_its_maximum_is_stuck_never_a_reason_to_restart():
    mon = DetectorSuite("job", DetectorConfig(relaunch_max_s=600.0))
    last = warm(mon)
    at = last + 1.0
    mon.restarted(at)
    assert ticks(mon, at, at + 599.0) == []
    assert mon.state(at + 599.0) == "relaunching"
    stuck = ticks(mon, at + 600.0, at + 6 * 600.0, every=30.0)
    assert mon.state(at + 600.0) == "relaunch_stuck"
    assert [(a.kind, a.grade, a.state) for a in stuck] == [
        (AlertKind.HANG, Grade.WARNING, AlertState.FIRING)
    ]
    (a,) = stuck
    assert a.recommended_action is RecommendedAction.INVESTIGATE
    assert "relaunch_stuck" in a.summary and a.evidence.metric == "seconds_relaunching"
    assert a.ts.timestamp() == pytest.approx(at + 600.0)
    # the new run comes at last: the episode resolves, the job runs
    done = mon.process_step(frame(10, at + 3600.0, 99))
    assert [(x.kind, x.state) for x in done] == [(AlertKind.HANG, AlertState.RESOLVED)]
    assert mon.state(at + 3600.0) == "running"


def test_a_repeated_restart_does_not_extend_the_relaunch():
    """The executor's SUCCEEDED result calls restarted() again (the relaunch carried
    out): the relaunch is still dated from the first call, so a replayed result cannot
    keep a job that never comes back "relaunching" for ever."""
    mon = DetectorSuite("job", DetectorConfig(relaunch_max_s=300.0))
    last = warm(mon)
    mon.restarted(last + 1.0)
    mon.restarted(last + 200.0)
    assert mon.relaunching_since == last + 1.0
    assert mon.state(last + 301.0) == "relaunch_stuck"


def test_relaunch_max_s_must_be_positive():
    with pytest.raises(ValueError, match="relaunch_max_s"):
        DetectorConfig(relaunch_max_s=0.0)


def test_the_core_shows_relaunching_from_the_command_to_the_first_step():
    det = JobDetection("job")
    last = warm(det)
    assert det.state == "running"
    now = datetime.fromtimestamp(last, UTC)
    cmd = Command(
        command_id="cmd-1", kind=CommandKind.RESTART, job_id="job", checkpoint_step=10,
        reason=("test",), mode=ActuatorMode.AUTO, issued_at=now,
        expires_at=now + timedelta(minutes=5),
    )  # fmt: skip
    det.on_command(cmd, now=last + 1.0)
    assert det.state == "relaunching"
    assert ticks(det, last + 2.0, last + 300.0) == []  # 5 minutes: no hang
    assert det.state == "relaunching"
    det.on_frame(frame(10, last + 300.0 + STEP_S, 99))
    assert det.state == "running"
