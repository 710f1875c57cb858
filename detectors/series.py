"""Strictly causal anomaly scores for exported metric series (``stepguard score-series``).

Each numeric column keeps a River ``stats.EWMean`` / ``stats.EWVar`` baseline. A row is
scored against the baselines *before* it is learned, so a row's score depends on
earlier rows only. The per-column robust deviation ``z = |x - mean| / sd`` (``sd``
floored at ``rel_floor * |mean|`` and ``abs_floor``) maps to ``[0, 1]`` as
``1 - exp(-max(z - z_offset, 0) / z_scale)``; a row's score is the maximum over its
columns. Learning is winsorised: a value is clipped to ``mean ± clip_z * sd`` before it
is learned, so a spike barely moves the baseline while a lasting level shift is
absorbed gradually. Missing values (None / NaN) are neither scored nor learned. The
first ``warmup`` values of a column score 0.

Examples
--------
>>> s = SeriesScorer(warmup=5)
>>> rows = [{"step_time": 1.0 + 0.01 * (i % 3)} for i in range(20)] + [{"step_time": 2.0}]
>>> scores = s.score_rows(rows)
>>> scores[:5], round(scores[-2], 3), round(scores[-1], 3)
([0.0, 0.0, 0.0, 0.0, 0.0], 0.0, 1.0)
>>> score_series([0, 1, 2], {"a": [1.0, None, 1.0]}, warmup=1)
[0.0, 0.0, 0.0]
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from river import stats

from detectors.base import check_non_negative, check_positive

__all__ = ["SeriesScorer", "score_series"]

Row = Mapping[str, float | None]


class _Column:
    __slots__ = ("mean", "n", "var")

    def __init__(self, fading_factor: float) -> None:
        self.mean = stats.EWMean(fading_factor)
        self.var = stats.EWVar(fading_factor)
        self.n = 0


class SeriesScorer:
    """Per-column EW baselines and a causal anomaly score in ``[0, 1]`` per row.

    Parameters
    ----------
    fading_factor
        Weight of a new value in the EW mean and variance (River's ``fading_factor``).
    warmup
        Values a column needs before it is scored.
    z_offset
        Deviations up to this many standard deviations score 0.
    z_scale
        Standard deviations beyond ``z_offset`` that bring the score to ``1 - 1/e``.
    clip_z
        Values are clipped to ``mean ± clip_z * sd`` before being learned.
    rel_floor
        Floor of ``sd`` as a fraction of ``|mean|``.
    abs_floor
        Absolute floor of ``sd``.
    """

    def __init__(
        self,
        fading_factor: float = 0.05,
        warmup: int = 10,
        z_offset: float = 3.0,
        z_scale: float = 3.0,
        clip_z: float = 3.0,
        rel_floor: float = 0.01,
        abs_floor: float = 1e-9,
    ) -> None:
        if not 0 < fading_factor <= 1:
            raise ValueError(f"fading_factor must be in (0, 1], got {fading_factor!r}")
        if warmup < 1:
            raise ValueError(f"warmup must be >= 1, got {warmup!r}")
        check_non_negative("z_offset", z_offset)
        check_positive("z_scale", z_scale)
        check_positive("clip_z", clip_z)
        check_non_negative("rel_floor", rel_floor)
        check_positive("abs_floor", abs_floor)
        self.fading_factor = fading_factor
        self.warmup = warmup
        self.z_offset = z_offset
        self.z_scale = z_scale
        self.clip_z = clip_z
        self.rel_floor = rel_floor
        self.abs_floor = abs_floor
        self._columns: dict[str, _Column] = {}

    def _sd(self, col: _Column) -> float:
        mean = col.mean.get()
        return max(math.sqrt(max(col.var.get(), 0.0)), self.rel_floor * abs(mean), self.abs_floor)

    def score_column(self, name: str, x: float | None) -> float:
        """Score of one value of one column; 0 while warming up or when missing."""
        col = self._columns.get(name)
        if x is None or not math.isfinite(x) or col is None or col.n < self.warmup:
            return 0.0
        z = abs(x - col.mean.get()) / self._sd(col)
        return 1.0 - math.exp(-max(z - self.z_offset, 0.0) / self.z_scale)

    def score_one(self, row: Row) -> float:
        """Score of one row (max over its columns); reads state only."""
        return max((self.score_column(k, v) for k, v in row.items()), default=0.0)

    def learn_one(self, row: Row) -> None:
        """Learn one row (winsorised); missing values are skipped."""
        for name, value in row.items():
            if value is None or not math.isfinite(value):
                continue
            x = value
            col = self._columns.get(name)
            if col is None:
                col = self._columns[name] = _Column(self.fading_factor)
            if col.n >= self.warmup:
                mean, sd = col.mean.get(), self._sd(col)
                x = min(max(x, mean - self.clip_z * sd), mean + self.clip_z * sd)
            col.mean.update(x)
            col.var.update(x)
            col.n += 1

    def score_rows(self, rows: Iterable[Row]) -> list[float]:
        """Score then learn each row in order: strictly causal scores."""
        out = []
        for row in rows:
            out.append(self.score_one(row))
            self.learn_one(row)
        return out


def score_series(
    timestamps: Sequence[object],
    columns: Mapping[str, Sequence[float | None]],
    **params: float,
) -> list[float]:
    """Score a column-oriented series (one score per timestamp, in the given order).

    ``params`` are passed to :class:`SeriesScorer`.
    """
    n = len(timestamps)
    for name, values in columns.items():
        if len(values) != n:
            raise ValueError(f"column {name!r} has {len(values)} values for {n} timestamps")
    scorer = SeriesScorer(**params)  # type: ignore[arg-type]
    rows = ({k: v[i] for k, v in columns.items()} for i in range(n))
    return scorer.score_rows(rows)
