"""Whole model replicas that became persistently slower: the nodes of one rack or switch.

:func:`~detectors.steps.slowdown.replica_corrected` subtracts, step by step, the common
mode of a model replica (``dp_group``) measured on its other nodes, so that sequence-
length imbalance (a replica faster or slower from one step to the next) names no node.
A rack or leaf switch that holds whole replicas and slows all of them is then invisible
node by node: every node of the replica is slow together. This detector keeps what the
correction removes, per replica: the slowdown of its *least* slow node (each node's mean
over its ranks, against their stage peers: every node of the replica must be slow, one
slow node is a straggler the correction already leaves visible), minus the median
replica's (a whole-cluster shift moves every replica alike), smoothed
over steps (random per-step imbalance averages out, a shared part that slowed stays),
against the replica's own slow baseline (a replica that always ran a little slower is
its normal). A replica whose smoothed excess reaches ``floor`` yields one candidate
per node, ``"straggler"`` findings that only :class:`~detectors.steps.group.GroupFaults`
reads (as evidence of a group, never graded on their own: a replica on fewer nodes than
a group needs names nothing).

Examples
--------
>>> import numpy as np
>>> rep = np.repeat(np.arange(8), 16)               # 8 replicas of 2 nodes (8 ranks each)
>>> node = np.arange(128) // 8
>>> drift = ReplicaDrift(alpha=0.2, warmup_steps=5)
>>> rng = np.random.default_rng(0)
>>> for step in range(30):
...     slow = 0.05 * rng.standard_normal(8)[rep]    # per-step imbalance: noise
...     if step >= 15:
...         slow[rep >= 6] += 0.2                     # replicas 6 and 7 slow for good
...     seen = drift.score(slow, rep, node, np.ones(128, dtype=bool))
...     found = drift.findings(seen, rep, node, [f"n{i}" for i in range(16)], floor=0.05)
...     drift.learn(seen, flagged=0.05)
>>> sorted(f.node for f in found)
['n12', 'n13', 'n14', 'n15']
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from detectors._stats import MAD_TO_SIGMA, median
from detectors.base import Finding

__all__ = ["MAX_REPLICAS", "REL_CLIP_SIGMAS", "REL_FLOOR", "ReplicaDrift", "ReplicaStep"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

#: Replica ids tracked at most (state is one slot per id below this).
MAX_REPLICAS = 65536
#: A replica's slowdown over the median replica counts at most this many robust
#: sigmas of the replicas' spread, the spread at least ``REL_FLOOR``.
REL_CLIP_SIGMAS = 6.0
REL_FLOOR = 0.05


@dataclass(frozen=True, slots=True)
class ReplicaStep:
    """One step as :meth:`ReplicaDrift.score` saw it."""

    ids: I64  #: replica ids measured
    rel: F64  #: their mean slowdown over the median replica's
    excess: F64  #: smoothed excess over own baseline by replica id (NaN: not scored)


class ReplicaDrift:
    """Each replica's smoothed slowdown over the median replica, against its own normal.

    Parameters
    ----------
    alpha
        Weight of one step in a replica's smoothed slowdown.
    base_alpha
        Weight of one step in its slow baseline (learned only while not flagged).
    warmup_steps
        Steps a replica is observed before it is scored.
    """

    def __init__(
        self, alpha: float = 0.05, base_alpha: float = 0.005, warmup_steps: int = 20
    ) -> None:
        for name, v in (("alpha", alpha), ("base_alpha", base_alpha)):
            if not 0 < v <= 1:
                raise ValueError(f"{name} must be within (0, 1], got {v!r}")
        if warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1, got {warmup_steps!r}")
        self.alpha = alpha
        self.base_alpha = base_alpha
        self.warmup_steps = warmup_steps
        self._fast: F64 = np.zeros(0)
        self._base: F64 = np.zeros(0)
        self._seen: I64 = np.zeros(0, dtype=np.int64)

    def _weights(self, seen: I64) -> tuple[F64, F64]:
        """Step weights of the smoothed value and the baseline: a running mean until
        the EW weight takes over (no first value anchors either)."""
        first = 1.0 / (seen + 1.0)
        return np.maximum(self.alpha, first), np.maximum(self.base_alpha, first)

    def score(
        self, slowdown: F64, replica: npt.NDArray[np.integer], rank_node: I64, rows: B
    ) -> ReplicaStep:
        """Each replica's smoothed excess with this step included.

        ``slowdown`` is each rank's slowdown over its stage peers before replica
        correction, ``rank_node`` its node; ``rows`` the TRAIN rows. Reads state only.
        """
        rep = replica.astype(np.int64)
        keep = rows & (rep >= 0) & (rep < MAX_REPLICAS) & np.isfinite(slowdown)
        rep, x, node = rep[keep], slowdown[keep], rank_node[keep]
        none = ReplicaStep(np.zeros(0, np.int64), np.zeros(0), np.zeros(0))
        if rep.shape[0] == 0:
            return none
        size = int(rep.max()) + 1
        # each (replica, node) pair's mean slowdown, then the least slow node per replica
        pairs, pair = np.unique(rep * (int(node.max()) + 1) + node, return_inverse=True)
        pmean = np.bincount(pair, weights=x) / np.bincount(pair)
        prep = pairs // (int(node.max()) + 1)
        mean = np.full(size, np.inf)
        np.minimum.at(mean, prep, pmean)
        cnt = np.bincount(prep, minlength=size)
        ids = np.flatnonzero(cnt > 0).astype(np.int64)
        if ids.shape[0] < 3:
            return none
        rel = mean[ids] - float(median(mean[ids]))
        # winsorised to REL_CLIP_SIGMAS of the replicas' own spread (at least
        # REL_FLOOR): one rank's glitched 10^6 s compute in a replica on one node
        # otherwise held that replica's smoothed slowdown up for hundreds of steps
        spread = max(MAD_TO_SIGMA * float(median(np.abs(rel))), REL_FLOOR)
        rel = np.clip(rel, -REL_CLIP_SIGMAS * spread, REL_CLIP_SIGMAS * spread)
        fast, base, seen = self._state(ids)
        wf, _ = self._weights(seen)
        fast = fast + wf * (rel - fast)
        out = np.full(size, np.nan)
        warmed = seen + 1 >= self.warmup_steps
        out[ids[warmed]] = (fast - base)[warmed]
        return ReplicaStep(ids, rel, out)

    def _state(self, ids: I64) -> tuple[F64, F64, I64]:
        have = self._fast.shape[0]
        old = ids < have
        fast, base = np.zeros(ids.shape[0]), np.zeros(ids.shape[0])
        seen = np.zeros(ids.shape[0], dtype=np.int64)
        fast[old], base[old] = self._fast[ids[old]], self._base[ids[old]]
        seen[old] = self._seen[ids[old]]
        return fast, base, seen

    def findings(
        self,
        step: ReplicaStep,
        replica: npt.NDArray[np.integer],
        rank_node: I64,
        node_names: Sequence[str],
        floor: float,
    ) -> list[Finding]:
        """One node-level candidate per node of every replica at or above ``floor``."""
        excess = step.excess
        hot = np.flatnonzero(np.nan_to_num(excess, nan=-np.inf) >= floor)
        if hot.shape[0] == 0:
            return []
        rep = replica.astype(np.int64)
        out: list[Finding] = []
        for r in hot.tolist():
            s = float(excess[r])
            for n in np.unique(rank_node[rep == r]).tolist():
                out.append(
                    Finding(
                        "straggler",
                        node_names[n],
                        None,
                        s,
                        "replica_slowdown",
                        s,
                        s,
                        baseline=0.0,
                        detail=f"model replica {r} slower as a whole",
                    )
                )
        return out

    def learn(self, step: ReplicaStep, flagged: float) -> None:
        """Fold ``step`` (from :meth:`score`) in; replicas whose excess reached
        ``flagged`` do not move their baseline (the fault is not their normal)."""
        ids, rel = step.ids, step.rel
        if ids.shape[0] == 0:
            return
        need = int(ids.max()) + 1
        if need > self._fast.shape[0]:
            grow = need - self._fast.shape[0]
            self._fast = np.concatenate((self._fast, np.zeros(grow)))
            self._base = np.concatenate((self._base, np.zeros(grow)))
            self._seen = np.concatenate((self._seen, np.zeros(grow, np.int64)))
        fast, base, seen = self._state(ids)
        wf, wb = self._weights(seen)
        ex = step.excess[ids]
        calm = ~(np.nan_to_num(ex, nan=-np.inf) >= flagged)
        self._fast[ids] = fast + wf * (rel - fast)
        self._base[ids] = np.where(calm, base + wb * (rel - base), base)
        self._seen[ids] = seen + 1
