"""Slowdown findings of one TRAIN step: stragglers, creeping degradation, data stalls.

Each rank's slowdown against its peers (:mod:`detectors.steps.peer`) counts only beyond
the rank's own normal (:mod:`detectors.steps.temporal`), so a rank that was always a little
slower, or a pipeline stage that always does more work, stays quiet:

- **straggler**: compute above peers and above the rank's own baseline, while the
  rank does not wait in the collectives (a culprit does not wait; its peers do) nor
  on its data loader (the data stall's); the evidence is one step's z or, in a noisy
  job, the z of the smoothed excess;
- **degradation**: a slow creep (smoothed excess or CUSUM) still below the straggler
  threshold; an open degradation episode keeps following it and keeps the straggler
  signal quiet on its ranks (one episode per incident);
- **data_stall**: data-loader wait above peers and above the rank's own normal.

:func:`replica_corrected` removes the common mode of one model replica (sequence-length
imbalance) before the baselines see the slowdown. When enough of a node's ranks are
flagged, :func:`rank_or_node_findings` reports the node once instead of each rank.

Examples
--------
>>> import numpy as np
>>> from detectors.frame import StepFrame
>>> frame = StepFrame.from_arrays("j", 0, 1.0, np.ones(6), ranks_per_node=3)
>>> rank_node = np.array([0, 0, 0, 1, 1, 1])
>>> score = np.array([0.2, 0.3, 0.0, 0.0, 0.0, 0.1])    # 2 of 3 ranks of node a
>>> def describe(idx, score, signal):
...     return "compute_s", 1.0, 0.0, None, None, None, "slow"
>>> found = rank_or_node_findings("straggler", score, 0.05, frame, rank_node,
...                               np.bincount(rank_node), 0.5, describe, ["a", "b"])
>>> [(f.node, f.rank, f.score, f.detail) for f in found]
[('a', None, 0.2, '2/3 ranks: slow'), ('b', 5, 0.1, 'slow')]
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from detectors._stats import MAD_TO_SIGMA
from detectors.base import Finding
from detectors.config import DetectorConfig
from detectors.frame import StepFrame
from detectors.steps.peer import PeerScores
from detectors.steps.temporal import TemporalScores

__all__ = [
    "NODE_LEVEL_SIGNALS",
    "POOL_CLIP_SIGMAS",
    "Describe",
    "rank_or_node_findings",
    "replica_corrected",
    "slowdown_findings",
]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

#: The signals of this module; each reports a node once when enough of its ranks show it.
NODE_LEVEL_SIGNALS = ("straggler", "degradation", "data_stall")

#: Evidence of the ranks ``idx`` scoring ``score`` for ``signal``: (metric, value,
#: deviation, peer median, baseline, trend, detail), the fields of a :class:`Finding`.
Describe = Callable[
    [I64, float, str],
    tuple[str, float, float, float | None, float | None, float | None, str],
]


def slowdown_findings(
    frame: StepFrame,
    peer: PeerScores,
    temporal: TemporalScores,
    rank_node: I64,
    node_names: Sequence[str],
    *,
    config: DetectorConfig,
    floors: Mapping[str, float],
    degradation_rows: B,
    open_nodes: Mapping[str, Collection[int]],
) -> list[Finding]:
    """Straggler, degradation and data-stall findings of one TRAIN step.

    Reads its arguments only.

    Parameters
    ----------
    frame
        The step.
    peer
        Peer-relative scores of ``frame``.
    temporal
        Per-rank baseline scores of ``frame`` (slowdown, data excess, comm excess).
    rank_node
        Global node id of each row of ``frame``.
    node_names
        Node names by global id.
    config
        Thresholds.
    floors
        Per signal of :data:`NODE_LEVEL_SIGNALS`: scores below this are left out.
    degradation_rows
        Rows of ``frame`` covered by an open degradation episode.
    open_nodes
        Per signal of :data:`NODE_LEVEL_SIGNALS`: global ids of the nodes with an open
        node-level episode (a node stays node-level while any of its ranks shows it).

    Returns
    -------
    list of Finding
        Stragglers, then degradations, then data stalls.
    """
    cfg = config
    t = temporal
    names = node_names
    inv = peer.groups.inverse
    warmed = t.warmed
    # straggler: slower than peers beyond the rank's own normal, and not waiting; in
    # noisy jobs the smoothed excess may carry the evidence one step's z lacks
    ex_c = np.minimum(t.excess[0], peer.slowdown)
    sure = (t.z[0] >= cfg.straggler_z) | (t.smooth_z >= cfg.degradation_z)
    # waiting: comm or data wait above its peers' by more than culprit_comm_max of
    # the step *and* beyond their noise (straggler_z robust units); where comm wait
    # is all noise (ranks sharing busy cores) a culprit's is as often above as below.
    # A rank waiting on its data loader is the data stall's, whatever its compute
    waits = peer.waits_in_comm(cfg.culprit_comm_max, cfg.straggler_z)
    waits |= peer.waits_for_data(cfg.culprit_comm_max, cfg.straggler_z)
    gate = warmed & sure & ~waits
    # degradation: a creep seen by the smoothed excess or the CUSUM while the rank
    # is still below the straggler threshold (a sudden jump is a straggler); an
    # open degradation episode keeps following the smoothed excess and suppresses
    # the straggler signal on the same ranks (one episode per incident)
    creep = (t.smooth_z >= cfg.degradation_z) | (t.cusum >= cfg.degradation_cusum)
    creep &= (ex_c < cfg.straggler_warning) & ~waits
    smooth = np.minimum(t.smooth, np.maximum(peer.slowdown, 0.0))
    degr = np.where(warmed & (creep | degradation_rows), np.maximum(smooth, 0.0), 0.0)
    straggler = np.where(gate & ~degradation_rows, ex_c, 0.0)
    # data-loader stall: data wait above peers beyond the rank's own normal
    ex_d = np.minimum(t.excess[1], peer.data_excess)
    data = np.where(warmed & (t.z[1] >= cfg.data_stall_z), ex_d, 0.0)
    present = np.bincount(rank_node, minlength=len(names))

    def compute_ev(
        idx: I64, s: float, signal: str
    ) -> tuple[str, float, float, float | None, float | None, float | None, str]:
        med = float(np.median(peer.med_compute[inv[idx]]))
        val = float(np.median(frame.compute[idx]))
        base = med * (1.0 + float(np.median(t.baseline[0, idx])))
        z = float(np.median(t.z[0, idx]))
        if signal == "degradation":
            z = float(np.median(t.smooth_z[idx]))
        return (
            "compute_s",
            val,
            z,
            med,
            base,
            float(np.median(t.trend[idx])),
            f"compute {val:.3f}s is {float(np.median(peer.slowdown[idx])):+.1%} vs peers "
            f"{med:.3f}s (own baseline {float(np.median(t.baseline[0, idx])):+.1%}); comm "
            f"wait {float(np.median(frame.comm_wait[idx])):.3f}s vs peers "
            f"{float(np.median(peer.med_comm[inv[idx]])):.3f}s",
        )

    def data_ev(
        idx: I64, s: float, signal: str
    ) -> tuple[str, float, float, float | None, float | None, float | None, str]:
        med = float(np.median(peer.med_data[inv[idx]]))
        val = float(np.median(frame.data_wait[idx]))
        return (
            "data_wait_s",
            val,
            float(np.median(t.z[1, idx])),
            med,
            None,
            None,
            f"data wait {val:.3f}s vs peers {med:.3f}s "
            f"({float(np.median(peer.data_excess[idx])):+.1%} of the step); investigate "
            f"the input path (data loader workers, storage, the host's disk and NIC)",
        )

    out: list[Finding] = []
    for signal, score, describe in (
        ("straggler", straggler, compute_ev),
        ("degradation", degr, compute_ev),
        ("data_stall", data, data_ev),
    ):
        out += rank_or_node_findings(
            signal,
            score,
            floors[signal],
            frame,
            rank_node,
            present,
            cfg.node_fraction,
            describe,
            names,
            open_nodes[signal],
        )
    return out


#: Robust sigmas of its stage peers beyond which a rank's slowdown is winsorised before
#: it enters another rank's common mode (:func:`replica_corrected`).
POOL_CLIP_SIGMAS = 6.0


def replica_corrected(
    peer: PeerScores, replica: npt.NDArray[np.int32], rank_node: I64, floor_rel: float
) -> tuple[F64, F64]:
    """Slowdown minus the mean slowdown of the *other nodes* of the same model replica
    (``dp_group``), and its robust scale per rank.

    Sequence-length imbalance makes a whole replica slower or faster from one step to
    the next; its ranks on other nodes measure that common mode, so a node's own
    excess stands out from it. Ranks whose replica has no other node keep their
    slowdown.

    What a rank contributes to *another* rank's common mode is winsorised to
    :data:`POOL_CLIP_SIGMAS` robust sigmas of its stage peers (a replica's imbalance
    lies within that spread): one rank reporting a 50 s compute in a 0.2 s job (a
    profiler hiccup, or a hostile record) moved every other rank of its replica by
    tens of step times, and that negative excess entered their learned noise, which
    blinded straggler detection for the rest of the job. Its own corrected value keeps
    the whole of its slowdown.

    >>> import numpy as np
    >>> from detectors.frame import StepFrame
    >>> from detectors.steps.peer import PeerDetector
    >>> compute = 1.0 + 0.01 * np.tile([-1.0, 1.0], 8); compute[2] = 250.0
    >>> frame = StepFrame.from_arrays("j", 1, 1.0, compute, ranks_per_node=2)
    >>> peer = PeerDetector().score_frame(frame)
    >>> rep = np.arange(16) // 4                      # replicas of 2 nodes x 2 ranks
    >>> corrected, _ = replica_corrected(peer, rep, np.arange(16) // 2, 0.01)
    >>> bool(corrected[2] > 200), bool(abs(corrected[0]) < 0.1)
    (True, True)
    """
    x = peer.slowdown
    bound = POOL_CLIP_SIGMAS * peer.compute_scale[peer.groups.inverse]
    pooled = np.clip(x, -bound, bound)  # slowdown is relative to the peer median (0)
    rep = replica.astype(np.int64)
    n_nodes = int(rank_node.max()) + 1 if rank_node.shape[0] else 0
    _, pair = np.unique(rep * max(n_nodes, 1) + rank_node, return_inverse=True)
    pair_sum = np.bincount(pair, weights=pooled)
    pair_cnt = np.bincount(pair)
    rep_sum = np.bincount(rep, weights=pooled)
    rep_cnt = np.bincount(rep)
    other_cnt = rep_cnt[rep] - pair_cnt[pair]
    if not other_cnt.any():
        return x, peer.compute_scale[peer.groups.inverse]
    other_sum = rep_sum[rep] - pair_sum[pair]
    common = np.where(other_cnt > 0, other_sum / np.maximum(other_cnt, 1), 0.0)
    corrected = x - common
    _, mad = peer.groups.median_and_mad(corrected[None, :])
    scale = np.maximum(MAD_TO_SIGMA * mad[0], floor_rel)
    return corrected, scale[peer.groups.inverse]


def rank_or_node_findings(
    signal: str,
    score: F64,
    floor: float,
    frame: StepFrame,
    rank_node: I64,
    present: I64,
    node_fraction: float,
    describe: Describe,
    node_names: Sequence[str],
    sticky: Collection[int] = (),
) -> list[Finding]:
    """Findings for ranks scoring >= floor; a node with at least ``node_fraction`` of
    its ranks flagged (or with an open node-level episode, ``sticky``) becomes one
    node-level finding instead."""
    cand = np.flatnonzero(score >= floor)
    if cand.size == 0:
        return []
    n_nodes = present.shape[0]
    flagged = np.bincount(rank_node[cand], minlength=n_nodes)
    node_level = (flagged >= node_fraction * present) & (present >= 2) & (flagged >= 2)
    for n in sticky:
        if n < n_nodes and flagged[n] > 0:
            node_level[n] = True
    out: list[Finding] = []
    for n in np.flatnonzero(node_level).tolist():
        members = np.flatnonzero(rank_node == n)
        s = float(np.median(score[members]))
        metric, val, dev, med, base, trend, detail = describe(members, s, signal)
        out.append(
            Finding(
                signal,
                node_names[int(n)],
                None,
                s,
                metric,
                val,
                dev,
                peer_median=med,
                baseline=base,
                trend=trend,
                detail=f"{int(flagged[n])}/{int(present[n])} ranks: {detail}",
            )
        )
    for i in cand.tolist():
        n = int(rank_node[i])
        if node_level[n]:
            continue
        idx = np.array([i])
        s = float(score[i])
        metric, val, dev, med, base, trend, detail = describe(idx, s, signal)
        out.append(
            Finding(
                signal,
                node_names[n],
                int(frame.rank[i]),
                s,
                metric,
                val,
                dev,
                peer_median=med,
                baseline=base,
                trend=trend,
                detail=detail,
            )
        )
    return out
