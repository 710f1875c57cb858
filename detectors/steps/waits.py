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
- its own clocks do not explain it: the part of that gap its compute clock (above its
  peers') or its wait for data (above its peers': a stalled loader, the data stall's
  to name) accounts for is not counted;
- and the step itself is slower than the job's own recent steps by at least
  ``waits_step_slow`` and four robust sigmas of their spread (:class:`StepBaseline`,
  learned from the steps that were not slow, ready after ``waits_warmup`` of them):
  ranks whose waits just differ a little in a healthy job, or differ persistently by
  where they sit, are never blamed while the job runs at its own pace.

A rank its peers *keep* waiting on is named whatever the step's pace
(:class:`LastArrivals`): exactly one rank of a stage arrives last at its collectives in
each step, and on a healthy job who that is changes from step to step, or is the same
rank by where it sits (the leader), at a rate learned as that rank's normal. A rank
that arrived last in so many of its last ``waits_last_span`` steps that its usual rate
makes that less likely than ``waits_last_p``, with its peers waiting on it by at least
``waits_floor`` of the step beyond what its own clocks explain, is named, though the
step's pace hides it: on a quiet two-core host a hog on one rank's core of a 4-rank
gloo job cost the step only 8-18 % against a step-to-step spread of 70-160 ms, and the
step gate above never opened, while the hogged rank arrived last in 44 and 45 of 50
steps and no healthy rank other than the leader in more than 6 of any 10.

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
>>> base = StepBaseline(warmup=3, span=3)
>>> for s in (0.21, 0.215, 0.205):
...     base.learn(s, slow=False)
>>> base.slowdown(0.26, k=4.0)                        # one slow step of the last three
0.0
>>> base.learn(0.26, slow=True)
>>> slow = base.slowdown(0.26, k=4.0)                 # two of three
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

A host that slows both its ranks in a stage of four is half the stage: its ranks are
judged against the other node's, not against a median that sits between them.

>>> comm4 = np.array([0.06, 0.06, 0.02, 0.02])
>>> four = StepFrame.from_arrays("j", 9, 9.0, np.full(4, 0.2), comm4, step_time=np.full(4, 0.26))
>>> none = np.zeros(4, bool)
>>> bool(waited_on(four, slow, own[:4], none, floor=0.1, k=4.0, min_peers=4).any())
False
>>> nodes = np.array([0, 0, 1, 1])
>>> score = waited_on(four, slow, own[:4], none, node=nodes, floor=0.1, k=4.0, min_peers=4)
>>> np.flatnonzero(score).tolist()
[2, 3]
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from detectors._stats import MAD_TO_SIGMA, Groups, median
from detectors.frame import StepFrame

__all__ = [
    "NODE_SHARE",
    "LastArrivals",
    "RecentScores",
    "StepBaseline",
    "last_arrivals",
    "waited_on",
]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

#: Robust sigma of the peers' comm wait is floored at this fraction of the step.
_SIGMA_FLOOR_REL = 0.01


class StepBaseline:
    """The job's own recent step time: the median of the last ``window`` steps that
    were not slow, and its robust relative spread; a step is judged by the median of
    the last ``span`` steps (its own included), whose noise is that spread shrunk by
    ``1.2533 / sqrt(span)`` (the median's standard error): on a shared host one step
    varies by 10-15 %, a contention that holds does not.

    Parameters
    ----------
    warmup
        Steps learned before :meth:`slowdown` says anything.
    window
        Steps kept (bounded memory: one float each).
    span
        Recent steps whose median is judged.
    """

    __slots__ = ("history", "recent", "span", "warmup", "window")

    def __init__(self, warmup: int = 8, window: int = 64, span: int = 5) -> None:
        if warmup < 1:
            raise ValueError(f"warmup must be >= 1, got {warmup!r}")
        if window < warmup:
            raise ValueError(f"window must be >= warmup, got {window!r}")
        if span < 1:
            raise ValueError(f"span must be >= 1, got {span!r}")
        self.warmup = warmup
        self.window = window
        self.span = span
        self.history: F64 = np.empty(0)
        self.recent: F64 = np.empty(0)

    def slowdown(self, step_time: float, k: float, span: int | None = None) -> float:
        """How much slower the median of the last ``span`` steps (``step_time`` the
        newest) is than the baseline (a fraction), or 0 while warming or while within
        ``k`` robust sigmas of that median's noise."""
        h = self.history
        if h.shape[0] < self.warmup or not np.isfinite(step_time):
            return 0.0
        med = float(np.median(h))
        if med <= 0:
            return 0.0
        sigma = MAD_TO_SIGMA * float(np.median(np.abs(h - med))) / med
        n = self.span if span is None else span
        last = np.append(
            self.recent[max(self.recent.shape[0] - n + 1, 0) :] if n > 1 else [], step_time
        )
        if last.shape[0] > 1:
            sigma *= _MEDIAN_SE / np.sqrt(last.shape[0])
        slow = float(np.median(last)) / med - 1.0
        return slow if slow >= k * sigma else 0.0

    def learn(self, step_time: float, slow: bool) -> None:
        """Keep ``step_time`` among the recent steps, and in the baseline unless the
        step was slow (a fault is not the baseline)."""
        if not np.isfinite(step_time) or step_time <= 0:
            return
        keep = max(self.recent.shape[0] - self.span + 2, 0)
        self.recent = np.append(self.recent[keep:], step_time)
        if not slow:
            self.history = np.append(self.history[-(self.window - 1) :], step_time)


