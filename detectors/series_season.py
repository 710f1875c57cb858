"""Seasonal profile by phase of a period (a day, a week) for the series scorer.

A :class:`SeasonalProfile` keeps, per phase bin of a period, a robust exponentially
weighted mean of how far the values in that bin sit from the series' slow level. The
scorer subtracts the profile before its baselines see a value, so a daily cycle is
not a drift twice a day and a missing daily peak is a surprise. The profile is used
(``ready``) only once a whole period has been seen and every bin holds at least two
values. Bins are ``period / interval / 3`` wide (at least 3 values per bin and period),
4 to 168 of them. Learning is clipped by the caller (see :meth:`learn`), so one spike
moves a bin by a bounded amount.

Examples
--------
>>> import math
>>> p = SeasonalProfile(period=86400.0, interval=3600.0)
>>> p.bins
8
>>> for h in range(48):
...     ts = h * 3600.0
...     p.learn(ts, 10.0 * math.sin(2 * math.pi * h / 24), step=50.0)
>>> p.ready(48 * 3600.0)
True
>>> round(p.value(6 * 3600.0), 1)   # the bin of 06:00-09:00 sits high
9.4
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["SeasonalProfile", "season_bins"]


def season_bins(period: float, interval: float) -> int:
    """Number of phase bins for a period sampled every ``interval`` seconds.

    Examples
    --------
    >>> season_bins(86400.0, 300.0), season_bins(604800.0, 300.0), season_bins(86400.0, 3600.0)
    (96, 168, 8)
    """
    if not period > 0 or not interval > 0:
        raise ValueError(f"period and interval must be > 0, got {period!r}, {interval!r}")
    return int(min(max(period / interval / 3.0, 4.0), 168.0))


class SeasonalProfile:
    """Per-phase-bin offsets of one period, learned robustly and causally.

    Parameters
    ----------
    period
        Length of the season in seconds (86400 for a day, 604800 for a week).
    interval
        Typical seconds between two rows (sets the bin width).
    memory
        Periods a bin's offset remembers (its EW weight is ``1 / (memory * visits)``
        where ``visits`` is the values a bin gets per period).
    """

    __slots__ = ("_counts", "_first", "_offsets", "bins", "interval", "memory", "period", "visits")

    def __init__(self, period: float, interval: float, memory: float = 4.0) -> None:
        if not math.isfinite(period) or period <= 0:
            raise ValueError(f"period must be > 0 seconds, got {period!r}")
        if not math.isfinite(interval) or interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        if not memory >= 1:
            raise ValueError(f"memory must be >= 1, got {memory!r}")
        self.period = float(period)
        self.interval = float(interval)
        self.memory = float(memory)
        self.bins = season_bins(period, interval)
        self.visits = max(period / interval / self.bins, 1.0)
        self._offsets = np.zeros(self.bins)
        self._counts = np.zeros(self.bins, dtype=np.int64)
        self._first: float | None = None

    def _bin(self, ts: float) -> int:
        return int((ts % self.period) / self.period * self.bins) % self.bins

    def ready(self, ts: float) -> bool:
        """Whether the profile has seen a whole period and two values in every bin."""
        return (
            self._first is not None
            and ts - self._first >= self.period
            and int(self._counts.min()) >= 2
        )

    def value(self, ts: float) -> float:
        """The learned offset of ``ts``'s phase bin (0 until learned)."""
        return float(self._offsets[self._bin(ts)])

    def learn(self, ts: float, deviation: float, step: float) -> None:
        """Move ``ts``'s bin toward ``deviation`` (value minus slow level), by at most ``step``."""
        if not math.isfinite(ts) or not math.isfinite(deviation):
            return
        if self._first is None:
            self._first = ts
        b = self._bin(ts)
        self._counts[b] += 1
        weight = max(1.0 / float(self._counts[b]), 1.0 / (self.memory * self.visits))
        delta = deviation - self._offsets[b]
        self._offsets[b] += weight * min(max(delta, -step), step)
