"""Peer-relative scores of one step: who is slow compared with ranks doing the same work.

In synchronous training every rank's wall step time equals the slowest rank's, so step
time alone cannot name the culprit. The culprit shows *high compute and low comm wait*;
its healthy peers show the mirror image (they wait for it in the collectives). Ranks
are compared within their peer group (same pipeline stage, falling back to the whole
job when stages are too small), with robust statistics (median / MAD, the MAD floored
at a fraction of the median so that tiny noise does not explode the z-scores).

All scores are vectorised across ranks; the detector holds no state.

Examples
--------
>>> import numpy as np
>>> from detectors.frame import StepFrame
>>> compute = np.full(16, 1.0); compute[5] = 1.2           # rank 5 is 20 % slower
>>> comm = 1.25 - compute                                   # everyone else waits for it
>>> frame = StepFrame.from_arrays("j", step=1, ts=10.0, compute=compute, comm_wait=comm)
>>> s = PeerDetector().score_frame(frame)
>>> round(float(s.slowdown[5]), 3), round(float(s.z_compute[5]), 1)
(0.2, 20.0)
>>> bool(s.comm_excess[5] < 0), float(s.z_compute[0])
(True, 0.0)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from detectors._stats import Groups, robust_scale
from detectors.base import check_non_negative, check_positive
from detectors.frame import StepFrame

__all__ = ["PeerDetector", "PeerScores"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

_EPS = 1e-9


@dataclass(frozen=True, slots=True, eq=False)
class PeerScores:
    """Per-rank peer-relative scores of one frame (arrays align with the frame rows).

    Per-group arrays (``med_*``, ``*_scale``) are indexed by ``groups.inverse``.
    """

    groups: Groups
    med_compute: F64  #: per group: median compute time
    med_comm: F64  #: per group: median comm wait
    med_data: F64  #: per group: median data wait
    med_step: F64  #: per group: median wall step time
    compute_scale: F64  #: per group: robust relative noise of compute (sigma / median)
    comm_scale: F64  #: per group: robust noise of comm wait, as a fraction of step time
    data_scale: F64  #: per group: robust noise of data wait, as a fraction of step time
    slowdown: F64  #: compute / peer median compute - 1
    z_compute: F64  #: (compute - median) / robust scale
    comm_excess: F64  #: (comm wait - peer median) / median step time
    z_comm: F64
    data_excess: F64  #: (data wait - peer median) / median step time
    z_data: F64

    @property
    def n_ranks(self) -> int:
        return int(self.slowdown.shape[0])

    def waits_in_comm(self, excess_min: float, z_min: float) -> B:
        """Ranks waiting in the collectives: comm wait above their peers' by more than
        ``excess_min`` of the step *and* beyond their noise (``z_min`` robust units).
        A compute culprit does not wait; its peers do."""
        return (self.comm_excess > excess_min) & (self.z_comm >= z_min)

    def waits_for_data(self, excess_min: float, z_min: float) -> B:
        """Ranks waiting on their data loader: data wait above their peers' by more
        than ``excess_min`` of the step *and* beyond their noise (``z_min`` robust
        units).

        Such a rank is the data stall's to name, not a compute straggler: its compute
        between the waits reads high as well (cold caches, a core clocked down while it
        slept: +58 % over its peers in a real 4-rank DDP job sleeping 0.2 s a step),
        which is the wait's cost, not a slower device.
        """
        return (self.data_excess > excess_min) & (self.z_data >= z_min)


class PeerDetector:
    """Robust peer-relative scores of compute, comm wait and data wait for one step.

    Parameters
    ----------
    mad_floor_rel
        The MAD is floored at this fraction of the group's median (compute) or median
        step time (comm and data wait), so identical peers do not give infinite z.
    mad_floor_abs
        Absolute floor of every robust scale, in seconds.
    min_group_size
        Pipeline stages with fewer ranks than this make the whole job one peer group.
    """

    def __init__(
        self,
        mad_floor_rel: float = 0.01,
        mad_floor_abs: float = 1e-6,
        min_group_size: int = 8,
    ) -> None:
        check_non_negative("mad_floor_rel", mad_floor_rel)
        check_positive("mad_floor_abs", mad_floor_abs)
        if min_group_size < 1:
            raise ValueError(f"min_group_size must be >= 1, got {min_group_size!r}")
        self.mad_floor_rel = mad_floor_rel
        self.mad_floor_abs = mad_floor_abs
        self.min_group_size = min_group_size

    def groups_of(self, frame: StepFrame) -> Groups:
        """Peer groups: pipeline stages, or the whole job if a stage is too small."""
        groups = Groups.of(frame.pp_stage)
        if groups.n_groups > 1 and int(groups.sizes.min()) < self.min_group_size:
            return Groups.single(frame.n_ranks)
        return groups

    def score_frame(self, frame: StepFrame) -> PeerScores:
        """Score every rank of ``frame`` against its peers (reads no state)."""
        groups = self.groups_of(frame)
        x = np.stack((frame.compute, frame.comm_wait, frame.data_wait, frame.step_time))
        med, mad = groups.median_and_mad(x)
        med_c, med_comm, med_d, med_step = med
        med_c_safe = np.maximum(med_c, _EPS)
        step_ref = np.maximum(med_step, med_c + med_comm + med_d)
        step_ref = np.maximum(step_ref, _EPS)
        c_scale = robust_scale(mad[0], med_c, self.mad_floor_rel, self.mad_floor_abs)
        comm_scale = robust_scale(mad[1], step_ref, self.mad_floor_rel, self.mad_floor_abs)
        d_scale = robust_scale(mad[2], step_ref, self.mad_floor_rel, self.mad_floor_abs)
        inv = groups.inverse
        dev_c = frame.compute - med_c[inv]
        dev_comm = frame.comm_wait - med_comm[inv]
        dev_d = frame.data_wait - med_d[inv]
        step_r = step_ref[inv]
        return PeerScores(
            groups=groups,
            med_compute=med_c,
            med_comm=med_comm,
            med_data=med_d,
            med_step=step_ref,
            compute_scale=c_scale / med_c_safe,
            comm_scale=comm_scale / step_ref,
            data_scale=d_scale / step_ref,
            slowdown=dev_c / med_c_safe[inv],
            z_compute=dev_c / c_scale[inv],
            comm_excess=dev_comm / step_r,
            z_comm=dev_comm / comm_scale[inv],
            data_excess=dev_d / step_r,
            z_data=dev_d / d_scale[inv],
        )

    def learn_one(self, frame: StepFrame) -> None:
        """Peer scores need no history; present for the common detector shape."""
        return None
