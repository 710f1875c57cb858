"""Vectorised robust statistics shared by the detectors (numpy only).

Examples
--------
>>> import numpy as np
>>> g = Groups.of(np.array([0, 0, 1, 1, 1]))
>>> g.median(np.array([[1.0, 3.0, 10.0, 20.0, 30.0]]))
array([[ 2., 20.]])
>>> ew = EWArrays(n_slots=2, alpha=0.5, warmup=1)
>>> ew.update(np.array([0, 1]), np.array([1.0, 4.0]))
>>> ew.update(np.array([0]), np.array([3.0]))
>>> ew.mean.tolist(), ew.var.tolist()
([2.0, 4.0], [1.0, 0.0])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["MAD_TO_SIGMA", "EWArrays", "Groups", "median", "robust_scale"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

#: Scale factor that makes the MAD a consistent estimator of a normal sigma.
MAD_TO_SIGMA = 1.4826


def median(values: npt.NDArray[np.floating], keepdims: bool = False) -> npt.NDArray[np.float64]:
    """``np.median(values, axis=-1)`` of a float array, the same bits, NaN included.

    np.median spends most of its time in its generic wrapper (8-15 us a call, against
    2-4 us here), and the detectors call it some twenty times a step. The same
    partition (the middle element or two, and the last, where NaNs sort), the same
    mean of the two middle ones, and NaN where a row holds one; anything else (no
    values, not float64) goes to np.median itself.

    >>> median(np.array([3.0, 1.0, 2.0, 10.0])), median(np.array([1.0, np.nan, 0.0]))
    (np.float64(2.5), np.float64(nan))
    """
    n = values.shape[-1] if values.ndim else 0
    if n == 0 or values.dtype != np.float64:
        return np.median(values, axis=-1, keepdims=keepdims)  # type: ignore[no-any-return]
    k = n // 2
    if n % 2:
        part = np.partition(values, (k, n - 1), axis=-1)
        out = part[..., k]
    else:
        part = np.partition(values, (k - 1, k, n - 1), axis=-1)
        out = (part[..., k - 1] + part[..., k]) / 2.0
    last = part[..., -1]
    if np.isnan(last).any():
        out = np.where(np.isnan(last), np.nan, out)
    out = out[()]  # 1-D in, a scalar out (``[...]`` indexing leaves a 0-d array)
    return out[..., None] if keepdims else out


@dataclass(frozen=True, slots=True, eq=False)
class Groups:
    """A partition of ``n`` items into groups, with the sort order to slice them."""

    inverse: I64  #: group index of each item
    order: I64  #: items sorted by group (stable)
    bounds: I64  #: group g is ``order[bounds[g]:bounds[g + 1]]``
    n_groups: int

    @classmethod
    def of(cls, keys: npt.NDArray[np.integer]) -> Groups:
        n = int(keys.shape[0])
        if n == 0 or int(keys.min()) == int(keys.max()):
            return cls.single(n)
        _, inverse = np.unique(keys, return_inverse=True)
        inv = inverse.astype(np.int64, copy=False)
        order = np.argsort(inv, kind="stable").astype(np.int64, copy=False)
        counts = np.bincount(inv)
        bounds = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        return cls(inverse=inv, order=order, bounds=bounds, n_groups=int(counts.shape[0]))

    @classmethod
    def single(cls, n: int) -> Groups:
        return cls(
            inverse=np.zeros(n, dtype=np.int64),
            order=np.arange(n, dtype=np.int64),
            bounds=np.array([0, n], dtype=np.int64),
            n_groups=1,
        )

    @property
    def sizes(self) -> I64:
        return np.diff(self.bounds)

    def median(self, values: F64) -> F64:
        """Per-group medians of each row of ``values`` (shape ``(m, n)`` -> ``(m, G)``)."""
        if self.n_groups == 1:
            return median(values, keepdims=True)
        v = values[:, self.order]
        out = np.empty((values.shape[0], self.n_groups))
        for g in range(self.n_groups):
            lo, hi = int(self.bounds[g]), int(self.bounds[g + 1])
            out[:, g] = median(v[:, lo:hi])
        return out

    def median_and_mad(self, values: F64) -> tuple[F64, F64]:
        """Per-group medians and median absolute deviations, each ``(m, G)``."""
        med = self.median(values)
        dev = np.abs(values - med[:, self.inverse])
        return med, self.median(dev)


def robust_scale(mad: F64, reference: F64, floor_rel: float, floor_abs: float) -> F64:
    """``max(1.4826 * MAD, floor_rel * |reference|, floor_abs)`` elementwise."""
    return np.maximum(np.maximum(MAD_TO_SIGMA * mad, floor_rel * np.abs(reference)), floor_abs)


class EWArrays:
    """Exponentially weighted mean and variance for many series at once.

    Each slot is one series. Update ``n`` of a slot uses the weight
    ``a = max(alpha, 1 / n)`` while ``n <= warmup`` and ``alpha`` afterwards, so the
    first ``warmup`` values give the plain running mean and (population) variance, and
    with ``warmup=1`` the recurrence is exactly River's ``stats.EWMean`` /
    ``stats.EWVar`` with ``fading_factor=alpha`` (Finch, 2009). ``alpha_up`` (default
    ``alpha``) is used instead when a value lies above the mean: a small ``alpha_up``
    lets the baseline fall quickly but creep up only slowly.
    """

    def __init__(
        self, n_slots: int, alpha: float, warmup: int = 1, alpha_up: float | None = None
    ) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        if alpha_up is not None and not 0 < alpha_up <= 1:
            raise ValueError(f"alpha_up must be in (0, 1], got {alpha_up!r}")
        if warmup < 1:
            raise ValueError(f"warmup must be >= 1, got {warmup!r}")
        self.alpha = alpha
        self.alpha_up = alpha if alpha_up is None else alpha_up
        self.warmup = warmup
        self.n = np.zeros(n_slots, dtype=np.int64)
        self.mean = np.zeros(n_slots)
        self.var = np.zeros(n_slots)

    @property
    def n_slots(self) -> int:
        return int(self.n.shape[0])

    def grow(self, n_slots: int) -> None:
        """Make room for at least ``n_slots`` series (new ones start empty)."""
        if n_slots <= self.n_slots:
            return
        size = max(n_slots, 2 * self.n_slots)
        extra = size - self.n_slots
        self.n = np.concatenate((self.n, np.zeros(extra, dtype=np.int64)))
        self.mean = np.concatenate((self.mean, np.zeros(extra)))
        self.var = np.concatenate((self.var, np.zeros(extra)))

    def update(self, slots: I64, x: F64) -> None:
        """Learn one value for each of ``slots`` (unique indices)."""
        if slots.shape[0] == 0:
            return
        n = self.n[slots] + 1
        mean = self.mean[slots]
        diff = x - mean
        alpha: F64 | float = (
            self.alpha
            if self.alpha_up == self.alpha
            else np.where(diff > 0, self.alpha_up, self.alpha)
        )
        a: F64 | float = alpha
        if int(n.min()) <= self.warmup:
            a = np.where(n <= self.warmup, np.maximum(alpha, 1.0 / n), alpha)
        incr = a * diff
        self.mean[slots] = mean + incr
        self.var[slots] = (1.0 - a) * (self.var[slots] + diff * incr)
        self.n[slots] = n