class RecentScores:
    """Each rank's :func:`waited_on` scores of its last ``span`` steps (0 where it was
    not waited on), by slot: a rank is named on their median, so it must be waited on
    in most of them. One step's waits on a busy host are noise (a healthy rank of a
    4-rank CPU job waited 30 % less than its own normal in some steps); a neighbour
    that takes its core keeps it waited on in most steps.

    >>> r = RecentScores(span=3)
    >>> slots = np.arange(2)
    >>> r.median(slots, np.array([0.3, 0.0])).tolist()   # one step: not yet
    [0.0, 0.0]
    >>> r.learn(slots, np.array([0.3, 0.0]))
    >>> r.median(slots, np.array([0.2, 0.4])).tolist()   # two of three
    [0.2, 0.0]
    """

    __slots__ = ("span", "values")

    def __init__(self, span: int = 5) -> None:
        if span < 1:
            raise ValueError(f"span must be >= 1, got {span!r}")
        self.span = span
        self.values: F64 = np.zeros((span - 1, 0))

    def median(self, slots: I64, score: F64) -> F64:
        """The median of each slot's stored scores and ``score`` (reads state only)."""
        past = np.zeros((self.span - 1, slots.shape[0]))
        inside = slots < self.values.shape[1]
        past[:, inside] = self.values[:, slots[inside]]
        return np.median(np.vstack((past, score[None, :])), axis=0)

    def learn(self, slots: I64, score: F64) -> None:
        """Store ``score`` as each slot's newest; the oldest goes."""
        if not score.any() and not self.values.any():
            return  # nothing waited on lately: the common case costs a scan
        need = int(slots.max()) + 1 if slots.shape[0] else 0
        if need > self.values.shape[1]:
            grow = np.zeros((self.span - 1, need - self.values.shape[1]))
            self.values = np.hstack((self.values, grow))
        if self.span > 1:
            self.values[:-1, slots] = self.values[1:, slots]
            self.values[-1, slots] = score

    def forget(self, slots: I64) -> None:
        """Forget ``slots`` (a replaced node's ranks start afresh)."""
        self.values[:, slots[slots < self.values.shape[1]]] = 0.0


#: The standard error of a sample's median, in sigmas of its values, times sqrt(n).
_MEDIAN_SE = 1.2533


