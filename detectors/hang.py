"""Hangs and missing telemetry: silence is a signal, not a zero.

- :class:`HangDetector`: a job that completes no step within ``factor`` times its
  median step time is hung. Measured on event time: :meth:`HangDetector.score` takes
  ``now`` (the worker calls it from ``tick(now)`` when no data arrives).
- :class:`MissingRanks`: ranks that reported recently but are absent from the current
  step while the rest of the job progresses (a crashed node or a dead exporter).
- :class:`HealthPresence`: a node whose health reports stop while other nodes keep
  reporting.

Examples
--------
>>> h = HangDetector(factor=3.0, min_steps=3)
>>> for i in range(5):
...     h.learn_step(i, ts=100.0 + i)
>>> h.median_step_time, h.score(104.5), h.score(107.5)
(1.0, 0.5, 3.5)
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from detectors.base import check_positive

__all__ = ["HangDetector", "HealthPresence", "MissingRanks"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


class HangDetector:
    """Time since the last completed step, in units of the median step time.

    Parameters
    ----------
    factor
        Score at which the job counts as hung (the grading threshold uses it).
    window
        Number of recent step intervals the median is taken over.
    min_steps
        Intervals needed before a median exists; until then the score is neutral (0).
    """

    def __init__(self, factor: float = 3.0, window: int = 50, min_steps: int = 5) -> None:
        check_positive("factor", factor)
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        if min_steps < 1:
            raise ValueError(f"min_steps must be >= 1, got {min_steps!r}")
        self.factor = factor
        self.window = window
        self.min_steps = min_steps
        self._intervals = np.zeros(window)
        self._count = 0
        self.last_step: int | None = None
        self.last_ts: float | None = None
        self._in_grace = False

    @property
    def median_step_time(self) -> float | None:
        """Median of the recent step intervals, or None while warming up."""
        if self._count < self.min_steps:
            return None
        return float(np.median(self._intervals[: min(self._count, self.window)]))

    def score(self, now: float) -> float:
        """Elapsed time since the last step, over the median step time (0 if unknown)."""
        med = self.median_step_time
        if med is None or self.last_ts is None or med <= 0:
            return 0.0
        return max(0.0, now - self.last_ts) / med

    def restart(self, ts: float, grace_steps: float) -> None:
        """The job was relaunched at event time ``ts`` (from a checkpoint): step numbers
        start again and the relaunch itself, up to ``grace_steps`` median step times,
        is not a hang. The learned step-time median is kept."""
        med = self.median_step_time or 0.0
        self.last_step = None
        self.last_ts = ts + grace_steps * med
        self._in_grace = True

    def learn_step(self, step: int, ts: float, ts_start: float | None = None) -> None:
        """A step completed at event time ``ts``. A repeated or older step number is
        ignored, unless it is newer in event time: then the job resumed from a
        checkpoint (restart or rollback) and step numbers start again."""
        if self.last_step is not None and step <= self.last_step:
            if self.last_ts is None or ts <= self.last_ts:
                return
            self.last_step = None  # relaunched: count from here
        if self.last_ts is not None and self.last_step is not None:
            interval = (ts - self.last_ts) / (step - self.last_step)
        elif ts_start is not None and ts_start < ts:
            interval = ts - ts_start
        else:
            interval = None
        if interval is not None and interval > 0:
            self._intervals[self._count % self.window] = interval
            self._count += 1
        self.last_step = step
        if self._in_grace:  # the first step after a relaunch ends the grace
            self.last_ts, self._in_grace = ts, False
        else:
            self.last_ts = ts if self.last_ts is None else max(ts, self.last_ts)


class MissingRanks:
    """Consecutive steps each recently seen rank has been absent.

    Parameters
    ----------
    forget_steps
        A rank absent for more than this many steps is no longer expected (it left
        the job); its count drops back to zero.
    """

    def __init__(self, forget_steps: int = 50) -> None:
        if forget_steps < 1:
            raise ValueError(f"forget_steps must be >= 1, got {forget_steps!r}")
        self.forget_steps = forget_steps
        self._missing = np.zeros(0, dtype=np.int64)
        self._seen = np.zeros(0, dtype=bool)
        self._steps = 0

    def score(self, present: I64) -> tuple[I64, I64]:
        """Ranks expected but absent from ``present`` and their consecutive-missing count
        including this step (reads state only)."""
        if self._seen.shape[0] == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        absent = self._seen.copy()
        inside = present[present < absent.shape[0]]
        absent[inside] = False
        ranks = np.flatnonzero(absent)
        counts = self._missing[ranks] + 1
        keep = counts <= self.forget_steps
        return ranks[keep].astype(np.int64), counts[keep]

    def expected(self) -> I64:
        """Ranks currently expected to report."""
        return np.flatnonzero(self._seen).astype(np.int64)

    def learn(self, present: I64) -> None:
        need = int(present.max()) + 1 if present.shape[0] else 0
        if need > self._seen.shape[0]:
            extra = max(need, 2 * self._seen.shape[0]) - self._seen.shape[0]
            self._seen = np.concatenate((self._seen, np.zeros(extra, dtype=bool)))
            self._missing = np.concatenate((self._missing, np.zeros(extra, dtype=np.int64)))
        self._missing[self._seen] += 1
        self._missing[present] = 0
        self._seen[present] = True
        gone = self._seen & (self._missing > self.forget_steps)
        self._seen[gone] = False
        self._missing[gone] = 0


class HealthPresence:
    """Nodes whose health reports stopped while other nodes keep reporting.

    Parameters
    ----------
    factor
        A node is missing once ``now - last report > factor * its report interval``.
    quorum
        Nodes are only named while at least this fraction of the fleet reports on
        time; when most nodes are quiet together the feed (or the reader) is behind.
    """

    def __init__(self, factor: float = 3.0, quorum: float = 0.5) -> None:
        check_positive("factor", factor)
        if not 0 <= quorum <= 1:
            raise ValueError(f"quorum must be within [0, 1], got {quorum!r}")
        self.factor = factor
        self.quorum = quorum
        self._last: dict[str, tuple[float, float]] = {}

    def learn(self, node: str, ts: float, interval_s: float) -> None:
        old = self._last.get(node)
        if old is None or ts >= old[0]:
            self._last[node] = (ts, interval_s)

    def nodes(self) -> Iterable[str]:
        return self._last.keys()

    def score(self, now: float) -> dict[str, float]:
        """Silence of each silent node in units of its interval, only while another node
        reported within its own interval (otherwise the whole feed stopped)."""
        if not self._last:
            return {}
        fresh = sum(1 for ts, iv in self._last.values() if now - ts <= 1.5 * iv)
        if fresh == 0 or fresh < self.quorum * len(self._last):
            # most of the fleet is quiet at once: the feed stalled or lags, which says
            # nothing about any one node (a cluster-wide shift is not a node fault)
            return {}
        out: dict[str, float] = {}
        for node, (ts, iv) in self._last.items():
            silence = (now - ts) / iv
            if silence > 1.0:
                out[node] = silence
        return out

    def forget(self, node: str) -> None:
        self._last.pop(node, None)
