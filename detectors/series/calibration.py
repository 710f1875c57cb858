"""Tail calibration of raw series statistics: how rare is this value, for this series.

A raw statistic (a robust z of a value, of a short mean, of a short spread) means
different things on different series: autocorrelation widens the spread of a short
mean, heavy tails make 6-sigma values routine, quantization piles values up. A
:class:`TailCalibrator` keeps the statistic's own recent long-run distribution (a
bounded ring buffer of magnitudes) and answers the tail probability of a new value:
the empirical fraction at least as large below the buffer's 90th percentile, and a
generalised Pareto tail fitted to the excesses above it (probability-weighted moments,
Hosking & Wallis 1987; the shape raised by one standard error of its estimate and
clamped to ``[0, 0.9]``, so never lighter than an exponential tail) beyond it. Until
the buffer fills, the answer is a mixture with a half-normal prior, weighted by the
number of values seen; the mixture is never less conservative than its larger part.
Everything is in natural-log probability so that values far beyond anything seen do
not underflow.

:func:`calibrated_score` maps a log tail probability to ``[0, 1]``:
``L / (L + log(rarity))`` with ``L = -log p``, so a score of 0.5 means "as rare as
one row in ``rarity``" on every series.

Examples
--------
>>> import math, random
>>> rng = random.Random(0)
>>> cal = TailCalibrator(capacity=512, prior_weight=64)
>>> for _ in range(2000):
...     cal.add(abs(rng.gauss(0.0, 3.0)))   # a series whose "z" is really 3 times wider
>>> round(math.exp(cal.log_tail(3.0)), 1)    # a 3 is routine here (p ~ 0.32)
0.3
>>> cal.log_tail(30.0) < math.log(1e-4)
True
>>> round(calibrated_score(math.log(1e-4), rarity=1e4), 12)
0.5
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["TailCalibrator", "calibrated_score", "log_normal_tail"]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def log_normal_tail(z: float) -> float:
    """Natural log of ``P(|N(0, 1)| >= z)`` for ``z >= 0``, finite for any finite ``z``.

    Examples
    --------
    >>> round(math.exp(log_normal_tail(1.959964)), 4)
    0.05
    >>> log_normal_tail(100.0) < -5000
    True
    """
    z = abs(z)
    if z < 30.0:
        return math.log(max(math.erfc(z / math.sqrt(2.0)), 1e-300))
    # Mills ratio asymptote: P(Z >= z) ~ phi(z) / z, doubled for |Z|.
    return math.log(2.0) - 0.5 * z * z - _LOG_SQRT_2PI - math.log(z)


def calibrated_score(log_p: float, rarity: float) -> float:
    """Score in ``[0, 1]`` of a log tail probability; 0.5 at ``p = 1 / rarity``.

    Examples
    --------
    >>> calibrated_score(0.0, 1e4), calibrated_score(-math.inf, 1e4)
    (0.0, 1.0)
    >>> round(calibrated_score(math.log(1e-8), 1e4), 3)
    0.667
    """
    if rarity <= 1.0:
        raise ValueError(f"rarity must be > 1, got {rarity!r}")
    if log_p >= 0.0:
        return 0.0
    if math.isinf(log_p):
        return 1.0
    surprise = -log_p
    return surprise / (surprise + math.log(rarity))


class TailCalibrator:
    """Long-run distribution of one non-negative statistic and its tail probability.

    Parameters
    ----------
    capacity
        Values kept (a ring buffer; the oldest is forgotten first).
    prior_weight
        Pseudo-count of the half-normal prior; the empirical part weighs
        ``n / (n + prior_weight)`` after ``n`` values.
    refit_every
        Values between two refits of the sorted copy and the tail fit.
    tail_fraction
        Fraction of the buffer above the tail threshold (fitted by a Pareto tail).

    Examples
    --------
    >>> cal = TailCalibrator()
    >>> round(math.exp(cal.log_tail(1.96)), 3)        # no data: the half-normal prior
    0.05
    >>> TailCalibrator(capacity=4)
    Traceback (most recent call last):
    ...
    ValueError: capacity must be >= 32, got 4
    """

    __slots__ = (
        "_buf",
        "_count",
        "_frac",
        "_pos",
        "_scale",
        "_shape",
        "_since_fit",
        "_sorted",
        "_u",
        "capacity",
        "prior_weight",
        "refit_every",
        "tail_fraction",
    )

    def __init__(
        self,
        capacity: int = 2048,
        prior_weight: float = 256.0,
        refit_every: int = 64,
        tail_fraction: float = 0.1,
    ) -> None:
        if capacity < 32:
            raise ValueError(f"capacity must be >= 32, got {capacity!r}")
        if not prior_weight > 0:
            raise ValueError(f"prior_weight must be > 0, got {prior_weight!r}")
        if refit_every < 1:
            raise ValueError(f"refit_every must be >= 1, got {refit_every!r}")
        if not 0.01 <= tail_fraction <= 0.5:
            raise ValueError(f"tail_fraction must be in [0.01, 0.5], got {tail_fraction!r}")
        self.capacity = capacity
        self.prior_weight = float(prior_weight)
        self.refit_every = refit_every
        self.tail_fraction = tail_fraction
        self._buf = np.zeros(capacity)
        self._pos = 0
        self._count = 0
        self._since_fit = 0
        self._sorted = np.zeros(0)
        self._u = math.inf
        self._frac = 0.0
        self._scale = 1.0
        self._shape = 0.0

    @property
    def size(self) -> int:
        """Values currently in the buffer."""
        return min(self._count, self.capacity)

    def add(self, value: float) -> None:
        """Learn one value (its magnitude); non-finite values are ignored."""
        if not math.isfinite(value):
            return
        self._buf[self._pos] = abs(value)
        self._pos = (self._pos + 1) % self.capacity
        self._count += 1
        self._since_fit += 1
        n = self._count
        # Refit often while the buffer is young (doubling sizes), then every refit_every.
        young = 16 <= n < self.refit_every and n & (n - 1) == 0
        if young or self._since_fit >= self.refit_every:
            self._refit()

    def quantile(self, q: float) -> float:
        """The ``q`` quantile of the values as of the last refit (inf when none)."""
        m = len(self._sorted)
        if not m:
            return math.inf
        return float(self._sorted[min(int(q * m), m - 1)])

    def _refit(self) -> None:
        self._since_fit = 0
        data = np.sort(self._buf[: self.size])
        self._sorted = data
        m = len(data)
        k = max(int(self.tail_fraction * m), 8)
        if m < 2 * k:
            self._u, self._frac = math.inf, 0.0
            return
        u = float(data[m - k - 1])
        excess = data[m - k :] - u
        self._u, self._frac = u, k / m
        # Probability-weighted moments of the excesses (ascending order i = 0..k-1):
        # a0 = mean, a1 = mean(x_i * (k-1-i) / (k-1)) estimates E[X (1 - F(X))];
        # GPD shape xi = 2 - a0 / (a0 - 2 a1) (Hosking & Wallis 1987, their k = -xi).
        a0 = float(excess.mean())
        a1 = float((excess * np.arange(k - 1, -1, -1) / (k - 1)).mean())
        denom = a0 - 2.0 * a1
        if a0 <= 0.0 or denom <= 0.0:
            # Tied excesses (quantized values): an exponential tail that continues the
            # fall from the median to the threshold.
            median = float(data[m // 2])
            spread = (u - median) / math.log(0.5 / self._frac) if self._frac < 0.5 else 0.0
            self._shape, self._scale = 0.0, max(a0, spread, 1e-12)
            return
        shape = 2.0 - a0 / denom
        # Claim no rarer tail than the data support: the shape is raised by one
        # approximate standard error of its estimate (4 / (3 k) at shape 0, growing
        # with the shape), clamped to [0, 0.9], and the scale refitted so the mean
        # excess (scale / (1 - shape)) is kept.
        shape += (1.0 + max(shape, 0.0)) * math.sqrt(4.0 / (3.0 * k))
        self._shape = min(max(shape, 0.0), 0.9)
        self._scale = max(a0 * (1.0 - self._shape), 1e-12)

    def _log_empirical(self, z: float) -> float:
        m = len(self._sorted)
        if z <= self._u:
            at_least = m - int(np.searchsorted(self._sorted, z, side="left"))
            return math.log(max(at_least, 0.5) / m)
        y = (z - self._u) / self._scale
        log_sf = -math.log1p(self._shape * y) / self._shape if self._shape > 1e-6 else -y
        return math.log(self._frac) + log_sf

    def threshold(self, log_p: float) -> float:
        """The smallest magnitude whose log tail probability is at most ``log_p`` (< 0).

        Examples
        --------
        >>> round(TailCalibrator().threshold(math.log(0.05)), 2)
        1.96
        """
        if not log_p < 0:
            raise ValueError(f"log_p must be < 0, got {log_p!r}")
        lo, hi = 0.0, 1.0
        while self.log_tail(hi) > log_p and hi < 1e300:
            lo, hi = hi, hi * 2.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if self.log_tail(mid) > log_p:
                lo = mid
            else:
                hi = mid
        return hi

    def log_tail(self, z: float) -> float:
        """Natural log of the tail probability of a magnitude ``z`` (reads state only)."""
        z = abs(z)
        if math.isnan(z):
            return 0.0
        prior = log_normal_tail(z) if math.isfinite(z) else -math.inf
        m = len(self._sorted)
        if m < 16 or not math.isfinite(z):
            return prior
        w = m / (m + self.prior_weight)
        a = math.log1p(-w) + prior
        b = math.log(w) + self._log_empirical(z)
        hi = max(a, b)
        if hi == -math.inf:  # both tails underflow (z ~ 1e200): -inf - -inf is NaN
            return -math.inf
        return min(hi + math.log1p(math.exp(min(a, b) - hi)), 0.0)
