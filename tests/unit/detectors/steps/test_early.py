"""A gross outlier among its peers is named from the job's first steps (issue 44 item 1):
evidence, not a count of warm-up steps, whatever the step length."""

import numpy as np
import pytest

from detectors.engine import DetectorConfig, DetectorSuite
from detectors.frame import StepFrame
from detectors.steps.early import early_outliers
from detectors.steps.peer import PeerDetector
from schemas import AlertKind, Grade
from tests.unit.detectors.steps.test_first_step import alerts_of, job, named


def first_warning(alerts, node, rank=None):
    return min(
        (
            a.step
            for a in alerts
            if a.kind is AlertKind.STRAGGLER
            and a.grade is Grade.WARNING
            and a.node == node
            and (rank is None or a.rank == rank)
        ),
        default=None,
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("step_s", [30.0, 46.0, 60.0])
@pytest.mark.parametrize("slow", [0.5, 0.8, 1.35])
def test_a_gross_outlier_from_step_0_is_named_at_warning_within_3_steps(seed, step_s, slow):
    alerts = alerts_of(
        DetectorSuite("job"), job(steps=40, seed=seed, factor=step_s, slow={45: slow})
    )
    assert first_warning(alerts, "node-5", 45) is not None
    assert first_warning(alerts, "node-5", 45) <= 2  # steps 0, 1, 2: the third step
    assert {(a.node, a.rank) for a in alerts} == {("node-5", 45)}


@pytest.mark.parametrize("pp", [1, 2])
def test_a_gross_node_outlier_is_named_once_at_node_level(pp):
    slow = dict.fromkeys(range(24, 32), 0.6)
    alerts = alerts_of(DetectorSuite("job"), job(steps=40, factor=60.0, slow=slow, pp=pp))
    assert first_warning(alerts, "node-3") == 2
    assert {(a.node, a.rank) for a in alerts} == {("node-3", None)}


def test_the_episode_carries_on_past_the_warm_up_without_a_gap():
    """When the rank's baseline warms (anchored at its stage's typical value) its own
    baseline takes the evidence over: one episode, never resolved while it is slow."""
    alerts = alerts_of(DetectorSuite("job"), job(steps=80, factor=46.0, slow={45: 0.6}))
    assert [(a.grade, a.state.value) for a in alerts] == [
        (Grade.WARNING, "firing"),
        (Grade.CRITICAL, "firing"),
    ]
    assert named(alerts, "node-5", 45)[0] == 2


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "kw",
    [
        {"slow": {45: 0.2}},  # within the floor: the warm-up and first_step judge it
        {"noise": 0.06, "spread": 0.02},  # a noisy job: nobody 30 % and 5 sigmas out
        {"pp": 4, "stage_extra": 0.5, "nodes": 32},  # a slower stage: its own peers
        {"pp": 2, "seq_sigma": 0.15},  # sequence-length imbalance between replicas
        {"factor": 60.0 * 1.5},  # the whole job slower
    ],
)
def test_no_early_alert_from_noise_imbalance_or_a_small_offset(kw, seed):
    alerts = alerts_of(
        DetectorSuite("job"), job(steps=DetectorConfig().warmup_steps, seed=seed, **kw)
    )
    assert [a for a in alerts if a.grade is not Grade.INFO] == []


def test_one_step_blips_are_not_persistence():
    """A different rank doubles its compute each step: one observation each, no page."""
    frames = []
    for f in job(steps=20, factor=46.0):
        c = f.compute.copy()
        c[(7 * f.step) % c.shape[0]] *= 2.0
        frames.append(StepFrame.from_arrays("job", f.step, f.ts, c, f.comm_wait, f.data_wait))
    assert alerts_of(DetectorSuite("job"), frames) == []


def test_disabled_by_an_unreachable_floor_the_old_delay_returns():
    cfg = DetectorConfig(early_floor=1e9)
    alerts = alerts_of(DetectorSuite("job", cfg), job(steps=40, factor=46.0, slow={45: 1.35}))
    assert first_warning(alerts, "node-5", 45) > DetectorConfig().warmup_steps


def frame_with(compute, comm=None):
    comm = compute.max() + 0.05 - compute if comm is None else comm
    return StepFrame.from_arrays("j", 0, 100.0, compute, comm_wait=comm)


def test_early_outliers_leaves_warm_ranks_and_waiting_ranks_alone():
    compute = np.full(16, 1.0) + 0.01 * np.tile([-1.0, 1.0], 8)
    compute[[3, 5, 9]] = 2.0
    peer = PeerDetector().score_frame(frame_with(compute))
    scale = peer.compute_scale[peer.groups.inverse]
    warmed = np.zeros(16, bool)
    warmed[3] = True
    waits = np.zeros(16, bool)
    waits[9] = True
    score = early_outliers(peer, peer.slowdown, scale, warmed, waits, floor=0.3, k=5.0, min_peers=4)
    assert np.flatnonzero(score).tolist() == [5]


def test_early_outliers_needs_both_the_margin_and_the_sigmas_and_enough_peers():
    rng = np.random.default_rng(0)
    compute = 1.0 + 0.1 * rng.standard_normal(16)  # 10 % noise: 5 sigmas is ~50 %
    compute[5] = float(np.median(compute)) * 1.35
    peer = PeerDetector().score_frame(frame_with(compute))
    scale = peer.compute_scale[peer.groups.inverse]
    none = np.zeros(16, bool)
    assert not early_outliers(
        peer, peer.slowdown, scale, none, none, floor=0.3, k=5.0, min_peers=4
    ).any()
    quiet = np.full(16, 1.0)
    quiet[5] = 1.2  # 20 sigmas of a 1 % floor, below the 30 % margin
    peer = PeerDetector().score_frame(frame_with(quiet))
    scale = peer.compute_scale[peer.groups.inverse]
    assert not early_outliers(
        peer, peer.slowdown, scale, none, none, floor=0.3, k=5.0, min_peers=4
    ).any()
    few = np.array([1.0, 1.0, 2.0])
    peer = PeerDetector().score_frame(frame_with(few))
    scale = peer.compute_scale[peer.groups.inverse]
    three = np.zeros(3, bool)
    assert not early_outliers(
        peer, peer.slowdown, scale, three, three, floor=0.3, k=5.0, min_peers=4
    ).any()
