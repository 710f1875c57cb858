"""Silent hardware slowdowns (issue 16 item 2): PCIe downtraining, NVLink links down,
row remapping, drain XIDs and clock reasons, scored and graded through DetectorSuite."""

from datetime import timedelta

from detectors.engine import DetectorSuite
from detectors.hardware.health import FATAL_XIDS, HardwareDetector
from schemas import GpuHealth, NodeHealth
from schemas.alerts import Grade, RecommendedAction
from tests.clock import day_start

T0 = day_start()
NODES = tuple(f"n{i}" for i in range(8))


def report(node, i, *, bad=False, util=98.0, reasons=(), **fault):
    """A node of 4 GPUs at PCIe Gen5 x16 with 18 NVLinks; ``fault`` applies to GPU 2
    when ``bad``; ``reasons`` to every GPU."""
    gpus = []
    for g in range(4):
        fields = {
            "pcie_gen": 5, "pcie_gen_max": 5, "pcie_width": 16, "pcie_width_max": 16,
            "throttle_reasons": reasons,
        }  # fmt: skip
        if bad and g == 2:
            fields |= fault
        gpus.append(
            GpuHealth(
                index=g,
                temperature_c=65.0,
                power_w=600,
                sm_clock_mhz=1980,
                utilization_pct=util,
                **fields,
            )
        )
    return NodeHealth(node=node, ts=T0 + timedelta(seconds=10 * i), gpus=tuple(gpus))


def run(reports_of, n_reports=30):
    """Feed ``reports_of(node, i)`` for every node through a DetectorSuite; the alerts."""
    mon = DetectorSuite("job")
    alerts = []
    for i in range(n_reports):
        for n in NODES:
            alerts += mon.process_health(report(n, i, **reports_of(n, i)))
    return alerts


def firing(alerts, grade=None):
    return {
        (a.node, a.evidence.metric, a.grade, a.recommended_action)
        for a in alerts
        if a.state.value == "firing" and (grade is None or a.grade is grade)
    }


def test_pcie_width_downtrain_warns_with_replace_at_checkpoint():
    alerts = run(lambda n, i: {"bad": n == "n3" and i >= 10, "pcie_width": 8})
    assert firing(alerts) == {
        ("n3", "pcie_bandwidth_lost", Grade.WARNING, RecommendedAction.REPLACE_AT_CHECKPOINT)
    }
    (a,) = [a for a in alerts if a.state.value == "firing"]
    assert a.evidence.value == 0.5 and "Gen5 x8 of Gen5 x16" in a.evidence.detail


def test_pcie_generation_drop_counts_only_while_busy():
    hw = HardwareDetector()
    idle = report("a", 0, bad=True, util=3.0, pcie_gen=1)
    busy = report("a", 0, bad=True, util=98.0, pcie_gen=4)
    assert hw.score_one(idle) == []  # idle links drop to Gen1 to save power
    (f,) = hw.score_one(busy)
    assert f.signal == "pcie_downtrain" and 0.49 < f.score < 0.51


def test_idle_gpus_at_low_generation_on_every_node_stay_silent():
    assert run(lambda n, i: {"bad": True, "util": 0.0, "pcie_gen": 1}) == []


def test_nvlink_links_down_warns_after_two_reports():
    alerts = run(lambda n, i: {"bad": n == "n5" and i >= 12, "nvlink_links_down": 2})
    assert firing(alerts) == {
        ("n5", "nvlink_links_down", Grade.WARNING, RecommendedAction.REPLACE_AT_CHECKPOINT)
    }
    first = next(a for a in alerts if a.state.value == "firing")
    assert first.ts == T0 + timedelta(seconds=130)  # the second report with links down


def test_row_remap_pending_warns_and_a_failed_remap_is_critical_isolate():
    pending = run(lambda n, i: {"bad": n == "n1" and i >= 8, "remap_pending": True})
    assert firing(pending) == {
        ("n1", "row_remap_pending", Grade.WARNING, RecommendedAction.REPLACE_AT_CHECKPOINT)
    }
    failed = run(lambda n, i: {"bad": n == "n1" and i >= 8, "remap_failed": True})
    assert firing(failed) == {("n1", "ecc_uncorrected", Grade.CRITICAL, RecommendedAction.ISOLATE)}
    first = next(a for a in failed if a.state.value == "firing")
    assert first.ts == T0 + timedelta(seconds=80) and "row remap failed" in first.evidence.detail


