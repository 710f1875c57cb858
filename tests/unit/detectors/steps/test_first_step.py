"""Ranks and nodes slow from the job's first step are named from peer comparison."""

import numpy as np
import pytest

from detectors.engine import DetectorConfig, DetectorSuite
from detectors.frame import StepFrame
from detectors.steps.first_step import node_outliers, warmup_outliers
from schemas import AlertKind

WARMUP = DetectorConfig().warmup_steps


def job(
    steps=60,
    nodes=16,
    seed=0,
    slow=None,
    pp=1,
    noise=0.015,
    spread=0.01,
    stage_extra=0.0,
    seq_sigma=0.0,
    factor=1.0,
    names=None,
    start=0,
):
    """A synchronous job with tp = 8 (one node per replica stage); ``slow`` maps rank ->
    slowdown from step 0 on; ``names(step)`` gives the node names (a relaunch)."""
    rng = np.random.default_rng(seed)
    n = nodes * 8
    stage = (np.arange(n) // 8) % pp
    replica = np.arange(n) // (8 * pp)
    static = 1.0 + spread * rng.standard_normal(n)
    ts = 1_000.0
    for step in range(start, start + steps):
        compute = factor * static * (1.0 + noise * rng.standard_normal(n))
        compute *= np.where(stage == pp - 1, 1.0 + stage_extra, 1.0)
        compute *= np.exp(seq_sigma * rng.standard_normal(replica.max() + 1))[replica]
        for r, s in (slow or {}).items():
            compute[r] *= 1.0 + s
        data = 0.01 + 0.001 * rng.random(n)
        busy = compute + data
        comm = busy.max() + 0.05 - busy
        ts += busy.max() + 0.05
        yield StepFrame.from_arrays(
            "job",
            step,
            ts,
            compute,
            comm,
            data,
            pp_stage=stage,
            dp_group=replica,
            node_names=None if names is None else names(step),
        )


def alerts_of(mon, frames):
    out = []
    for f in frames:
        out += mon.process_step(f)
    return out


def named(alerts, node, rank=None):
    """Steps of the firing slowdown alerts that name ``node`` (and ``rank``)."""
    return [
        a.step
        for a in alerts
        if a.kind in (AlertKind.STRAGGLER, AlertKind.DEGRADATION)
        and a.node == node
        and (rank is None or a.rank == rank)
    ]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("pp", [1, 4])
def test_gpu_slow_from_step_0_by_8pct_is_named_within_20_steps_of_warmup(seed, pp):
    alerts = alerts_of(DetectorSuite("job"), job(slow={45: 0.08}, pp=pp, seed=seed))
    steps = named(alerts, "node-5", 45)
    assert steps and steps[0] <= WARMUP + 20
    assert {(a.node, a.rank) for a in alerts} == {("node-5", 45)}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    "kw",
    [
        {"seq_sigma": 0.05, "slow": {45: 0.2}},  # a replica is one node: no correction
        {"noise": 0.025, "spread": 0.015, "slow": {45: 0.1}},
    ],
)
def test_in_a_noisy_job_the_smoothed_excess_names_it_when_one_step_cannot(kw, seed):
    alerts = alerts_of(DetectorSuite("job"), job(seed=seed, **kw))
    steps = named(alerts, "node-5", 45)
    assert steps and steps[0] <= WARMUP + 20
    assert {(a.node, a.rank) for a in alerts} == {("node-5", 45)}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("pp", [1, 2])
def test_node_slow_from_step_0_by_8pct_is_named_at_node_level(seed, pp):
    slow = dict.fromkeys(range(24, 32), 0.08)
    alerts = alerts_of(DetectorSuite("job"), job(slow=slow, pp=pp, seed=seed))
    steps = named(alerts, "node-3")
    assert steps and steps[0] <= WARMUP + 20
    assert alerts[0].node == "node-3" and alerts[0].rank is None
    assert {a.node for a in alerts} == {"node-3"}


