"""Hangs: a job that stops completing steps.

:class:`HangDetector`: a job that completes no step within ``factor`` times its
median step time is hung, unless a long step it learned to expect (a periodic
checkpoint or eval) or a phase the job announced is due: then the silence is measured
against that step's own duration (:mod:`detectors.hang.long_steps`). Measured on event
time: :meth:`HangDetector.score` takes ``now`` (the worker calls it from
``tick(now)`` when no data arrives).

Missing ranks and silent nodes live in :mod:`detectors.hang.presence`; their classes are
re-exported here.

Examples
--------
>>> h = HangDetector(factor=3.0, min_steps=3)
>>> for i in range(5):
...     h.learn_step(i, ts=100.0 + i)
>>> h.median_step_time, h.score(104.5), h.score(107.5)
(1.0, 0.5, 3.5)
>>> h.explain(107.5)
(1.0, 'no step completed for 3.5 median step times (1.000s)')
"""

from __future__ import annotations

import math

import numpy as np

from detectors._stats import median
from detectors.base import check_positive
from detectors.hang.long_steps import TREND_RUNS, AnnouncedPhases, PeriodicLongSteps
from detectors.hang.presence import HealthPresence, MissingRanks

__all__ = ["HangDetector", "HealthPresence", "MissingRanks"]


