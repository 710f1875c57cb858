"""Missing telemetry: silence is a signal, not a zero.

- :class:`MissingRanks`: ranks that reported recently but are absent from the current
  step while the rest of the job progresses (a crashed node or a dead exporter).
- :class:`HealthPresence`: a node whose health reports stop while other nodes keep
  reporting.

A job that stops completing steps altogether is :class:`~detectors.hang.detector.HangDetector`'s.

Examples
--------
>>> import numpy as np
>>> m = MissingRanks(forget_steps=3)
>>> m.learn(np.arange(4))
>>> ranks, counts = m.score(np.array([0, 1, 3]))  # rank 2 is absent
>>> ranks.tolist(), counts.tolist()
([2], [1])
>>> p = HealthPresence()
>>> for t in range(3):
...     p.learn("a", 10.0 * t, interval_s=10.0)
>>> p.learn("b", 0.0, interval_s=10.0)
>>> p.score(25.0)  # "a" reported 5 s ago, "b" 25 s ago
{'b': 2.5}
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from detectors.base import check_positive

__all__ = ["HealthPresence", "MissingRanks"]

I64 = npt.NDArray[np.int64]


class MissingRanks:
    """Consecutive steps each recently seen rank has been absent.

    Ranks are addressed by *slot*, the dense index :class:`~detectors.steps.ranks.RankIndex`
    gives them (state is one entry per distinct rank, whatever the rank ids).

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
        """Slots of the ranks expected but absent from ``present`` (the step's slots)
        and their consecutive-missing count including this step (reads state only)."""
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
        """Slots of the ranks currently expected to report."""
        return np.flatnonzero(self._seen).astype(np.int64)

    def learn(self, present: I64) -> None:
        """The ranks in slots ``present`` reported this step."""
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
        self._resumed: float | None = None

    #: event time from which silence counts after :meth:`resume` (class default: a
    #: state stored before the field existed reads it)
    _resumed: float | None = None

    def learn(self, node: str, ts: float, interval_s: float) -> None:
        old = self._last.get(node)
        if old is None or ts >= old[0]:
            self._last[node] = (ts, interval_s)

    def nodes(self) -> Iterable[str]:
        return self._last.keys()

    def resume(self, at: float) -> None:
        """The reports' path (not the nodes) was interrupted until event time ``at``: a
        broker outage, or a worker that re-keys them died and another took over. Each
        known node's silence counts from ``at`` at the earliest, so a node is missing
        only when it stays silent for its intervals after that.

        Examples
        --------
        >>> p = HealthPresence()
        >>> for t in range(4):
        ...     p.learn("a", 10.0 * t, interval_s=10.0)
        >>> p.learn("b", 0.0, interval_s=10.0)
        >>> p.score(35.0)
        {'b': 3.5}
        >>> p.resume(30.0)  # b's reports were held up on their way until t=30
        >>> p.score(35.0)
        {}
        >>> for t in range(4, 7):
        ...     p.learn("a", 10.0 * t, interval_s=10.0)
        >>> p.score(65.0)  # b stayed silent after the path came back: missing again
        {'b': 3.5}
        """
        self._resumed = at if self._resumed is None else max(self._resumed, at)

    def score(self, now: float) -> dict[str, float]:
        """Silence of each silent node in units of its interval, only while another node
        reported within its own interval (otherwise the whole feed stopped)."""
        if not self._last:
            return {}
        floor = self._resumed if self._resumed is not None else -math.inf
        last = {node: (max(ts, floor), iv) for node, (ts, iv) in self._last.items()}
        fresh = sum(1 for ts, iv in last.values() if now - ts <= 1.5 * iv)
        if fresh == 0 or fresh < self.quorum * len(self._last):
            # most of the fleet is quiet at once: the feed stalled or lags, which says
            # nothing about any one node (a cluster-wide shift is not a node fault)
            return {}
        out: dict[str, float] = {}
        for node, (ts, iv) in last.items():
            silence = (now - ts) / iv
            if silence > 1.0:
                out[node] = silence
        return out

    def forget(self, node: str) -> None:
        self._last.pop(node, None)
