"""Ranks slow from their first step: a warm-up must not learn a fault as normal.

A job launched onto a bad node (or relaunched onto a bad spare) is slow from its first
step. Every per-rank baseline (:class:`~detectors.steps.temporal.RankBaselines`) starts from
the values of its warm-up, so without a check it learns that slowdown as the rank's
normal and the straggler gate (slowdown *above the rank's own baseline*) never opens.

When a rank completes its warm-up, its warm-up mean of the peer-relative slowdown is
compared with the baselines of the ranks of the same pipeline stage (whatever their
age: in a new job every rank is new, after a relaunch only the spare is). A rank whose
offset above its stage's typical (median) baseline exceeds

    ``max(floor, k * sqrt(spread**2 + se**2))``

(``spread``: robust sigma of every rank's baseline around its stage's median; ``se``:
the standard error of the
rank's own warm-up mean) is an outlier from its first step: its baseline is anchored
at the stage's typical value, so the usual straggler gates (slowdown above baseline,
z, no comm wait, minimum steps) judge it against its peers' normal and name it.
Ranks within the threshold keep their own baseline: a little slower is normal. The
same test runs on the median offset of each node's ranks among the nodes
(:func:`node_outliers`): a whole node a little slower is clearer in its median than in
each GPU alone.

What stays quiet: pipeline-stage imbalance (a whole stage is slower; compared within
its stage it is typical), sequence-length imbalance (the replica common mode is
removed before the baselines, and it averages out over the warm-up), a job that is
uniformly slower (the slowdown is relative to peers), single-step blips (they inflate
the rank's own ``se``), and the natural spread of ranks (``k`` robust sigmas).

Examples
--------
>>> import numpy as np
>>> offset = np.array([0.00, 0.01, -0.01, 0.002, 0.09, -0.004, 0.005, 0.0])
>>> se = np.full(8, 0.003)
>>> stage = np.zeros(8, dtype=np.int64)
>>> out, typical = warmup_outliers(offset, se, stage, np.ones(8, bool), np.ones(8, bool),
...                                floor=0.05, k=5.0)
>>> np.flatnonzero(out).tolist(), float(typical[4])
([4], 0.001)
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from detectors._stats import MAD_TO_SIGMA, Groups, median
from detectors.steps.temporal import RankBaselines

__all__ = ["anchor_first_step_outliers", "node_outliers", "warmup_outliers"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


def warmup_outliers(
    offset: F64, se: F64, key: I64, peers: B, candidates: B, *, floor: float, k: float
) -> tuple[B, F64]:
    """Candidates whose ``offset`` lies more than the threshold above the median of the
    ``peers`` with the same ``key``, and that median (the group's typical offset).

    Reads its arguments only. The spread (robust sigma of the peers' offsets around
    their group's median) is pooled over the groups. Groups with fewer than 3 peers
    flag nothing.
    """
    out = np.zeros(offset.shape[0], dtype=bool)
    typical = np.zeros(offset.shape[0])
    enough = np.zeros(offset.shape[0], dtype=bool)
    for g in np.unique(key[peers]).tolist():
        in_g = key == g
        ref = offset[in_g & peers]
        typical[in_g] = float(median(ref))
        enough[in_g] = ref.shape[0] >= 3
    ok = peers & enough
    if not ok.any():
        return out, typical
    # one spread pooled over the groups: ranks spread alike in every stage, and a
    # stage of a few dozen ranks estimates it poorly
    spread = MAD_TO_SIGMA * float(median(np.abs(offset[ok] - typical[ok])))
    cand = candidates & enough
    thr = np.maximum(floor, k * np.sqrt(spread**2 + se[cand] ** 2))
    out[cand] = offset[cand] - typical[cand] > thr
    return out, typical


def node_outliers(
    offset: F64, se: F64, key: I64, node: I64, peers: B, candidates: B, *, floor: float, k: float
) -> B:
    """Candidates on a node whose ranks of one ``key`` group are, by their median
    ``offset``, an outlier among the nodes (:func:`warmup_outliers` on node medians).

    A slow node shows in all its ranks at once; its median is not blurred by the
    spread of single GPUs, so a node-wide slowdown is seen when some of its ranks
    alone are still within their threshold. Reads its arguments only.
    """
    idx = np.flatnonzero(peers)
    out = np.zeros(offset.shape[0], dtype=bool)
    if idx.shape[0] == 0:
        return out
    unit = node[idx] * (int(key.max()) + 1) + key[idx]
    groups = Groups.of(unit)
    med = groups.median(offset[idx][None, :])[0]
    size = groups.sizes
    se_u = np.sqrt(np.bincount(groups.inverse, weights=se[idx] ** 2)) / size
    key_u = np.zeros(groups.n_groups, dtype=np.int64)
    key_u[groups.inverse] = key[idx]
    cand_u = np.bincount(groups.inverse, weights=candidates[idx]) > 0
    flagged, _ = warmup_outliers(
        med, se_u, key_u, size >= 2, cand_u & (size >= 2), floor=floor, k=k
    )
    out[idx] = flagged[groups.inverse] & candidates[idx]
    return out


def anchor_first_step_outliers(
    baselines: RankBaselines,
    slots: I64,
    key: I64,
    node: I64,
    learned: B,
    *,
    floor: float,
    k: float,
) -> I64:
    """After ``baselines`` learned one step (``learned`` rows of ``slots``): anchor the
    slowdown baseline of each rank that has just completed its warm-up as an outlier
    (:func:`warmup_outliers` within its ``key`` group, e.g. the pipeline stage, or
    :func:`node_outliers` with the other ranks of its ``node``) at its group's typical
    value. Returns the slots anchored.
    """
    mean, var, count, steps = baselines.state(slots)
    warmed = count[0] >= baselines.warmup_steps
    just = learned & warmed & (steps == baselines.warmup_steps)
    if not just.any():
        return np.zeros(0, dtype=np.int64)
    se = np.sqrt(var[0] / np.maximum(count[0], 1))
    out, typical = warmup_outliers(mean[0], se, key, warmed, just, floor=floor, k=k)
    out |= node_outliers(mean[0], se, key, node, warmed, just, floor=floor, k=k)
    baselines.anchor(slots[out], typical[out])
    return slots[out]
