"""Structural imbalance: a pipeline stage slower as a whole than the job's other stages.

Peer comparison (:mod:`detectors.steps.peer`) compares a rank with the ranks of its own
stage, so a stage that is slower as a whole (too many layers, the loss head, a longer
sequence share) names no rank, rightly: no node is at fault and isolating one would not
help. The job owner should still be told, once, with the stage, the size of the gap and
since when, so that the layers can be rebalanced. This module measures it:

- per TRAIN step, each stage's median compute time over its ranks, and the *gap* of
  every stage: its median over the median of the other stages' medians, minus 1;
- an exponentially weighted mean of each stage's gap (slow: a persistent property of
  the job, not a step), and since when it has been above ``exit`` (a streak ends only
  when both the step's gap and the mean are below it);
- one job-level finding (node and rank None, signal ``"imbalance"``) scored by the
  largest mean gap, naming every stage above ``floor`` in its detail, graded INFO and
  recommending ``rebalance`` (never an isolation: :data:`~schemas.alerts.RecommendedAction`).

A whole-cluster shift (an eval step, a storage hiccup, a power cap) moves every stage
alike and leaves the gaps flat; a node straggler moves its stage's median by nothing
(it is one of many ranks); only TRAIN rows are compared.

Examples
--------
>>> import numpy as np
>>> from detectors.frame import StepFrame
>>> imb = StageImbalance(alpha=0.2, warmup_steps=5)
>>> pp = np.repeat(np.arange(4), 8)              # 4 stages of 8 ranks
>>> for step in range(40):
...     compute = np.ones(32)
...     if step >= 10:
...         compute[pp == 3] *= 1.15              # stage 3 slows mid-job
...     frame = StepFrame.from_arrays("j", step, float(step), compute, pp_stage=pp)
...     gaps = imb.score(frame, np.ones(32, dtype=bool))
...     imb.learn(gaps, step)
>>> (f,) = imb.findings(floor=0.1)
>>> f.signal, f.node, round(f.score, 3)
('imbalance', None, 0.15)
>>> f.detail
'pipeline stage 3 is 15.0% slower than the other stages since step 10: rebalance its layers'
>>> imb.findings(floor=0.2)
[]
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from detectors._stats import median
from detectors.base import Finding
from detectors.frame import StepFrame

__all__ = ["MAX_STAGES", "StageImbalance"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

#: Stages tracked at most (state is one slot per stage id below this).
MAX_STAGES = 1024


class StageImbalance:
    """How much slower each pipeline stage has been than the others, and since when.

    Parameters
    ----------
    alpha
        Weight of one step in a stage's mean gap (0.05: about 20 steps of memory).
    exit
        A stage's streak (and its "since" step) ends once its step gap and its mean gap
        are both below this fraction.
    warmup_steps
        TRAIN steps observed before anything is scored.
    min_ranks
        Stages with fewer TRAIN ranks in a step are left out of that step.
    """

    def __init__(
        self,
        alpha: float = 0.05,
        exit: float = 0.05,
        warmup_steps: int = 20,
        min_ranks: int = 2,
    ) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be within (0, 1], got {alpha!r}")
        if not 0 <= exit < 1:
            raise ValueError(f"exit must be within [0, 1), got {exit!r}")
        if warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1, got {warmup_steps!r}")
        if min_ranks < 1:
            raise ValueError(f"min_ranks must be >= 1, got {min_ranks!r}")
        self.alpha = alpha
        self.exit = exit
        self.warmup_steps = warmup_steps
        self.min_ranks = min_ranks
        self._gap: F64 = np.zeros(0, dtype=np.float64)  #: mean gap per stage id
        self._seen: I64 = np.zeros(0, dtype=np.int64)  #: steps learned per stage id
        self._since: I64 = np.zeros(0, dtype=np.int64)  #: streak start step, -1: none
        self.steps = 0  #: steps learned with at least two stages

    def score(self, frame: StepFrame, rows: B) -> F64:
        """The gap of every stage id in this step (NaN where not measured).

        Reads ``frame`` and ``rows`` (the TRAIN rows to compare) only.
        """
        stage = frame.pp_stage.astype(np.int64)[rows]
        compute = frame.compute[rows]
        keep = (stage >= 0) & (stage < MAX_STAGES) & np.isfinite(compute)
        stage, compute = stage[keep], compute[keep]
        if stage.shape[0] == 0:
            return np.full(0, np.nan)
        size = int(stage.max()) + 1
        gaps = np.full(size, np.nan)
        ids = np.unique(stage)
        meds = np.array([float(median(compute[stage == s])) for s in ids])
        counts = np.array([int((stage == s).sum()) for s in ids])
        ok = (counts >= self.min_ranks) & (meds > 0)
        ids, meds = ids[ok], meds[ok]
        if ids.shape[0] < 2:
            return gaps
        for i, s in enumerate(ids):
            others = float(median(np.delete(meds, i)))
            gaps[s] = meds[i] / others - 1.0
        return gaps

    def learn(self, gaps: F64, step: int) -> None:
        """Fold one step's gaps (from :meth:`score`) into the per-stage means."""
        measured = np.flatnonzero(np.isfinite(gaps))
        if measured.shape[0] < 2:
            return
        need = int(measured.max()) + 1
        if need > self._gap.shape[0]:
            grow = need - self._gap.shape[0]
            self._gap = np.concatenate((self._gap, np.zeros(grow)))
            self._seen = np.concatenate((self._seen, np.zeros(grow, np.int64)))
            self._since = np.concatenate((self._since, np.full(grow, -1, np.int64)))
        g = gaps[measured]
        first = self._seen[measured] == 0
        old = self._gap[measured]
        self._gap[measured] = np.where(first, g, old + self.alpha * (g - old))
        self._seen[measured] += 1
        since = self._since[measured]
        above = g > self.exit
        ended = ~above & (self._gap[measured] <= self.exit)
        since = np.where(ended, -1, since)
        since = np.where(above & (since < 0), step, since)
        self._since[measured] = since
        self.steps += 1

    def findings(self, floor: float) -> list[Finding]:
        """One job-level finding when a stage's mean gap reaches ``floor`` (after the
        warm-up), scored by the largest gap and naming every stage at or above it.

        Reads state only.
        """
        if self.steps < self.warmup_steps or self._gap.shape[0] == 0:
            return []
        warmed = self._seen >= self.warmup_steps
        gap = np.where(warmed, self._gap, -np.inf)
        worst = int(np.argmax(gap))
        top = float(gap[worst])
        if not np.isfinite(top) or top < floor:
            return []
        slow = [int(s) for s in np.argsort(-gap, kind="stable") if gap[s] >= floor]
        since = int(self._since[worst])
        names = ", ".join(str(s) for s in slow)
        what = "stage" if len(slow) == 1 else "stages"
        when = f" since step {since}" if since >= 0 else ""
        detail = (
            f"pipeline {what} {names} {'is' if len(slow) == 1 else 'are'} "
            f"{100 * top:.1f}% slower than the other stages{when}: rebalance "
            f"{'its' if len(slow) == 1 else 'their'} layers"
        )
        return [
            Finding(
                "imbalance",
                None,
                None,
                top,
                "stage_compute_gap",
                top,
                top,
                baseline=0.0,
                detail=detail,
            )
        ]

    def forget(self) -> None:
        """Start over (the job was relaunched on another layout)."""
        self._gap = np.zeros(0, dtype=np.float64)
        self._seen = np.zeros(0, dtype=np.int64)
        self._since = np.zeros(0, dtype=np.int64)
        self.steps = 0
