"""Findings from what one step reports: ranks missing from it, and a loss gone wrong.

Unlike slowdowns (:mod:`detectors.steps.slowdown`) these need no peer comparison:

- **missing**: ranks the job expects (:class:`~detectors.hang.detector.MissingRanks`) that are
  absent from the step while others report; a node whose ranks are all absent is
  reported once;
- **nonfinite**: NaN or Inf loss or gradient norm, on any step;
- **loss**: the step's median loss or gradient norm far above its rolling median
  (:class:`~detectors.training.divergence.DivergenceDetector`).

Examples
--------
>>> import numpy as np
>>> from detectors.frame import StepFrame
>>> from detectors.hang.detector import MissingRanks
>>> from detectors.steps.ranks import RankIndex
>>> from detectors.registry import NodeRegistry
>>> full = StepFrame.from_arrays("j", 0, 1.0, np.ones(6), ranks_per_node=2,
...                             rank=10 * np.arange(6))  # rank ids 0, 10, ..., 50
>>> index, nodes, missing = RankIndex(), NodeRegistry(), MissingRanks()
>>> slots = index.assign(full.rank)
>>> nodes.register(full.nodes)
>>> _ = nodes.record_ranks(slots, full.node_idx.astype(np.int64))
>>> missing.learn(slots)
>>> present = index.lookup(np.array([0, 10, 40]))  # 20, 30, 50 absent
>>> found = missing_findings(missing, present, 0.5, nodes, index.ids)
>>> [(f.node, f.rank, f.detail) for f in found]
[('node-1', None, 'all 2 ranks silent for 1 steps'), ('node-2', 50, 'rank 50 silent for 1 steps')]
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from detectors._stats import median
from detectors.base import Finding
from detectors.frame import StepFrame
from detectors.hang.detector import MissingRanks
from detectors.registry import NodeRegistry
from detectors.training.divergence import DivergenceDetector

__all__ = ["loss_findings", "loss_values", "missing_findings", "nonfinite_findings"]

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


def missing_findings(
    missing: MissingRanks, present: I64, floor: float, registry: NodeRegistry, rank_ids: I64
) -> list[Finding]:
    """Expected ranks absent from a step, per rank or, when all its ranks are, per node.

    Reads its arguments only.

    Parameters
    ----------
    missing
        The ranks the job expects and how long each has been absent.
    present
        The slots of the step's ranks (:meth:`~detectors.steps.ranks.RankIndex.lookup` of
        ``StepFrame.rank``).
    floor
        Ranks absent for fewer steps (this one included) are left out.
    registry
        The job's nodes and the node of each rank slot.
    rank_ids
        Rank id by slot (:attr:`~detectors.steps.ranks.RankIndex.ids`): what findings name.
    """
    slots, counts = missing.score(present)
    keep = counts >= floor
    slots, counts = slots[keep], counts[keep]
    if slots.shape[0] == 0:
        return []
    ranks = rank_ids[slots]
    order = np.argsort(ranks, kind="stable")  # named in rank order, as slots may not be
    slots, ranks, counts = slots[order], ranks[order], counts[order]
    rank_node, node_names = registry.rank_node, registry.names
    nodes = rank_node[slots]
    absent = np.bincount(nodes, minlength=len(node_names))
    # ranks the job expects per node (seen recently)
    seen = missing.expected()
    seen = seen[seen < rank_node.shape[0]]
    per_node = np.bincount(rank_node[seen], minlength=len(node_names))
    out: list[Finding] = []
    for n in np.unique(nodes):
        name = node_names[int(n)]
        sel = nodes == n
        if absent[n] >= per_node[n] and per_node[n] > 1:
            c = float(np.median(counts[sel]))
            out.append(
                Finding(
                    "missing",
                    name,
                    None,
                    c,
                    "steps_missing",
                    c,
                    c,
                    detail=f"all {int(per_node[n])} ranks silent for {int(c)} steps",
                )
            )
            continue
        for r, c in zip(ranks[sel], counts[sel], strict=True):
            out.append(
                Finding(
                    "missing",
                    name,
                    int(r),
                    float(c),
                    "steps_missing",
                    float(c),
                    float(c),
                    detail=f"rank {int(r)} silent for {int(c)} steps",
                )
            )
    return out


def nonfinite_findings(frame: StepFrame) -> list[Finding]:
    """One finding when ranks of ``frame`` report a NaN or Inf loss or gradient norm.

    It names the first such rank and its node when fewer than half of the reporting
    ranks are affected, and the whole job otherwise.
    """
    bad_l = frame.has_loss & ~np.isfinite(frame.loss)
    bad_g = frame.has_grad_norm & ~np.isfinite(frame.grad_norm)
    bad = bad_l | bad_g
    nonfinite: list[Finding] = []
    if bad.any():
        idx = np.flatnonzero(bad)
        reporting = int((frame.has_loss | frame.has_grad_norm).sum())
        node: str | None = None
        rank: int | None = None
        if idx.size * 2 < reporting:  # only some ranks: name the first one
            rank = int(frame.rank[idx[0]])
            node = frame.nodes[int(frame.node_idx[idx[0]])]
        i0 = int(idx[0])
        value = float(frame.loss[i0]) if bad_l[i0] else float(frame.grad_norm[i0])
        nonfinite.append(
            Finding(
                "nonfinite",
                node,
                rank,
                1.0,
                "loss" if bad_l[i0] else "grad_norm",
                value,
                math.inf,
                detail=f"{idx.size} of {reporting} ranks reported NaN/Inf loss or grad norm",
            )
        )
    return nonfinite


def loss_findings(
    frame: StepFrame, train: B, divergence: DivergenceDetector, floor: float
) -> list[Finding]:
    """One job-level finding when the step's loss or gradient norm diverges.

    Parameters
    ----------
    frame
        The step.
    train
        Rows of ``frame`` in the TRAIN phase (the only ones whose loss counts).
    divergence
        Rolling robust statistics of the loss and gradient norm; read only.
    floor
        Scores below this are left out.
    """
    s = divergence.score_one(*loss_values(frame, train))
    if s.score >= floor:
        use_loss = s.loss_z >= s.grad_z
        return [
            Finding(
                "loss",
                None,
                None,
                s.score,
                "loss" if use_loss else "grad_norm",
                s.loss if use_loss else s.grad_norm,
                s.score,
                baseline=s.loss_median if use_loss else s.grad_median,
                detail=(
                    f"loss {s.loss:.4g} (z {s.loss_z:.1f}), grad norm {s.grad_norm:.4g} "
                    f"(z {s.grad_z:.1f}) vs rolling median"
                ),
            )
        ]
    return []


def loss_values(frame: StepFrame, train: B) -> tuple[float, float]:
    """Median finite loss and gradient norm of the TRAIN rows that report them (NaN
    when none does): what the divergence detector scores and learns."""
    lmask = frame.has_loss & train & np.isfinite(frame.loss)
    gmask = frame.has_grad_norm & train & np.isfinite(frame.grad_norm)
    loss = float(median(frame.loss[lmask])) if lmask.any() else math.nan
    grad = float(median(frame.grad_norm[gmask])) if gmask.any() else math.nan
    return loss, grad
