"""Intermittent stragglers: a rank slow on some steps only (one step in k, a fraction).

A GPU that is 60 % slower on every 5th step (periodic throttling, a noisy neighbour's
cron job, a flapping link) hides from a robust centre: its median compute is normal
and each slow step is a lone outlier that hysteresis (several steps in a row) does
not let through. What gives it away is *how often* it is clearly slow: a healthy
rank is slow beyond ``z`` robust units on about one step in a thousand, an
intermittent straggler on one step in k.

:class:`IntermittentSlowdown` keeps, per rank, the last ``window`` train steps as one
bit each (slow or not: the caller decides, from the rank's excess over its own
baseline and its peers) in a ``uint64``, and the mean excess of its slow steps. A
rank is intermittent once at least ``min_slow`` of its last ``window`` steps were
slow; its score is the average slowdown those steps cost (fraction x excess), the
pattern (one step in k when the slow steps are evenly spaced, the fraction
otherwise) goes to the evidence.

A window of 48 steps cannot show a rank slow on one step in 15 or 60. So each rank
also keeps its last ``min_pulses`` (8) *pulses* (a slow step after one that was not:
a burst of slow steps is one pulse) however far apart: a rank whose pulses come at a
steady spacing (all gaps but one within 10 % of their median) and go on (the last is
at most 1.5 spacings old) is intermittent at whatever period, with at least the
WARNING score (:func:`intermittent_findings`): eight evenly spaced pulses of one rank
are what noise does not make (a noisy rank's spikes come at random).

Examples
--------
>>> import numpy as np
>>> det = IntermittentSlowdown(window=20, min_slow=3)
>>> slots = np.arange(3)
>>> for step in range(20):
...     slow = np.array([False, step % 5 == 4, False])  # slot 1: every 5th step
...     excess = np.where(slow, 0.6, 0.0)
...     det.learn(slots, slow, excess, np.ones(3, bool))
>>> det.counts(slots).tolist()
[0, 4, 0]
>>> [round(float(x), 3) for x in det.score(slots)]
[0.0, 0.12, 0.0]
>>> det.pattern(1)
'slow on 4 of the last 20 steps (one step in 5), +60.0% on those steps'
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from itertools import pairwise

import numpy as np
import numpy.typing as npt

from detectors.base import Finding
from detectors.config import DetectorConfig
from detectors.frame import StepFrame
from detectors.steps.peer import PeerScores
from detectors.steps.slowdown import rank_or_node_findings

__all__ = ["IntermittentSlowdown", "intermittent_findings", "slow_steps"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]
U64 = npt.NDArray[np.uint64]


class IntermittentSlowdown:
    """How often each rank was slow over its last ``window`` train steps.

    Parameters
    ----------
    window
        Train steps remembered per rank (at most 64: one bit each in a ``uint64``).
    min_slow
        Slow steps within the window before a rank scores at all.
    alpha
        Weight of a new slow step in the mean excess of the rank's slow steps.
    """

    def __init__(
        self, window: int = 48, min_slow: int = 5, alpha: float = 0.2, min_pulses: int = 8
    ) -> None:
        if not 2 <= window <= 64:
            raise ValueError(f"window must be within [2, 64], got {window!r}")
        if not 1 <= min_slow <= window:
            raise ValueError(f"min_slow must be within [1, window], got {min_slow!r}")
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be within (0, 1], got {alpha!r}")
        if not 4 <= min_pulses <= 64:
            raise ValueError(f"min_pulses must be within [4, 64], got {min_pulses!r}")
        self.window = window
        self.min_slow = min_slow
        self.alpha = alpha
        self.min_pulses = min_pulses
        self._bits: U64 = np.zeros(0, dtype=np.uint64)
        self._seen: I64 = np.zeros(0, dtype=np.int64)  #: steps learned, capped at window
        self._excess: F64 = np.zeros(0, dtype=np.float64)
        self._init_pulses()

    #: pulses that name a rank at any period; class defaults (with the empty arrays
    #: below) so that state written before pulses existed reads them
    min_pulses: int = 8
    _steps: I64 = np.zeros(0, dtype=np.int64)  #: train steps learned per rank
    _pulse_at: I64 = np.zeros((0, 8), dtype=np.int64)  #: ring: step count at each pulse
    _n_pulses: I64 = np.zeros(0, dtype=np.int64)
    _pulse_excess: F64 = np.zeros(0, dtype=np.float64)  #: mean excess of the slow steps

    def _init_pulses(self, size: int = 0) -> None:
        self._steps = np.zeros(size, dtype=np.int64)
        self._pulse_at = np.zeros((size, self.min_pulses), dtype=np.int64)
        self._n_pulses = np.zeros(size, dtype=np.int64)
        self._pulse_excess = np.zeros(size, dtype=np.float64)

    @property
    def _mask(self) -> np.uint64:
        return np.uint64((1 << self.window) - 1)

    def _ensure(self, slots: I64) -> None:
        need = int(slots.max()) + 1 if slots.shape[0] else 0
        have = self._bits.shape[0]
        if need <= have:
            return
        size = max(need, 2 * have)
        self._bits = np.concatenate((self._bits, np.zeros(size - have, np.uint64)))
        self._seen = np.concatenate((self._seen, np.zeros(size - have, np.int64)))
        self._excess = np.concatenate((self._excess, np.zeros(size - have, np.float64)))
        self._ensure_pulses(size)

    def _ensure_pulses(self, size: int) -> None:
        have = self._steps.shape[0]
        if have >= size:
            return
        if self._pulse_at.shape[1] != self.min_pulses or have == 0:
            self._init_pulses(size)  # none kept yet (or state written before pulses)
            return
        grow = size - have
        self._steps = np.concatenate((self._steps, np.zeros(grow, np.int64)))
        self._pulse_at = np.concatenate(
            (self._pulse_at, np.zeros((grow, self.min_pulses), np.int64))
        )
        self._n_pulses = np.concatenate((self._n_pulses, np.zeros(grow, np.int64)))
        self._pulse_excess = np.concatenate((self._pulse_excess, np.zeros(grow, np.float64)))

    def counts(self, slots: I64) -> I64:
        """Slow steps of each of ``slots`` within its window (reads state only)."""
        out = np.zeros(slots.shape[0], dtype=np.int64)
        inside = slots < self._bits.shape[0]
        out[inside] = np.bitwise_count(self._bits[slots[inside]]).astype(np.int64)
        return out

    def score(self, slots: I64) -> F64:
        """Average slowdown the slow steps cost each rank over its window (0 below
        ``min_slow`` slow steps, or before a full window): reads state only."""
        out = np.zeros(slots.shape[0], dtype=np.float64)
        inside = slots < self._bits.shape[0]
        s = slots[inside]
        n = np.bitwise_count(self._bits[s]).astype(np.int64)
        full = self._seen[s] >= self.window
        val = np.where(full & (n >= self.min_slow), n / self.window * self._excess[s], 0.0)
        out[inside] = val
        return out

    #: the most one slow step's excess (a fraction of its peers' compute) counts
    MAX_EXCESS = 1.0

    def learn(self, slots: I64, slow: B, excess: F64, mask: B) -> None:
        """Ranks ``slots`` completed a train step (rows where ``mask``): ``slow`` says
        which were clearly slow, ``excess`` by how much (used where slow)."""
        slots = slots[mask]
        if slots.shape[0] == 0:
            return
        self._ensure(slots)
        self._ensure_pulses(self._bits.shape[0])
        slow, excess = slow[mask], excess[mask]
        self._learn_pulses(slots, slow, np.minimum(excess, self.MAX_EXCESS))
        bits = (self._bits[slots] << np.uint64(1)) & self._mask
        self._bits[slots] = bits | slow.astype(np.uint64)
        self._seen[slots] = np.minimum(self._seen[slots] + 1, self.window)
        hit = slots[slow]
        old = self._excess[hit]
        first = old == 0.0
        # winsorised: one slow step counts as at most MAX_EXCESS (a step twice its
        # peers'); a glitched 10^6 s compute otherwise set the rank's cost for good
        x = np.minimum(excess[slow], self.MAX_EXCESS)
        self._excess[hit] = np.where(first, x, (1 - self.alpha) * old + self.alpha * x)
        quiet = self._bits[slots] == 0  # nothing slow left in the window: start afresh
        self._excess[slots[quiet]] = 0.0

    def _learn_pulses(self, slots: I64, slow: B, excess: F64) -> None:
        """Count a pulse where a rank is slow after a step it was not (a burst of slow
        steps is one pulse), at its step count; the mean excess of its slow steps."""
        was_slow = (self._bits[slots] & np.uint64(1)).astype(bool)
        start = slots[slow & ~was_slow]
        self._pulse_at[start, self._n_pulses[start] % self.min_pulses] = self._steps[start]
        self._n_pulses[start] += 1
        hit, x = slots[slow], excess[slow]
        old = self._pulse_excess[hit]
        self._pulse_excess[hit] = np.where(old == 0.0, x, (1 - self.alpha) * old + self.alpha * x)
        self._steps[slots] += 1

    def periods(self, slots: I64) -> F64:
        """The spacing (in train steps) of each rank's last ``min_pulses`` pulses when
        it is steady (every gap but one within 10 % of their median, at least one step)
        and still going (the last pulse at most 1.5 spacings old); 0 otherwise. Reads
        state only.

        >>> det = IntermittentSlowdown(min_pulses=8)
        >>> slots = np.arange(2)
        >>> for step in range(200):
        ...     slow = np.array([step % 20 == 7, step in (3, 9, 50, 51, 90, 130, 131, 199)])
        ...     det.learn(slots, slow, np.full(2, 0.5), np.ones(2, bool))
        >>> det.periods(slots).tolist()  # slot 1's spikes come at random
        [20.0, 0.0]
        """
        out = np.zeros(slots.shape[0], dtype=np.float64)
        inside = slots < self._n_pulses.shape[0]
        s = slots[inside]
        ready = self._n_pulses[s] >= self.min_pulses
        if not ready.any():
            return out
        at = np.sort(self._pulse_at[s[ready]], axis=1)
        gaps = np.diff(at, axis=1).astype(np.float64)
        mid = np.median(gaps, axis=1)
        near = np.abs(gaps - mid[:, None]) <= np.maximum(1.0, 0.1 * mid)[:, None]
        age = self._steps[s[ready]] - 1 - at[:, -1]
        steady = (near.sum(axis=1) >= gaps.shape[1] - 1) & (mid >= 2) & (age <= 1.5 * mid)
        val = np.zeros(s.shape[0], dtype=np.float64)
        val[ready] = np.where(steady, mid, 0.0)
        out[inside] = val
        return out

    def pulse_excess(self, slots: I64) -> F64:
        """The mean excess of each rank's slow steps, over its pulses (reads state only)."""
        out = np.zeros(slots.shape[0], dtype=np.float64)
        inside = slots < self._pulse_excess.shape[0]
        out[inside] = self._pulse_excess[slots[inside]]
        return out

    def forget(self, slots: I64) -> None:
        """New hardware runs ``slots``: their history starts again."""
        inside = slots[slots < self._bits.shape[0]]
        self._bits[inside] = 0
        self._seen[inside] = 0
        self._excess[inside] = 0.0
        pulsed = inside[inside < self._steps.shape[0]]
        self._steps[pulsed] = 0
        self._n_pulses[pulsed] = 0
        self._pulse_excess[pulsed] = 0.0

    def pattern(self, slot: int) -> str:
        """The slot's slow steps in words: one step in k when evenly spaced."""
        if slot >= self._bits.shape[0]:
            return "no slow step"
        period = float(self.periods(np.array([slot]))[0])
        if period >= self.window / self.min_slow:  # too rare for the window to show
            return (
                f"slow once every {period:.0f} steps for its last {self.min_pulses} pulses, "
                f"{self._pulse_excess[slot]:+.1%} on those steps"
            )
        bits = int(self._bits[slot])
        ages = [i for i in range(self.window) if bits >> i & 1]  # 0: the newest step
        n = len(ages)
        head = f"slow on {n} of the last {self.window} steps"
        gaps = Counter(b - a for a, b in pairwise(ages))
        k, seen = gaps.most_common(1)[0] if gaps else (0, 0)
        if n >= 3 and seen >= 0.75 * (n - 1):
            head += f" (one step in {k})"
        else:
            head += f" ({n / self.window:.0%} of steps)"
        return f"{head}, {self._excess[slot]:+.1%} on those steps"


