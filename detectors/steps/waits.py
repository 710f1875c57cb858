"""Who waits for whom: the rank a synchronous step's peers wait on, whatever its clock says.

In a synchronous step the slow rank waits least in the collectives and its peers wait
for it. The compute rules (:mod:`detectors.steps.slowdown`, :mod:`detectors.steps.early`)
read the slow rank's *compute* clock; a clock that does not see the delay leaves them
blind. Compute is the thread's own time: a CPU hog pinned to the rank's core (a noisy
neighbour), a throttled host thread or a slow queue in front of the device stretch the
rank's step without stretching the time its thread computes. On a real gloo DDP job a
hog pinned to one rank's core made every step 22 % slower while that rank's compute
read normal; what named it was the waits: 22 ms of exposed comm wait on it against
53-62 ms on its peers.

A rank is *waited on* in a step when

- its stage peers' median comm wait exceeds its own, less the part of that gap its
  compute clock already explains (``max(compute - peers' median compute, 0)``), by at
  least ``waits_floor`` of the step *and* ``waits_z`` robust sigmas of its peers' comm
  wait (the sigma floored at 1 % of the step);
- that deficit is also beyond the rank's own normal (its baseline of comm wait
  against its peers, :mod:`detectors.steps.temporal`, warm): a rank that always waits
  less by where it sits (nearer the reduction's root) is not blamed when the whole
  job slows for another reason;
- it does not wait on its data loader (that is the data stall's);
- and the step itself is slower than the job's own recent steps by at least
  ``waits_step_slow`` and four robust sigmas of their spread (:class:`StepBaseline`,
  learned from the steps that were not slow, ready after ``waits_warmup`` of them):
  ranks whose waits just differ a little in a healthy job, or differ persistently by
  where they sit, are never blamed while the job runs at its own pace.

Peers are the rank's pipeline stage (stages wait differently by design: a pipeline's
bubble is not a culprit); a stage of fewer than ``early_min_peers`` ranks names nobody.
Its score, graded as a ``straggler`` (metric ``comm_wait_deficit``), is the smaller of
the unexplained deficit and the step's slowdown: the job's delay this rank accounts
for. The grader's persistence makes it a WARNING after ``straggler_min_steps``
consecutive steps.

Blind spots that remain are listed in ``docs/detection.md`` (a step whose every rank is
slowed alike, two culprits in one stage, a job whose clients report no comm wait).

Examples
--------
>>> import numpy as np
>>> from detectors.frame import StepFrame
>>> compute = np.full(8, 0.20)                       # every clock reads normal
>>> comm = np.full(8, 0.06); comm[3] = 0.02          # rank 3's peers wait on it
>>> frame = StepFrame.from_arrays("j", 9, 9.0, compute, comm, step_time=np.full(8, 0.26))
>>> base = StepBaseline(warmup=3)
>>> for s in (0.21, 0.215, 0.205):
...     base.learn(s, slow=False)
>>> slow = base.slowdown(0.26, k=4.0)
>>> round(slow, 3)
0.238
>>> own = np.full(8, 0.5)                             # all of it new to each rank
>>> score = waited_on(frame, slow, own, np.zeros(8, bool), floor=0.1, k=4.0, min_peers=4)
>>> np.flatnonzero(score).tolist(), round(float(score[3]), 3)
([3], 0.154)
>>> bool(waited_on(frame, 0.0, own, np.zeros(8, bool), floor=0.1, k=4.0, min_peers=4).any())
False
>>> bool(waited_on(frame, slow, own * 0, np.zeros(8, bool), floor=0.1, k=4.0, min_peers=4).any())
False
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from detectors._stats import MAD_TO_SIGMA, Groups
from detectors.frame import StepFrame

__all__ = ["StepBaseline", "waited_on"]

F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]

#: Robust sigma of the peers' comm wait is floored at this fraction of the step.
_SIGMA_FLOOR_REL = 0.01


class StepBaseline:
    """The job's own recent step time: the median of the last ``window`` steps that
    were not slow, and its robust relative spread.

    Parameters
    ----------
    warmup
        Steps learned before :meth:`slowdown` says anything.
    window
        Steps kept (bounded memory: one float each).
    """

    __slots__ = ("history", "warmup", "window")

    def __init__(self, warmup: int = 8, window: int = 64) -> None:
        if warmup < 1:
            raise ValueError(f"warmup must be >= 1, got {warmup!r}")
        if window < warmup:
            raise ValueError(f"window must be >= warmup, got {window!r}")
        self.warmup = warmup
        self.window = window
        self.history: F64 = np.empty(0)

    def slowdown(self, step_time: float, k: float) -> float:
        """How much slower ``step_time`` is than the baseline (a fraction), or 0 while
        warming or while within ``k`` robust sigmas of the baseline's own spread."""
        h = self.history
        if h.shape[0] < self.warmup or not np.isfinite(step_time):
            return 0.0
        med = float(np.median(h))
        if med <= 0:
            return 0.0
        sigma = MAD_TO_SIGMA * float(np.median(np.abs(h - med))) / med
        slow = step_time / med - 1.0
        return slow if slow >= k * sigma else 0.0

    def learn(self, step_time: float, slow: bool) -> None:
        """Keep ``step_time`` unless the step was slow (a fault is not the baseline)."""
        if slow or not np.isfinite(step_time) or step_time <= 0:
            return
        self.history = np.append(self.history[-(self.window - 1) :], step_time)


