"""Whole replicas slowing for good are seen; per-step imbalance is not."""

import numpy as np

from detectors.steps.replica import ReplicaDrift


def play(steps, shift, seed=0, sigma=0.05):
    rep = np.repeat(np.arange(16), 16)  # 16 replicas of 2 nodes
    node = np.arange(256) // 8
    names = [f"n{i}" for i in range(32)]
    d = ReplicaDrift()
    rng = np.random.default_rng(seed)
    first = {}
    for step in range(steps):
        x = sigma * rng.standard_normal(16)[rep] + shift(step, rep)
        seen = d.score(x, rep, node, np.ones(256, dtype=bool))
        for f in d.findings(seen, rep, node, names, floor=0.05):
            first.setdefault(f.node, step)
        d.learn(seen, 0.05)
    return first


def test_sequence_length_noise_and_a_cluster_shift_name_nothing():
    assert play(400, lambda s, r: np.zeros(r.shape)) == {}
    assert play(400, lambda s, r: np.full(r.shape, 0.3 if s > 200 else 0.0)) == {}


def test_a_replica_that_slows_for_good_names_its_nodes_soon():
    first = play(300, lambda s, r: np.where((r == 5) & (s >= 150), 0.2, 0.0))
    assert sorted(first) == ["n10", "n11"]
    assert all(150 <= s <= 165 for s in first.values())


def test_one_slow_node_of_a_replica_is_no_replica_fault():
    node = np.arange(256) // 8
    assert play(300, lambda s, r: np.where((node == 10) & (s >= 100), 0.3, 0.0)) == {}


def test_a_replica_always_a_little_slower_is_its_normal():
    assert play(300, lambda s, r: np.where(r == 2, 0.08, 0.0)) == {}


def test_one_glitched_step_moves_a_replica_little():
    """Issue 39: one rank's 10^6 s compute held its replica's smoothed slowdown above the
    floor for hundreds of steps."""
    first = play(300, lambda s, r: np.where((r == 3) & (s == 100), 1e6, 0.0))
    assert first == {}
