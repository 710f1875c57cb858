"""Persistence the job's own noise cannot fake (issue 44 2(b)).

The compute rule names a straggler after a *run*: ``straggler_min_steps`` consecutive
steps in which a rank computes ``straggler_warning`` or more over its peers. On a quiet
cluster noise never runs that long. On a shared host it does: on the real DDP job of
``tests/integration`` (four ranks on two busy cores) a healthy rank computes +20 to +40 %
over its peers for three or four steps now and then, and the leader's such runs raised
WARNING stragglers recommending a replacement.

:class:`NoiseRuns` keeps the runs the job's own ranks ended by themselves (noise: no
episode named them), each as its length and the least excess it sustained, the last
:data:`KEEP` of them, and says of a run in progress whether it is beyond them:

- it has lasted half as long again as the longest of them, and longer (never asking
  more than ``cap`` steps: a job that saw a noise run of 4 steps asks for 7), or
- it has sustained, at every step of it, ``margin`` times the most excess any of them
  of two steps or more sustained.

A job whose noise never ran is judged as before (``min_steps`` steps); a gross straggler
on a noisy host is still named in ``min_steps`` steps; a run like the noise's waits
until it outlasts it.

Examples
--------
>>> import numpy as np
>>> runs = NoiseRuns()
>>> slots, above = np.array([0, 1]), np.array([0.30, 0.0])
>>> for _ in range(2):  # rank 0's noise: +30 % for two steps, then it ends
...     runs.learn(slots, above, floor=0.05, named=np.zeros(2, bool), cap=9)
>>> runs.learn(slots, np.zeros(2), floor=0.05, named=np.zeros(2, bool), cap=9)
>>> runs.longest, round(runs.record, 2)
(2, 0.3)
>>> gross, like = np.array([0.9, 0.0]), np.array([0.3, 0.0])
>>> runs.beyond(slots, gross, 0.05, min_steps=3, cap=9, margin=2.0).tolist()
[True, False]
>>> runs.beyond(slots, like, 0.05, min_steps=3, cap=9, margin=2.0).tolist()  # its first step
[False, False]
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["KEEP", "NoiseRuns"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

#: noise runs remembered (the oldest goes first): the job's recent noise, not its history
KEEP = 32
#: the longest run a slot counts (int16)
_MAX_RUN = 30000


class NoiseRuns:
    """The runs of excess the job's ranks ended by themselves (module docstring).

    State: per rank slot the run in progress (length, least excess so far), and the
    last :data:`KEEP` noise runs (length, least excess).
    """

    __slots__ = ("_ended", "_len", "_low", "_next")

    def __init__(self) -> None:
        self._len = np.zeros(0, dtype=np.int16)
        self._low = np.zeros(0, dtype=np.float32)
        self._ended = np.zeros((KEEP, 2), dtype=np.float64)  # (length, least excess)
        self._next = 0

    @property
    def longest(self) -> int:
        """The longest noise run remembered (0: none)."""
        return int(self._ended[:, 0].max())

    @property
    def record(self) -> float:
        """The most excess a remembered noise run of two steps or more sustained."""
        two = self._ended[:, 0] >= 2
        return float(self._ended[two, 1].max()) if two.any() else 0.0

    def _grow(self, slots: I64) -> None:
        n = int(slots.max()) + 1 if slots.shape[0] else 0
        if n > self._len.shape[0]:
            extra = n - self._len.shape[0]
            self._len = np.concatenate((self._len, np.zeros(extra, dtype=np.int16)))
            self._low = np.concatenate((self._low, np.zeros(extra, dtype=np.float32)))

    def _runs(self, slots: I64, excess: F64, floor: float) -> tuple[I64, F64]:
        """Each row's run including this step (0 where it is below ``floor``): its
        length and the least excess it sustained."""
        n = self._len.shape[0]
        known = slots < n
        if n:
            safe = np.where(known, slots, 0)
            prev = np.where(known, self._len[safe], 0).astype(np.int64)
            low = np.where(known & (prev > 0), self._low[safe], np.inf)
        else:
            prev, low = np.zeros(slots.shape[0], dtype=np.int64), np.full(slots.shape[0], np.inf)
        above = excess >= floor
        length = np.where(above, prev + 1, 0)
        least = np.where(above, np.minimum(low, excess), 0.0)
        return length, least

    def beyond(
        self, slots: I64, excess: F64, floor: float, *, min_steps: int, cap: int, margin: float
    ) -> B:
        """Rows whose run, this step included, is beyond the job's noise: counted from
        here, the grading's ``min_steps`` consecutive steps end when the run has lasted
        1.5 times the longest remembered noise run and more (at most ``cap`` steps),
        or at once where it sustains ``margin`` times their record. Reads state only."""
        length, least = self._runs(slots, excess, floor)
        longest = self.longest
        need = min(max(longest + 1 + longest // 2, min_steps), max(cap, min_steps))
        lasted = length >= need - min_steps + 1
        strong = least >= margin * self.record
        return (length > 0) & (lasted | strong)

    def learn(self, slots: I64, excess: F64, floor: float, named: B, *, cap: int) -> None:
        """Move each row's run on by this step. A run that ended is noise unless
        ``named`` (its rank is in an episode) or it lasted beyond ``cap`` steps: a
        fault the other gates let pass must not teach the job that its noise runs
        longer than the most it may ask."""
        self._grow(slots)
        length, least = self._runs(slots, excess, floor)
        prev = self._len[slots].astype(np.int64)
        ended = (length == 0) & (prev >= 1) & (prev <= cap) & ~named
        for row in np.flatnonzero(ended)[:KEEP]:
            self._ended[self._next] = (prev[row], float(self._low[slots[row]]))
            self._next = (self._next + 1) % KEEP
        self._len[slots] = np.minimum(length, _MAX_RUN).astype(np.int16)
        self._low[slots] = least.astype(np.float32)

    def forget(self, slots: I64) -> None:
        """These slots run on other hardware: their runs in progress are dropped."""
        slots = slots[slots < self._len.shape[0]]
        self._len[slots] = 0
        self._low[slots] = 0.0
