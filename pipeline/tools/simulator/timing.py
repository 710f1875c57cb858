"""Dating a played job by the wall clock: what ``stepguard simulate`` and ``stepguard
demo`` share, so that their jobs' event times cannot drift apart.

A job played at SPEED x real time runs its own clock SPEED times faster than the wall
clock. Started at now, its events would run ahead of the wall clock by
``elapsed x (1 - 1/SPEED)``, and every service refuses records dated beyond its wall
clock + ``STEPGUARD_MAX_CLOCK_SKEW_S`` (300 s by default: after ~43 s of wall time at
8x). So the job starts back-dated by what the speed-up gains over its expected length
(restarts and stalls included, hence :data:`RUN_MARGIN`): its last event is dated about
when it is played and none is ahead of the wall clock. At or below real time it starts
now (never ahead).

Examples
--------
>>> from datetime import UTC, datetime
>>> from pipeline.tools.simulator import find_scenario
>>> sc = find_scenario("ci_smoke")  # 160 steps of ~1.01 s
>>> round(back_dating_s(sc, 8.0), 1)  # 160 x 1.0105 s x 1.25 x (1 - 1/8)
176.8
>>> back_dating_s(sc, 1.0)
0.0
>>> now = datetime(2026, 1, 1, tzinfo=UTC)
>>> start_from_now(sc, 8.0, now=now).isoformat(timespec="seconds")
'2025-12-31T23:57:03+00:00'
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pipeline.tools.simulator.scenario import Scenario

__all__ = ["RUN_MARGIN", "back_dating_s", "start_from_now"]

#: A played job's expected length over its scenario's steps x nominal step time: room
#: for restarts (the relaunch, the steps run again), checkpoints and stalls.
RUN_MARGIN = 1.25


def back_dating_s(scenario: Scenario, speed: float | None) -> float:
    """How far before now a job played at ``speed`` x real time starts.

    Parameters
    ----------
    scenario
        The scenario played (its steps and nominal step time).
    speed
        Event time x this in real time; ``None``: as fast as possible (the whole
        expected length is gained).

    Returns
    -------
    float
        Seconds: the expected length x ``(1 - 1/speed)``, 0 at or below real time.

    Examples
    --------
    >>> from pipeline.tools.simulator import find_scenario
    >>> sc = find_scenario("ci_smoke")
    >>> back_dating_s(sc, 0.5)  # slower than real time: dated now, never ahead
    0.0
    >>> back_dating_s(sc, None) == sc.steps * sc.nominal_step_s * RUN_MARGIN
    True
    >>> back_dating_s(sc, 0)
    Traceback (most recent call last):
    ...
    ValueError: speed must be positive (or None: as fast as possible), got 0
    """
    if speed is not None and not speed > 0:
        raise ValueError(f"speed must be positive (or None: as fast as possible), got {speed}")
    expected_s = scenario.steps * scenario.nominal_step_s * RUN_MARGIN
    if speed is None:
        return expected_s
    return expected_s * max(0.0, 1.0 - 1.0 / speed)


def start_from_now(
    scenario: Scenario, speed: float | None, *, now: datetime | None = None
) -> datetime:
    """The start time that dates ``scenario`` played at ``speed`` by the wall clock:
    ``now`` (default: the wall clock) less :func:`back_dating_s`.

    Examples
    --------
    >>> from datetime import UTC, datetime
    >>> from pipeline.tools.simulator import find_scenario
    >>> now = datetime(2026, 1, 1, tzinfo=UTC)
    >>> start_from_now(find_scenario("ci_smoke"), 1.0, now=now) == now
    True
    """
    now = datetime.now(UTC) if now is None else now
    return now - timedelta(seconds=back_dating_s(scenario, speed))