def waited_on(
    frame: StepFrame,
    step_slow: float,
    own_deficit: F64,
    excluded: B,
    *,
    compute: F64 | None = None,
    node: I64 | None = None,
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
        Rows never named (not training, baseline still warming).
    compute
        The time each rank's clock measured, where ``frame.compute`` was rescaled to
        the step's median work (:func:`detectors.steps.work.per_work`): a rank given
        more tokens waits less for what it did, which its clock explains.
    node
        Each row's node. A rank's node-mates share its host, and its contention: they
        are no witnesses of it. Where a node holds at least ``1 / NODE_SHARE`` of its
        stage, its ranks are judged against the stage's ranks on *other* nodes (a
        hogged host of two ranks in a stage of four is half the stage, and the
        stage's median sits between the waiters and the waited-on).
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
    unexplained, step, ref, spread, med = _unexplained(frame, groups, compute, node)
    inv = groups.inverse
    sigma = np.maximum(MAD_TO_SIGMA * spread, _SIGMA_FLOOR_REL * step)
    sigma = np.maximum(sigma, 1e-9)
    # its own normal was learned against the whole stage: move it to the same reference
    own = own_deficit + (ref[0] - med[0][inv]) / np.maximum(step, 1e-9)
    rel = np.minimum(unexplained / np.maximum(step, 1e-9), own)
    hit = (rel >= floor) & (unexplained >= k * sigma) & (groups.sizes[inv] >= min_peers)
    hit &= ~excluded & np.isfinite(rel)
    return np.where(hit, np.minimum(rel, step_slow), 0.0)


def _unexplained(
    frame: StepFrame, groups: Groups, compute: F64 | None, node: I64 | None
) -> tuple[F64, F64, F64, F64, F64]:
    """Per row: its stage peers' comm wait less its own, less what its own clocks
    explain (seconds), the stage's step, the references (comm wait, clock, data wait)
    and the comm wait's spread it was judged against, and the stage medians."""
    clock = frame.compute if compute is None else compute
    values = np.stack((frame.comm_wait, clock, frame.data_wait, frame.step_time))
    med, mad = groups.median_and_mad(values)
    inv = groups.inverse
    step = np.maximum(med[3], med[1] + med[0])[inv]
    ref, spread = med[:3, inv], mad[0][inv]
    if node is not None:
        ref, spread = _other_nodes(values, groups, node, ref, spread)
    # what its own clocks say it spent: more compute, or a longer wait for its batch
    # (a stalled loader arrives late by its stall: the data stall's to name)
    explained = np.maximum(clock - ref[1], 0.0) + np.maximum(frame.data_wait - ref[2], 0.0)
    return ref[0] - frame.comm_wait - explained, step, ref, spread, med


def last_arrivals(
    frame: StepFrame,
    excluded: B,
    *,
    compute: F64 | None = None,
    node: I64 | None = None,
    min_peers: int,
) -> tuple[B, F64]:
    """Which row arrived last at its stage's collectives this step (the least comm
    wait among the rows judged: its peers waited on it), and each row's unexplained
    share of the step (:func:`waited_on`'s, before any gate; NaN where not judged:
    ``excluded``, or a stage of fewer than ``min_peers`` rows, which has no last
    arrival).

    Reads its arguments only.

    >>> comm = np.array([0.06, 0.05, 0.07, 0.02, 0.06])
    >>> f = StepFrame.from_arrays("j", 1, 1.0, np.full(5, 0.2), comm, step_time=np.full(5, 0.3))
    >>> last, share = last_arrivals(f, np.zeros(5, bool), min_peers=4)
    >>> np.flatnonzero(last).tolist(), round(float(share[3]), 3)
    ([3], 0.133)
    """
    n = frame.n_ranks
    last = np.zeros(n, dtype=bool)
    if n == 0:
        return last, np.zeros(0)
    groups = Groups.of(frame.pp_stage)
    inv = groups.inverse
    judged = ~excluded & np.isfinite(frame.comm_wait) & (groups.sizes[inv] >= min_peers)
    if not judged.any():
        return last, np.full(n, np.nan)
    unexplained, step, _ref, _spread, _med = _unexplained(frame, groups, compute, node)
    share = unexplained / np.maximum(step, 1e-9)
    # each stage's least comm wait among the rows judged (one pass; ties: the first row)
    comm = np.where(judged, frame.comm_wait, np.inf)
    sizes = groups.sizes
    least = np.full(groups.n_groups, np.inf)
    full = sizes > 0
    least[full] = np.minimum.reduceat(comm[groups.order], groups.bounds[:-1][full])
    at = np.flatnonzero(judged & (comm <= least[inv]))
    _, first = np.unique(inv[at], return_index=True)
    last[at[first]] = True
    return last, np.where(judged, share, np.nan)


class LastArrivals:
    """Who its stage's peers keep waiting on: per slot, which of the last ``span``
    steps it arrived last in its stage (a bit each), how often it usually does
    (``rate``, learned while it is not suspect), and its unexplained share of the
    step when it did (``gap``, exponentially weighted).

    In a synchronous step exactly one rank of a stage arrives last; on a healthy job
    who it is changes from step to step, or is the same rank by where it sits (the
    leader, nearer the reduction's root: its usual rate is high, and that is its
    normal). A rank whose thread gets less of its core (a CPU hog, a throttled host
    thread) arrives last step after step while its compute clock reads normal: on a
    real 4-rank gloo job on a quiet two-core host one step's comm waits spread by
    15-26 % of the step, so no magnitude test over a few steps tells a hog that costs
    the job 8 % from noise, but the hogged rank arrived last in 44 of 50 steps where
    no healthy non-leader rank did in more than 6 of any 10. A rank is named when it
    arrived last in so many of its last ``span`` steps that its usual rate makes that
    less likely than ``p_value`` (the binomial tail), and its peers waited on it by at
    least ``floor`` of the step.

    >>> arr = LastArrivals(span=10)
    >>> slots = np.arange(4)
    >>> share = np.array([0.0, 0.0, 0.0, 0.2])
    >>> for step in range(20):                          # rank `step % 4` arrives last
    ...     last = np.arange(4) == step % 4
    ...     _ = arr.learn(slots, last, share, arr.evidence(slots, last, share, 0.1, 1e-3))
    >>> last = np.array([False, False, False, True])     # then rank 3, every step
    >>> found = []
    >>> for step in range(10):
    ...     ev = arr.evidence(slots, last, share, 0.1, 1e-3)
    ...     found.append(bool(ev[3] > 0))
    ...     arr.learn(slots, last, share, ev)
    >>> found.index(True)                               # named at its 8th step in a row
    7
    """

    __slots__ = ("alpha", "bits", "gap", "min_rate", "named", "rate", "seen", "span")

    def __init__(self, span: int = 10, alpha: float = 0.02, min_rate: float = 0.02) -> None:
        if not 2 <= span <= 30:
            raise ValueError(f"span must be in [2, 30], got {span!r}")
        self.span = span
        self.alpha = alpha
        self.min_rate = min_rate
        self.bits = np.zeros(0, dtype=np.uint32)
        self.rate: F64 = np.zeros(0)
        self.gap: F64 = np.zeros(0)
        self.named: B = np.zeros(0, dtype=bool)
        #: steps each slot was judged in (up to ``2 * span``): its first ``2 * span``
        #: set its usual rate whatever it did (a leader that arrives last from the
        #: first step does so by where it sits); it is judged after ``span``
        self.seen = np.zeros(0, dtype=np.int64)

    def _get(self, slots: I64) -> tuple[npt.NDArray[np.uint32], F64, F64, B]:
        inside = slots < self.bits.shape[0]
        bits = np.zeros(slots.shape[0], dtype=np.uint32)
        rate = np.full(slots.shape[0], np.nan)
        gap = np.zeros(slots.shape[0])
        named = np.zeros(slots.shape[0], dtype=bool)
        bits[inside] = self.bits[slots[inside]]
        rate[inside] = self.rate[slots[inside]]
        gap[inside] = self.gap[slots[inside]]
        named[inside] = self.named[slots[inside]]
        return bits, rate, gap, named

    def count_and_rate(self, slots: I64, last: B) -> tuple[int, float]:
        """How many of its last ``span`` steps (this one included) the first of
        ``slots`` arrived last in, and its usual rate (reads state only)."""
        bits, rate, _gap, _named = self._get(slots)
        mask = np.uint32((1 << self.span) - 1)
        now = ((bits << np.uint32(1)) | last.astype(np.uint32)) & mask
        return int(np.bitwise_count(now)[0]), float(np.nan_to_num(rate[0]))

    def evidence(self, slots: I64, last: B, share: F64, floor: float, p_value: float) -> F64:
        """Per row: its gap where it is named this step, else 0 (reads state only). A
        row named stays named while it still arrives last in most of its last steps,
        by half the floor (one step that someone else arrived last in does not
        resolve it)."""
        bits, rate, gap, named_before = self._get(slots)
        mask = np.uint32((1 << self.span) - 1)
        now = ((bits << np.uint32(1)) | last.astype(np.uint32)) & mask
        count = np.bitwise_count(now).astype(np.int64)
        gap = np.where(last & np.isfinite(share), gap + 0.3 * (share - gap), gap)
        out = np.zeros(slots.shape[0])
        seen = np.zeros(slots.shape[0], dtype=np.int64)
        inside = slots < self.seen.shape[0]
        seen[inside] = self.seen[slots[inside]]
        cand = np.flatnonzero((2 * count > self.span) & (seen >= self.span) & (gap >= floor))
        if cand.shape[0]:
            p = np.clip(rate[cand], self.min_rate, 1.0 - 1e-9)
            k = count[cand]
            tail = np.zeros(cand.shape[0])
            for j in range(self.span + 1):
                tail += np.where(
                    j >= k, math.comb(self.span, j) * p**j * (1 - p) ** (self.span - j), 0.0
                )
            named = tail <= p_value
            out[cand[named]] = gap[cand[named]]
        held = named_before & (2 * count > self.span) & (gap >= floor / 2) & (out <= 0)
        out[held] = gap[held]
        return out

    def learn(self, slots: I64, last: B, share: F64, named: F64) -> None:
        """Shift this step in: each slot's bit, its gap where it arrived last, and its
        usual rate where it is neither named nor suspect (last in over half)."""
        need = int(slots.max()) + 1 if slots.shape[0] else 0
        if need > self.bits.shape[0]:
            grow = need - self.bits.shape[0]
            self.bits = np.append(self.bits, np.zeros(grow, dtype=np.uint32))
            self.rate = np.append(self.rate, np.full(grow, np.nan))
            self.gap = np.append(self.gap, np.zeros(grow))
            self.named = np.append(self.named, np.zeros(grow, dtype=bool))
            self.seen = np.append(self.seen, np.zeros(grow, dtype=np.int64))
        self.named[slots] = named > 0
        mask = np.uint32((1 << self.span) - 1)
        bits = ((self.bits[slots] << np.uint32(1)) | last.astype(np.uint32)) & mask
        self.bits[slots] = bits
        ok = last & np.isfinite(share)
        self.gap[slots[ok]] += 0.3 * (share[ok] - self.gap[slots[ok]])
        judged = np.isfinite(share)
        seen = self.seen[slots]
        first = judged & (seen < 2 * self.span)  # its usual rate: the mean so far
        calm = judged & ~first & (named <= 0)
        calm &= 2 * np.bitwise_count(bits).astype(np.int64) <= self.span
        rate = np.nan_to_num(self.rate[slots])
        rate = np.where(first, rate + (last - rate) / (seen + 1), rate)
        rate = np.where(calm, rate + self.alpha * (last - rate), rate)
        self.rate[slots] = np.where(judged | ~np.isnan(self.rate[slots]), rate, np.nan)
        self.seen[slots] = np.minimum(seen + judged, 2 * self.span)

    def forget(self, slots: I64) -> None:
        """Forget ``slots`` (a replaced node's ranks start afresh)."""
        slots = slots[slots < self.bits.shape[0]]
        self.bits[slots] = 0
        self.rate[slots] = np.nan
        self.gap[slots] = 0.0
        self.named[slots] = False
        self.seen[slots] = 0


#: A node holding at least 1 / NODE_SHARE of its stage's ranks is judged against the
#: stage's other nodes (:func:`waited_on`); smaller shares move the stage's median
#: little, and the exact reference would cost a pass per node.
NODE_SHARE = 8


def _other_nodes(values: F64, groups: Groups, node: I64, ref: F64, spread: F64) -> tuple[F64, F64]:
    """``ref`` (comm wait, clock and data wait medians) and ``spread`` (comm wait's MAD) of each
    row, from its stage's rows on other nodes where its node holds a large share."""
    inv = groups.inverse
    if int(np.bincount(node).max()) * NODE_SHARE < int(groups.sizes.min()):
        return ref, spread  # no node holds a large share of any stage (a large job)
    pair = inv * (int(node.max()) + 1) + node
    keys, first, counts = np.unique(pair, return_index=True, return_counts=True)
    big = counts * NODE_SHARE >= groups.sizes[inv[first]]
    if not big.any():
        return ref, spread
    ref, spread = ref.copy(), spread.copy()
    for key, row in zip(keys[big].tolist(), first[big].tolist(), strict=True):
        rows = pair == key
        others = (inv == inv[row]) & ~rows
        if not others.any():
            continue  # one node is the whole stage: nobody else to compare with
        m = median(values[:3, others])
        ref[:, rows] = m[:, None]
        spread[rows] = median(np.abs(values[0, others] - m[0]))
    return ref, spread
