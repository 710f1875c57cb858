"""Hangs and missing telemetry: silence is a signal, not a zero.

- :class:`HangDetector`: a job that completes no step within ``factor`` times its
  median step time is hung, unless a long step it learned to expect (a periodic
  checkpoint or eval) or a phase the job announced is due: then the silence is
  measured against that step's own duration. Measured on event time:
  :meth:`HangDetector.score` takes ``now`` (the worker calls it from ``tick(now)``
  when no data arrives).
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

import math
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from detectors.base import check_positive

__all__ = ["HangDetector", "HealthPresence", "MissingRanks"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


class HangDetector:
    """Time since the last completed step, in units of the step time it may take.

    Normally that is the median step time: a job silent for ``factor`` median step
    times is hung. Two kinds of step may legitimately take much longer, and the silence
    before them is measured against their own duration instead, so that a healthy job
    is not restarted at every checkpoint:

    - **Periodic long steps** (checkpoint saves, eval steps), learned. A completed
      step is *long* when its interval is at least ``long_ratio`` median step times.
      Two long steps ``g`` steps apart make a candidate period ``g``: the next one is
      due ``g`` steps later (within ``tolerance`` steps). A candidate whose due step
      comes and goes without a long step is dropped; once its long step arrives it is
      confirmed, and a confirmed period is dropped after two missed due steps in a row.
      Each period keeps the durations of its last eight long steps; its *typical
      duration* is their maximum (the interval from the step before to its end).
      Several periods live side by side (evals every 25 steps, checkpoints every 60).
    - **Announced phases** (:meth:`announce`): the exporter says a long phase starts
      (``"checkpoint"``, ``"eval"``, ...), perhaps with its expected duration. Its
      expected duration is the larger of the announced one and the longest of its last
      eight announced runs; with neither, ``phase_steps`` median step times. The next
      completed step ends the announcement and records its duration.

    While such a step is due (the step after :attr:`last_step` is at a learned
    position, or a phase is announced), the job may stay silent for ``long_margin``
    times its typical or expected duration (but never less than ``factor`` median
    step times) before the score reaches ``factor``. :attr:`expected_step_time` is
    that allowance divided by ``factor``, so the score keeps its scale: elapsed time
    over the median step time whenever no long step is due, exactly as before. The
    price: a hang that starts right where a long step is due is flagged after
    ``long_margin`` x its typical duration instead of ``factor`` median step times.

    The median step time is taken over ordinary intervals: a long step that a
    learned period or an announcement explains is not learned into it. An
    unexplained long step still is, as before, so that a job that really became
    slower (a new regime) moves the median instead of being called hung forever; for
    the same reason a long step right after another long one is never paired into a
    period (a run of long steps is a slower job, not a periodic phase).

    Parameters
    ----------
    factor
        Score at which the job counts as hung (the grading threshold uses it).
    window
        Number of recent step intervals the median is taken over.
    min_steps
        Intervals needed before a median exists; until then the score is neutral (0).
    long_ratio
        An interval of at least this many median step times is a long step (> 1).
    long_margin
        A due long step or announced phase may last this many times its typical or
        expected duration before it scores ``factor`` (>= 1).
    tolerance
        Steps a periodic long step may come early or late and still match its period.
    phase_steps
        Expected duration, in median step times, of an announced phase whose
        duration was neither announced nor learned before (20; with ``long_margin``
        1.5 the job may then stay silent for 30 median step times).
    max_periods
        Periods (candidates included) kept at once; a new candidate replaces the
        oldest unconfirmed one when the table is full.

    Examples
    --------
    A job with 1 s steps saves a 10 s checkpoint every 20 steps. Two checkpoints
    teach the period; at the third one the silence is measured against 1.5 x 10 s:

    >>> h = HangDetector(factor=2.5, min_steps=3)
    >>> ts = 0.0
    >>> for step in range(60):
    ...     ts += 10.0 if step % 20 == 19 else 1.0
    ...     h.learn_step(step, ts)
    >>> h.learned_periods, h.median_step_time
    ({20: 10.0}, 1.0)
    >>> h.score(ts + 3.0)  # step 60 is ordinary: 3 median step times, a hang
    3.0
    >>> for step in range(60, 79):
    ...     ts += 1.0
    ...     h.learn_step(step, ts)
    >>> h.expected_step_time, h.score(ts + 12.0), h.score(ts + 15.0)  # step 79 saves
    (6.0, 2.0, 2.5)

    An announced phase with no known duration may take 1.5 x 20 median step times;
    the next step ends it, and its duration is what the next one may take:

    >>> ts += 10.0
    >>> h.learn_step(79, ts)
    >>> h.announce("eval", ts)
    >>> h.expected_step_time, h.score(ts + 30.0)
    (12.0, 2.5)
    >>> ts += 4.0
    >>> h.learn_step(80, ts)
    >>> h.announce("eval", ts)
    >>> h.expected_step_time, h.score(ts + 6.0)  # 1.5 x 4 s allowed
    (2.4, 2.5)
    """

    #: long-step durations kept per period and per announced phase name
    DURATIONS_KEPT = 8
    #: unexplained long steps remembered to pair into candidate periods
    LOOSE_KEPT = 4
    #: announced phase names whose durations are remembered
    PHASES_KEPT = 8

    def __init__(
        self,
        factor: float = 3.0,
        window: int = 50,
        min_steps: int = 5,
        *,
        long_ratio: float = 2.0,
        long_margin: float = 1.5,
        tolerance: int = 1,
        phase_steps: float = 20.0,
        max_periods: int = 8,
    ) -> None:
        check_positive("factor", factor)
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        if min_steps < 1:
            raise ValueError(f"min_steps must be >= 1, got {min_steps!r}")
        if not (math.isfinite(long_ratio) and long_ratio > 1):
            raise ValueError(f"long_ratio must be > 1, got {long_ratio!r}")
        if not (math.isfinite(long_margin) and long_margin >= 1):
            raise ValueError(f"long_margin must be >= 1, got {long_margin!r}")
        if tolerance < 0:
            raise ValueError(f"tolerance must be >= 0, got {tolerance!r}")
        check_positive("phase_steps", phase_steps)
        if max_periods < 1:
            raise ValueError(f"max_periods must be >= 1, got {max_periods!r}")
        self.factor = factor
        self.window = window
        self.min_steps = min_steps
        self.long_ratio = long_ratio
        self.long_margin = long_margin
        self.tolerance = tolerance
        self.phase_steps = phase_steps
        self.max_periods = max_periods
        self._intervals = np.zeros(window)
        self._count = 0
        self.last_step: int | None = None
        self.last_ts: float | None = None
        self._in_grace = False
        self._last_long = False  # whether the last completed step was long
        # learned periods, one row each; period 0 marks a free row
        k = self.DURATIONS_KEPT
        self._period = np.zeros(max_periods, dtype=np.int64)
        self._anchor = np.zeros(max_periods, dtype=np.int64)  # step of its last long step
        self._hits = np.zeros(max_periods, dtype=np.int64)  # due long steps that came
        self._misses = np.zeros(max_periods, dtype=np.int64)  # due steps missed in a row
        self._born = np.zeros(max_periods, dtype=np.int64)  # creation order
        self._durations = np.zeros((max_periods, k))
        self._n_durations = np.zeros(max_periods, dtype=np.int64)
        self._created = 0
        # recent long steps no period explained: (step, duration)
        self._loose_steps = np.zeros(0, dtype=np.int64)
        self._loose_durations = np.zeros(0)
        # announced phase in progress and the recent durations of each phase name
        self.phase: str | None = None
        self._phase_ts = 0.0
        self._phase_expected: float | None = None
        self._phase_durations: dict[str, list[float]] = {}

    @property
    def median_step_time(self) -> float | None:
        """Median of the recent ordinary step intervals, or None while warming up."""
        if self._count < self.min_steps:
            return None
        return float(np.median(self._intervals[: min(self._count, self.window)]))

    @property
    def learned_periods(self) -> dict[int, float]:
        """Confirmed periods (in steps) and the typical duration of their long steps."""
        out: dict[int, float] = {}
        for i in np.flatnonzero((self._period > 0) & (self._hits > 0)):
            p, d = int(self._period[i]), self._typical(int(i))
            out[p] = max(d, out.get(p, 0.0))
        return out

    @property
    def expected_step_time(self) -> float | None:
        """The step time the silence is measured in (None while warming up): the
        median, or the allowance of a due long step or announced phase over
        ``factor``."""
        med = self.median_step_time
        if med is None or med <= 0:
            return None
        allowance = self.factor * med
        due = self._due_duration()
        if due > 0:
            allowance = max(allowance, self.long_margin * due)
        if self.phase is not None and self.last_ts is not None:
            expected = self._phase_expected_s()
            budget = self.phase_steps * med if expected is None else expected
            allowance = max(allowance, self._phase_ts - self.last_ts + self.long_margin * budget)
        if allowance <= self.factor * med:
            return med  # exactly today's scale when nothing long is due
        return allowance / self.factor

    def score(self, now: float) -> float:
        """Elapsed time since the last step over :attr:`expected_step_time` (0 if
        unknown); reads state only."""
        expected = self.expected_step_time
        if expected is None or self.last_ts is None:
            return 0.0
        return max(0.0, now - self.last_ts) / expected

    def announce(self, phase: str, ts: float, expected_s: float | None = None) -> None:
        """The job starts a long ``phase`` (checkpoint, eval, ...) at event time ``ts``,
        expected to last ``expected_s`` seconds if known.

        Until the next step completes, the silence is measured against the phase's
        expected duration (see the class notes). An announcement older than the last
        completed step is ignored: the step it announced has already completed.
        """
        if expected_s is not None:
            check_positive("expected_s", expected_s)
        if self.last_ts is not None and ts < self.last_ts and not self._in_grace:
            return
        self.phase, self._phase_ts, self._phase_expected = phase, ts, expected_s

    def restart(self, ts: float, grace_steps: float) -> None:
        """The job was relaunched at event time ``ts`` (from a checkpoint): step numbers
        start again and the relaunch itself, up to ``grace_steps`` median step times,
        is not a hang. The learned step-time median and periods are kept; an announced
        phase ends."""
        med = self.median_step_time or 0.0
        self.last_step = None
        self.last_ts = ts + grace_steps * med
        self._in_grace = True
        self.phase = None

    def learn_step(self, step: int, ts: float, ts_start: float | None = None) -> None:
        """A step completed at event time ``ts``. A repeated or older step number is
        ignored, unless it is newer in event time: then the job resumed from a
        checkpoint (restart or rollback) and step numbers start again."""
        if self.last_step is not None and step <= self.last_step:
            if self.last_ts is None or ts <= self.last_ts:
                return
            self.last_step = None  # relaunched: count from here
        self._rewind(step)
        if self.last_step is None:
            self._last_long = False
        gap = None if self.last_step is None else step - self.last_step
        if self.last_ts is not None and gap is not None:
            interval = (ts - self.last_ts) / gap
        elif ts_start is not None and ts_start < ts:
            interval = ts - ts_start
        else:
            interval = None
        med = self.median_step_time
        is_long = (
            gap == 1
            and interval is not None
            and med is not None
            and interval >= self.long_ratio * med
        )
        explained = False
        if self.phase is not None and ts >= self._phase_ts:
            self._remember_phase(self.phase, ts - self._phase_ts)
            self.phase, explained = None, True
        if is_long and interval is not None:
            explained = self._learn_long(step, interval, isolated=not self._last_long) or explained
        self._last_long = is_long
        self._expire(step)
        if interval is not None and interval > 0 and not (is_long and explained):
            self._intervals[self._count % self.window] = interval
            self._count += 1
        self.last_step = step
        if self._in_grace:  # the first step after a relaunch ends the grace
            self.last_ts, self._in_grace = ts, False
        else:
            self.last_ts = ts if self.last_ts is None else max(ts, self.last_ts)

    # -- periodic long steps ---------------------------------------------------------
    def _typical(self, i: int) -> float:
        n = min(int(self._n_durations[i]), self.DURATIONS_KEPT)
        return float(self._durations[i, :n].max()) if n else 0.0

    def _due(self, step: int) -> npt.NDArray[np.intp]:
        """Rows whose next long step is due at ``step`` (within the tolerance)."""
        nxt = self._anchor + self._period
        hit = (self._period > 0) & (np.abs(step - nxt) <= self.tolerance)
        return np.flatnonzero(hit)

    def _due_duration(self) -> float:
        """Typical duration of the long step due next (0 if none is due)."""
        if self.last_step is None:
            return 0.0
        rows = self._due(self.last_step + 1)
        return max((self._typical(int(i)) for i in rows), default=0.0)

    def _push_duration(self, i: int, duration: float) -> None:
        self._durations[i, self._n_durations[i] % self.DURATIONS_KEPT] = duration
        self._n_durations[i] += 1

    def _learn_long(self, step: int, duration: float, *, isolated: bool) -> bool:
        """Learn a long step; True when a period explains it. A long step that follows
        another one and is not due is no periodic phase but a slower job: not learned
        as long, so the median moves to the new step time."""
        rows = self._due(step)
        if rows.size:
            self._anchor[rows] = step
            self._hits[rows] += 1
            self._misses[rows] = 0
            # the duration goes to the period whose long steps it resembles most (a
            # checkpoint that is also an eval step must not stretch the evals)
            typical = np.array([self._typical(int(i)) for i in rows])
            closest = int(rows[np.argmin(np.abs(np.log(duration / typical)))])
            self._push_duration(closest, duration)
            return True
        if not isolated:
            return False
        min_period = 2 * self.tolerance + 2
        for prev, prev_duration in zip(
            self._loose_steps.tolist(), self._loose_durations.tolist(), strict=True
        ):
            if step - prev >= min_period:
                self._add_candidate(step - prev, step, (prev_duration, duration))
        kept = self.LOOSE_KEPT
        self._loose_steps = np.append(self._loose_steps, step)[-kept:]
        self._loose_durations = np.append(self._loose_durations, duration)[-kept:]
        return False

    def _add_candidate(self, period: int, step: int, durations: tuple[float, float]) -> None:
        same = (self._period == period) & (self._anchor == step)
        if same.any():
            return
        free = np.flatnonzero(self._period == 0)
        if free.size:
            i = int(free[0])
        else:
            unconfirmed = np.flatnonzero(self._hits == 0)
            if not unconfirmed.size:
                return
            i = int(unconfirmed[np.argmin(self._born[unconfirmed])])
        self._period[i], self._anchor[i] = period, step
        self._hits[i] = self._misses[i] = 0
        self._born[i], self._created = self._created, self._created + 1
        self._n_durations[i] = 0
        for d in durations:
            self._push_duration(i, d)

    def _expire(self, step: int) -> None:
        """Count the due long steps that did not come by ``step``; drop candidates at
        their first miss and confirmed periods at their second in a row."""
        active = self._period > 0
        late = np.flatnonzero(active & (step >= self._anchor + self._period + self.tolerance))
        if not late.size:
            return
        periods = self._period[late]
        self._anchor[late] += periods * ((step - self.tolerance - self._anchor[late]) // periods)
        self._misses[late] += 1
        drop = late[(self._hits[late] == 0) | (self._misses[late] >= 2)]
        self._period[drop] = 0

    def _rewind(self, step: int) -> None:
        """Step numbers went back (relaunch, rollback): move each period's anchor to
        its last position before ``step``, forget long steps at or after it."""
        back = (self._period > 0) & (self._anchor >= step)
        if back.any():
            p = self._period[back]
            self._anchor[back] -= p * ((self._anchor[back] - step) // p + 1)
        if self._loose_steps.size and self._loose_steps.max() >= step:
            keep = self._loose_steps < step
            self._loose_steps = self._loose_steps[keep]
            self._loose_durations = self._loose_durations[keep]

    # -- announced phases ------------------------------------------------------------
    def _phase_expected_s(self) -> float | None:
        seen = self._phase_durations.get(self.phase or "", [])
        known = [d for d in (self._phase_expected, max(seen, default=None)) if d is not None]
        return max(known) if known else None

    def _remember_phase(self, phase: str, duration: float) -> None:
        if duration <= 0:
            return
        if phase not in self._phase_durations and len(self._phase_durations) >= self.PHASES_KEPT:
            del self._phase_durations[next(iter(self._phase_durations))]
        kept = self._phase_durations.setdefault(phase, [])
        kept.append(duration)
        del kept[: -self.DURATIONS_KEPT]


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
