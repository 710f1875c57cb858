"""Step time read against the work each rank did (tokens, FLOPs), when ranks say it.

Compute time follows the work a rank was given: sequence lengths, packing and MoE
routing give ranks unequal tokens every step. Read as time alone, that variation is
either noise (which blunts sensitivity) or slowness (a rank that got long sequences
looks like a straggler). Where the frame carries work (:data:`~detectors.frame.WORK_FIELDS`):

- :func:`per_work` rescales each rank's compute to the step's median work
  (``compute * median_work / work``): every detector that compares compute (peers,
  own baselines, intermittence, replicas) then compares *time per unit of work*, in
  seconds of a median rank's step. A rank slow because it got more tokens is not a
  straggler; a rank slow per token is one even when its batches are short.
- :class:`WorkImbalance` tells the job owner, once (a job-level INFO of the
  ``imbalance`` signal, never a node), when the work itself is persistently unequal:
  a pipeline stage doing more work than the others, or some ranks given more than the
  median rank, with the size of the gap and since when.

FLOPs are the work when every reporting rank said them (they count what a token costs,
e.g. a stage with more layers), else tokens. A rank without work, or with none (0),
keeps its time as it is; a factor is bounded (:data:`MAX_FACTOR`) so that a
hostile or broken work figure moves a rank's time by at most that much.

Examples
--------
>>> import numpy as np
>>> from detectors.frame import StepFrame
>>> tokens = np.array([1000.0, 2000.0, 1000.0, 1000.0])
>>> f = StepFrame.from_arrays("j", 0, 1.0, [1.0, 2.0, 1.1, 1.0], tokens=tokens)
>>> per_work(f).compute.round(3).tolist()   # rank 1: twice the tokens, twice the time
[1.0, 1.0, 1.1, 1.0]
>>> per_work(StepFrame.from_arrays("j", 0, 1.0, [1.0, 2.0])).compute.tolist()
[1.0, 2.0]
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

from detectors._stats import median
from detectors.base import Finding
from detectors.frame import StepFrame
from detectors.steps.imbalance import MAX_STAGES

__all__ = ["MAX_FACTOR", "WorkImbalance", "per_work", "work_factor", "work_of"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

#: The most a rank's compute is scaled by its work, either way.
MAX_FACTOR = 8.0
#: Ranks tracked by :class:`WorkImbalance` at most (by rank id; above: not tracked).
MAX_TRACKED_RANKS = 1 << 20


def work_of(frame: StepFrame) -> tuple[str, F64] | None:
    """The step's work per rank and what it counts (``"flops"`` when every rank said
    them, else ``"tokens"`` when any did); None when no rank said either. NaN where a
    rank did not say."""
    flops = frame.flops
    if flops is not None and frame.n_ranks and bool(np.isfinite(flops).all()):
        return "flops", flops
    if frame.tokens is not None:
        return "tokens", frame.tokens
    if flops is not None:
        return "flops", flops
    return None


def per_work(frame: StepFrame) -> StepFrame:
    """``frame`` with each rank's compute at the step's median work (module docstring);
    the frame itself when no rank said its work."""
    factor = work_factor(frame)
    return frame if factor is None else dataclasses.replace(frame, compute=frame.compute * factor)


def work_factor(frame: StepFrame) -> F64 | None:
    """What :func:`per_work` multiplies each rank's compute by (None: nothing); the
    same of its result, whose work columns are the step's own (dividing by it gives
    back the time each rank's clock measured)."""
    got = work_of(frame)
    if got is None:
        return None
    work = got[1]
    said = np.isfinite(work) & (work > 0)
    if not bool(said.any()):
        return None
    typical = float(median(work[said]))
    factor = np.ones(frame.n_ranks)
    factor[said] = np.clip(typical / work[said], 1.0 / MAX_FACTOR, MAX_FACTOR)
    return factor


