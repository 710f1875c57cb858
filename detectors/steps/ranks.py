"""RankIndex: dense slots for the rank ids of one job.

Per-rank state (temporal baselines, missing-step counts, the rank -> node map) lives
in arrays indexed by *slot*, ``0 .. n - 1`` for the ``n`` distinct ranks seen, given in
first-seen order, and never by the rank id itself: a job whose ranks are
``{0, 1_048_575}`` keeps two slots, not a million. Rank ids are bounded by the
schema's cap (:data:`schemas.telemetry.MAX_RANKS_PER_JOB`); beyond it is a
``ValueError``.

Scoring reads the index (:meth:`RankIndex.lookup`: a new rank gets a provisional
slot, the one :meth:`RankIndex.assign` will give it); only learning changes it.
Whatever is reported names the real rank id (:attr:`RankIndex.ids`).

Examples
--------
>>> import numpy as np
>>> idx = RankIndex()
>>> idx.lookup(np.array([7, 1_048_575])).tolist(), idx.n_slots   # reads only
([0, 1], 0)
>>> idx.assign(np.array([7, 1_048_575])).tolist()
[0, 1]
>>> idx.assign(np.array([3, 7])).tolist()   # 3 is new: the next slot
[2, 0]
>>> idx.ids.tolist()
[7, 1048575, 3]
>>> idx.lookup(np.array([1 << 20]))
Traceback (most recent call last):
...
ValueError: rank ids must be in [0, 1048576), got 1048576
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from schemas.telemetry import MAX_RANKS_PER_JOB

__all__ = ["RankIndex"]

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]

#: The slot-by-id table is kept while the largest id is below this many entries per
#: slot (or :data:`_TABLE_MIN`); sparser ids are looked up in a sorted array instead.
_TABLE_PER_SLOT = 4
_TABLE_MIN = 4096


class RankIndex:
    """Rank id -> dense slot, in first-seen order, and back.

    Parameters
    ----------
    max_ranks
        Rank ids must lie in ``[0, max_ranks)`` (at most the schema's
        ``MAX_RANKS_PER_JOB``).

    Lookups are vectorised: while ids are dense (the largest below
    ``max(4096, 4 x slots)``, every ordinary job) an ``int32`` table indexed by id
    gives the slot in one gather; sparser ids are found by binary search in the
    sorted known ids. Either way memory is linear in the number of slots.

    Examples
    --------
    >>> import numpy as np
    >>> idx = RankIndex()
    >>> idx.assign(np.arange(4)).tolist(), idx.table_size   # dense: a table
    ([0, 1, 2, 3], 4)
    >>> idx.assign(np.array([5, 1 << 19])).tolist(), idx.table_size  # sparse: none
    ([4, 5], 0)
    >>> idx.lookup(np.array([1 << 19, 9, 0, 9])).tolist()  # 9 is new (once)
    [5, 6, 0, 6]
    """

    def __init__(self, max_ranks: int = MAX_RANKS_PER_JOB) -> None:
        if not 1 <= max_ranks <= MAX_RANKS_PER_JOB:
            raise ValueError(f"max_ranks must be in [1, {MAX_RANKS_PER_JOB}], got {max_ranks!r}")
        self.max_ranks = max_ranks
        self._ids = np.zeros(0, dtype=np.int64)
        self._table = np.zeros(0, dtype=np.int32)  #: slot by id (-1: unknown), if dense
        self._sorted = np.zeros(0, dtype=np.int64)  #: known ids sorted, if sparse
        self._sorted_slot = np.zeros(0, dtype=np.int64)  #: slot of each ``_sorted``

    @property
    def ids(self) -> I64:
        """Rank id by slot."""
        return self._ids

    @property
    def n_slots(self) -> int:
        """Distinct ranks assigned."""
        return int(self._ids.shape[0])

    @property
    def table_size(self) -> int:
        """Entries of the slot-by-id table (0 while ids are sparse)."""
        return int(self._table.shape[0])

    def lookup(self, ranks: I64) -> I64:
        """Slot of each of ``ranks``, without assigning; reads state only.

        New ranks get provisional slots after the assigned ones, in first-seen order
        (a repeated new id gets one slot): the slots :meth:`assign` will give them.

        Raises
        ------
        ValueError
            When a rank id lies outside ``[0, max_ranks)``.
        """
        return self._resolve(ranks)[0]

    def assign(self, ranks: I64) -> I64:
        """Slot of each of ``ranks``, giving the new ones the next slots (as
        :meth:`lookup` said)."""
        slots, new = self._resolve(ranks)
        if new.shape[0]:
            self._add(new)
        return slots

    def _resolve(self, ranks: I64) -> tuple[I64, I64]:
        """Slots of ``ranks`` (new ones provisional) and the new ids in slot order."""
        slots = self._find(ranks)
        unknown = slots < 0
        if not unknown.any():
            return slots, np.zeros(0, dtype=np.int64)
        uniq, first, inv = np.unique(ranks[unknown], return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")  # first-seen order of the new ids
        place = np.empty(order.shape[0], dtype=np.int64)
        place[order] = np.arange(order.shape[0])
        slots[unknown] = self.n_slots + place[inv.ravel()]
        return slots, uniq[order].astype(np.int64)

    def _find(self, ranks: I64) -> I64:
        """Assigned slot of each of ``ranks``; -1 for unknown ids."""
        n = ranks.shape[0]
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        lo, hi = int(ranks.min()), int(ranks.max())
        if lo < 0 or hi >= self.max_ranks:
            raise ValueError(
                f"rank ids must be in [0, {self.max_ranks}), got {lo if lo < 0 else hi}"
            )
        if self._sorted.shape[0] == 0:  # dense (or empty): the table
            table = self._table
            if hi < table.shape[0]:
                return table[ranks].astype(np.int64)
            slots = np.full(n, -1, dtype=np.int64)
            inside = ranks < table.shape[0]
            slots[inside] = table[ranks[inside]]
            return slots
        known = self._sorted
        pos = np.minimum(np.searchsorted(known, ranks), known.shape[0] - 1)
        return np.where(known[pos] == ranks, self._sorted_slot[pos], -1)

    def _add(self, new: I64) -> None:
        """Assign the next slots to ``new`` (distinct unknown ids, in slot order)."""
        start = self.n_slots
        self._ids = ids = np.concatenate((self._ids, new))
        n = ids.shape[0]
        hi = int(ids.max())
        limit = max(_TABLE_MIN, _TABLE_PER_SLOT * n)
        if hi >= limit:  # sparse ids: binary search in the sorted ids
            order = np.argsort(ids, kind="stable")
            self._sorted, self._sorted_slot = ids[order], order.astype(np.int64)
            self._table = np.zeros(0, dtype=np.int32)
        elif self._sorted.shape[0] or hi >= self._table.shape[0]:  # (re)build the table
            size = min(limit, max(hi + 1, 2 * self._table.shape[0]))
            table: I32 = np.full(size, -1, dtype=np.int32)
            table[ids] = np.arange(n, dtype=np.int32)
            self._table = table
            self._sorted = np.zeros(0, dtype=np.int64)
            self._sorted_slot = np.zeros(0, dtype=np.int64)
        else:
            self._table[new] = np.arange(start, n, dtype=np.int32)