def waited_on(
    frame: StepFrame,
    step_slow: float,
    own_deficit: F64,
    excluded: B,
    *,
    compute: F64 | None = None,
    floor: float,
    k: float,
    min_peers: int,
) -> F64:
    """Per rank: the share of the step its stage peers waited on it, else 0.

    Reads its arguments only.

    Parameters
    ----------
    frame
        The step.
    step_slow
        How much slower the step is than the job's baseline (:meth:`StepBaseline.slowdown`;
        the caller decides how much is slow): the most any rank is charged with.
    own_deficit
        Each rank's comm-wait deficit beyond its own normal (a fraction of the step:
        minus its peer comm excess less its baseline's): a rank that always waits
        less, by where it sits, is named only for what it waits less than it used to.
    excluded
        Rows never named (not training, baseline still warming, waiting on their
        data loader).
    compute
        The time each rank's clock measured, where ``frame.compute`` was rescaled to
        the step's median work (:func:`detectors.steps.work.per_work`): a rank given
        more tokens waits less for what it did, which its clock explains.
    floor, k
        The unexplained comm-wait deficit must reach this fraction of the step and
        this many robust sigmas of the peers' comm wait.
    min_peers
        Stages with fewer ranks name nobody.
    """
    n = frame.n_ranks
    if n == 0 or step_slow <= 0:
        return np.zeros(n)
    groups = Groups.of(frame.pp_stage)
    clock = frame.compute if compute is None else compute
    med, mad = groups.median_and_mad(np.stack((frame.comm_wait, clock, frame.step_time)))
    inv = groups.inverse
    step = np.maximum(med[2], med[1] + med[0])[inv]
    explained = np.maximum(clock - med[1][inv], 0.0)
    unexplained = med[0][inv] - frame.comm_wait - explained
    sigma = np.maximum(MAD_TO_SIGMA * mad[0][inv], _SIGMA_FLOOR_REL * step)
    sigma = np.maximum(sigma, 1e-9)
    rel = np.minimum(unexplained / np.maximum(step, 1e-9), own_deficit)
    hit = (rel >= floor) & (unexplained >= k * sigma) & (groups.sizes[inv] >= min_peers)
    hit &= ~excluded & np.isfinite(rel)
    return np.where(hit, np.minimum(rel, step_slow), 0.0)
