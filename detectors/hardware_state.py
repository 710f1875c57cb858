"""What the hardware detector keeps per node and across the fleet, and one
:class:`schemas.NodeHealth` report read against it.

:class:`NodeState` holds one node's GPUs as arrays indexed by position (a GPU
``index`` gets the next position the first time it is learned): the last cumulative
counters, the reports learned per GPU, the hard-rule latch and the baselines
(temperature and SM-clock offsets against the fleet, EW rates of the ECC and NVLink
counters, the node's NIC rate). :class:`FleetState` holds the latest value per GPU and
per node across the fleet, with medians recomputed now and then.
:meth:`NodeState.read` turns one report into a :class:`Prepared`: its arrays and the
counts since the node's previous report. Counters going down (reboot, driver reload)
give a zero count. Scoring and learning are :mod:`detectors.hardware`'s.

Examples
--------
>>> from datetime import datetime, timezone
>>> from schemas import GpuHealth, NodeHealth
>>> st, fleet = NodeState(), FleetState()
>>> st.positions((3, 5), fleet, "a").tolist(), fleet.slots   # registered
([0, 1], 2)
>>> st.positions((5, 9), None, "a").tolist()                  # 9 is unknown
[1, -1]
>>> g = GpuHealth(index=3, temperature_c=60.0, power_w=300, sm_clock_mhz=1980,
...               utilization_pct=99, ecc_corrected=7, xid_codes=(79,))
>>> msg = NodeHealth(node="a", ts=datetime(2026, 1, 1, tzinfo=timezone.utc), gpus=(g,))
>>> prep = st.read(msg, fatal_xids=frozenset({79}))
>>> prep.corr.tolist(), prep.d_ecc.tolist(), prep.known.tolist(), prep.xid_fatal.tolist()
([7], [0.0], [False], [True])
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from detectors._stats import EWArrays
from schemas.telemetry import NodeHealth

__all__ = ["FleetState", "NodeState", "Prepared"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

_RATE_ALPHA = 0.05
_OFFSET_ALPHA = 0.02


_T = TypeVar("_T", bound=np.generic)


def _grow(a: npt.NDArray[_T], n: int, fill: float = 0.0) -> npt.NDArray[_T]:
    if a.shape[0] >= n:
        return a
    out = np.full(max(n, 2 * a.shape[0]), fill, dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


@dataclass
class NodeState:
    """One node: per-GPU arrays indexed by position (``pos`` maps GPU index)."""

    n: int = 0
    last_ts: float = -math.inf
    nic: int = 0  #: last cumulative errors + retransmits
    nic_rate: EWArrays = field(default_factory=lambda: EWArrays(1, _RATE_ALPHA, warmup=5))
    pos: dict[int, int] = field(default_factory=dict)
    fleet_slot: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    gpu_n: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    ecc_corr: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    ecc_unc: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    nvlink: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    latch: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    latch_detail: dict[int, str] = field(default_factory=dict)
    temp_off: EWArrays = field(default_factory=lambda: EWArrays(0, _OFFSET_ALPHA, warmup=5))
    clock_off: EWArrays = field(default_factory=lambda: EWArrays(0, _OFFSET_ALPHA, warmup=5))
    ecc_rate: EWArrays = field(default_factory=lambda: EWArrays(0, _RATE_ALPHA, warmup=5))
    nvl_rate: EWArrays = field(default_factory=lambda: EWArrays(0, _RATE_ALPHA, warmup=5))
    _key: tuple[int, ...] = ()
    _idx: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def positions(self, indices: tuple[int, ...], fleet: FleetState | None, node: str) -> I64:
        """Positions of the GPUs of a report (registering new GPUs when ``fleet``)."""
        if indices == self._key:
            return self._idx
        out = np.full(len(indices), -1, dtype=np.int64)
        for i, gi in enumerate(indices):
            p = self.pos.get(gi)
            if p is None and fleet is not None:
                p = self.pos[gi] = len(self.pos)
                n = p + 1
                self.gpu_n = _grow(self.gpu_n, n)
                self.ecc_corr = _grow(self.ecc_corr, n)
                self.ecc_unc = _grow(self.ecc_unc, n)
                self.nvlink = _grow(self.nvlink, n)
                self.latch = _grow(self.latch, n)
                self.fleet_slot = _grow(self.fleet_slot, n, -1)
                self.fleet_slot[p] = fleet.add_gpu(node, gi)
                for ew in (self.temp_off, self.clock_off, self.ecc_rate, self.nvl_rate):
                    ew.grow(n)
            out[i] = -1 if p is None else p
        if fleet is not None:
            self._key, self._idx = indices, out
        return out

    def read(self, msg: NodeHealth, fatal_xids: frozenset[int]) -> Prepared:
        """Read one report of this node into arrays and count events since the
        previous report (reads state only; valid until the node next learns)."""
        gpus = msg.gpus
        rows = np.array(
            [
                (
                    g.index,
                    g.temperature_c,
                    g.sm_clock_mhz,
                    g.ecc_corrected,
                    g.ecc_uncorrected,
                    g.nvlink_errors,
                )
                for g in gpus
            ],
            dtype=np.float64,
        ).reshape(len(gpus), 6)
        indices = tuple(int(g.index) for g in gpus)
        corr = rows[:, 3].astype(np.int64)
        nvl = rows[:, 5].astype(np.int64)
        pos = self.positions(indices, None, msg.node)
        ts = msg.ts.timestamp()
        dt = ts - self.last_ts
        nic_total = msg.nic_errors + msg.nic_retransmits
        d_ecc, d_nvl, d_nic, known = self._counts(pos, corr, nvl, nic_total, dt)
        return Prepared(
            msg=msg,
            ts=ts,
            dt=dt,
            indices=indices,
            temp=rows[:, 1],
            clock=rows[:, 2],
            corr=corr,
            unc=rows[:, 4].astype(np.int64),
            nvl=nvl,
            nic_total=nic_total,
            d_ecc=d_ecc,
            d_nvl=d_nvl,
            d_nic=d_nic,
            known=known,
            xid_fatal=np.array(
                [bool(fatal_xids.intersection(g.xid_codes)) for g in gpus], dtype=bool
            ),
        )

    def _counts(
        self, pos: I64, corr: I64, nvl: I64, nic: int, dt: float
    ) -> tuple[F64, F64, float, npt.NDArray[np.bool_]]:
        """Counts since the previous report (0 for new GPUs, resets and first reports)."""
        if self.n == 0 or dt <= 0 or self.gpu_n.shape[0] == 0:
            zero = np.zeros(pos.shape[0])
            return zero, zero.copy(), 0.0, np.zeros(pos.shape[0], dtype=bool)
        p = np.where(pos >= 0, pos, 0)
        known = (pos >= 0) & (self.gpu_n[p] > 0)
        d_ecc = np.where(known, np.maximum(corr - self.ecc_corr[p], 0), 0).astype(np.float64)
        d_nvl = np.where(known, np.maximum(nvl - self.nvlink[p], 0), 0).astype(np.float64)
        return d_ecc, d_nvl, float(max(0, nic - self.nic)), known


@dataclass(frozen=True, slots=True, eq=False)
class Prepared:
    """One NodeHealth report as arrays, with the counts since the previous report."""

    msg: NodeHealth
    ts: float
    dt: float  #: seconds since the node's previous report (inf-like before the first)
    indices: tuple[int, ...]
    temp: F64
    clock: F64
    corr: I64
    unc: I64
    nvl: I64
    nic_total: int
    d_ecc: F64
    d_nvl: F64
    d_nic: float
    known: npt.NDArray[np.bool_]  #: GPUs with a previous report to count from
    xid_fatal: npt.NDArray[np.bool_]


@dataclass
class FleetState:
    """Latest value per GPU and per node across the fleet, with cached medians."""

    slots: int = 0
    temp: F64 = field(default_factory=lambda: np.zeros(0))
    clock: F64 = field(default_factory=lambda: np.zeros(0))
    ecc: F64 = field(default_factory=lambda: np.zeros(0))
    nvl: F64 = field(default_factory=lambda: np.zeros(0))
    nic: dict[str, float] = field(default_factory=dict)
    medians: tuple[float, float, float, float, float] = (math.nan, math.nan, 0.0, 0.0, 0.0)
    updates: int = 0
    fresh: bool = False

    def add_gpu(self, node: str, index: int) -> int:
        """Give a new GPU its fleet slot."""
        s = self.slots
        self.slots += 1
        self.temp = _grow(self.temp, self.slots, math.nan)
        self.clock = _grow(self.clock, self.slots, math.nan)
        self.ecc = _grow(self.ecc, self.slots, math.nan)
        self.nvl = _grow(self.nvl, self.slots, math.nan)
        return s

    def refresh(self) -> None:
        """Recompute the medians (temperature, SM clock, ECC, NVLink and NIC rates)."""
        n = self.slots

        def med(a: F64, default: float) -> float:
            v = a[:n]
            v = v[np.isfinite(v)]
            return float(np.median(v)) if v.size else default

        self.medians = (
            med(self.temp, math.nan),
            med(self.clock, math.nan),
            med(self.ecc, 0.0),
            med(self.nvl, 0.0),
            float(np.median(list(self.nic.values()))) if self.nic else 0.0,
        )
        self.updates = 0
        self.fresh = True
