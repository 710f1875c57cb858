"""What the hardware detector keeps per node and across the fleet, and one
:class:`schemas.NodeHealth` report read against it.

:class:`NodeState` holds one node's GPUs as arrays indexed by position (a GPU
``index`` gets the next position the first time it is learned): the last cumulative
counters, the reports learned per GPU, the hard-rule latch and the baselines
(temperature and SM-clock offsets against the fleet, EW rates of the ECC and NVLink
counters, the node's NIC rate, the short and long-run fractions of reports with a
thermal/hardware-slowdown or a power-cap clock reason). :class:`FleetState` holds the
latest value per GPU and per node across the fleet, with medians recomputed now and
then.
:meth:`NodeState.read` turns one report into a :class:`Prepared`: its arrays and the
counts since the node's previous report. Counters going down (reboot, driver reload)
give a zero count. The silent-slowdown readings (PCIe bandwidth lost to a link trained
below its maximum, NVLink links down, row remapping, clock reasons) are read here too
(:func:`pcie_loss`, :func:`clock_reasons`). Scoring and learning are
:mod:`detectors.hardware.health`'s.

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
>>> round(pcie_loss(4, 5, 16, 16, busy=True), 2), pcie_loss(4, 5, 16, 16, busy=False)
(0.5, 0.0)
>>> pcie_loss(5, 5, 8, 16, busy=False), pcie_loss(None, None, None, None, busy=True)
(0.5, 0.0)
>>> clock_reasons(("hw_slowdown", "hw_power_brake_slowdown")), clock_reasons(("sw_power_cap",))
((False, True), (False, True))
>>> clock_reasons(("hw_thermal_slowdown",)), clock_reasons(("gpu_idle",))
((True, False), (False, False))
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from detectors._stats import EWArrays
from schemas.telemetry import GpuHealth, NodeHealth

__all__ = [
    "PCIE_BUSY_UTIL_PCT", "POWER_REASONS", "REMAP_XIDS", "SLOWDOWN_REASONS", "FleetState",
    "NodeState", "Prepared", "clock_reasons", "pcie_loss",
]  # fmt: skip

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

_RATE_ALPHA = 0.05
_OFFSET_ALPHA = 0.02
#: Weight of the latest report in a GPU's short-run throttle fraction (3 reports of a
#: reason take it from 0 to 0.66), and in its long-run baseline.
THROTTLE_SHORT_ALPHA = 0.3
THROTTLE_BASE_ALPHA = 0.02

#: A GPU this busy (utilisation %) runs its PCIe link at full generation; idle GPUs
#: lower the generation to save power, which is not a fault.
PCIE_BUSY_UTIL_PCT = 50.0
#: Clock reasons of a thermal or hardware slowdown (``hw_slowdown`` alone: NVML sets it
#: for power-brake assertions too, so it counts only without ``hw_power_brake``).
SLOWDOWN_REASONS = frozenset({"sw_thermal_slowdown", "hw_thermal_slowdown"})
#: Clock reasons of a power limit (software cap or an external power brake).
POWER_REASONS = frozenset({"sw_power_cap", "hw_power_brake_slowdown"})
#: XIDs that record a memory row remap waiting for a GPU reset (63: "ECC page
#: retirement or row remapping recording event").
REMAP_XIDS = frozenset({63})
#: Usable GB/s per lane by PCIe generation (after line encoding).
_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563, 7: 15.125}


def _lane(gen: int) -> float:
    return _LANE_GBPS.get(gen, 0.25 * 2.0 ** (gen - 1))


def pcie_loss(
    gen: int | None, gen_max: int | None, width: int | None, width_max: int | None, *, busy: bool
) -> float:
    """Fraction of a GPU's PCIe bandwidth lost to a link trained below its maximum.

    Width below the maximum always counts; a lower generation only while the GPU is
    ``busy`` (idle links drop their generation to save power). Unknown values
    (``None`` or 0 for a maximum) count as no loss.
    """
    ratio = 1.0
    if width is not None and width_max and width < width_max:
        ratio *= width / width_max
    if busy and gen and gen_max and gen < gen_max:
        ratio *= _lane(gen) / _lane(gen_max)
    return 1.0 - ratio


def _pcie_losses(gpus: tuple[GpuHealth, ...]) -> F64:
    return np.array(
        [
            pcie_loss(
                g.pcie_gen, g.pcie_gen_max, g.pcie_width, g.pcie_width_max,
                busy=g.utilization_pct >= PCIE_BUSY_UTIL_PCT,
            )
            for g in gpus
        ],
        dtype=np.float64,
    ).reshape(len(gpus))  # fmt: skip


def clock_reasons(reasons: tuple[str, ...]) -> tuple[bool, bool]:
    """``(slowdown, power)``: whether clock reasons show a thermal/hardware slowdown,
    and whether they show a power limit."""
    r = set(reasons)
    power = bool(r & POWER_REASONS)
    slowdown = bool(r & SLOWDOWN_REASONS) or ("hw_slowdown" in r and not power)
    return slowdown, power


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
    #: a clock reason was ever learned (before, the throttle fractions only count)
    throttled: bool = False
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
    thr_short: EWArrays = field(default_factory=lambda: EWArrays(0, THROTTLE_SHORT_ALPHA))
    thr_base: EWArrays = field(default_factory=lambda: EWArrays(0, THROTTLE_BASE_ALPHA, warmup=5))
    pcap_short: EWArrays = field(default_factory=lambda: EWArrays(0, THROTTLE_SHORT_ALPHA))
    pcap_base: EWArrays = field(default_factory=lambda: EWArrays(0, THROTTLE_BASE_ALPHA, warmup=5))
    _key: tuple[int, ...] = ()
    _idx: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def upgrade(self) -> None:
        """Fill the fields a state written before NodeHealth v2 lacks (a worker
        restored from an older snapshot): throttle fractions that learned nothing."""
        if "thr_short" in vars(self):
            return
        n = self.gpu_n.shape[0]
        self.thr_short = EWArrays(n, THROTTLE_SHORT_ALPHA)
        self.thr_base = EWArrays(n, THROTTLE_BASE_ALPHA, warmup=5)
        self.pcap_short = EWArrays(n, THROTTLE_SHORT_ALPHA)
        self.pcap_base = EWArrays(n, THROTTLE_BASE_ALPHA, warmup=5)

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
                for ew in (
                    self.temp_off, self.clock_off, self.ecc_rate, self.nvl_rate,
                    self.thr_short, self.thr_base, self.pcap_short, self.pcap_base,
                ):  # fmt: skip
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
        n_gpus = len(gpus)
        any_reason = any(g.throttle_reasons for g in gpus)
        reasons = [clock_reasons(g.throttle_reasons) for g in gpus] if any_reason else []
        zeros = np.zeros(n_gpus)
        flagged = any(
            g.nvlink_links_down or g.remap_pending or g.remap_failed or g.xid_codes for g in gpus
        )
        no_links, no_flags = np.zeros(n_gpus, dtype=np.int64), np.zeros(n_gpus, dtype=bool)
        at_max = all(
            g.pcie_width == g.pcie_width_max and g.pcie_gen == g.pcie_gen_max for g in gpus
        )
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
            pcie_loss=zeros if at_max else _pcie_losses(gpus),
            links_down=np.array([g.nvlink_links_down for g in gpus], dtype=np.int64)
            if flagged
            else no_links,
            remap_pending=np.array(
                [g.remap_pending or bool(REMAP_XIDS.intersection(g.xid_codes)) for g in gpus],
                dtype=bool,
            )
            if flagged
            else no_flags,
            remap_failed=np.array([g.remap_failed for g in gpus], dtype=bool)
            if flagged
            else no_flags,
            any_reason=any_reason,
            link_events=flagged or not at_max,
            slowdown=np.array([r[0] for r in reasons], dtype=np.float64) if any_reason else zeros,
            power_cap=np.array([r[1] for r in reasons], dtype=np.float64) if any_reason else zeros,
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
    pcie_loss: F64  #: PCIe bandwidth lost (fraction, :func:`pcie_loss`)
    links_down: I64  #: NVLink links down
    remap_pending: npt.NDArray[np.bool_]  #: row remap pending (flag or XID 63)
    remap_failed: npt.NDArray[np.bool_]
    any_reason: bool  #: any GPU reports any clock reason
    link_events: bool  #: any GPU reports a PCIe, NVLink-link, remap or XID reading
    slowdown: F64  #: 1.0 where a thermal/hardware-slowdown clock reason is active
    power_cap: F64  #: 1.0 where a power-cap clock reason is active


@dataclass
class FleetState:
    """Latest value per GPU and per node across the fleet, with cached medians."""

    slots: int = 0
    temp: F64 = field(default_factory=lambda: np.zeros(0))
    clock: F64 = field(default_factory=lambda: np.zeros(0))
    ecc: F64 = field(default_factory=lambda: np.zeros(0))
    nvl: F64 = field(default_factory=lambda: np.zeros(0))
    thr: F64 = field(default_factory=lambda: np.zeros(0))  #: short slowdown fraction
    pcap: F64 = field(default_factory=lambda: np.zeros(0))  #: short power-cap fraction
    nic: dict[str, float] = field(default_factory=dict)
    medians: tuple[float, float, float, float, float] = (math.nan, math.nan, 0.0, 0.0, 0.0)
    #: medians of the GPUs' short-run slowdown and power-cap fractions
    throttle_medians: tuple[float, float] = (0.0, 0.0)
    updates: int = 0
    fresh: bool = False

    def upgrade(self) -> None:
        """Fill the fields a state written before NodeHealth v2 lacks."""
        if "thr" not in vars(self):
            self.thr = np.zeros(self.temp.shape[0])
            self.pcap = np.zeros(self.temp.shape[0])

    def add_gpu(self, node: str, index: int) -> int:
        """Give a new GPU its fleet slot."""
        s = self.slots
        self.slots += 1
        self.temp = _grow(self.temp, self.slots, math.nan)
        self.clock = _grow(self.clock, self.slots, math.nan)
        self.ecc = _grow(self.ecc, self.slots, math.nan)
        self.nvl = _grow(self.nvl, self.slots, math.nan)
        # 0 until the GPU's node first reports a clock reason (it learns none before)
        self.thr = _grow(self.thr, self.slots, 0.0)
        self.pcap = _grow(self.pcap, self.slots, 0.0)
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
        self.throttle_medians = (med(self.thr, 0.0), med(self.pcap, 0.0))
        self.updates = 0
        self.fresh = True
