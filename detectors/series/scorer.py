"""Strictly causal, calibrated anomaly scores for metric series (``stepguard score-series``).

Every numeric column is watched by robust baselines with long and short memory, on
the column itself and, when timestamps allow it, on the column less a daily or weekly
seasonal profile (:mod:`detectors.series.season`). Each baseline yields four raw
statistics, each a robust z that tells one kind of change apart:

========  ====================================================================
spike     the value against the short-memory level (``shift_memory`` rows),
          in units of the long-run spread around that level
shift     the short-memory level against the long-memory level (``long_memory``
          rows): an abrupt level shift
drift     a medium-memory level (``drift_memory`` rows) against the long level:
          a slow drift
variance  log ratio of the short-memory spread (``variance_memory`` rows) to the
          long-run spread: the noise grew or shrank
========  ====================================================================

Spreads are exponentially weighted mean absolute deviations (Gaussian-consistent,
clipped so one outlier moves them little) floored at half the series' quantum (the
smallest step between two values: counts and rounded gauges are not scored as if
continuous). Learning is robust: values are clipped (Huber) before the baselines
learn them, a row whose spike is alarming is learned clipped, and a shift, drift or
variance alarm that lasts its statistic's memory re-anchors the long baseline (the
new regime becomes normal instead of alarming for a whole long memory).

Calibration. Each statistic's magnitude is judged against its own long-run
distribution on this series (:class:`detectors.series.calibration.TailCalibrator`):
autocorrelation, heavy tails and quantization are learned, not assumed. A column's
tail probability is its rarest statistic's, times 4 (Bonferroni); a row's is its
rarest column's, times the number of columns scored. The score is
``L / (L + log(rarity))`` with ``L = -log p``: **0.5 means "rarer than one row in
rarity"** (10,000 by default) on every series, near 1 means far rarer, 0 means
ordinary. A row is scored from earlier rows only (score, then learn), so appending
rows never changes an earlier score. Missing values (None / NaN) are neither scored
nor learned, values beyond 1e100 in magnitude are scored but not learned; the first
``warmup`` values of a column score 0.

Seasonality (``season``): ``"none"``; ``"auto"`` (a day and a week are tried when the
rows carry timestamps in seconds and a period spans at least 12 rows; a seasonal
baseline is used once it has seen a whole period, its calibration (started afresh then)
holds 256 values, and its fit (a very long-run spread around its level, kept apart
from the re-anchoring) is below 0.8 times the plain baseline's, and then while it stays
below the plain one's); or a period in seconds (that period only, same rule).

Examples
--------
>>> s = SeriesScorer(warmup=5)
>>> rows = [{"step_time": 1.0 + 0.01 * (i % 3)} for i in range(30)] + [{"step_time": 2.0}]
>>> scores = s.score_rows(rows)
>>> scores[:5], max(scores[5:-1]) < 0.5, scores[-1] > 0.9
([0.0, 0.0, 0.0, 0.0, 0.0], True, True)
>>> s.explain_one({"step_time": 2.0}).kind
'spike'
>>> [round(v, 3) for v in score_series(range(5), {"a": [1.0, None, 2.0, 1.5, 1.0]}, warmup=3)]
[0.0, 0.0, 0.0, 0.0, 0.008]
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from detectors.series.calibration import TailCalibrator, calibrated_score
from detectors.series.season import SeasonalProfile

__all__ = ["KINDS", "SeriesScore", "SeriesScorer", "score_series"]

Row = Mapping[str, float | None]

#: The raw statistics, in the order a column model reports them.
KINDS: tuple[str, ...] = ("spike", "shift", "drift", "variance")

DAY = 86400.0
WEEK = 7 * DAY
_GAUSS_SD_PER_MAD = math.sqrt(math.pi / 2.0)  # sd / mean |x - mu| for a normal
_REL_SD_OF_MAD = math.sqrt(math.pi / 2.0 - 1.0)  # sd(|N|) / E|N|
_LOG_KINDS = math.log(len(KINDS))
_HUBER = 3.0
_FAST_CLIP = 5.0
_SEASON_MARGIN = 0.8
_AUTO_PERIODS = (DAY, WEEK)
_MIN_ROWS_PER_PERIOD = 12
_INTERVAL_SAMPLES = 32
#: Values beyond this magnitude are scored but never learned: differences of such
#: values overflow and would leave the baselines without a number.
_MAX_LEARNED = 1e100


@dataclass(frozen=True, slots=True)
class SeriesScore:
    """One row's score and what drove it.

    ``column`` and ``kind`` (one of :data:`KINDS`) name the rarest statistic (None
    when nothing was scored); ``seasonal`` is the period in seconds of the baseline
    that scored that column, or None for the plain one; ``log_p`` is the row's
    natural-log tail probability.
    """

    score: float
    column: str | None = None
    kind: str | None = None
    seasonal: float | None = None
    log_p: float = 0.0


@dataclass(frozen=True, slots=True)
class _Eval:
    """One value of one column as every baseline sees it (``stats[i]`` is ``(z, log
    tails)`` of baseline ``i``: 0 plain, then the seasons; None while warming)."""

    floor: float
    stats: list[tuple[list[float], list[float]] | None]
    chosen: int | None


@dataclass(frozen=True, slots=True)
class _Memory:
    long: float
    shift: float
    drift: float
    variance: float


class _Baseline:
    """Robust level/spread baselines of one residual stream and their four statistics."""

    __slots__ = (
        "_warm",
        "cals",
        "fast",
        "fit",
        "fit_n",
        "fresh",
        "level",
        "medium",
        "n",
        "runs",
        "short_dev",
        "spread_fast",
        "spread_level",
    )

    def __init__(self) -> None:
        self.n = 0
        self._warm: list[float] = []
        self.level = self.fast = self.medium = 0.0
        self.spread_level = self.spread_fast = self.short_dev = 0.0
        self.cals = tuple(TailCalibrator() for _ in KINDS)
        self.runs = [0] * len(KINDS)
        # How well this baseline fits normal data, for choosing among baselines: a
        # very long EW mean absolute deviation from the level that no re-anchoring
        # touches (an anomaly must not make a baseline look like a bad model).
        self.fit = 0.0
        self.fit_n = 0
        self.fresh = False  # calibration started afresh (seasonal: profile ready)

    def fit_sigma(self, floor: float) -> float:
        return max(_GAUSS_SD_PER_MAD * self.fit, floor)

    def sigma_level(self, floor: float) -> float:
        return max(_GAUSS_SD_PER_MAD * self.spread_level, floor)

    def sigma_fast(self, floor: float) -> float:
        return max(_GAUSS_SD_PER_MAD * self.spread_fast, floor)

    def stats(self, y: float, floor: float, mem: _Memory) -> tuple[float, float, float, float]:
        s_fast, s_level = self.sigma_fast(floor), self.sigma_level(floor)
        a_f, a_m, a_v = 1.0 / mem.shift, 1.0 / mem.drift, 1.0 / mem.variance
        spike = (y - self.fast) / s_fast
        shift = (self.fast - self.level) / (s_level * math.sqrt(a_f / (2.0 - a_f)))
        drift = (self.medium - self.level) / (s_level * math.sqrt(a_m / (2.0 - a_m)))
        dev_floor = floor / _GAUSS_SD_PER_MAD
        ratio = max(self.short_dev, dev_floor) / max(self.spread_fast, dev_floor)
        variance = math.log(ratio) / (_REL_SD_OF_MAD * math.sqrt(a_v / (2.0 - a_v)))
        return spike, shift, drift, variance

    def log_tails(self, z: Sequence[float]) -> list[float]:
        return [cal.log_tail(v) for cal, v in zip(self.cals, z, strict=True)]

    def learn(
        self,
        y: float,
        floor: float,
        mem: _Memory,
        z: Sequence[float] | None,
        alarms: Sequence[bool],
        log_alarm: float = 0.0,
    ) -> None:
        if z is None:
            self._warm.append(y)
            return
        for cal, value, alarm in zip(self.cals, z, alarms, strict=True):
            # An alarming value is learned as the alarm threshold itself: it counts as
            # large (a heavy tail is still learned, slowly) but cannot fatten the tail
            # beyond what already alarms (two spikes must not hide a third).
            cal.add(min(abs(value), cal.threshold(log_alarm)) if alarm else value)
        self.n += 1
        a_l = max(1.0 / mem.long, 1.0 / self.n)
        a_f, a_m, a_v = 1.0 / mem.shift, max(1.0 / mem.drift, 1.0 / self.n), 1.0 / mem.variance
        s_fast, s_level = self.sigma_fast(floor), self.sigma_level(floor)
        dev_fast = y - self.fast
        if alarms[0]:
            # Do not learn the fault: a spike is learned as a value at the clip.
            y = self.fast + min(max(dev_fast, -_HUBER * s_fast), _HUBER * s_fast)
        dev_level = y - self.level
        dev_cap = (_HUBER if alarms[0] else 10.0) * s_fast
        self.short_dev += a_v * (min(abs(dev_fast), dev_cap) - self.short_dev)
        self.spread_fast += a_l * (min(abs(dev_fast), 4.0 * s_fast) - self.spread_fast)
        self.spread_level += a_l * (min(abs(dev_level), 4.0 * s_level) - self.spread_level)
        self.fit_n += 1
        a_fit = max(1.0 / (4.0 * mem.long), 1.0 / self.fit_n)
        self.fit += a_fit * (min(abs(dev_level), 4.0 * s_level) - self.fit)
        self.level += a_l * min(max(dev_level, -_HUBER * s_level), _HUBER * s_level)
        self.fast += a_f * min(max(y - self.fast, -_FAST_CLIP * s_fast), _FAST_CLIP * s_fast)
        self.medium += a_m * min(max(y - self.medium, -_FAST_CLIP * s_level), _FAST_CLIP * s_level)
        self._reanchor(alarms, mem)

    def _reanchor(self, alarms: Sequence[bool], mem: _Memory) -> None:
        for i, on in enumerate(alarms):
            self.runs[i] = self.runs[i] + 1 if on else 0
        if self.runs[1] >= mem.shift:
            self.level = self.medium = self.fast
            self.runs[1] = self.runs[2] = 0
        elif self.runs[2] >= mem.drift:
            self.level = self.medium
            self.runs[2] = 0
        if self.runs[3] >= mem.variance:
            ratio = self.short_dev / self.spread_fast if self.spread_fast > 0 else 1.0
            self.spread_fast = self.short_dev
            self.spread_level *= ratio
            self.runs[3] = 0

    def recalibrate(self) -> None:
        """Forget the calibration and the fit (after the seasonal profile became ready)."""
        self.cals = tuple(TailCalibrator() for _ in KINDS)
        self.runs = [0] * len(KINDS)
        self.fit, self.fit_n, self.fresh = 0.0, 0, True

    def start(self) -> None:
        """End the warm-up: median level, mean absolute deviation spread."""
        values = sorted(self._warm)
        mid = len(values) // 2
        median = values[mid] if len(values) % 2 else 0.5 * (values[mid - 1] + values[mid])
        mad = sum(abs(v - median) for v in values) / len(values)
        self.level = self.fast = self.medium = median
        self.spread_level = self.spread_fast = self.short_dev = mad
        self.n = len(values)
        self._warm = []

    @property
    def seasoned(self) -> bool:
        """Whether the calibration has as many values as its prior weighs (a seasonal
        baseline is chosen only then: its first period's statistics are not its normal)."""
        return self.fresh and all(cal.size >= cal.prior_weight for cal in self.cals)

    @property
    def warm_count(self) -> int:
        return len(self._warm)

    @property
    def warming(self) -> bool:
        return bool(self._warm) or self.n == 0


class _Column:
    """One column: its quantum, the plain baseline and any seasonal ones."""

    __slots__ = (
        "_intervals",
        "_last_ts",
        "active",
        "last",
        "plain",
        "quantum",
        "seasons",
        "values",
    )

    def __init__(self) -> None:
        self.values = 0
        self.last: float | None = None
        self.quantum = math.inf
        self.plain = _Baseline()
        self.seasons: list[tuple[SeasonalProfile, _Baseline]] = []
        self._intervals: list[float] = []
        self._last_ts: float | None = None
        self.active: int | None = None  # the baseline that scored the last value

    def floor(self) -> float:
        level = abs(self.plain.level)
        q = 0.5 * self.quantum if math.isfinite(self.quantum) else 0.0
        return max(q, 1e-9 * level, 1e-12)

    def interval(self) -> float | None:
        if len(self._intervals) < 8:
            return None
        ordered = sorted(self._intervals)
        return ordered[len(ordered) // 2]

    def note_time(self, ts: float) -> None:
        if self._last_ts is not None and len(self._intervals) < _INTERVAL_SAMPLES:
            dt = ts - self._last_ts
            if dt > 0 and math.isfinite(dt):
                self._intervals.append(dt)
        self._last_ts = ts


class SeriesScorer:
    """Calibrated, strictly causal anomaly scores in ``[0, 1]`` for rows of metrics.

    Parameters
    ----------
    warmup
        Values a column needs before it is scored (at least 3).
    long_memory
        Rows the long-memory level and spreads remember (EW time constant).
    shift_memory
        Rows of the short-memory level (spikes are judged against it; shifts are
        this level against the long one).
    drift_memory
        Rows of the medium-memory level whose departure is a drift.
    variance_memory
        Rows of the short-memory spread whose ratio to the long one is a variance change.
    rarity
        A score of 0.5 means a row as rare as one in ``rarity`` on this series.
    season
        ``"auto"``, ``"none"`` or a period in seconds (see the module docstring).
    max_columns
        At most this many distinct columns are tracked; further ones raise ``ValueError``.
        A column holds about 0.4 MB (three baselines of four 2048-value calibrations).

    Examples
    --------
    >>> SeriesScorer(season="hourly")
    Traceback (most recent call last):
    ...
    ValueError: season must be 'auto', 'none' or a period in seconds > 0, got 'hourly'
    """

    def __init__(
        self,
        warmup: int = 10,
        long_memory: float = 250.0,
        shift_memory: float = 4.0,
        drift_memory: float = 25.0,
        variance_memory: float = 12.0,
        rarity: float = 1e4,
        season: str | float = "auto",
        max_columns: int = 1024,
    ) -> None:
        if warmup < 3:
            raise ValueError(f"warmup must be >= 3, got {warmup!r}")
        if not 1 <= shift_memory < drift_memory < long_memory:
            raise ValueError(
                "need 1 <= shift_memory < drift_memory < long_memory, got "
                f"shift_memory={shift_memory!r}, drift_memory={drift_memory!r}, "
                f"long_memory={long_memory!r}"
            )
        if not 1 <= variance_memory < long_memory:
            raise ValueError(
                f"variance_memory must be in [1, long_memory), got {variance_memory!r}"
            )
        if not rarity > 1:
            raise ValueError(f"rarity must be > 1, got {rarity!r}")
        if max_columns < 1:
            raise ValueError(f"max_columns must be >= 1, got {max_columns!r}")
        self.warmup = int(warmup)
        self.long_memory = float(long_memory)
        self.shift_memory = float(shift_memory)
        self.drift_memory = float(drift_memory)
        self.variance_memory = float(variance_memory)
        self.rarity = float(rarity)
        self.season = season
        self.periods = _periods(season)
        self.max_columns = max_columns
        self._mem = _Memory(
            self.long_memory, self.shift_memory, self.drift_memory, self.variance_memory
        )
        self._log_alarm = -math.log(self.rarity)
        self._columns: dict[str, _Column] = {}

    # -- scoring (reads state only) ---------------------------------------------------

    def _evaluate(self, col: _Column, x: float, ts: float | None) -> _Eval:
        """Every baseline's statistics and tails for ``x``, and the one that scores it."""
        floor = col.floor()
        bases = [(None, col.plain), *col.seasons]
        stats: list[tuple[list[float], list[float]] | None] = []
        chosen, best_sigma, plain_sigma = None, math.inf, math.inf
        for i, (profile, base) in enumerate(bases):
            if base.warming or (profile is not None and ts is None):
                stats.append(None)
                continue
            y = x if profile is None or ts is None else x - profile.value(ts)
            z = list(base.stats(y, floor, self._mem))
            stats.append((z, base.log_tails(z)))
            sigma = base.fit_sigma(floor)
            if profile is None:
                chosen, plain_sigma = 0, sigma
                continue
            # Hysteresis: a seasonal baseline must beat the plain one by the margin to
            # be chosen, and stays chosen while it is no worse than the plain one.
            margin = 1.0 if col.active == i else _SEASON_MARGIN
            usable = ts is not None and base.seasoned and profile.ready(ts)
            if usable and sigma < margin * plain_sigma and sigma < best_sigma:
                chosen, best_sigma = i, sigma
        return _Eval(floor, stats, chosen)

    def _score(self, evals: Mapping[str, _Eval], scored: int) -> SeriesScore:
        best: tuple[float, str, int, float | None] | None = None
        for name, ev in evals.items():
            if ev.chosen is None:
                continue
            entry = ev.stats[ev.chosen]
            assert entry is not None
            tails = entry[1]
            k = min(range(len(tails)), key=tails.__getitem__)
            if best is None or tails[k] < best[0]:
                col = self._columns[name]
                period = None if ev.chosen == 0 else col.seasons[ev.chosen - 1][0].period
                best = (tails[k], name, k, period)
        if best is None:
            return SeriesScore(0.0)
        log_p = min(best[0] + _LOG_KINDS + math.log(max(scored, 1)), 0.0)
        return SeriesScore(
            calibrated_score(log_p, self.rarity), best[1], KINDS[best[2]], best[3], log_p
        )

    def _evaluate_row(self, row: Row, ts: float | None) -> dict[str, _Eval]:
        evals = {}
        for name, value in row.items():
            col = self._columns.get(name)
            if col is None or value is None or not math.isfinite(value):
                continue
            evals[name] = self._evaluate(col, float(value), ts)
        return evals

    def explain_one(self, row: Row, ts: float | None = None) -> SeriesScore:
        """Score of one row and what drove it; reads state only.

        ``ts`` is the row's time in seconds (for seasonal baselines), or None.
        """
        evals = self._evaluate_row(row, _finite(ts))
        return self._score(evals, sum(ev.chosen is not None for ev in evals.values()))

    def score_one(self, row: Row, ts: float | None = None) -> float:
        """Score of one row in ``[0, 1]``; reads state only."""
        return self.explain_one(row, ts).score

    # -- learning -----------------------------------------------------------------------

    def learn_one(self, row: Row, ts: float | None = None) -> None:
        """Learn one row (robustly); missing values are skipped."""
        t = _finite(ts)
        self._learn(row, t, self._evaluate_row(row, t))

    def step_one(self, row: Row, ts: float | None = None) -> SeriesScore:
        """Score one row, then learn it (what :meth:`score_rows` does per row)."""
        t = _finite(ts)
        evals = self._evaluate_row(row, t)
        result = self._score(evals, sum(ev.chosen is not None for ev in evals.values()))
        self._learn(row, t, evals)
        return result

    def _learn(self, row: Row, ts: float | None, evals: Mapping[str, _Eval]) -> None:
        for name, value in row.items():
            if value is None or not abs(value) <= _MAX_LEARNED:
                continue
            col = self._columns.get(name)
            if col is None:
                if len(self._columns) >= self.max_columns:
                    raise ValueError(
                        f"more than max_columns={self.max_columns} columns (new column {name!r})"
                    )
                col = self._columns[name] = _Column()
            x = float(value)
            ev = evals.get(name) or self._evaluate(col, x, ts)
            self._learn_column(col, x, ts, ev)

    def _learn_column(self, col: _Column, x: float, ts: float | None, ev: _Eval) -> None:
        floor = ev.floor
        self._learn_base(col.plain, x, floor, ev.stats[0])
        step = _HUBER * col.plain.sigma_level(floor)
        for (profile, base), entry in zip(col.seasons, ev.stats[1:], strict=True):
            if ts is None:
                continue
            alarms = self._learn_base(base, x - profile.value(ts), floor, entry)
            if not base.warming and not alarms[0]:
                profile.learn(ts, x - base.level, step)
            if not base.fresh and profile.ready(ts):
                # The statistics seen while the profile was learning are not this
                # baseline's normal: calibrate afresh from here.
                base.recalibrate()
        col.active = ev.chosen
        if col.last is not None and x != col.last:
            col.quantum = min(col.quantum, abs(x - col.last))
        col.last = x
        col.values += 1
        if ts is not None:
            col.note_time(ts)
            self._add_seasons(col)

    def _learn_base(
        self,
        base: _Baseline,
        y: float,
        floor: float,
        entry: tuple[list[float], list[float]] | None,
    ) -> list[bool]:
        if entry is None:
            base.learn(y, floor, self._mem, None, ())
            if base.warm_count >= self.warmup:
                base.start()
            return [False] * len(KINDS)
        z, tails = entry
        log_alarm = self._log_alarm - _LOG_KINDS
        alarms = [t <= log_alarm for t in tails]
        base.learn(y, floor, self._mem, z, alarms, log_alarm)
        return alarms

    def _add_seasons(self, col: _Column) -> None:
        if col.seasons or not self.periods:
            return
        interval = col.interval()
        if interval is None:
            return
        for period in self.periods:
            if period / interval >= _MIN_ROWS_PER_PERIOD:
                col.seasons.append((SeasonalProfile(period, interval), _Baseline()))

    def score_rows(
        self, rows: Iterable[Row], timestamps: Iterable[float | None] | None = None
    ) -> list[float]:
        """Score then learn each row in order: strictly causal scores."""
        times = iter(timestamps) if timestamps is not None else None
        return [
            self.step_one(row, next(times, None) if times is not None else None).score
            for row in rows
        ]


def _finite(ts: float | None) -> float | None:
    return ts if ts is not None and math.isfinite(ts) else None


def _periods(season: str | float) -> tuple[float, ...]:
    if isinstance(season, str):
        if season == "auto":
            return _AUTO_PERIODS
        if season == "none":
            return ()
        try:
            season = float(season)
        except ValueError:
            raise ValueError(
                f"season must be 'auto', 'none' or a period in seconds > 0, got {season!r}"
            ) from None
    if isinstance(season, bool) or not math.isfinite(season) or season <= 0:
        raise ValueError(
            f"season must be 'auto', 'none' or a period in seconds > 0, got {season!r}"
        )
    return (float(season),)


def score_series(
    timestamps: Sequence[object],
    columns: Mapping[str, Sequence[float | None]],
    times: Sequence[float | None] | None = None,
    **params: float | str,
) -> list[float]:
    """Score a column-oriented series (one score per timestamp, in the given order).

    ``times`` are the rows' times in seconds (for seasonality), if known; ``params``
    are passed to :class:`SeriesScorer`.
    """
    n = len(timestamps)
    for name, values in columns.items():
        if len(values) != n:
            raise ValueError(f"column {name!r} has {len(values)} values for {n} timestamps")
    if times is not None and len(times) != n:
        raise ValueError(f"times has {len(times)} values for {n} timestamps")
    scorer = SeriesScorer(**params)  # type: ignore[arg-type]
    rows = ({k: v[i] for k, v in columns.items()} for i in range(n))
    return scorer.score_rows(rows, times)
