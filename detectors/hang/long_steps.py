"""Long steps a healthy job takes: learned periodic ones and announced phases.

A checkpoint save or an eval step may take many ordinary step times; the hang clock
(:class:`~detectors.hang.detector.HangDetector`) measures the silence before such a step
against that step's own duration. This module keeps what it needs to know:

- :class:`PeriodicLongSteps`: periods (in steps) of long steps learned from where
  they came, and the typical duration of each;
- :class:`AnnouncedPhases`: the phase the job announced (``"checkpoint"``,
  ``"eval"``, ...) and how long each phase name took the last times.

Both hold plain fields only (numpy arrays, dicts, lists), so the worker's state codec
writes them as data.

Examples
--------
>>> p = PeriodicLongSteps()
>>> p.learn(19, 10.0, isolated=True), p.learn(39, 10.0, isolated=True)
(False, False)
>>> p.due(59), p.due(59, confirmed=True), p.learn(59, 12.0, isolated=True), p.learned
((20, 10.0), None, True, {20: 13.2})

A job's start is a boundary its schedules count from: one save teaches a candidate.

>>> q = PeriodicLongSteps()
>>> q.start(-1)
>>> q.learn(199, 7.0, isolated=True), q.due(399), q.due(399, confirmed=True)
(False, (200, 7.0), None)
>>> a = AnnouncedPhases()
>>> a.announce("eval", 100.0, expected_s=None)
>>> a.end(104.0), a.phase, a.expected_s("eval")
(True, None, 4.0)
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["MAX_GROWTH", "TREND_RUNS", "AnnouncedPhases", "PeriodicLongSteps", "trend_next"]

#: most growth from one run of a long step to the next that a job's own trend may
#: allow (a save four times the last one is past any trend, and no announcer can
#: stretch the allowance faster than this)
MAX_GROWTH = 4.0
#: runs of a long step (a phase name, a period) before its trend says what the next
#: run takes: one run is no trend
TREND_RUNS = 2


def trend_next(durations: Sequence[float]) -> float:
    """What the next run of a long step may take by the trend of its ``durations``
    (oldest first): the longest of them, or the last one times the median ratio of the
    last three runs to the run before each (between 1 and :data:`MAX_GROWTH`),
    whichever is longer. Saves that grow, or double, are judged by how they grow, not
    by a fixed multiple of the longest. 0.0 when empty.

    >>> trend_next([10.0, 10.5, 9.8]), trend_next([2.0, 4.0, 8.0]), trend_next([10.0])
    (10.5, 16.0, 10.0)
    >>> round(trend_next([10.0, 12.0, 14.0, 16.0]), 2)  # + 2 s a run: 16 x 1.17
    18.67
    >>> trend_next([1.0, 100.0])  # no trend grows faster than MAX_GROWTH a run
    400.0
    """
    runs = [d for d in durations if d > 0]
    if not runs:
        return 0.0
    longest = max(runs)
    if len(runs) < TREND_RUNS:
        return longest
    recent = runs[-4:]
    ratios = sorted(b / a for a, b in itertools.pairwise(recent))
    mid = len(ratios) // 2
    ratio = ratios[mid] if len(ratios) % 2 else 0.5 * (ratios[mid - 1] + ratios[mid])
    return max(longest, runs[-1] * min(max(ratio, 1.0), MAX_GROWTH))


class PeriodicLongSteps:
    """Periods of long steps (checkpoint saves, eval steps), learned from their steps.

    The caller decides which completed steps are *long* and passes each with its
    duration to :meth:`learn`. Two long steps ``g`` steps apart make a candidate
    period ``g``: the next one is due ``g`` steps later (within ``tolerance`` steps).
    A candidate whose due step comes and goes without a long step is dropped
    (:meth:`expire`); once its long step arrives it is confirmed, and a confirmed
    period is dropped after two missed due steps in a row. Each period keeps the
    durations of its last eight long steps; its *typical duration* is their maximum.
    Several periods live side by side (evals every 25 steps, checkpoints every 60).
    A long step right after another long one (``isolated=False``) is never paired
    into a period: a run of long steps is a slower job, not a periodic phase.

    Parameters
    ----------
    tolerance
        Steps a periodic long step may come early or late and still match its period.
    max_periods
        Periods (candidates included) kept at once; a new candidate replaces the
        oldest unconfirmed one when the table is full.

    Examples
    --------
    Checkpoints of about 10 s at steps 19, 39 and 59 (the next may take what their
    trend says, :func:`trend_next`); then two due steps pass without one and the
    period is dropped:

    >>> p = PeriodicLongSteps(tolerance=1)
    >>> for step, duration in [(19, 10.0), (39, 9.0), (59, 10.5)]:
    ...     explained = p.learn(step, duration, isolated=True)
    >>> explained, round(p.learned[20], 2), p.due(70)
    (True, 10.85, None)
    >>> p.expire(80)
    >>> p.expire(100)
    >>> p.learned
    {}
    """

    #: long-step durations kept per period
    DURATIONS_KEPT = 8
    #: unexplained long steps remembered to pair into candidate periods
    LOOSE_KEPT = 4

    def __init__(self, tolerance: int = 1, max_periods: int = 8) -> None:
        if tolerance < 0:
            raise ValueError(f"tolerance must be >= 0, got {tolerance!r}")
        if max_periods < 1:
            raise ValueError(f"max_periods must be >= 1, got {max_periods!r}")
        self.tolerance = tolerance
        self.max_periods = max_periods
        # one row per period; period 0 marks a free row
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

    @property
    def learned(self) -> dict[int, float]:
        """Confirmed periods (in steps) and the typical duration of their long steps."""
        out: dict[int, float] = {}
        for i in np.flatnonzero((self._period > 0) & (self._hits > 0)):
            p, d = int(self._period[i]), self._typical(int(i))
            out[p] = max(d, out.get(p, 0.0))
        return out

    def start(self, step: int) -> None:
        """The job's run begins after ``step``: -1 for a fresh job, the step its
        checkpoint was saved at for a relaunch. Saves and evals scheduled every N
        steps count from there, so the boundary is remembered as a long step of
        unknown duration: the first real long step pairs with it into a candidate
        period, and the second checkpoint of a job is already due (reads as expected
        rather than as a hang)."""
        kept = self.LOOSE_KEPT
        self._loose_steps = np.append(self._loose_steps, step)[-kept:]
        self._loose_durations = np.append(self._loose_durations, 0.0)[-kept:]

    def due(self, step: int, *, confirmed: bool = False) -> tuple[int, float] | None:
        """The period and typical duration of the longest long step due at ``step``
        (None if none is due); with ``confirmed``, only periods whose long step has
        come when due at least once (not a candidate seen twice); reads state only."""
        rows = self._due(step)
        if confirmed:
            rows = rows[self._hits[rows] > 0]
        if not rows.size:
            return None
        typical = [self._typical(int(i)) for i in rows]
        i = int(np.argmax(typical))
        return int(self._period[rows[i]]), typical[i]

    def learn(self, step: int, duration: float, *, isolated: bool) -> bool:
        """Learn a long step; True when a period explains it. A long step that follows
        another one (not ``isolated``) and is not due is no periodic phase but a
        slower job: it pairs with nothing."""
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

    def expire(self, step: int) -> None:
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

    def rewind(self, step: int) -> None:
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

    def _typical(self, i: int) -> float:
        """The period's typical duration: what its next long step may take by the
        trend of its last ones (:func:`trend_next`)."""
        n, k = int(self._n_durations[i]), self.DURATIONS_KEPT
        if n <= k:
            return trend_next(self._durations[i, :n].tolist())
        return trend_next(np.roll(self._durations[i], -(n % k)).tolist())  # oldest first

    def _due(self, step: int) -> npt.NDArray[np.intp]:
        """Rows whose next long step is due at ``step`` (within the tolerance)."""
        nxt = self._anchor + self._period
        hit = (self._period > 0) & (np.abs(step - nxt) <= self.tolerance)
        return np.flatnonzero(hit)

    def _push_duration(self, i: int, duration: float) -> None:
        self._durations[i, self._n_durations[i] % self.DURATIONS_KEPT] = duration
        self._n_durations[i] += 1

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
            if d > 0:  # the run's start is a boundary of unknown duration
                self._push_duration(i, d)


class AnnouncedPhases:
    """The long phase the job announced, and the recent durations of each phase name.

    The exporter says a long phase starts (``"checkpoint"``, ``"eval"``, ...), perhaps
    with its expected duration (:meth:`announce`); the next completed step ends it
    (:meth:`end`) and its duration is remembered under its name. The expected
    duration of a phase is the larger of the announced one and the longest of its
    last eight runs (:meth:`expected_s`).

    Attributes
    ----------
    phase
        The phase in progress, or None.
    started
        Event time the phase in progress was announced to start.

    Examples
    --------
    >>> a = AnnouncedPhases()
    >>> a.announce("checkpoint", 10.0, expected_s=None)
    >>> a.expected_s(), a.end(25.0)
    (None, True)
    >>> a.announce("checkpoint", 40.0, expected_s=12.0)
    >>> a.expected_s()  # the last one took 15 s, longer than announced
    15.0
    >>> a.end(50.0), a.end(60.0)  # the next step ended it; nothing is announced now
    (True, False)

    Phases may follow one another with no step between (an eval, then a save), but
    announcements cannot stretch one silence without end: past the ``CHAINED_KEPT``-th
    in a row, a new one names the phase and its length while the phase still counts
    from the last start that moved.

    >>> b = AnnouncedPhases()
    >>> for ts in (10.0, 40.0, 70.0, 100.0):
    ...     b.announce("eval", ts, expected_s=None)
    >>> b.started, b.end(130.0), b.expected_s("eval")
    (40.0, True, 90.0)
    """

    #: announcements in a row, with no step completed between, that may each move the
    #: phase's start (an eval, then a checkpoint)
    CHAINED_KEPT = 2
    #: announcements since the last phase ended (a class default, so that state
    #: written before it existed reads it)
    _chained: int = 0

    #: durations kept per phase name
    DURATIONS_KEPT = 8
    #: phase names whose durations are remembered
    PHASES_KEPT = 8

    def __init__(self) -> None:
        self.phase: str | None = None
        self.started = 0.0
        #: the last step completed when the phase was announced (None: not known)
        self.after_step: int | None = None
        self._announced_s: float | None = None
        self._durations: dict[str, list[float]] = {}

    def announce(
        self, phase: str, ts: float, expected_s: float | None, after_step: int | None = None
    ) -> None:
        """``phase`` starts at event time ``ts`` after step ``after_step`` (if known),
        announced to last ``expected_s`` seconds if known (replacing any phase in
        progress; see the class notes on announcements in a row)."""
        self._chained = self._chained + 1 if self.phase is not None else 1
        if self._chained <= self.CHAINED_KEPT:
            self.started, self.after_step = ts, after_step
        self.phase, self._announced_s = phase, expected_s

    def expected_s(self, phase: str | None = None, cap: float | None = None) -> float | None:
        """Expected duration of ``phase`` (default: the one in progress): the announced
        one, or what the trend of its last runs says the next takes
        (:func:`trend_next`, growth beyond the longest run cut to ``cap`` seconds),
        whichever is longer; None when neither announced nor seen before; reads state
        only."""
        name = self.phase if phase is None else phase
        seen = self._durations.get(name or "", [])
        announced = self._announced_s if name == self.phase else None
        trend = trend_next(seen) if seen else None
        if trend is not None and cap is not None:
            trend = max(min(trend, cap), *seen)
        known = [d for d in (announced, trend) if d is not None]
        return max(known) if known else None

    def runs(self, phase: str | None = None) -> int:
        """Runs of ``phase`` (default: the one in progress) remembered; reads state only."""
        return len(self._durations.get((self.phase if phase is None else phase) or "", []))

    @property
    def announced_s(self) -> float | None:
        """The length the phase in progress was announced to take, if it said."""
        return self._announced_s if self.phase is not None else None

    def end(self, ts: float, step: int | None = None) -> bool:
        """Step ``step`` completed at event time ``ts``: True when it ends the phase in
        progress, whose duration is then remembered. The phase's own step is one
        after ``after_step`` when the announcement named it; otherwise one that
        completed after the announcement. The step the phase follows can complete
        after the announcement arrives (its last node's message travels on another
        path) and ends nothing."""
        if self.phase is None:
            return False
        if self.after_step is not None and step is not None:
            if step <= self.after_step:
                return False
        elif ts <= self.started:
            return False
        self._remember(self.phase, ts - self.started)
        self.phase, self._chained = None, 0
        return True

    def cancel(self) -> None:
        """The job was relaunched: the phase in progress ends unmeasured."""
        self.phase, self._chained = None, 0

    def _remember(self, phase: str, duration: float) -> None:
        if duration <= 0:
            return
        if phase not in self._durations and len(self._durations) >= self.PHASES_KEPT:
            del self._durations[next(iter(self._durations))]
        kept = self._durations.setdefault(phase, [])
        kept.append(duration)
        del kept[: -self.DURATIONS_KEPT]
