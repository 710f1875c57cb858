"""Hardware hard rules: an uncorrectable ECC error, a failed row remap or a fatal XID
is critical at once (recommended action: isolate the node now).

``hw_fatal`` fires for a GPU on any increase of ``ecc_uncorrected`` (a first report
with a non-zero count counts as one), a report of a failed row remap
(``remap_failed``: the GPU has no spare rows left, it needs an RMA) or any XID in
``fatal_xids``. Score 1, latched
for ``latch_reports`` more reports of the node so the episode stays open while the GPU
reports normally again. No baseline and no warm-up: the rules apply from a GPU's first
report. The state they read and write (last uncorrectable count, latch) lives in
:class:`~detectors.hardware.state.NodeState`.

:data:`FATAL_XIDS` (NVIDIA XID catalogue, the XIDs after which a GPU must be
drained): 48 double-bit ECC error; 64 ECC page retirement or row-remap failure; 74
NVLink error; 79 GPU fallen off the bus; 94 contained ECC error; 95 uncontained ECC
error; 119 GSP RPC timeout; 120 GSP error. XID 63 (a row remap recorded, applied at
the next GPU reset) is the ``row_remap`` signal of :mod:`detectors.hardware.links`,
not a hard rule. Other XIDs (application faults such as 13, 31, 43) are not scored.

Examples
--------
>>> from datetime import datetime, timedelta, timezone
>>> from schemas import GpuHealth, NodeHealth
>>> from detectors.hardware.health import HardwareDetector
>>> t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
>>> def report(i, unc=0, xids=()):
...     g = GpuHealth(index=0, temperature_c=60.0, power_w=300, sm_clock_mhz=1980,
...                   utilization_pct=99, ecc_uncorrected=unc, xid_codes=xids)
...     return NodeHealth(node="a", ts=t0 + timedelta(seconds=10 * i), gpus=(g,))
>>> hw = HardwareDetector(fatal_latch_reports=2)
>>> for i, unc in enumerate([0, 1, 1, 1, 1]):
...     msg = report(i, unc)
...     print(i, [f.detail for f in hw.score_one(msg)])
...     hw.learn_one(msg)
0 []
1 ['GPU 0: uncorrectable ECC +1']
2 ['GPU 0: after uncorrectable ECC / failed row remap / fatal XID']
3 ['GPU 0: after uncorrectable ECC / failed row remap / fatal XID']
4 []
>>> [f.detail for f in hw.score_one(report(5, 1, xids=(13, 79)))]
['GPU 0: fatal XID 79']
>>> g = GpuHealth(index=2, temperature_c=60.0, power_w=300, sm_clock_mhz=1980,
...               utilization_pct=99, remap_failed=True)
>>> msg = NodeHealth(node="b", ts=t0, gpus=(g,))
>>> [f.detail for f in HardwareDetector().score_one(msg)]
['GPU 2: row remap failed']
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from detectors.base import Finding
from detectors.hardware.state import NodeState, Prepared
from detectors.signals import FATAL_XIDS  # defined below the families: the config reads it

__all__ = ["FATAL_XIDS", "fatal_findings", "learn_fatal"]

I64 = npt.NDArray[np.int64]


def fatal_findings(
    prep: Prepared,
    st: NodeState,
    p: I64,
    seen: npt.NDArray[np.bool_],
    fatal_xids: frozenset[int],
) -> list[Finding]:
    """``hw_fatal`` findings of a report (reads state only).

    ``p`` holds the GPUs' positions in ``st`` (0 where unknown) and ``seen`` marks
    the GPUs ``st`` has learned a report of.
    """
    msg, unc = prep.msg, prep.unc
    n = len(prep.indices)
    sized = st.gpu_n.shape[0] > 0
    prev_unc = np.where(seen, st.ecc_unc[p], 0) if sized else np.zeros(n, np.int64)
    latch = np.where(seen, st.latch[p], 0) if sized else np.zeros(n, np.int64)
    out: list[Finding] = []
    for i, g in enumerate(msg.gpus):
        reasons = []
        if unc[i] > prev_unc[i]:
            reasons.append(f"uncorrectable ECC +{int(unc[i] - prev_unc[i])}")
        if prep.remap_failed[i]:
            reasons.append("row remap failed")
        if prep.xid_fatal[i]:
            fatal = sorted(set(g.xid_codes) & fatal_xids)
            reasons.append("fatal XID " + ",".join(map(str, fatal)))
        if reasons or latch[i] > 0:
            detail = "; ".join(reasons) or st.latch_detail.get(int(p[i]), "earlier fatal")
            out.append(
                Finding(
                    "hw_fatal",
                    msg.node,
                    None,
                    1.0,
                    "ecc_uncorrected",
                    float(unc[i]),
                    1.0,
                    detail=f"GPU {g.index}: {detail}",
                )
            )
    return out


def learn_fatal(
    prep: Prepared,
    st: NodeState,
    pos: I64,
    first_seen: npt.NDArray[np.bool_],
    latch_reports: int,
) -> None:
    """Latch the GPUs a report shows a fatal event on for ``latch_reports`` reports;
    count the others' latches down.

    ``pos`` holds the GPUs' positions in ``st`` (all registered) and ``first_seen``
    marks the GPUs registered by this report.
    """
    prev_unc = np.where(first_seen | (st.gpu_n[pos] == 0), 0, st.ecc_unc[pos])
    fatal = (prep.unc > prev_unc) | prep.xid_fatal | prep.remap_failed
    st.latch[pos] = np.where(fatal, latch_reports, np.maximum(st.latch[pos] - 1, 0))
    for p in pos[fatal]:
        st.latch_detail[int(p)] = "after uncorrectable ECC / failed row remap / fatal XID"
