"""Dating a played job by the stack's clock: what ``stepguard simulate`` and ``stepguard
demo`` share, so that their jobs' event times cannot drift apart.

A played job starts at the wall clock's now, when it is played (never before: its first
record, alert and command come after the stack that watches it started), and runs its
own clock SPEED times faster. Its events then run ahead of the wall clock by ``elapsed x
(1 - 1/SPEED)`` (:func:`lead_s`, at the end of a job of its expected length, restarts and
stalls included, hence :data:`RUN_MARGIN`), and every service refuses records dated more
than ``STEPGUARD_MAX_CLOCK_SKEW_S`` beyond its wall clock (300 s by default). So either
the stack allows the job's lead (the demo: its own throw-away stack) or the player holds
each event back until it is no more than :func:`lead_budget_s` ahead (``stepguard
simulate`` against a stack it does not own: it then plays at real time once the budget
is used). Effects are thus dated after their causes: a command (dated by the actuator's
wall clock) comes before the relaunch it causes (dated by the job's clock), and report
and queries order one clock.

Examples
--------
>>> from datetime import UTC, datetime
>>> from pipeline.tools.simulator import find_scenario
>>> sc = find_scenario("ci_smoke")  # 160 steps of ~1.01 s
>>> round(lead_s(sc, 8.0), 1)  # 160 x 1.0105 s x 1.25 x (1 - 1/8)
176.8
>>> lead_s(sc, 1.0)
0.0
>>> now = datetime(2026, 1, 1, tzinfo=UTC)
>>> start_from_now(sc, 8.0, now=now) == now  # never before the stack's clock
True
>>> lead_budget_s(300.0)
240.0
"""

from __future__ import annotations

from datetime import UTC, datetime

from pipeline.tools.simulator.scenario import Scenario

__all__ = ["LEAD_SHARE", "RUN_MARGIN", "back_dating_s", "lead_budget_s", "lead_s", "start_from_now"]

#: A played job's expected length over its scenario's steps x nominal step time: room
#: for restarts (the relaunch, the steps run again), checkpoints and stalls.
RUN_MARGIN = 1.25
#: The share of the services' clock-skew allowance a played job's events may lead the
#: wall clock by (the rest is room for the hosts' own skew).
LEAD_SHARE = 0.8


def lead_budget_s(max_clock_skew_s: float) -> float:
    """How far ahead of the wall clock a played job's events may be dated: a share
    (:data:`LEAD_SHARE`) of the services' ``STEPGUARD_MAX_CLOCK_SKEW_S``."""
    return max_clock_skew_s * LEAD_SHARE


def lead_s(scenario: Scenario, speed: float | None) -> float:
    """How far ahead of the wall clock a job played at ``speed`` x real time, started
    now, is by its expected end.

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
    >>> lead_s(sc, 0.5)  # slower than real time: never ahead
    0.0
    >>> lead_s(sc, None) == sc.steps * sc.nominal_step_s * RUN_MARGIN
    True
    >>> lead_s(sc, 0)
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


#: The name this had when a played job was back-dated by it.
back_dating_s = lead_s


def start_from_now(
    scenario: Scenario, speed: float | None, *, now: datetime | None = None
) -> datetime:
    """The start time that dates ``scenario`` by the stack's clock: ``now`` (default:
    the wall clock), whatever the speed; never before it. ``scenario`` and ``speed``
    size its lead (:func:`lead_s`), which the caller bounds.

    Examples
    --------
    >>> from datetime import UTC, datetime
    >>> from pipeline.tools.simulator import find_scenario
    >>> now = datetime(2026, 1, 1, tzinfo=UTC)
    >>> start_from_now(find_scenario("ci_smoke"), None, now=now) == now
    True
    """
    lead_s(scenario, speed)  # the speed is checked
    return datetime.now(UTC) if now is None else now
