"""Gross outliers among peers from the job's first step: evidence, not a step count.

A rank's own baseline (:mod:`detectors.steps.temporal`) needs a warm-up before it can say
what is normal *for that rank*, and until it is warm the straggler gate of
:mod:`detectors.steps.slowdown` stays shut. Peer comparison needs no history: in the
first step in which peers are comparable, a rank computing far above its stage's
distribution is already evidence. Counting warm-up steps instead meant that a GPU at
half speed from the job's start (+135 % over its peers, 46 s steps) was named at step
23: 18 minutes of the job at half speed, longest exactly where each step costs most.

A rank whose baseline is still warming is an *early outlier* of a step when its
compute slowdown over the peer median (and over the other nodes of its model replica,
which removes sequence-length imbalance) is at least

    ``max(floor, k * sigma)``

(``sigma``: the robust relative spread of its peers' compute this step; ``floor``: a
relative margin far above the suite's noise, by default 30 %) and it does not wait in
the collectives or on its data loader (a culprit does not wait; its peers do). Its
score is that slowdown, graded as a ``straggler``: the grader's persistence (WARNING
after ``straggler_min_steps`` consecutive observations, 3 by default) makes "a few
consecutive steps", so a gross outlier from step 0 is named at WARNING at step 2.

What stays quiet: a rank a little slower than its peers (below the floor: the warm-up
learns it and :mod:`detectors.steps.first_step` judges it when the warm-up ends), a
whole stage slower (peers are the stage), a whole job slower (the slowdown is
relative), a replica's sequence-length common mode, one-step blips (no persistence),
peer groups too small to have a distribution (fewer than ``min_peers`` ranks). Once a
rank's baseline is warm this test no longer applies to it: its own baseline (anchored
at its stage's typical value when it was slow from its first step) carries on.

Examples
--------
>>> import numpy as np
>>> from detectors.frame import StepFrame
>>> from detectors.steps.peer import PeerDetector
>>> compute = np.full(16, 46.0) + 0.2 * np.tile([-1.0, 1.0], 8); compute[5] = 92.0
>>> frame = StepFrame.from_arrays("j", 0, 100.0, compute, comm_wait=93.0 - compute)
>>> peer = PeerDetector().score_frame(frame)
>>> scale = peer.compute_scale[peer.groups.inverse]
>>> score = early_outliers(peer, peer.slowdown, scale, np.zeros(16, bool),
...                        np.zeros(16, bool), floor=0.3, k=5.0, min_peers=4)
>>> np.flatnonzero(score).tolist(), round(float(score[5]), 2)
([5], 1.0)
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from detectors.steps.peer import PeerScores

__all__ = ["early_outliers"]

F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]


def early_outliers(
    peer: PeerScores,
    corrected: F64,
    scale: F64,
    warmed: B,
    waits: B,
    *,
    floor: float,
    k: float,
    min_peers: int,
) -> F64:
    """Per rank: its slowdown where it is an early outlier of this step, else 0.

    Reads its arguments only.

    Parameters
    ----------
    peer
        The step's peer scores.
    corrected
        Each rank's slowdown less its replica's common mode (the peer slowdown where
        no correction applies).
    scale
        Each rank's robust relative spread of that slowdown among its peers.
    warmed
        Ranks whose own baseline is warm: left to it.
    waits
        Ranks waiting in the collectives or on their data loader: not culprits.
    floor, k
        The relative margin and the number of robust sigmas to exceed (both).
    min_peers
        Peer groups with fewer ranks flag nothing.
    """
    x = np.minimum(peer.slowdown, corrected)
    sizes = peer.groups.sizes[peer.groups.inverse]
    far = (x >= floor) & (x >= k * scale) & (sizes >= min_peers)
    far &= ~warmed & ~waits & np.isfinite(x)
    return np.where(far, x, 0.0)