class HangDetector:
    """Time since the last completed step, in units of the step time it may take.

    Normally that is the median step time: a job silent for ``factor`` median step
    times is hung. Two kinds of step may legitimately take much longer, and the silence
    before them is measured against their own duration instead, so that a healthy job
    is not restarted at every checkpoint:

    - **Periodic long steps** (checkpoint saves, eval steps), learned. A completed
      step is *long* when its interval is at least ``long_ratio`` median step times
      (its duration: the interval from the step before to its end). Two long steps
      ``g`` steps apart make a candidate period ``g`` whose next long step is due
      ``g`` steps later; a period is confirmed when it comes and dropped when due
      steps pass without one. Its *typical duration* is what the trend of its last
      eight long steps says the next takes, at least their longest
      (:class:`~detectors.hang.long_steps.PeriodicLongSteps`).
    - **Announced phases** (:meth:`announce`): the exporter says a long phase starts
      (``"checkpoint"``, ``"eval"``, ...), perhaps with its expected duration. Its
      expected duration is the larger of the announced one and what the trend of its
      last announced runs says the next takes (saves that grow or double are judged
      by how they grow); with neither, or one run only (no trend yet), ``phase_steps``
      median step times (at least ``phase_floor_s``). The next
      completed step ends the announcement and records its duration
      (:class:`~detectors.hang.long_steps.AnnouncedPhases`).

    - **Waits for input** (:meth:`waiting`): the job's leader says it has been waiting
      for its next batch (the data loader, the storage behind it) since a time, while
      the next step is in progress. A job whose input stalls is slower, not hung in its
      collectives: the silence is allowed ``wait_steps`` median step times from the
      wait's start before it counts, and the allowance climbs from there (the wait may
      be a storage that never answers, see :meth:`graded`).

    While such a step is due (the step after :attr:`last_step` is at a learned
    position, a phase is announced, or the job waits for input), the job may stay
    silent for ``long_margin`` times its typical or expected duration (but never less
    than ``factor`` median step times) before the score reaches ``factor``.
    :attr:`expected_step_time` is that allowance divided by ``factor``, so the score
    keeps its scale: elapsed time over the median step time whenever no long step is
    due, exactly as before. The price: a hang that starts right where a long step is
    due is flagged after ``long_margin`` x its typical duration instead of ``factor``
    median step times.

    A long step nothing explained tells that the job may have slowed down (a storage
    stall, a throttled cluster): the step after it may take as long, within
    ``long_margin`` and at most ``critical_factor`` median step times, before the
    silence counts (one flag where the slowdown begins, not one per step until the
    median follows).

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
        1.5 the job may then stay silent for 30 median step times), but never less
        than ``phase_floor_s``.
    phase_floor_s
        Seconds an announced phase of unknown length is expected to take at least
        (120): a checkpoint save's time follows its size and the storage, not the
        step time, and a first save of a fast job at scale takes minutes. Overrunning
        it is no proof of a hang: the silence climbs from WARNING (see
        :meth:`graded`).
    wait_steps
        Median step times a step whose input the job waits for may take, counted from
        the wait's start (10; with ``long_margin`` 1.5 the job may then stay silent for
        15 median step times after it), at most the operator's ``max_s``.
    max_periods
        Periods (candidates included) kept at once; a new candidate replaces the
        oldest unconfirmed one when the table is full.
    critical_factor
        Median step times of silence that no learned or announced long step explains
        before :meth:`graded` reaches it (the CRITICAL threshold); ``factor`` if not
        given, so that :meth:`graded` equals :meth:`score` (see :meth:`graded`).

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
    >>> h.explain(ts + 15.0)
    (10.0, 'no step completed for 15.0s, 1.5 x the 10.0s a long step every 20 steps ...')

    An announced phase with no known duration may take 1.5 x 120 s (``phase_floor_s``,
    or 20 median step times when longer); the next step ends it and its duration is
    learned. One run is no trend (the next save may take twice as long), so the second
    is still allowed the unknown length; from two runs on, the next may take 1.5 x what
    their trend says (:func:`~detectors.hang.long_steps.trend_next`):

    >>> ts += 10.0
    >>> h.learn_step(79, ts)
    >>> allowed = []
    >>> for run in range(2):
    ...     h.announce("eval", ts)
    ...     allowed.append(h.expected_step_time)
    ...     ts += 4.0
    ...     h.learn_step(80 + run, ts)
    >>> h.announce("eval", ts)
    >>> allowed, h.expected_step_time, h.score(ts + 6.0)  # 1.5 x 4 s now
    ([72.0, 72.0], 2.4, 2.5)
    """

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
        phase_floor_s: float = 120.0,
        wait_steps: float = 10.0,
        max_periods: int = 8,
        critical_factor: float | None = None,
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
        if not (math.isfinite(phase_floor_s) and phase_floor_s >= 0):
            raise ValueError(f"phase_floor_s must be >= 0, got {phase_floor_s!r}")
        check_positive("wait_steps", wait_steps)
        if max_periods < 1:
            raise ValueError(f"max_periods must be >= 1, got {max_periods!r}")
        critical = factor if critical_factor is None else critical_factor
        if not (math.isfinite(critical) and critical >= factor):
            raise ValueError(f"critical_factor must be >= factor, got {critical_factor!r}")
        self.critical_factor = critical
        self.factor = factor
        self.window = window
        self.min_steps = min_steps
        self.long_ratio = long_ratio
        self.long_margin = long_margin
        self.tolerance = tolerance
        self.phase_steps = phase_steps
        self.phase_floor_s = phase_floor_s
        self.wait_steps = wait_steps
        self.max_periods = max_periods
        self._intervals = np.zeros(window)
        self._count = 0
        self.last_step: int | None = None
        self.last_ts: float | None = None
        self._in_grace = False
        self._last_long = False  # whether the last completed step was long
        self._periods = PeriodicLongSteps(tolerance, max_periods)
        self._phases = AnnouncedPhases()

    @property
    def median_step_time(self) -> float | None:
        """Median of the recent ordinary step intervals, or None while warming up."""
        if self._count < self.min_steps:
            return None
        return float(median(self._intervals[: min(self._count, self.window)]))

    @property
    def learned_periods(self) -> dict[int, float]:
        """Confirmed periods (in steps) and the typical duration of their long steps."""
        return self._periods.learned

    @property
    def phase(self) -> str | None:
        """The announced phase in progress, or None."""
        return self._phases.phase

    @property
    def expected_step_time(self) -> float | None:
        """The step time the silence is measured in (None while warming up): the
        median, or the allowance of a due long step or announced phase over
        ``factor``."""
        med = self.median_step_time
        if med is None or med <= 0:
            return None
        long = self._long_step(med)
        if long is None:
            return med  # exactly today's scale when nothing long is due
        return long[0] / self.factor

    def score(self, now: float) -> float:
        """Elapsed time since the last step over :attr:`expected_step_time` (0 if
        unknown); reads state only."""
        expected = self.expected_step_time
        if expected is None or self.last_ts is None or self._in_grace:
            return 0.0  # a relaunch in progress is not a hang (the suite bounds it)
        # no real step takes under a nanosecond: a subnormal median must not overflow
        return max(0.0, now - self.last_ts) / max(expected, 1e-9)

    def explain(self, now: float) -> tuple[float, str]:
        """What the silence at event time ``now`` is measured against: the baseline in
        seconds (the median step time, or the time since the last step that the due
        long step or announced phase is expected to take) and a sentence saying so;
        reads state only."""
        med = self.median_step_time or 0.0
        long = None if med <= 0 or self.last_ts is None else self._long_step(med)
        if long is None or self.last_ts is None:
            h = self.score(now)
            return med, f"no step completed for {h:.1f} median step times ({med:.3f}s)"
        _, expected, what, _ = long
        silence = now - self.last_ts
        return expected, (
            f"no step completed for {silence:.1f}s, {silence / expected:.1f} x the "
            f"{expected:.1f}s {what} (median step {med:.3f}s)"
        )

    def _long_step(self, med: float) -> tuple[float, float, str, bool] | None:
        """The due long step or announced phase that allows the job the longest silence,
        if longer than ``factor`` median step times: that allowance, the silence it is
        expected to take, what it is (``"a checkpoint takes here"``), and whether it is
        *known* (announced with a length or learned from announced runs, or a period
        that a long step coming when due confirmed) rather than an allowance it is
        unsure of (see :meth:`graded`)."""
        found: list[tuple[float, float, str, bool]] = []
        step = None if self.last_step is None else self.last_step + 1
        due = None if step is None else self._periods.due(step)
        if due is not None and due[1] > 0:
            period, duration = due
            known = self._periods.due(step, confirmed=True) == due  # type: ignore[arg-type]
            takes = "takes" if known else "may take"
            what = f"a long step every {period} steps {takes} here"
            found.append((self.long_margin * duration, duration, what, known))
        if self._slow_s is not None:  # a slower job (a storage stall) is not a hung one
            # within critical_factor median steps: a hang right after a long stall
            # is still flagged before CRITICAL would be
            allowance = min(self.long_margin * self._slow_s, self.critical_factor * med)
            what = f"the last step took {self._slow_s:.1f}s, so the next one may take"
            found.append((allowance, self._slow_s, what, False))
        wait = self._waits.get(self.last_step) if self.last_step is not None else None
        if wait is not None and self.last_ts is not None:
            budget = self.wait_steps * med
            if self._wait_max_s is not None:
                budget = min(budget, self._wait_max_s)
            since = wait - self.last_ts  # below 0 for a wait said before the step came
            what = "allowed for a step whose input the job waits for"
            allowance = since + self.long_margin * budget
            found.append((allowance, max(0.0, since + budget), what, False))
        if self.phase is not None and self.last_ts is not None:
            phases = self._phases
            expected = phases.expected_s(cap=self._phase_max_s)
            unknown = max(self.phase_steps * med, self.phase_floor_s)
            if self._phase_max_s is not None:
                unknown = min(unknown, self._phase_max_s)
            # a length it was told, or the trend of its own runs, is known; one run is
            # no trend (the next save may be twice as long): the unknown length floors it
            known = expected is not None and (
                phases.announced_s is not None or phases.runs() >= TREND_RUNS
            )
            budget = unknown if expected is None else expected if known else max(expected, unknown)
            since = phases.started - self.last_ts
            name = ("an " if self.phase[:1].lower() in tuple("aeiou") else "a ") + self.phase
            what = f"{name} takes here" if known else f"allowed for {name} of unknown length"
            allowance = since + self.long_margin * budget
            # overrunning a length it does not know is no proof of a hang: it climbs
            found.append((allowance, max(since, 0.0) + budget, what, known))
        best = max(found, default=None)
        return best if best is not None and best[0] > self.factor * med else None

    def announce(
        self,
        phase: str,
        ts: float,
        expected_s: float | None = None,
        after_step: int | None = None,
        *,
        max_s: float | None = None,
    ) -> None:
        """The job starts a long ``phase`` (checkpoint, eval, ...) at event time ``ts``,
        expected to last ``expected_s`` seconds if known, right after step
        ``after_step`` (if known: only a later step ends the phase). ``max_s``: the
        most a phase of unknown length is expected to take (the operator's
        ``STEPGUARD_MAX_PHASE_S``, which also cuts an announced length), below
        ``phase_floor_s`` and ``phase_steps`` median steps when lower.

        Until the next step completes, the silence is measured against the phase's
        expected duration (see the class notes). An announcement older than the last
        completed step is ignored: the step it announced has already completed. With
        ``after_step`` that is judged by step number (an event time rounded to the
        microsecond of a message may read a hair before the step it follows), else by
        event time.
        """
        if expected_s is not None:
            check_positive("expected_s", expected_s)
        if max_s is not None:
            check_positive("max_s", max_s)
        if not self._in_grace:
            if after_step is not None and self.last_step is not None:
                stale = after_step < self.last_step  # a step after the one it announced
            else:
                stale = self.last_ts is not None and ts < self.last_ts
            if stale:
                return
        self._phases.announce(phase, ts, expected_s, after_step)
        self._phase_max_s = max_s

    #: steps ahead of the last completed one a wait for input may be for (its leader's
    #: step count runs ahead of the steps assembled here)
    WAIT_LEAD_STEPS = 16

    def waiting(self, ts: float, after_step: int, *, max_s: float | None = None) -> None:
        """The job's leader has waited for the input of the step after ``after_step``
        since event time ``ts`` (its data loader, the storage behind it): until that
        step completes, the silence is allowed ``wait_steps`` median step times from
        ``ts`` (at most ``max_s``, the operator's ``STEPGUARD_MAX_PHASE_S``) before it
        counts, climbing from there as an allowance it is unsure of (:meth:`graded`).

        A wait for a step that completed already is ignored, and so is one more than
        :attr:`WAIT_LEAD_STEPS` ahead of the last completed step. Each step gets one
        allowance, from its earliest wait: a wait said again and again (a writer of
        the topic that wants a hang hidden) never moves it.

        >>> h = HangDetector(factor=2.5, min_steps=3)
        >>> for step in range(10):
        ...     h.learn_step(step, ts=float(step))
        >>> h.waiting(9.2, after_step=9)  # step 10's batch is late
        >>> h.score(9.0 + 5.0), h.score(9.0 + 15.2)  # 1.5 x 10 steps from 9.2 s
        (0.82..., 2.5)
        >>> h.waiting(14.0, after_step=9)  # said again: the allowance stays
        >>> h.learn_step(10, ts=13.0)  # it came: the next step is judged as before
        >>> h.score(13.0 + 2.5)
        2.5
        """
        if max_s is not None:
            check_positive("max_s", max_s)
        last = self.last_step
        if last is None or after_step < last or after_step > last + self.WAIT_LEAD_STEPS:
            return
        waits = self._waits
        if waits is HangDetector._waits:  # state written before waits existed
            waits = self._waits = {}
        if after_step not in waits:
            waits[after_step] = ts
        self._wait_max_s = max_s

    #: long steps remembered for the CRITICAL ceiling of :meth:`graded`
    LONG_KEPT = 8
    #: the job's recent long steps (seconds, newest last), explained or not
    long_durations: tuple[float, ...] = ()

    def graded(self, now: float) -> float:
        """The silence at event time ``now`` on the grading scale: WARNING at
        ``factor``, CRITICAL at ``critical_factor``; reads state only.

        A job that has not announced a long step, and has not taken it often enough
        for its period to be learned, may be in one: its first checkpoint saves look
        exactly like a hang for as long as they last. So past ``factor`` (the time
        :meth:`score` flags) the silence climbs linearly to ``critical_factor`` at
        the *ceiling*: ``critical_factor`` median step times, or ``long_margin``
        times the longest of the job's recent long steps (:attr:`long_durations`),
        whichever is later. With no long step seen that is :meth:`score` itself.
        A silence that overruns a long step the job announced, or whose period a
        long step that came when due confirmed, is past what that step may take:
        ``critical_factor`` at once. An allowance it is unsure of (a candidate period,
        two long steps or the run's start and one, which may have learned an eval where
        a checkpoint is due; a phase announced without a length; the step after a slow
        one) only moves the climb: it begins there and reaches ``critical_factor`` at
        ``critical_factor / factor`` times that allowance, or the ceiling if later.

        >>> h = HangDetector(factor=2.5, min_steps=3, critical_factor=8.0)
        >>> for step in range(10):
        ...     h.learn_step(step, ts=float(step))
        >>> h.graded(9.0 + 2.0), h.graded(9.0 + 5.0), h.graded(9.0 + 8.0)
        (2.0, 5.0, 8.0)
        >>> h.learn_step(10, ts=9.0 + 12.0)  # a 12 s step, none announced or learned
        >>> [round(h.graded(21.0 + t), 2) for t in (2.5, 10.0, 25.6)]  # the next may be slow
        [0.78, 3.12, 8.0]
        >>> h.learn_step(11, ts=22.0)  # it was not: the climb starts at factor again
        >>> [round(h.graded(22.0 + t), 2) for t in (2.5, 10.0, 18.0)]
        [2.5, 5.16, 8.0]
        """
        s = self.score(now)
        med = self.median_step_time
        if s < self.factor or med is None or med <= 0 or self.last_ts is None:
            return s
        long = self._long_step(med)
        if long is not None and long[3]:  # a known long step, overrun
            return s * self.critical_factor / self.factor
        silence = now - self.last_ts
        # an allowance it is unsure of (a candidate period, a phase of unknown length,
        # the step after a slow one): past it the silence climbs as an unexplained one does
        flagged = self.factor * med if long is None else long[0]
        ceiling = max(
            self.critical_factor * med, self.long_margin * max(self.long_durations, default=0.0)
        )
        if long is not None:  # past an allowance it was unsure of: the climb, scaled to it
            ceiling = max(ceiling, flagged * self.critical_factor / self.factor)
        if silence >= ceiling or ceiling <= flagged:
            return self.critical_factor * silence / max(ceiling, 1e-9)
        climb = (self.critical_factor - self.factor) * (silence - flagged) / (ceiling - flagged)
        return self.factor + climb

    #: the floor of a phase announced without a length (see the class parameters); a
    #: class default, so that state written before it existed reads it
    phase_floor_s: float = 120.0
    #: the cap of the announced phase in progress on a length it did not say (see
    #: :meth:`announce`); a class default for state written before it existed
    _phase_max_s: float | None = None

    #: waits for input by the step they follow (event time each began), at most
    #: ``WAIT_LEAD_STEPS + 1``; class defaults, so that state written before waits
    #: existed reads them (:meth:`waiting` gives an instance its own map)
    _waits: dict[int, float] = {}  # noqa: RUF012 - never written through the class
    _wait_max_s: float | None = None
    wait_steps: float = 10.0

    #: the last step's interval when it was long and nothing explained it: the next one
    #: may take as long (a job slowed down, on a storage stall, is still stepping);
    #: a class default, so that state written before it existed reads None
    _slow_s: float | None = None

    #: class defaults: state written before relaunches were learned reads them here
    _relaunch_at: float | None = None
    _relaunch_started: float | None = None
    _old_last_step: int | None = None
    #: how long the job's recent relaunches took (seconds, newest last)
    relaunch_durations: tuple[float, ...] = ()

    @property
    def relaunching_since(self) -> float | None:
        """Event time the relaunch in progress began (its first :meth:`restart` call),
        or None when none is: from then until the new run's first step the job is
        relaunching, not hung, and :meth:`score` is 0."""
        return self._relaunch_started if self._in_grace else None

    def restart(
        self, ts: float, grace_steps: float, min_s: float = 0.0, margin: float = 1.5
    ) -> None:
        """The job was relaunched at event time ``ts`` (from a checkpoint): step numbers
        start again and, until the new run's first step, the job is relaunching
        (:attr:`relaunching_since`): its silence is not a hang however long the
        relaunch takes (the suite bounds it: ``relaunch_stuck``); its silence is measured
        again from the new run's first step. ``grace_steps``, ``min_s`` and ``margin``
        are unused (the grace in step times before relaunching was a state); how long
        relaunches took is still learned (:attr:`relaunch_durations`). A step of the
        old run still in flight (it started before ``ts``) does not end the relaunch.
        The learned step-time median and periods are kept; an announced phase ends.

        >>> h = HangDetector(factor=2.5, min_steps=3)
        >>> for step in range(10):
        ...     h.learn_step(step, ts=100.0 + step, ts_start=99.0 + step)
        >>> h.restart(109.5, grace_steps=5, min_s=10.0)
        >>> h.learn_step(10, ts=110.0, ts_start=109.0)  # in flight: the old run's
        >>> h.score(119.0), h.relaunching_since  # relaunching since 109.5
        (0.0, 109.5)
        >>> h.score(109.5 + 3600.0)  # however long it takes: not a hang
        0.0
        >>> h.learn_step(9, ts=121.5, ts_start=120.5)  # the new run's first step
        >>> h.relaunch_durations, h.relaunching_since
        ((12.0,), None)
        """
        if not self._in_grace:  # a second call (the relaunch carried out) keeps these
            self._old_last_step = self.last_step
            self._relaunch_started = ts
        self._relaunch_at = ts
        self.last_step = None
        self.last_ts = ts
        self._in_grace = True
        self._phases.cancel()
        self._waits = {}

    def _of_the_old_run(self, step: int, ts: float, ts_start: float | None) -> bool:
        """Whether a step completing during a relaunch grace is a straggler of the run
        before the relaunch: it started before the relaunch (or, with no start time,
        it continues the old run's numbering and ended within a step time of it)."""
        at = self._relaunch_at
        if at is None:
            return False
        if ts_start is not None and 0 < ts_start < ts:
            return ts_start < at
        old, med = self._old_last_step, self.median_step_time or 0.0
        return old is not None and step > old and ts <= at + med

    def learn_step(self, step: int, ts: float, ts_start: float | None = None) -> None:
        """A step completed at event time ``ts``. A repeated or older step number is
        ignored, unless it is newer in event time: then the job resumed from a
        checkpoint (restart or rollback) and step numbers start again."""
        if self._in_grace and self._of_the_old_run(step, ts, ts_start):
            self._old_last_step = max(step, self._old_last_step or step)
            return  # the old run's last step in flight: the relaunch has not begun
        if self.last_step is not None and step <= self.last_step:
            if self.last_ts is None or ts <= self.last_ts:
                return
            self.last_step = None  # relaunched: count from here
        self._periods.rewind(step)
        if self.last_step is None:
            self._last_long = False
            self._periods.start(step - 1)  # a fresh job, or one resumed from a save
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
        explained = self._phases.end(ts, step)
        if self._waits:  # a step whose input it waited for: slower, not a new pace
            explained = self._waits.get(step - 1) is not None or explained
            self._waits = {k: v for k, v in self._waits.items() if k >= step}
        if is_long and interval is not None:
            self.long_durations = (*self.long_durations[-(self.LONG_KEPT - 1) :], interval)
            isolated = not self._last_long
            explained = self._periods.learn(step, interval, isolated=isolated) or explained
        self._last_long = is_long
        self._slow_s = interval if is_long and not explained else None
        self._periods.expire(step)
        if interval is not None and interval > 0 and not (is_long and explained):
            self._intervals[self._count % self.window] = interval
            self._count += 1
        self.last_step = step
        if self._in_grace:  # the first step of the new run ends the grace
            if self._relaunch_started is not None and ts > self._relaunch_started:
                took = ts - self._relaunch_started
                self.relaunch_durations = (*self.relaunch_durations[-3:], took)
            self.last_ts, self._in_grace = ts, False
            self._relaunch_at = self._relaunch_started = self._old_last_step = None
        else:
            self.last_ts = ts if self.last_ts is None else max(ts, self.last_ts)
