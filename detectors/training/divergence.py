"""Training divergence: loss and gradient-norm spikes against a rolling baseline.

A job-level signal: each step contributes the median of the finite losses and
gradient norms its ranks reported. Each is scored with a one-sided robust z against
the median / MAD of the last ``window`` learned values (MAD floored at
``mad_floor_rel`` of the median). A reported NaN or infinity anywhere is critical at
once (the grading policy fires on the first observation). Anomalous values are not
learned, and nothing is learned before ``warmup`` values are in (scores are neutral).

Examples
--------
>>> import numpy as np
>>> d = DivergenceDetector(window=20, warmup=5)
>>> for i in range(10):
...     d.learn_one(loss=2.0 - 0.01 * i, grad_norm=1.0)
>>> s = d.score_one(loss=2.0, grad_norm=1.0)
>>> round(s.loss_z, 2), s.grad_z
(1.21, 0.0)
>>> s = d.score_one(loss=2.0, grad_norm=50.0)
>>> round(s.grad_z, 1), s.nonfinite
(4900.0, False)
>>> d.score_one(loss=float("nan"), grad_norm=1.0, nonfinite=True).nonfinite
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from detectors._stats import MAD_TO_SIGMA, median
from detectors.base import check_non_negative, check_positive

__all__ = ["DivergenceDetector", "DivergenceScore"]


@dataclass(frozen=True, slots=True)
class DivergenceScore:
    loss: float
    grad_norm: float
    loss_z: float  #: one-sided robust z of the loss (0 while warming up)
    grad_z: float  #: one-sided robust z of the grad norm
    loss_median: float | None
    grad_median: float | None
    nonfinite: bool  #: a reported loss or grad norm was NaN/Inf

    @property
    def score(self) -> float:
        return max(self.loss_z, self.grad_z)


class _Window:
    def __init__(self, size: int) -> None:
        self.values = np.zeros(size)
        self.count = 0

    def data(self) -> np.ndarray[tuple[int], np.dtype[np.float64]]:
        return self.values[: min(self.count, self.values.shape[0])]

    def push(self, x: float) -> None:
        self.values[self.count % self.values.shape[0]] = x
        self.count += 1


class DivergenceDetector:
    """Robust rolling scores of loss and gradient norm.

    Parameters
    ----------
    window
        Number of recent learned values the baseline median / MAD covers.
    warmup
        Learned values before scores leave neutral.
    mad_floor_rel
        MAD floor as a fraction of the baseline median.
    learn_gate_z
        Values scoring above this are not learned.
    """

    def __init__(
        self,
        window: int = 50,
        warmup: int = 20,
        mad_floor_rel: float = 0.01,
        learn_gate_z: float = 6.0,
    ) -> None:
        if window < 2:
            raise ValueError(f"window must be >= 2, got {window!r}")
        if not 1 <= warmup <= window:
            raise ValueError(f"warmup must be in [1, window], got {warmup!r}")
        check_non_negative("mad_floor_rel", mad_floor_rel)
        check_positive("learn_gate_z", learn_gate_z)
        self.window = window
        self.warmup = warmup
        self.mad_floor_rel = mad_floor_rel
        self.learn_gate_z = learn_gate_z
        self._loss = _Window(window)
        self._grad = _Window(window)

    def _z(self, w: _Window, x: float) -> tuple[float, float | None]:
        if w.count < self.warmup or not math.isfinite(x):
            return 0.0, None
        data = w.data()
        med = float(median(data))
        mad = float(median(np.abs(data - med)))
        scale = max(MAD_TO_SIGMA * mad, self.mad_floor_rel * abs(med), 1e-12)
        return max(0.0, (x - med) / scale), med

    def score_one(
        self, loss: float = math.nan, grad_norm: float = math.nan, *, nonfinite: bool = False
    ) -> DivergenceScore:
        """Score one step's loss and grad norm (NaN means "not reported" unless
        ``nonfinite`` is set); reads state only. Infinite values count as non-finite."""
        lz, lmed = self._z(self._loss, loss)
        gz, gmed = self._z(self._grad, grad_norm)
        bad = nonfinite or math.isinf(loss) or math.isinf(grad_norm)
        return DivergenceScore(loss, grad_norm, lz, gz, lmed, gmed, bad)

    def learn_one(self, loss: float = math.nan, grad_norm: float = math.nan) -> None:
        """Learn one step's values; non-finite or anomalous values are skipped."""
        s = self.score_one(loss, grad_norm)
        if math.isfinite(loss) and s.loss_z <= self.learn_gate_z:
            self._loss.push(loss)
        if math.isfinite(grad_norm) and s.grad_z <= self.learn_gate_z:
            self._grad.push(grad_norm)
