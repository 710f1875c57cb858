"""Hardware baselines (own + fleet) and hard rules."""

import math
from datetime import timedelta

import pytest

from detectors.hardware.health import FATAL_XIDS, HardwareDetector
from schemas import GpuHealth, NodeHealth
from tests.clock import day_start

T0 = day_start()


def report(node, i, *, temp=65.0, clock=1980.0, corr=0, unc=0, xids=(), reasons=(), nic=0):
    gpus = tuple(
        GpuHealth(
            index=g,
            temperature_c=temp if g == 0 else 65.0,
            power_w=400,
            sm_clock_mhz=clock if g == 0 else 1980.0,
            utilization_pct=98,
            ecc_corrected=corr if g == 0 else 0,
            ecc_uncorrected=unc if g == 0 else 0,
            xid_codes=xids if g == 0 else (),
            throttle_reasons=reasons if g == 0 else (),
        )
        for g in range(2)
    )
    return NodeHealth(node=node, ts=T0 + timedelta(seconds=10 * i), gpus=gpus, nic_retransmits=nic)


def warmed(n_reports=8, nodes=("a", "b", "c", "d")):
    hw = HardwareDetector()
    for i in range(n_reports):
        for n in nodes:
            hw.learn_one(report(n, i, nic=3 * i))
    return hw


def signals(findings):
    return sorted({f.signal for f in findings})


def test_fatal_xid_is_flagged_at_once_even_without_history():
    hw = HardwareDetector()
    assert signals(hw.score_one(report("new", 0, xids=(79,)))) == ["hw_fatal"]


def test_non_fatal_xid_is_ignored():
    assert warmed().score_one(report("a", 8, xids=(13,), nic=24)) == []


def test_uncorrectable_ecc_increase_is_fatal_and_latched():
    hw = warmed()
    msg = report("a", 8, unc=1, nic=24)
    assert signals(hw.score_one(msg)) == ["hw_fatal"]
    hw.learn_one(msg)
    nxt = report("a", 9, unc=1, nic=27)
    assert signals(hw.score_one(nxt)) == ["hw_fatal"]  # latched, no new increase


def test_fatal_list_is_documented():
    assert {48, 79, 94, 95} <= FATAL_XIDS


def test_diurnal_swing_on_every_node_is_not_thermal():
    hw = HardwareDetector()
    for i in range(60):
        swing = 10.0 * math.sin(i / 5.0)
        for n in "abcd":
            msg = report(n, i, temp=65.0 + swing, nic=3 * i)
            assert hw.score_one(msg) == [] or i < 1
            hw.learn_one(msg)


def test_hot_throttling_gpu_is_thermal_with_evidence():
    hw = warmed()
    (f,) = hw.score_one(report("b", 8, temp=85.0, clock=1600.0, reasons=("hw_thermal",), nic=24))
    assert f.signal == "thermal" and f.node == "b"
    assert f.score == pytest.approx(20.0, abs=0.5)
    assert f.peer_median == pytest.approx(65.0)
    assert "hw_thermal" in f.detail


def test_gpu_that_always_runs_hotter_is_normal():
    hw = HardwareDetector()
    for i in range(20):
        for n in "abcd":
            t = 75.0 if n == "a" else 65.0
            msg = report(n, i, temp=t, clock=1900.0 if n == "a" else 1980.0, nic=3 * i)
            if i > 8:
                assert hw.score_one(msg) == []
            hw.learn_one(msg)


def test_corrected_ecc_storm_is_a_poisson_outlier():
    hw = warmed()
    f = hw.score_one(report("c", 8, corr=40, nic=24))
    assert signals(f) == ["ecc_rate"] and f[0].score > 20


def test_counter_reset_is_not_an_event():
    hw = HardwareDetector()
    for i in range(8):
        for n in "abcd":
            hw.learn_one(report(n, i, corr=100 + i, nic=3 * i))
    assert hw.score_one(report("a", 8, corr=0, nic=24)) == []


def test_nic_retransmit_burst_is_flagged():
    hw = warmed()
    (f,) = hw.score_one(report("d", 8, nic=21 + 300))
    assert f.signal == "nic_errors" and f.score > 50


def test_score_one_does_not_mutate():
    import pickle

    hw = warmed()
    before = pickle.dumps(hw)
    hw.score_one(report("zz", 9, temp=99.0, xids=(48,)))
    hw.score_one(report("a", 9, temp=99.0, xids=(48,), corr=50))
    assert pickle.dumps(hw) == before


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"warmup_reports": 0}, "warmup_reports"),
        ({"temp_critical_c": 0}, "temp_critical_c"),
        ({"clock_drop": -1}, "clock_drop"),
        ({"fatal_latch_reports": 0}, "fatal_latch_reports"),
        ({"fleet_refresh": 0}, "fleet_refresh"),
    ],
)
def test_invalid_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        HardwareDetector(**kwargs)
