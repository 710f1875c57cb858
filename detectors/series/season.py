"""Seasonal profile by phase of a period (a day, a week) for the series scorer.

A :class:`SeasonalProfile` keeps, per phase bin of a period, a robust exponentially
weighted mean of how far the values in that bin sit from the series' slow level. The
scorer subtracts the profile before its baselines see a value, so a daily cycle is
not a drift twice a day and a missing daily peak is a surprise. The profile is used
(``ready``) only once a whole period has been seen and every bin holds at least two
values. There are ``period / interval / 3`` bins (at least 3 values per bin and
period), 4 to 168 of them; the profile is linear between bin centres. Learning is
clipped by the caller (see :meth:`learn`), so one spike moves a bin by a bounded
amount.

Examples
--------
>>> import math
>>> p = SeasonalProfile(period=86400.0, interval=3600.0)
>>> p.bins
8
>>> for h in range(96):   # four days of an hourly sine of amplitude 10
...     p.learn(h * 3600.0, 10.0 * math.sin(2 * math.pi * h / 24), step=50.0)
>>> p.ready(96 * 3600.0)
True
>>> [round(p.value(h * 3600.0), 1) for h in (0, 3, 6, 12, 18)]   # sin: 0, 7.1, 10, 0, -10
[0.2, 6.8, 9.7, -0.2, -9.7]
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
        self._counts = np.zeros(self.bins)  # values seen per bin, by share
        self._first: float | None = None

    def _where(self, ts: float) -> tuple[int, int, float]:
        """The two bins whose centres surround ``ts``'s phase, and how far past the first."""
        pos = (ts % self.period) / self.period * self.bins - 0.5
        lo = math.floor(pos)
        return lo % self.bins, (lo + 1) % self.bins, pos - lo

    def ready(self, ts: float) -> bool:
        """Whether the profile has seen a whole period and two values in every bin."""
        return (
            self._first is not None
            and ts - self._first >= self.period
            and float(self._counts.min()) >= 2.0
        )

    def value(self, ts: float) -> float:
        """The learned offset at ``ts``'s phase: linear between the two nearest bin
        centres (0 until learned), so a smooth cycle is not a staircase."""
        b0, b1, f = self._where(ts)
        return float((1.0 - f) * self._offsets[b0] + f * self._offsets[b1])

    def learn(self, ts: float, deviation: float, step: float) -> None:
        """Move the profile at ``ts`` toward ``deviation`` (value minus slow level): each
        of the two nearest bins by its share, the error clipped to ``step``."""
        if not math.isfinite(ts) or not math.isfinite(deviation):
            return
        if self._first is None:
            self._first = ts
        b0, b1, f = self._where(ts)
        error = min(max(deviation - self.value(ts), -step), step)
        floor = 1.0 / (self.memory * self.visits)
        for b, share in ((b0, 1.0 - f), (b1, f)):
            if share <= 0.0:
                continue
            self._counts[b] += share
            rate = min(1.0, share * max(1.0 / float(self._counts[b]), floor))
            self._offsets[b] += rate * error
