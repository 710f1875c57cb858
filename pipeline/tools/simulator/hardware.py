"""The simulated job's hardware: per-GPU and per-NIC state and the health reports it
produces (:class:`_NodeHealth`, mixed into :class:`~pipeline.tools.simulator.job.SimulatedJob`):
temperatures, clocks, ECC, XIDs, NVLink and PCIe readings, NIC flaps, each on the
scenario's health cadence."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import numpy.typing as npt

from pipeline.tools.simulator.health_path import HealthClock, HealthPath
from pipeline.tools.simulator.scenario import FaultSpec
from schemas.telemetry import GpuHealth, NodeHealth
from schemas.truth import FaultKind

F64 = npt.NDArray[np.float64]
PCIE_GEN, PCIE_WIDTH = 5, 16  #: every simulated GPU's PCIe maximum (Gen5 x16)


#: XID raised with an uncorrectable (double-bit) ECC error.
XID_DBE = 48


#: XIDs of a row remap recorded (pending a GPU reset) and of a failed remap.
XID_REMAP_PENDING = 63


XID_REMAP_FAILURE = 64


NVLINKS = 18  #: NVLink links per GPU


BASE_CLOCK_MHZ = 1980.0


NIC_FLAP_RETRANSMITS = 300.0


NIC_FLAP_ERRORS = 15.0


@dataclass(slots=True)
class _Hardware:
    temp0: F64  #: per-GPU temperature under load, deg C
    ecc_bg: F64  #: background corrected-ECC errors per report
    ecc_corrected: npt.NDArray[np.int64]
    ecc_uncorrected: npt.NDArray[np.int64]
    nic_errors: npt.NDArray[np.int64]  #: per node slot
    nic_retransmits: npt.NDArray[np.int64]
    flaps: npt.NDArray[np.int64]  #: NIC flaps since the last report, per slot
    nvl_crc: npt.NDArray[np.int64]  #: cumulative NVLink CRC errors per rank
    nvl_replay: npt.NDArray[np.int64]
    xids: dict[int, list[int]] = field(default_factory=dict)  #: rank -> pending XIDs


_LINK_KINDS = frozenset(
    {
        FaultKind.PCIE_DOWNTRAIN,
        FaultKind.NVLINK_DOWN,
        FaultKind.ROW_REMAP,
        FaultKind.DRAIN_XID,
        FaultKind.CLOCK_THROTTLE,
    }
)


@dataclass(slots=True)
class _Links:
    """Silent-slowdown readings of one health report, per rank where not nominal."""

    gen: dict[int, int] = field(default_factory=dict)
    width: dict[int, int] = field(default_factory=dict)
    down: dict[int, int] = field(default_factory=dict)
    pending: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    reasons: dict[int, tuple[str, ...]] = field(default_factory=dict)


class _NodeHealth:
    """Health reports of a :class:`~pipeline.tools.simulator.job.SimulatedJob` (its state:
    ``self._hw``, the scenario, the node slots and the health clock)."""

    def _due_health(self) -> list[NodeHealth]:
        if self._clock is not None and self._path is not None:
            return self._own_clock_health(self._clock, self._path)
        due = self.ts >= self._next_health
        if not due and not self._forced_health:
            return []
        if due:
            while self._next_health <= self.ts:
                self._next_health += self._health_every
            slots = np.flatnonzero(self._host_alive)
        else:
            slots = np.asarray(sorted(self._forced_health), dtype=np.intp)
        self._forced_health.clear()
        return self._health(slots)

    def _own_clock_health(self, clock: HealthClock, path: HealthPath) -> list[NodeHealth]:
        """Reports taken on each node's own clock up to now, restamped with the time
        each was taken, then what the health path delivers now."""
        forced = np.asarray(sorted(self._forced_health), dtype=np.intp)
        self._forced_health.clear()
        if forced.size:
            path.send(self._health(forced, scale=0.0))
        for slots, times in clock.due(self.ts, self._host_alive):
            last = float(times.max())
            scale = max(0.0, last - self._counted_to) / clock.interval_s
            reports = self._health(slots, scale=scale)
            self._counted_to = max(self._counted_to, last)
            path.send(
                [
                    r.model_copy(update={"ts": datetime.fromtimestamp(float(t), UTC)})
                    for r, t in zip(reports, times.tolist(), strict=True)
                ]
            )
        return path.deliver(self.ts, step=self.step, stalled=self._stall is not None)

    def _health(self, slots: npt.NDArray[np.intp], scale: float = 1.0) -> list[NodeHealth]:
        """Reports of ``slots`` now; the fleet's error counters advance by ``scale``
        report intervals' worth (reports on their own clocks come a few at a time)."""
        s, rng, hw = self.scenario, self._rng, self._hw
        n = s.n_ranks
        step = self.step
        util = self._util
        temp = hw.temp0 + 10.0 * util / 100.0 + 0.4 * rng.standard_normal(n)
        clock = BASE_CLOCK_MHZ - np.abs(6.0 * rng.standard_normal(n))
        thermal = np.zeros(n, dtype=bool)
        ecc_rate = hw.ecc_bg.copy()
        links = self._links(step, temp, clock)
        for f in s.faults:
            if f.kind == FaultKind.DIURNAL_TEMPERATURE:
                phase = 2.0 * math.pi * (self.ts - s.start_ts) / f.period_s
                temp += f.magnitude * math.sin(phase)
            elif f.kind == FaultKind.THERMAL and f.active(step):
                idx = self._mask(f)
                ramp = min(1.0, (step - f.onset_step + 1) / float(f.ramp_steps or 10))
                temp[idx] += (92.0 - temp[idx] + rng.normal(0, 0.7, idx.size)) * ramp
                clock[idx] *= 1.0 - min(f.magnitude * ramp, 0.9)
                thermal[idx] = True
            elif f.subsides and f.active(step):  # bursts in about half the reports
                idx = self._mask(f)
                burst = rng.random(idx.size) < 0.5
                ecc_rate[idx] += np.where(burst, f.magnitude * rng.uniform(0.3, 1.0, idx.size), 0)
            elif f.kind == FaultKind.ECC_STORM and f.onset_step <= step < f.crash_step:
                idx = self._mask(f)
                x = (step - f.onset_step) / float(max(1, f.crash_step - f.onset_step))
                ecc_rate[idx] += 2.0 + f.magnitude * (math.exp(4.0 * x) - 1.0) / (math.e**4 - 1)
        hw.ecc_corrected += rng.poisson(ecc_rate * scale)
        hw.nic_retransmits += rng.poisson(3.0 * scale + NIC_FLAP_RETRANSMITS * hw.flaps)
        hw.nic_errors += rng.poisson(0.01 * scale + NIC_FLAP_ERRORS * hw.flaps)
        hw.flaps[:] = 0
        power = np.clip(
            120.0
            + 560.0 * (util / 100.0) * (clock / BASE_CLOCK_MHZ)
            + 8.0 * rng.standard_normal(n),
            50.0,
            700.0,
        )
        temp_l = np.clip(temp, -50.0, 200.0).round(1).tolist()
        power_l = power.round(1).tolist()
        clock_l = clock.round(0).tolist()
        util_l = np.clip(util, 0.0, 100.0).round(1).tolist()
        corr_l = hw.ecc_corrected.tolist()
        crc_l = hw.nvl_crc.tolist()
        replay_l = hw.nvl_replay.tolist()
        unc_l = hw.ecc_uncorrected.tolist()
        thermal_l = thermal.tolist()
        ts = datetime.fromtimestamp(self.ts, UTC)
        g = s.gpus_per_node
        out = []
        for slot in slots.tolist():
            gpus = []
            for r in range(slot * g, slot * g + g):
                gpus.append(
                    GpuHealth(
                        index=r - slot * g,
                        temperature_c=temp_l[r],
                        power_w=power_l[r],
                        sm_clock_mhz=clock_l[r],
                        utilization_pct=util_l[r],
                        ecc_corrected=corr_l[r],
                        ecc_uncorrected=unc_l[r],
                        xid_codes=tuple(hw.xids.pop(r, ())),
                        throttle_reasons=(
                            ("hw_thermal_slowdown",) if thermal_l[r] else links.reasons.get(r, ())
                        ),
                        nvlink_errors=crc_l[r] + replay_l[r],
                        nvlink_crc_errors=crc_l[r],
                        nvlink_replay_errors=replay_l[r],
                        nvlink_links_down=links.down.get(r, 0),
                        pcie_gen=links.gen.get(r, PCIE_GEN),
                        pcie_gen_max=PCIE_GEN,
                        pcie_width=links.width.get(r, PCIE_WIDTH),
                        pcie_width_max=PCIE_WIDTH,
                        remap_pending=r in links.pending,
                        remap_failed=r in links.failed,
                    )
                )
            out.append(
                NodeHealth(
                    job_id=s.job,
                    node=self.node_names[slot],
                    ts=ts,
                    interval_s=self._health_every,
                    gpus=tuple(gpus),
                    nic_errors=int(hw.nic_errors[slot]),
                    nic_retransmits=int(hw.nic_retransmits[slot]),
                )
            )
        return out

    def _links(self, step: int, temp: F64, clock: F64) -> _Links:
        """The silent-slowdown readings due now (adjusting ``temp`` and ``clock`` of
        throttled GPUs in place); faults of a replaced node no longer apply."""
        s, rng, hw = self.scenario, self._rng, self._hw
        out = _Links()
        for f in s.faults:
            kind = f.kind
            if kind == FaultKind.CLUSTER_SLOWDOWN and f.variant == "power_cap" and f.active(step):
                clock *= 1.0 - min(f.magnitude * f.ramp_at(step), 0.9)
                out.reasons.update(dict.fromkeys(range(s.n_ranks), ("sw_power_cap",)))
                continue
            if kind not in _LINK_KINDS or not f.active(step):
                continue
            idx = self._mask(f)
            ranks = idx.tolist()
            if kind == FaultKind.PCIE_DOWNTRAIN:
                if f.variant == "gen":
                    out.gen.update(dict.fromkeys(ranks, int(f.magnitude or 4)))
                else:
                    out.width.update(dict.fromkeys(ranks, int(f.magnitude or 8)))
            elif kind == FaultKind.NVLINK_DOWN:
                out.down.update(dict.fromkeys(ranks, min(NVLINKS, int(f.magnitude or 1))))
                hw.nvl_crc[idx] += rng.poisson(20.0, idx.size)
                hw.nvl_replay[idx] += rng.poisson(10.0, idx.size)
            elif kind == FaultKind.ROW_REMAP:
                failed = f.variant == "failure"
                (out.failed if failed else out.pending).update(ranks)
                self._xid_once(f, idx, XID_REMAP_FAILURE if failed else XID_REMAP_PENDING)
            elif kind == FaultKind.DRAIN_XID:
                self._xid_once(f, idx, int(f.magnitude))
            elif kind == FaultKind.CLOCK_THROTTLE:
                clock[idx] *= 1.0 - min(f.magnitude, 0.9)
                variant = f.variant or "thermal"
                if variant == "thermal":
                    temp[idx] += 8.0
                    out.reasons.update(dict.fromkeys(ranks, ("sw_thermal_slowdown",)))
                elif variant == "hw_slowdown":
                    out.reasons.update(dict.fromkeys(ranks, ("hw_slowdown",)))
                else:
                    out.reasons.update(dict.fromkeys(ranks, ("sw_power_cap",)))
        return out

    def _xid_once(self, f: FaultSpec, idx: npt.NDArray[np.intp], xid: int) -> None:
        key = f"xid:{f.fault_id}"
        if key in self._triggered:
            return
        self._triggered.add(key)
        for r in idx.tolist():
            self._hw.xids.setdefault(r, []).append(xid)
