"""Silent-slowdown scoring on arbitrary valid reports: findings are finite and
non-negative, scoring never changes state, and the same readings on every node (a
cluster-wide condition) never rise to a grade."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from detectors.config import DetectorConfig
from detectors.hardware.health import HardwareDetector
from detectors.hardware.links import LINK_SIGNALS
from schemas import GpuHealth, NodeHealth

T0 = datetime(2026, 1, 1, tzinfo=UTC)
REASONS = ("gpu_idle", "sw_power_cap", "hw_slowdown", "sw_thermal_slowdown",
           "hw_thermal_slowdown", "hw_power_brake_slowdown")  # fmt: skip
opt_gen = st.none() | st.integers(0, 16)
opt_width = st.none() | st.integers(0, 64)
gpu = st.builds(
    GpuHealth,
    index=st.just(0),
    temperature_c=st.floats(-50, 200),
    power_w=st.floats(0, 1000),
    sm_clock_mhz=st.floats(0, 3000),
    utilization_pct=st.floats(0, 100),
    throttle_reasons=st.lists(st.sampled_from(REASONS), max_size=3, unique=True).map(tuple),
    nvlink_links_down=st.integers(0, 18),
    pcie_gen=opt_gen, pcie_gen_max=opt_gen, pcie_width=opt_width, pcie_width_max=opt_width,
    remap_pending=st.booleans(), remap_failed=st.booleans(),
    xid_codes=st.lists(st.sampled_from([13, 31, 48, 63, 64, 79, 119]), max_size=2).map(tuple),
)  # fmt: skip


def _node(node: str, i: int, g: GpuHealth, k: int = 4) -> NodeHealth:
    gpus = tuple(g.model_copy(update={"index": j}) for j in range(k))
    return NodeHealth(node=node, ts=T0 + timedelta(seconds=10 * i), gpus=gpus)


@settings(max_examples=150, deadline=None)
@given(st.lists(gpu, min_size=1, max_size=12), gpu)
def test_findings_are_finite_non_negative_and_scoring_does_not_learn(history, probe):
    hw = HardwareDetector()
    for i, g in enumerate(history):
        for n in ("a", "b", "c"):
            hw.learn_one(_node(n, i, g))
    msg = _node("a", len(history), probe)
    first = hw.score_one(msg)
    assert hw.score_one(msg) == first
    for f in first:
        assert math.isfinite(f.score) and f.score >= 0, f
        if f.signal == "pcie_downtrain":
            assert 0 < f.score <= 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from(REASONS), max_size=2, unique=True), min_size=8,
                max_size=30))  # fmt: skip
def test_the_same_clock_reasons_on_every_node_never_reach_a_grade(per_report):
    cfg = DetectorConfig()
    hw = HardwareDetector()
    base = GpuHealth(index=0, temperature_c=60, power_w=500, sm_clock_mhz=1980,
                     utilization_pct=98)  # fmt: skip
    for i, reasons in enumerate(per_report):
        g = base.model_copy(update={"throttle_reasons": tuple(reasons)})
        for n in "abcdefgh":
            msg = _node(n, i, g)
            for f in hw.score_one(msg):
                assert f.signal in LINK_SIGNALS
                limit = cfg.throttle_warning if f.signal == "clock_throttle" else cfg.power_cap_info
                assert f.score < limit, (i, n, f)
            hw.learn_one(msg)