class WorkImbalance:
    """How unequal the ranks' work has been, persistently, and since when.

    Per TRAIN step with work: each pipeline stage's median work over the median of the
    other stages' medians (minus 1), and each rank's work over the step's median
    (minus 1), both folded into exponentially weighted means (``alpha``). A gap that
    moves from rank to rank every step (sequence lengths) or every few steps (MoE
    routing) averages out; one that stays (a stage with more layers, a rank always
    given the longest shard) does not. :meth:`findings` names the stage, or the ranks,
    whose mean gap reaches ``floor``.
    """

    def __init__(self, alpha: float = 0.02, exit: float = 0.05, warmup_steps: int = 20) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be within (0, 1], got {alpha!r}")
        if not 0 <= exit < 1:
            raise ValueError(f"exit must be within [0, 1), got {exit!r}")
        if warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1, got {warmup_steps!r}")
        self.alpha, self.exit, self.warmup_steps = alpha, exit, warmup_steps
        self.what = "tokens"
        self._stage = _Gaps()  #: by stage id
        self._rank = _Gaps()  #: by rank id
        self.steps = 0
        self.step = -1  #: the last step learned

    def learn(self, frame: StepFrame, rows: B) -> None:
        """Fold one step's work (its TRAIN ``rows``) into the means."""
        got = work_of(frame)
        if got is None:
            return
        self.what, work = got
        keep = rows & np.isfinite(work) & (work > 0) & (frame.rank < MAX_TRACKED_RANKS)
        if int(keep.sum()) < 2:
            return
        work, rank = work[keep], frame.rank[keep]
        stage = frame.pp_stage.astype(np.int64)[keep]
        typical = float(median(work))
        self._rank.fold(rank, work / typical - 1.0, frame.step, self.alpha, self.exit)
        ids = np.unique(stage[(stage >= 0) & (stage < MAX_STAGES)])
        if ids.shape[0] >= 2:
            meds = np.array([float(median(work[stage == s])) for s in ids])
            gaps = np.array([meds[i] / float(median(np.delete(meds, i))) - 1.0
                             for i in range(ids.shape[0])])  # fmt: skip
            self._stage.fold(ids, gaps, frame.step, self.alpha, self.exit)
        self.steps += 1
        self.step = frame.step

    def findings(self, floor: float) -> list[Finding]:
        """One job-level finding when a stage's, or else some ranks', mean gap reaches
        ``floor`` after the warm-up. Reads state only."""
        if self.steps < self.warmup_steps:
            return []
        hold = 3 * self.warmup_steps  # persistent: above exit at every step this long
        for gaps, who in ((self._stage, "stage"), (self._rank, "rank")):
            heavy = gaps.heavy(floor, self.step, hold, self.warmup_steps)
            if heavy.shape[0] == 0:
                continue
            if who == "rank" and heavy.shape[0] * 2 > int((gaps.n > 0).sum()):
                continue  # most ranks above "the median rank": not a few heavy ones
            top = float(gaps.mean[heavy[0]])
            start = int(gaps.since[heavy[0]])
            names = ", ".join(str(int(x)) for x in heavy[:8])
            more = f" and {heavy.shape[0] - 8} more" if heavy.shape[0] > 8 else ""
            many = heavy.shape[0] > 1
            when = f" since step {start}" if start >= 0 else ""
            if who == "stage":
                subject = f"pipeline stage{'s' if many else ''} {names}"
                than, fix = "the other stages", "rebalance the layers or the batch share"
            else:
                subject = f"rank{'s' if many else ''} {names}{more}"
                than, fix = "the median rank", "balance the data shards or the routing"
            detail = (
                f"work imbalance: {subject} {'have' if many else 'has'} {100 * top:.1f}% "
                f"more work ({self.what}) than {than}{when}; slower for the work, not the "
                f"hardware: {fix}"
            )
            return [Finding("imbalance", None, None, top, f"{who}_{self.what}_gap", top, top,
                            baseline=0.0, detail=detail)]  # fmt: skip
        return []

    def forget(self) -> None:
        """Start over (the job was relaunched on another layout)."""
        self.__init__(self.alpha, self.exit, self.warmup_steps)  # type: ignore[misc]


class _Gaps:
    """Per id: the mean gap (a plain mean over the first ``1 / alpha`` steps, then
    exponentially weighted), steps seen, and the step since which every step's gap has
    been above ``exit`` (-1: not now)."""

    __slots__ = ("mean", "n", "since")

    def __init__(self) -> None:
        self.mean = np.zeros(0)
        self.n = np.zeros(0, dtype=np.int64)
        self.since = np.zeros(0, dtype=np.int64)

    def fold(self, ids: I64, gaps: F64, step: int, alpha: float, exit: float) -> None:
        need = int(ids.max()) + 1
        if need > self.mean.shape[0]:
            grow = need - self.mean.shape[0]
            self.mean = np.concatenate((self.mean, np.zeros(grow)))
            self.n = np.concatenate((self.n, np.zeros(grow, np.int64)))
            self.since = np.concatenate((self.since, np.full(grow, -1, np.int64)))
        self.n[ids] += 1
        weight = np.maximum(alpha, 1.0 / self.n[ids])
        self.mean[ids] += weight * (gaps - self.mean[ids])
        above = gaps > exit  # a streak ends with the first step below exit
        since = np.where(above, self.since[ids], -1)
        self.since[ids] = np.where(above & (since < 0), step, since)

    def heavy(self, floor: float, step: int, hold: int, min_n: int) -> I64:
        """Ids whose mean gap reaches ``floor`` and whose streak has lasted ``hold``
        steps, heaviest first."""
        ok = (self.n >= min_n) & (self.mean >= floor) & (self.since >= 0)
        ok &= step - self.since >= hold
        ids = np.flatnonzero(ok)
        return ids[np.argsort(-self.mean[ids], kind="stable")]
