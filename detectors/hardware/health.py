"""Hardware health per node and GPU: baselines against the node's own history *and*
the fleet at the same time, plus hard rules that are critical at once.

Scored per :class:`schemas.NodeHealth` report (one node, all its GPUs, vectorised):

- ``thermal``: temperature above the fleet median by more than the GPU's own learned
  offset (a diurnal swing on every node cancels out; a GPU that always runs 3 °C
  hotter is normal), counted only while the GPU throttles (SM clock down versus the
  fleet and its own baseline, or a thermal throttle reason) or when the excess is
  extreme. Score: excess in °C.
- ``ecc_rate``, ``nvlink_errors`` (per GPU) and ``nic_errors`` (per node: errors plus
  retransmits): counts since the previous report from the cumulative counters,
  scored as a Poisson z against the expected count at the baseline rate,
  ``(k - lam) / sqrt(lam + 1)`` with ``lam = max(own EW rate, fleet median rate) * dt``,
  so background noise on a busy counter does not page while a storm does.
- ``hw_fatal`` (hard rule, :mod:`detectors.hardware.rules`): any increase of
  ``ecc_uncorrected``, a failed row remap or any XID in ``fatal_xids`` (default
  :data:`FATAL_XIDS`). Score 1, latched for ``fatal_latch_reports`` reports so the
  episode stays open.
- silent slowdowns (:mod:`detectors.hardware.links`): ``pcie_downtrain``,
  ``nvlink_down`` and ``row_remap`` (rules), ``clock_throttle`` and ``power_cap``
  (own and fleet baselines of the clock reasons).

Counters going down (reboot, driver reload) re-base and give a zero count. Baseline
scores are neutral until a GPU has ``warmup_reports`` reports; the hard rules apply at
once. Power is reported in the evidence only. The state kept per node and across the
fleet, and a report read against it, are :mod:`detectors.hardware.state`'s.

Examples
--------
>>> from datetime import datetime, timedelta, timezone
>>> from schemas import GpuHealth, NodeHealth
>>> t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
>>> def report(node, i, temp=60.0, xids=(), unc=0):
...     g = GpuHealth(index=0, temperature_c=temp, power_w=300, sm_clock_mhz=1980,
...                   utilization_pct=99, ecc_uncorrected=unc, xid_codes=xids)
...     return NodeHealth(node=node, ts=t0 + timedelta(seconds=10 * i), gpus=(g,))
>>> hw = HardwareDetector()
>>> for i in range(5):
...     for n in ("a", "b", "c"):
...         hw.learn_one(report(n, i))
>>> hw.score_one(report("a", 5, xids=(79,)))[0].signal
'hw_fatal'
>>> hw.score_one(report("b", 5, temp=75.0))   # hot but not throttling: not thermal
[]
>>> hw.score_one(report("c", 5, temp=95.0))[0].signal   # extreme: thermal anyway
'thermal'
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from detectors.base import Finding, check_positive
from detectors.hardware.links import LINK_SIGNALS, learn_links, link_findings
from detectors.hardware.rules import FATAL_XIDS, fatal_findings, learn_fatal
from detectors.hardware.state import FleetState, NodeState, Prepared
from schemas.telemetry import NodeHealth

__all__ = ["FATAL_XIDS", "HEALTH_SIGNALS", "HardwareDetector", "Prepared"]

F64 = npt.NDArray[np.float64]
#: A fleet median SM clock below this (MHz) is no running GPU: the clock offsets and
#: the thermal signal wait (a ratio against ~0 overflows).
_MIN_CLOCK_MHZ = 1.0

#: Signals produced from NodeHealth reports.
HEALTH_SIGNALS: frozenset[str] = (
    frozenset({"thermal", "ecc_rate", "nvlink_errors", "nic_errors", "hw_fatal"}) | LINK_SIGNALS
)


def _poisson_z(count: F64, expected: F64) -> F64:
    return (count - expected) / np.sqrt(expected + 1.0)


class HardwareDetector:
    """Scores NodeHealth reports against own and fleet baselines, plus hard rules.

    Parameters
    ----------
    warmup_reports
        Reports per GPU before baseline scores leave neutral (hard rules apply at once).
    temp_critical_c
        Temperature excess (°C over fleet and own offset) that counts as thermal even
        without a throttling sign.
    clock_drop
        SM-clock drop (fraction, versus fleet and own baseline) that counts as
        throttling.
    fatal_xids
        XID codes that are critical at once.
    fatal_latch_reports
        Reports a hard-rule finding stays at score 1 after the event.
    fleet_refresh
        Fleet medians are recomputed after this fraction of the fleet has reported.
    """

    def __init__(
        self,
        warmup_reports: int = 5,
        temp_critical_c: float = 20.0,
        clock_drop: float = 0.05,
        fatal_xids: Iterable[int] = FATAL_XIDS,
        fatal_latch_reports: int = 30,
        fleet_refresh: float = 0.125,
    ) -> None:
        if warmup_reports < 1:
            raise ValueError(f"warmup_reports must be >= 1, got {warmup_reports!r}")
        check_positive("temp_critical_c", temp_critical_c)
        check_positive("clock_drop", clock_drop)
        if fatal_latch_reports < 1:
            raise ValueError(f"fatal_latch_reports must be >= 1, got {fatal_latch_reports!r}")
        if not 0 < fleet_refresh <= 1:
            raise ValueError(f"fleet_refresh must be in (0, 1], got {fleet_refresh!r}")
        self.warmup_reports = warmup_reports
        self.temp_critical_c = temp_critical_c
        self.clock_drop = clock_drop
        self.fatal_xids = frozenset(int(x) for x in fatal_xids)
        self.fatal_latch_reports = fatal_latch_reports
        self.fleet_refresh = fleet_refresh
        self._nodes: dict[str, NodeState] = {}
        self._fleet = FleetState()

    def prepare(self, msg: NodeHealth) -> Prepared:
        """Read one report into arrays and count events since the node's previous
        report (reads state only). Valid until the next :meth:`learn_prepared`."""
        st = self._nodes.get(msg.node) or NodeState()
        return st.read(msg, self.fatal_xids)

    def score_one(self, msg: NodeHealth) -> list[Finding]:
        """Findings of one report (reads state only; no finding means all clear)."""
        return self.score_prepared(self.prepare(msg))

    def score_prepared(self, prep: Prepared) -> list[Finding]:
        """Findings of a report read by :meth:`prepare` (reads state only)."""
        msg = prep.msg
        st = self._nodes.get(msg.node) or NodeState()
        st.upgrade()
        self._fleet.upgrade()
        node = msg.node
        indices, temp, clock = prep.indices, prep.temp, prep.clock
        pos = st.positions(indices, None, node)
        have = pos >= 0
        p = np.where(have, pos, 0)
        sized = st.gpu_n.shape[0] > 0
        seen = have & (st.gpu_n[p] > 0) if sized else np.zeros(len(indices), dtype=bool)
        dt = prep.dt
        d_ecc, d_nvl, d_nic, known = prep.d_ecc, prep.d_nvl, prep.d_nic, prep.known
        f_temp, f_clock, f_ecc, f_nvl, f_nic = self._fleet.medians
        # hard rules: critical at once, no warm-up
        out = fatal_findings(prep, st, p, seen, self.fatal_xids)
        warm = seen & (st.gpu_n[p] >= self.warmup_reports) if sized else seen
        out += link_findings(prep, st, p, seen, warm, self._fleet)
        if not warm.any():
            return out
        # thermal: peer-relative temperature against the GPU's own offset
        if math.isfinite(f_temp) and math.isfinite(f_clock) and f_clock >= _MIN_CLOCK_MHZ:
            off_t = st.temp_off.mean[p]
            excess = temp - f_temp - off_t
            drop = st.clock_off.mean[p] - clock / f_clock
            for i in np.flatnonzero(warm & (excess > 0)).tolist():
                g = msg.gpus[i]
                reason = any("thermal" in r.lower() for r in g.throttle_reasons)
                throttled = drop[i] >= self.clock_drop or reason
                if throttled or excess[i] >= self.temp_critical_c:
                    out.append(
                        Finding(
                            "thermal",
                            node,
                            None,
                            float(excess[i]),
                            "temperature_c",
                            float(temp[i]),
                            float(excess[i]),
                            peer_median=f_temp,
                            baseline=f_temp + float(off_t[i]),
                            detail=(
                                f"GPU {g.index}: {temp[i]:.0f} C vs fleet {f_temp:.0f} C "
                                f"(+{excess[i]:.1f} C over its usual offset), SM clock "
                                f"{-drop[i]:+.0%}, power {g.power_w:.0f} W, throttle "
                                f"{','.join(g.throttle_reasons) or 'none'}"
                            ),
                        )
                    )
        # counters: Poisson z of the count against the baseline rate
        if dt > 0:
            for signal, d, ew, fleet_rate, metric in (
                ("ecc_rate", d_ecc, st.ecc_rate, f_ecc, "ecc_corrected_per_report"),
                ("nvlink_errors", d_nvl, st.nvl_rate, f_nvl, "nvlink_errors_per_report"),
            ):
                rate = np.maximum(ew.mean[p], fleet_rate)
                z = _poisson_z(d, rate * dt)
                for i in np.flatnonzero(warm & known & (z > 0)).tolist():
                    out.append(
                        Finding(
                            signal,
                            node,
                            None,
                            float(z[i]),
                            metric,
                            float(d[i]),
                            float(z[i]),
                            peer_median=fleet_rate * dt,
                            baseline=float(ew.mean[p[i]]) * dt,
                            detail=(
                                f"GPU {indices[i]}: {int(d[i])} in {dt:.0f}s, expected "
                                f"{rate[i] * dt:.1f}"
                            ),
                        )
                    )
            if st.n >= self.warmup_reports:
                rate_n = max(float(st.nic_rate.mean[0]), f_nic)
                z_n = float(_poisson_z(np.array([d_nic]), np.array([rate_n * dt]))[0])
                if z_n > 0:
                    out.append(
                        Finding(
                            "nic_errors",
                            node,
                            None,
                            z_n,
                            "nic_errors_per_report",
                            d_nic,
                            z_n,
                            peer_median=f_nic * dt,
                            baseline=float(st.nic_rate.mean[0]) * dt,
                            detail=(
                                f"NIC errors+retransmits {int(d_nic)} in {dt:.0f}s, "
                                f"expected {rate_n * dt:.1f}"
                            ),
                        )
                    )
        return out

    def learn_one(self, msg: NodeHealth, anomalous: Iterable[str] = ()) -> None:
        """Learn one report. Signals named in ``anomalous`` (judged anomalous or graded
        critical) do not update their baselines; counters always re-base."""
        self.learn_prepared(self.prepare(msg), anomalous)

    def learn_prepared(self, prep: Prepared, anomalous: Iterable[str] = ()) -> None:
        """Learn a report read by :meth:`prepare` against the current state."""
        skip = set(anomalous)
        msg = prep.msg
        node = msg.node
        st = self._nodes.get(node)
        if st is None:
            st = self._nodes[node] = NodeState()
        st.upgrade()
        self._fleet.upgrade()
        ts = prep.ts
        if ts <= st.last_ts:
            return
        fl = self._fleet
        indices, temp, clock, corr, unc, nvl = (
            prep.indices,
            prep.temp,
            prep.clock,
            prep.corr,
            prep.unc,
            prep.nvl,
        )
        first_seen = np.array([gi not in st.pos for gi in indices], dtype=bool)
        pos = st.positions(indices, fl, node)
        dt, nic_total = prep.dt, prep.nic_total
        d_ecc, d_nvl, d_nic, known = prep.d_ecc, prep.d_nvl, prep.d_nic, prep.known
        f_temp, f_clock, _, _, _ = fl.medians
        # hard-rule latch, then the baselines
        learn_fatal(prep, st, pos, first_seen, self.fatal_latch_reports)
        learn_links(prep, st, pos, fl, skip)
        if (
            math.isfinite(f_temp)
            and math.isfinite(f_clock)
            and f_clock >= _MIN_CLOCK_MHZ
            and "thermal" not in skip
        ):
            st.temp_off.update(pos, temp - f_temp)
            st.clock_off.update(pos, clock / f_clock)
        if dt > 0 and known.any():
            if "ecc_rate" not in skip:
                st.ecc_rate.update(pos[known], d_ecc[known] / dt)
            if "nvlink_errors" not in skip:
                st.nvl_rate.update(pos[known], d_nvl[known] / dt)
            slots = st.fleet_slot[pos[known]]
            fl.ecc[slots] = d_ecc[known] / dt
            fl.nvl[slots] = d_nvl[known] / dt
        if st.n > 0 and dt > 0:
            if "nic_errors" not in skip:
                st.nic_rate.update(np.zeros(1, dtype=np.int64), np.array([d_nic / dt]))
            fl.nic[node] = d_nic / dt
        slots = st.fleet_slot[pos]
        fl.temp[slots] = temp
        fl.clock[slots] = clock
        st.gpu_n[pos] += 1
        st.ecc_corr[pos] = corr
        st.ecc_unc[pos] = unc
        st.nvlink[pos] = nvl
        st.nic = nic_total
        st.last_ts = ts
        st.n += 1
        fl.updates += 1
        if not fl.fresh or fl.updates >= max(1, int(self.fleet_refresh * len(self._nodes))):
            fl.refresh()

    def forget(self, node: str) -> None:
        """Drop a node's state (it left the job); its fleet entries stay until replaced."""
        self._nodes.pop(node, None)
