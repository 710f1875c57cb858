"""Slow-onset divergence: the loss drifting up from the best it reached, step by step.

:class:`~detectors.training.divergence.DivergenceDetector` scores each step against a
rolling median of recent steps: a jump stands out, but a loss that climbs a little every
step is learned as it goes and never does. Training loss falls or plateaus; a run that
is going wrong slowly climbs away from the best it had reached. This detector keeps:

- the median of the last ``short`` learned losses (one step's noise averages out);
- the lowest such median since the start (or since :meth:`LossDrift.reset`, called at a
  relaunch: a rollback resumes from an earlier, higher loss);

and scores each step by how far the short median stands above that best, as a fraction
(0.05: 5 % above the best). Nothing is scored before ``warmup`` losses (the first steps
of a run fall fast and noisily). Non-finite losses are not learned (they are the
``nonfinite`` signal's).

Examples
--------
>>> d = LossDrift(short=5, warmup=10)
>>> for i in range(40):
...     d.learn_one(3.0 - 0.01 * i)                  # falling: nothing to say
>>> d.score_one(2.6)
0.0
>>> for i in range(40):
...     d.learn_one(2.61 * (1 + 0.004 * i))          # then a slow climb, 0.4 % a step
>>> round(d.score_one(2.61 * 1.16), 3)
0.148
>>> d.reset()
>>> d.score_one(9.0)                                 # relaunched: warming up again
0.0
"""

from __future__ import annotations

import math

import numpy as np

from detectors._stats import median
from detectors.base import Finding

__all__ = ["LossDrift", "drift_findings"]


class LossDrift:
    """How far the recent loss stands above the best it reached.

    Parameters
    ----------
    short
        Learned losses the recent median covers.
    warmup
        Losses learned (since the start or a reset) before anything is scored.
    """

    def __init__(self, short: int = 10, warmup: int = 50) -> None:
        if short < 1:
            raise ValueError(f"short must be >= 1, got {short!r}")
        if warmup < short:
            raise ValueError(f"warmup must be >= short, got {warmup!r}")
        self.short = short
        self.warmup = warmup
        self._recent = np.zeros(short)
        self._count = 0
        self._best = math.inf

    def _median_with(self, loss: float) -> float:
        n = min(self._count, self.short)
        if n == 0:
            return loss
        recent = self._recent[:n] if self._count < self.short else self._recent
        if math.isfinite(loss):  # this step replaces the oldest value
            keep = recent if n < self.short else np.delete(recent, self._count % self.short)
            recent = np.append(keep, loss)
        return float(median(recent))

    def score_one(self, loss: float) -> float:
        """The step's drift (fraction above the best recent median; 0 while warming up
        or when ``loss`` is not finite). Reads state only."""
        if self._count < self.warmup or not math.isfinite(loss) or not self._best > 0:
            return 0.0
        return max(0.0, self._median_with(loss) / self._best - 1.0)

    def best(self) -> float:
        """The best (lowest) recent median so far (inf before any)."""
        return self._best

    def learn_one(self, loss: float) -> None:
        """Learn one step's loss (the median of its ranks'); non-finite ones are skipped."""
        if not math.isfinite(loss):
            return
        self._recent[self._count % self.short] = loss
        self._count += 1
        if self._count >= min(self.short, self.warmup):
            n = min(self._count, self.short)
            self._best = min(self._best, float(median(self._recent[:n])))

    def reset(self) -> None:
        """Start over (the job was relaunched, perhaps from an earlier checkpoint)."""
        self._recent[:] = 0.0
        self._count = 0
        self._best = math.inf


def drift_findings(drift: LossDrift, loss: float, floor: float) -> list[Finding]:
    """The job-level ``"loss_drift"`` finding of a step whose median ``loss`` drifted
    ``floor`` or more above the best (nothing otherwise). Reads ``drift`` only.

    >>> d = LossDrift(short=2, warmup=2)
    >>> d.learn_one(2.0); d.learn_one(2.0)
    >>> [(f.signal, f.node, round(f.score, 2)) for f in drift_findings(d, 2.4, 0.05)]
    [('loss_drift', None, 0.1)]
    """
    s = drift.score_one(loss)
    if s < floor:
        return []
    best = drift.best()
    return [
        Finding(
            "loss_drift",
            None,
            None,
            s,
            "loss",
            loss,
            s,
            baseline=best,
            detail=(
                f"loss {100 * s:.1f}% above the best it reached ({best:.4g}), climbing "
                f"slowly: a run going wrong before it spikes"
            ),
        )
    ]
