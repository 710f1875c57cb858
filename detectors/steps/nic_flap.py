"""NIC flapping: a node whose ranks wait in communication while their compute is normal.

A flapping link or NIC makes the ranks of one node spike in comm wait now and then,
each spike too short to grade alone. A node *spikes* on a step when at least half of
its ranks wait beyond their peers and their own normal while their compute stays
normal (a slow compute is a straggler, not the network). :class:`NicWindow` counts
spiking steps per node over the last ``nic_window`` TRAIN steps, and the node's
``nic_flap`` score is that fraction.

Examples
--------
>>> import numpy as np
>>> w = NicWindow(window=2)
>>> w.score(np.array([True, False])).tolist()      # this step included
[1.0, 0.0]
>>> w.learn(np.array([True, False]))
>>> w.learn(np.array([True, True, True]))            # a third node joined
>>> w.score(np.array([False, False, False])).tolist()  # the last 2 steps
[0.5, 0.5, 0.5]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from detectors.base import Finding
from detectors.config import DetectorConfig
from detectors.frame import StepFrame
from detectors.steps.peer import PeerScores
from detectors.steps.temporal import TemporalScores

__all__ = ["NicWindow", "nic_flap_findings"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


@dataclass
class NicWindow:
    """Per-node ring of spike indicators over the last ``window`` TRAIN steps.

    Parameters
    ----------
    window
        Steps the spike fraction is counted over (``DetectorConfig.nic_window``).

    Nodes are slots by global node id; the ring grows as nodes join.
    """

    window: int
    ring: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros((0, 0), dtype=bool))
    counts: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    t: int = 0

    def _grow(self, n_nodes: int) -> None:
        if n_nodes <= self.counts.shape[0]:
            return
        size = max(n_nodes, 2 * self.counts.shape[0])
        ring = np.zeros((self.window, size), dtype=bool)
        if self.ring.shape[0] == self.window:
            ring[:, : self.counts.shape[0]] = self.ring
        self.ring = ring
        counts = np.zeros(size, dtype=np.int64)
        counts[: self.counts.shape[0]] = self.counts
        self.counts = counts

    def score(self, spikes: npt.NDArray[np.bool_]) -> F64:
        """Spike fraction over the window including ``spikes`` (global node slots)."""
        n = spikes.shape[0]
        counts = np.zeros(n, dtype=np.int64)
        m = min(n, self.counts.shape[0])
        counts[:m] = self.counts[:m]
        if self.t >= self.window and m:
            counts[:m] -= self.ring[self.t % self.window, :m]
        counts += spikes
        return counts / min(self.t + 1, self.window)

    def learn(self, spikes: npt.NDArray[np.bool_]) -> None:
        """Add one step's spikes (global node slots) to the window."""
        self._grow(spikes.shape[0])
        row = self.t % self.window
        padded = np.zeros(self.counts.shape[0], dtype=bool)
        padded[: spikes.shape[0]] = spikes
        self.counts -= self.ring[row]
        self.ring[row] = padded
        self.counts += padded
        self.t += 1


def nic_flap_findings(
    frame: StepFrame,
    peer: PeerScores,
    temporal: TemporalScores,
    rank_node: I64,
    node_names: Sequence[str],
    *,
    config: DetectorConfig,
    floor: float,
    window: NicWindow,
) -> tuple[list[Finding], B]:
    """Nodes whose spike fraction, this step included, reaches ``floor``.

    Reads its arguments only; :meth:`NicWindow.learn` the spikes returned once the
    step is graded.

    Parameters
    ----------
    frame
        The step (a TRAIN step).
    peer
        Peer-relative scores of ``frame``.
    temporal
        Per-rank baseline scores of ``frame`` (slowdown, data excess, comm excess).
    rank_node
        Global node id of each row of ``frame``.
    node_names
        Node names by global id.
    config
        Thresholds (``nic_z``, ``nic_spike``, ``straggler_z``, ``nic_window``).
    floor
        Spike fractions below this are left out.
    window
        The spikes of the previous TRAIN steps.

    Returns
    -------
    findings, spikes
        One finding per flapping node, and whether each node (by global id) spikes on
        this step.
    """
    cfg = config
    t = temporal
    names = node_names
    inv = peer.groups.inverse
    # a rank spikes: comm wait above peers beyond its own normal, compute normal
    ex_m = np.minimum(t.excess[2], peer.comm_excess)
    spike_rank = (
        t.warmed & (t.z[2] >= cfg.nic_z) & (ex_m >= cfg.nic_spike) & (t.z[0] < cfg.straggler_z)
    )
    n_nodes = len(names)
    present = np.bincount(rank_node, minlength=n_nodes)
    spiking = np.bincount(rank_node[spike_rank], minlength=n_nodes)
    node_spike = (spiking * 2 >= present) & (spiking > 0)
    nic_frac = window.score(node_spike)

    out: list[Finding] = []
    for n in np.flatnonzero(nic_frac >= floor).tolist():
        members = np.flatnonzero(rank_node == n)
        if members.size == 0:
            continue
        val = float(np.median(frame.comm_wait[members]))
        med = float(np.median(peer.med_comm[inv[members]]))
        frac = float(nic_frac[n])
        out.append(
            Finding(
                "nic_flap",
                names[int(n)],
                None,
                frac,
                "comm_wait_s",
                val,
                float(np.median(t.z[2, members])),
                peer_median=med,
                detail=(
                    f"comm-wait spikes on {frac:.0%} of the last {cfg.nic_window} steps "
                    f"(now {val:.3f}s vs peers {med:.3f}s) while compute is normal"
                ),
            )
        )
    return out, node_spike