def test_spare_slow_from_its_first_step_after_a_relaunch_is_named():
    """node-6 is swapped for a bad spare at step 60; the others keep their baselines."""

    def names(step):
        return [f"node-{k}" if (k != 6 or step < 60) else "spare-0" for k in range(16)]

    mon = DetectorSuite("job")
    assert alerts_of(mon, job(steps=60, names=names)) == []
    mon.restarted(2_000.0, removed_nodes=["node-6"])
    slow = dict.fromkeys(range(48, 56), 0.10)
    later = job(steps=60, seed=9, slow=slow, names=names, start=60)
    steps = named(alerts_of(mon, later), "spare-0")
    assert steps and steps[0] <= 60 + WARMUP + 20


@pytest.mark.parametrize(
    "kw",
    [
        {"pp": 4, "stage_extra": 0.3},  # pipeline stages always imbalanced
        {"pp": 4, "stage_extra": 0.3, "nodes": 4},  # stages too small: whole-job peers
        {"pp": 2, "seq_sigma": 0.08},  # sequence-length imbalance across replicas
        {"pp": 1, "seq_sigma": 0.06},  # ... where a replica is one node
        {"factor": 1.25},  # the whole job is uniformly slower
        {"noise": 0.04, "spread": 0.015},  # only noise
    ],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_normal_imbalance_and_a_uniformly_slower_job_stay_silent(kw, seed):
    alerts = alerts_of(DetectorSuite("job"), job(steps=80, seed=seed, **kw))
    # a slower pipeline stage is told to the job owner once, as advice: no node, no page
    advice = [(a.kind.value, a.grade.value, a.node, a.recommended_action.value) for a in alerts]
    want = [("imbalance", "info", None, "rebalance")] if "stage_extra" in kw else []
    assert advice == want


def test_a_slightly_slower_rank_keeps_its_own_baseline():
    """3 % slower from the start is within normal spread: learned, not paged."""
    assert alerts_of(DetectorSuite("job"), job(slow={45: 0.03}, spread=0.005)) == []


def test_disabling_the_check_restores_the_old_blind_spot():
    cfg = DetectorConfig(first_step_floor=1e9)
    assert alerts_of(DetectorSuite("job", cfg), job(slow={45: 0.2})) == []


def test_warmup_outliers_compares_within_each_group_only():
    offset = np.array([0.0, 0.01, -0.01, 0.3, 0.31, 0.29, 0.3, 0.45])
    key = np.array([0, 0, 0, 1, 1, 1, 1, 1])
    everyone = np.ones(8, bool)
    out, typical = warmup_outliers(offset, np.zeros(8), key, everyone, everyone, floor=0.05, k=5)
    assert out.tolist() == [False] * 7 + [True]
    assert typical.tolist() == [0.0, 0.0, 0.0, 0.3, 0.3, 0.3, 0.3, 0.3]


def test_warmup_outliers_needs_three_peers_and_honours_the_noise():
    one = np.ones(2, bool)
    out, _ = warmup_outliers(
        np.array([0.0, 0.5]), np.zeros(2), np.zeros(2, np.int64), one, one, floor=0.05, k=5
    )
    assert not out.any()
    offset = np.array([0.0, 0.0, 0.0, 0.1])
    se = np.array([0.0, 0.0, 0.0, 0.03])  # a noisy warm-up mean: 0.1 is not 5 sigma
    four = np.ones(4, bool)
    out, _ = warmup_outliers(offset, se, np.zeros(4, np.int64), four, four, floor=0.05, k=5)
    assert not out.any()


def test_node_outliers_sees_a_node_whose_gpus_are_each_within_their_threshold():
    rng = np.random.default_rng(0)
    offset = 0.012 * rng.standard_normal(128)
    offset[40:48] = 0.06 + 0.012 * rng.standard_normal(8)  # node 5: +6 %, GPUs spread
    node = np.arange(128) // 8
    key = np.zeros(128, np.int64)
    se = np.full(128, 0.003)
    everyone = np.ones(128, bool)
    by_rank, _ = warmup_outliers(offset, se, key, everyone, everyone, floor=0.05, k=5)
    by_node = node_outliers(offset, se, key, node, everyone, everyone, floor=0.05, k=5)
    assert by_rank.sum() < 8
    assert np.flatnonzero(by_node).tolist() == list(range(40, 48))
