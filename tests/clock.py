"""Where the clocks the tests control start: a day before the run, never a calendar date.

A test that drives time itself (an injected ``now``, event times it writes) starts from
:func:`day_start`, so its data is dated from the day it runs: retention windows,
partitions by receive time and "is this in the future" checks see what they would in
production, and no test quietly depends on one fixed day of the calendar.
"""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

__all__ = ["day_start"]


def day_start(days_ago: int = 1, hour: int = 0) -> datetime:
    """Midnight UTC ``days_ago`` days before now, plus ``hour`` hours (aware, UTC).

    >>> t = day_start(hour=12)
    >>> (t.tzinfo, t.minute, t.second, t.microsecond, t.hour)
    (datetime.timezone.utc, 0, 0, 0, 12)
    >>> datetime.now(UTC) - timedelta(days=2) < t < datetime.now(UTC)
    True
    """
    today = datetime.now(UTC).date()
    return datetime.combine(today - timedelta(days=days_ago), time(hour), UTC)