def test_xid_63_is_a_pending_remap_and_drain_xids_are_fatal():
    assert 63 not in FATAL_XIDS
    assert {48, 74, 79, 94, 95, 119, 120} <= FATAL_XIDS
    hw = HardwareDetector()
    assert [f.signal for f in hw.score_one(report("a", 0, bad=True, xid_codes=(63,)))] == [
        "row_remap"
    ]
    for xid in (119, 120, 74):
        assert [f.signal for f in hw.score_one(report("a", 0, bad=True, xid_codes=(xid,)))] == [
            "hw_fatal"
        ]


def test_sustained_thermal_slowdown_on_one_node_warns():
    alerts = run(
        lambda n, i: {"bad": n == "n6" and i >= 15, "throttle_reasons": ("hw_thermal_slowdown",)}
    )
    assert firing(alerts) == {
        ("n6", "clock_throttle_fraction", Grade.WARNING, RecommendedAction.INVESTIGATE)
    }


def test_the_first_report_of_a_reason_weighs_as_one_report():
    hw = HardwareDetector()
    for i in range(8):
        for n in NODES:
            hw.learn_one(report(n, i))
    (f,) = hw.score_one(report("n1", 8, bad=True, throttle_reasons=("hw_thermal_slowdown",)))
    assert f.signal == "clock_throttle" and abs(f.score - 0.3) < 1e-9


def test_one_report_of_throttling_is_not_sustained():
    alerts = run(lambda n, i: {"bad": n == "n6" and i == 15, "throttle_reasons": ("hw_slowdown",)})
    assert alerts == []


def test_gpu_that_always_throttles_a_little_is_normal_for_it():
    # every third report of GPU 2 on n2 shows a thermal reason, from the start
    alerts = run(
        lambda n, i: {
            "bad": n == "n2" and i % 3 == 0,
            "throttle_reasons": ("sw_thermal_slowdown",),
        },
        n_reports=60,
    )
    assert alerts == []


def test_power_cap_on_one_node_is_info_only():
    alerts = run(lambda n, i: {"bad": n == "n4" and i >= 10, "throttle_reasons": ("sw_power_cap",)})
    assert firing(alerts) == {
        ("n4", "power_cap_fraction", Grade.INFO, RecommendedAction.INVESTIGATE)
    }


def test_cluster_wide_power_capping_is_not_a_node_fault():
    assert run(lambda n, i: {"reasons": ("sw_power_cap",) if i >= 10 else ()}) == []
    # nor is a hall-wide thermal event
    assert run(lambda n, i: {"reasons": ("hw_thermal_slowdown",) if i >= 10 else ()}) == []


def test_version_1_report_without_link_fields_scores_as_before():
    raw = (
        b'{"schema_version": 1, "node": "a", "ts": "2026-01-01T00:00:00Z", "gpus": [{"index": 0,'
        b' "temperature_c": 60, "power_w": 300, "sm_clock_mhz": 1980, "utilization_pct": 99}]}'
    )
    msg = NodeHealth.model_validate_json(raw)
    assert msg.schema_version == 1 and msg.gpus[0].pcie_gen is None
    assert HardwareDetector().score_one(msg) == []


def test_a_detector_restored_from_a_state_older_than_v2_keeps_working():
    from pipeline.io import statecodec

    hw = HardwareDetector()
    for i in range(8):
        for n in NODES:
            hw.learn_one(report(n, i))
    # what a snapshot written before NodeHealth v2 holds: no throttle fields
    for st in hw._nodes.values():
        for name in ("thr_short", "thr_base", "pcap_short", "pcap_base", "throttled"):
            vars(st).pop(name, None)
    for name in ("thr", "pcap", "throttle_medians"):
        vars(hw._fleet).pop(name, None)
    old = statecodec.loads(statecodec.dumps(hw))
    capped = report("n1", 8, bad=True, throttle_reasons=("hw_slowdown",), pcie_width=4)
    scores = {f.signal: f.score for f in old.score_one(capped)}
    assert scores["pcie_downtrain"] == 0.75 and 0 < scores["clock_throttle"] < 0.5
    for i in range(8, 14):
        for n in NODES:
            old.learn_one(report(n, i, bad=n == "n1", throttle_reasons=("hw_slowdown",)))
    (f,) = old.score_one(report("n1", 14, bad=True, throttle_reasons=("hw_slowdown",)))
    assert f.signal == "clock_throttle" and f.score > 0.5