def slow_steps(
    z: F64, excess: F64, peer: PeerScores, warmed: B, config: DetectorConfig
) -> tuple[B, F64]:
    """Which ranks were clearly slow this step, and by how much: ``z`` robust units
    over their own baseline (``excess``), ``intermittent_excess`` above their peers,
    not waiting in the collectives (a culprit does not wait; its peers do) and not
    waiting on their data loader (:meth:`~detectors.steps.peer.PeerScores.waits_for_data`)."""
    ex = np.minimum(excess, peer.slowdown)
    slow = warmed & (z >= config.intermittent_z) & (ex >= config.intermittent_excess)
    slow &= peer.comm_excess <= config.culprit_comm_max
    slow &= ~peer.waits_for_data(config.culprit_comm_max, config.straggler_z)
    return slow, np.maximum(ex, 0.0)


def intermittent_findings(
    det: IntermittentSlowdown,
    slots: I64,
    frame: StepFrame,
    rank_node: I64,
    node_names: Sequence[str],
    *,
    config: DetectorConfig,
    floor: float,
    busy_rows: B,
    open_nodes: Collection[int],
) -> list[Finding]:
    """Intermittent-straggler findings of one train step (reads state only).

    ``busy_rows``: rows already covered by a straggler or degradation episode (one
    incident per culprit); ranks slow on more than ``intermittent_max_fraction`` of
    their steps are steady stragglers, not intermittent ones.
    """
    score = det.score(slots)
    # steady pulses at a period too long for the window: named at WARNING whatever the
    # period (the cost they show, if higher); a shorter period is the window's to judge
    # by its cost (a mild rank's slow steps can fall a few steps apart by chance)
    period = det.periods(slots)
    pulsed = det.pulse_excess(slots) / np.maximum(period, 1.0)
    too_rare = period >= det.window / det.min_slow
    pulsed = np.where(too_rare, np.maximum(pulsed, config.intermittent_warning), 0.0)
    score = np.maximum(score, pulsed)
    steady = det.counts(slots) > config.intermittent_max_fraction * det.window
    score = np.where(busy_rows | steady, 0.0, score)
    present = np.bincount(rank_node, minlength=len(node_names))

    def describe(
        idx: I64, s: float, signal: str
    ) -> tuple[str, float, float, float | None, float | None, float | None, str]:
        worst = int(idx[int(np.argmax(score[idx]))])
        return (
            "slow_step_fraction",
            float(det.counts(slots[idx]).max()) / det.window,
            s,
            None,
            None,
            None,
            f"intermittent: {det.pattern(int(slots[worst]))}; costs {s:+.1%} on average",
        )

    return rank_or_node_findings(
        "intermittent",
        score,
        floor,
        frame,
        rank_node,
        present,
        config.node_fraction,
        describe,
        node_names,
        open_nodes,
    )
