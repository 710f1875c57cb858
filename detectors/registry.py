"""NodeRegistry: the nodes of one job and the node each rank runs on.

Every node gets a global id on first appearance, never reused, so arrays indexed by
node id (per-node counts, the NIC-flap window) stay valid as nodes join. The registry
also maps rank -> node id (by the rank's dense slot, :class:`~detectors.steps.ranks.RankIndex`),
to notice a rank that moved to other hardware (its baselines no longer apply), and
keeps the nodes taken out of the job at a relaunch.

Scoring reads the registry (:meth:`NodeRegistry.lookup`); only learning changes it
(:meth:`NodeRegistry.register`, :meth:`NodeRegistry.record_ranks`).

Examples
--------
>>> import numpy as np
>>> reg = NodeRegistry()
>>> ids, names = reg.lookup(("n0", "n1"))   # reads only: ids are provisional
>>> ids.tolist(), names, reg.names
([0, 1], ['n0', 'n1'], [])
>>> reg.register(("n0", "n1"))
>>> reg.record_ranks(np.array([0, 1, 2, 3]), np.array([0, 0, 1, 1])).tolist()
[]
>>> reg.record_ranks(np.array([2, 3]), np.array([0, 1])).tolist()  # slot 2 moved
[2]
>>> reg.rank_node.tolist(), reg.node_id("n1"), reg.node_id("spare")
([0, 0, 0, 1], 1, None)
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

__all__ = ["NodeRegistry"]

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


class NodeRegistry:
    """Global node ids, node names, the rank -> node map and the removed nodes of a job.

    The rank -> node map is an array indexed by rank *slot* (dense, see
    :class:`~detectors.steps.ranks.RankIndex`; ``-1``: slot not recorded), so its length
    follows the number of distinct ranks, never the rank ids: it grows to
    ``max(largest slot + 1, 2 x its length)`` and no further.

    Examples
    --------
    >>> import numpy as np
    >>> reg = NodeRegistry()
    >>> _ = reg.record_ranks(np.array([5]), np.array([0]))
    >>> reg.rank_node.tolist()
    [-1, -1, -1, -1, -1, 0]
    >>> _ = reg.record_ranks(np.array([7]), np.array([0]))   # doubles: room for growth
    >>> reg.rank_node.shape[0]
    12
    >>> _ = reg.record_ranks(np.array([30]), np.array([0]))  # no more than the slot needs
    >>> reg.rank_node.shape[0]
    31
    >>> reg.remove("n0")
    >>> reg.is_removed("n0")
    True
    >>> reg.register(("n0",))   # back in the job's steps: back in the job
    >>> reg.is_removed("n0")
    False
    """

    def __init__(self) -> None:
        self._names: list[str] = []
        self._ids: dict[str, int] = {}
        self._rank_node = np.full(0, -1, dtype=np.int64)
        self._frame_nodes: tuple[str, ...] = ()
        self._frame_node_ids = np.zeros(0, dtype=np.int64)
        self._removed: set[str] = set()

    @property
    def names(self) -> list[str]:
        """Node names by global id (registered nodes only)."""
        return self._names

    @property
    def rank_node(self) -> I64:
        """Global node id by rank slot; ``-1`` for a slot never recorded."""
        return self._rank_node

    def node_id(self, name: str) -> int | None:
        """Global id of the registered node ``name``; None if unknown."""
        return self._ids.get(name)

    def lookup(self, nodes: tuple[str, ...]) -> tuple[I64, list[str]]:
        """Global ids of ``nodes`` and the node names by id, without registering.

        Parameters
        ----------
        nodes
            The node names of one frame (``StepFrame.nodes``).

        Returns
        -------
        ids, names
            The id of each entry of ``nodes``; new nodes get provisional ids after the
            registered ones, the ids :meth:`register` will give them. ``names`` lists
            registered then new nodes by id.
        """
        if nodes == self._frame_nodes:
            return self._frame_node_ids, self._names
        known = self._ids
        names = self._names
        new: dict[str, int] = {}
        ids = np.empty(len(nodes), dtype=np.int64)
        for k, name in enumerate(nodes):
            i = known.get(name)
            if i is None:
                i = new.get(name)
                if i is None:
                    i = new[name] = len(names) + len(new)
            ids[k] = i
        if new:
            names = [*names, *new]
        return ids, names

    def register(self, nodes: tuple[str, ...]) -> None:
        """Give ids to the new nodes of a frame; a removed node seen again is back in
        the job. The ids of the last frame's nodes are cached for :meth:`lookup`."""
        if nodes == self._frame_nodes:
            return
        for name in nodes:
            if name not in self._ids:
                self._ids[name] = len(self._names)
                self._names.append(name)
            self._removed.discard(name)  # back in the job's steps: back in the job
        self._frame_nodes = nodes
        self._frame_node_ids = np.asarray([self._ids[n] for n in nodes], dtype=np.int64)

    def record_ranks(self, slots: I64, nodes: I64) -> I64:
        """Record that the ranks in ``slots`` run on the nodes with global ids ``nodes``.

        Parameters
        ----------
        slots
            Distinct rank slots (:meth:`RankIndex.assign <detectors.steps.ranks.RankIndex.assign>`).
        nodes
            Global node id of each rank.

        Returns
        -------
        numpy.ndarray
            The slots recorded before on another node: they run on other hardware now.
        """
        need = int(slots.max()) + 1 if slots.shape[0] else 0
        if need > self._rank_node.shape[0]:
            size = max(need, 2 * self._rank_node.shape[0])
            grown = np.full(size, -1, dtype=np.int64)
            grown[: self._rank_node.shape[0]] = self._rank_node
            self._rank_node = grown
        prev = self._rank_node[slots]
        moved: I64 = slots[(prev >= 0) & (prev != nodes)].astype(np.int64)
        self._rank_node[slots] = nodes
        return moved

    def rows_of(
        self, subjects: Iterable[tuple[str | None, int | None]], ranks: I64, rank_node: I64
    ) -> B:
        """Rows of a frame covered by ``subjects``.

        Parameters
        ----------
        subjects
            ``(node, rank)`` pairs: a rank covers its own row, a node (rank None) every
            row on it; unknown nodes and absent ranks cover nothing.
        ranks
            The frame's rank ids, sorted (``StepFrame.rank``).
        rank_node
            Global node id of each row.
        """
        out = np.zeros(ranks.shape[0], dtype=bool)
        for node, rank in subjects:
            if rank is not None:
                i = int(np.searchsorted(ranks, rank))
                if i < ranks.shape[0] and int(ranks[i]) == rank:
                    out[i] = True
            elif node is not None and node in self._ids:
                out |= rank_node == self._ids[node]
        return out

    def remove(self, node: str) -> None:
        """``node`` was taken out of the job (until it appears in a frame again)."""
        self._removed.add(node)

    def is_removed(self, node: str) -> bool:
        """Whether ``node`` was removed and has not reported a step since."""
        return node in self._removed

    @property
    def removed(self) -> frozenset[str]:
        """The nodes removed that have not reported a step since."""
        return frozenset(self._removed)
