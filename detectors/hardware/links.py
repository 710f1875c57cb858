"""Silent hardware slowdowns: what a GPU reports before step times move.

Scored per :class:`schemas.NodeHealth` report, one finding per signal and node (the
worst GPU), on top of :mod:`detectors.hardware.health`'s baselines and hard rules:

- ``pcie_downtrain`` (rule): the fraction of PCIe bandwidth lost to a link trained
  below the GPU's maximum width or generation (:func:`~detectors.hardware.state.
  pcie_loss`; a lower generation counts only while the GPU is busy, since idle links
  drop it to save power). Score: the lost fraction (x16 -> x8: 0.5).
- ``nvlink_down`` (rule): NVLink links the GPUs have that are not active. Score: the
  links down on the node.
- ``row_remap`` (rule): a memory row remap waits for a GPU reset (``remap_pending``
  or XID 63). Score 1. A *failed* remap is :mod:`detectors.hardware.rules`'s.
- ``clock_throttle`` (baseline): the GPU's short-run fraction of reports with a
  thermal or hardware-slowdown clock reason, above the larger of its own long-run
  fraction (a GPU that always throttles a little is normal for it) and the fleet's
  median (a hot day in the whole hall is not a node fault). Score: that excess.
- ``power_cap`` (baseline): the same for power-cap reasons. A power cap alone is
  informational; capping the whole cluster (a facility power limit) is not a node
  fault at all, and peer relativity keeps it silent.

The rules apply from a GPU's first report; the baselines after ``warmup`` reports.

Examples
--------
>>> from datetime import datetime, timedelta, timezone
>>> from schemas import GpuHealth, NodeHealth
>>> from detectors.hardware.health import HardwareDetector
>>> t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
>>> def report(node, i, width=16, reasons=()):
...     g = GpuHealth(index=0, temperature_c=60.0, power_w=300, sm_clock_mhz=1980,
...                   utilization_pct=99, pcie_gen=5, pcie_gen_max=5, pcie_width=width,
...                   pcie_width_max=16, throttle_reasons=reasons)
...     return NodeHealth(node=node, ts=t0 + timedelta(seconds=10 * i), gpus=(g,))
>>> hw = HardwareDetector()
>>> for i in range(8):
...     for n in "abcd":
...         hw.learn_one(report(n, i))
>>> [(f.signal, f.score) for f in hw.score_one(report("a", 8, width=8))]
[('pcie_downtrain', 0.5)]

Every node capped at once scores near zero (the grading's INFO threshold is 0.5); one
node capped stands out from its peers:

>>> capped = ("sw_power_cap",)
>>> for i in range(8, 12):
...     for n in "abcd":
...         hw.learn_one(report(n, i, reasons=capped))
>>> [(f.signal, round(f.score, 2)) for f in hw.score_one(report("a", 12, reasons=capped))]
[('power_cap', 0.07)]
>>> hw2 = HardwareDetector()
>>> for i in range(12):
...     for n in "abcd":
...         hw2.learn_one(report(n, i, reasons=capped if n == "a" and i > 8 else ()))
>>> [(f.signal, round(f.score, 2)) for f in hw2.score_one(report("a", 12, reasons=capped))]
[('power_cap', 0.7)]
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from detectors._stats import EWArrays
from detectors.base import Finding
from detectors.hardware.state import FleetState, NodeState, Prepared

__all__ = ["LINK_SIGNALS", "learn_links", "link_findings"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

#: Signals produced here.
LINK_SIGNALS: frozenset[str] = frozenset(
    {"pcie_downtrain", "nvlink_down", "row_remap", "clock_throttle", "power_cap"}
)


def _pcie_detail(prep: Prepared, i: int) -> str:
    g = prep.msg.gpus[i]
    return (
        f"GPU {g.index}: PCIe Gen{g.pcie_gen} x{g.pcie_width} of Gen{g.pcie_gen_max} "
        f"x{g.pcie_width_max} ({prep.pcie_loss[i]:.0%} of its bandwidth lost), "
        f"utilisation {g.utilization_pct:.0f} %"
    )


def _short(ew_mean: F64, ew_n: I64, x: F64, alpha: float) -> F64:
    """The short-run fraction after learning ``x`` (without learning it)."""
    return np.where(ew_n > 0, (1.0 - alpha) * ew_mean + alpha * x, x)


def link_findings(
    prep: Prepared,
    st: NodeState,
    p: I64,
    seen: npt.NDArray[np.bool_],
    warm: npt.NDArray[np.bool_],
    fleet: FleetState,
) -> list[Finding]:
    """Findings of the silent-slowdown signals of a report (reads state only).

    ``p`` holds the GPUs' positions in ``st`` (0 where unknown), ``seen`` marks the GPUs
    ``st`` has learned a report of and ``warm`` those past the baselines' warm-up.
    """
    if not (prep.link_events or prep.any_reason):
        return []
    msg, node = prep.msg, prep.msg.node
    out: list[Finding] = []
    loss = prep.pcie_loss
    if loss.size and float(loss.max()) > 0:
        i = int(np.argmax(loss))
        out.append(
            Finding("pcie_downtrain", node, None, float(loss[i]), "pcie_bandwidth_lost",
                    float(loss[i]), float(loss[i]), baseline=0.0, detail=_pcie_detail(prep, i))
        )  # fmt: skip
    down = int(prep.links_down.sum())
    if down > 0:
        where = ", ".join(
            f"GPU {msg.gpus[i].index}: {int(prep.links_down[i])}"
            for i in np.flatnonzero(prep.links_down).tolist()
        )
        out.append(
            Finding("nvlink_down", node, None, float(down), "nvlink_links_down", float(down),
                    float(down), baseline=0.0, detail=f"NVLink links down ({where})")
        )  # fmt: skip
    if prep.remap_pending.any():
        gpus = ",".join(str(msg.gpus[i].index) for i in np.flatnonzero(prep.remap_pending))
        out.append(
            Finding("row_remap", node, None, 1.0, "row_remap_pending", 1.0, 1.0,
                    detail=f"GPU {gpus}: row remap pending (checkpoint, then reset the GPU "
                    "or drain the node to apply it)")
        )  # fmt: skip
    if not prep.any_reason or not warm.any() or st.thr_short.n_slots == 0:
        return out
    f_thr, f_pcap = fleet.throttle_medians
    for signal, x, short, base, f_med, alpha in (
        ("clock_throttle", prep.slowdown, st.thr_short, st.thr_base, f_thr, st.thr_short.alpha),
        ("power_cap", prep.power_cap, st.pcap_short, st.pcap_base, f_pcap, st.pcap_short.alpha),
    ):
        if not x.any():
            continue
        # before its first clock reason a node's fractions only count in gpu_n
        learned = short.n[p] if st.throttled else st.gpu_n[p]
        now = _short(short.mean[p], np.where(seen, learned, 0), x, alpha)
        ref = np.maximum(np.where(seen, base.mean[p], 0.0), f_med)
        excess = np.where(warm, now - ref, 0.0)
        i = int(np.argmax(excess))
        if excess[i] <= 0:
            continue
        g = msg.gpus[i]
        out.append(
            Finding(
                signal,
                node,
                None,
                float(excess[i]),
                f"{signal}_fraction",
                float(now[i]),
                float(excess[i]),
                peer_median=f_med,
                baseline=float(base.mean[p[i]]),
                detail=(
                    f"GPU {g.index}: clock reasons {','.join(g.throttle_reasons)} in "
                    f"{now[i]:.0%} of recent reports (own usual {base.mean[p[i]]:.0%}, "
                    f"fleet {f_med:.0%}), SM clock {g.sm_clock_mhz:.0f} MHz, "
                    f"{g.temperature_c:.0f} C, {g.power_w:.0f} W"
                ),
            )
        )
    return out


def _learn_fraction(ew: EWArrays, pos: I64, x: F64) -> None:
    """``ew.update(pos, x)``; zeros into a zero mean and variance (a GPU that never
    throttled, the usual case) only move the counts, which is the same result."""
    if not x.any() and not ew.mean[pos].any() and not ew.var[pos].any():
        ew.n[pos] += 1
    else:
        ew.update(pos, x)


def learn_links(prep: Prepared, st: NodeState, pos: I64, fleet: FleetState, skip: set[str]) -> None:
    """Learn the throttle fractions of a report (``pos``: all GPUs registered).

    The short-run fractions always learn (they are the evidence); the long-run
    baselines not while their signal is judged anomalous, so a sustained fault is
    not learned as the GPU's normal.
    """
    if not st.throttled:
        if not prep.any_reason:
            return  # the usual case: zeros into zero fractions (counted when needed)
        # the node's first clock reason: each GPU had learned gpu_n reports of zeros
        st.throttled = True
        k = len(st.pos)
        for ew in (st.thr_short, st.pcap_short, st.thr_base, st.pcap_base):
            ew.n[:k] = st.gpu_n[:k]
    slots = st.fleet_slot[pos]
    _learn_fraction(st.thr_short, pos, prep.slowdown)
    _learn_fraction(st.pcap_short, pos, prep.power_cap)
    if "clock_throttle" not in skip:
        _learn_fraction(st.thr_base, pos, prep.slowdown)
    if "power_cap" not in skip:
        _learn_fraction(st.pcap_base, pos, prep.power_cap)
    fleet.thr[slots] = st.thr_short.mean[pos]
    fleet.pcap[slots] = st.pcap_short.mean[pos]
