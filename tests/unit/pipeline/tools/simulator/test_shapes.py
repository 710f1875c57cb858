"""Fault shapes of real clusters in the simulator (issue 23)."""

from itertools import pairwise

import numpy as np
import pytest

from pipeline.tools.simulator import Scenario, simulate
from pipeline.tools.simulator.announce import InputWaits
from schemas import FaultKind, JobEventKind


def sc(**kw):
    base = {"name": "shape", "nodes": 4, "steps": 60, "warmup_steps": 0, "seed": 3}
    return Scenario.model_validate({**base, **kw})


def frames(s):
    return [ev.frame for ev in simulate(s) if ev.frame is not None]


def test_intermittent_slows_one_step_in_k_only():
    s = sc(faults=[{"kind": "intermittent", "node": 1, "gpu": 2, "onset_step": 10,
                    "every_steps": 5, "magnitude": 0.6}])  # fmt: skip
    rank = 1 * 8 + 2
    slow = [f.step for f in frames(s) if f.compute[rank] > 1.3 * np.median(f.compute)]
    assert slow == list(range(14, 60, 5))
    assert s.faults[0].kind is FaultKind.INTERMITTENT and not s.faults[0].is_trap


def test_stage_slowdown_slows_its_stage_from_onset():
    s = sc(nodes=4, tp=4, pp=2, faults=[{"kind": "stage_slowdown", "stage": 1,
                                         "onset_step": 30, "magnitude": 0.2}])  # fmt: skip
    fs = frames(s)

    def gap(f):
        return np.median(f.compute[f.pp_stage == 1]) / np.median(f.compute[f.pp_stage == 0])

    assert all(abs(gap(f) - 1) < 0.03 for f in fs[:30])
    assert all(abs(gap(f) - 1.2) < 0.03 for f in fs[30:])
    with pytest.raises(ValueError, match="stage"):
        sc(faults=[{"kind": "stage_slowdown", "onset_step": 3, "magnitude": 0.2}])


def test_noisy_node_is_noisier_not_slower():
    s = sc(steps=200, faults=[{"kind": "noisy_node", "node": 2, "magnitude": 5.0}])
    c = np.stack([f.compute for f in frames(s)])
    noisy, calm = c[:, 16:24].ravel(), c[:, :8].ravel()
    assert noisy.std() > 3 * calm.std()
    assert abs(np.median(noisy) - np.median(calm)) < 0.01


def test_cluster_slowdown_follows_its_ramp():
    s = sc(steps=100, faults=[{"kind": "cluster_slowdown", "variant": "compute",
                               "onset_step": 20, "magnitude": 0.4, "shape": "linear",
                               "ramp_steps": 40}])  # fmt: skip
    med = [float(np.median(f.compute)) for f in frames(s)]
    assert med[30] / med[10] == pytest.approx(1.1, abs=0.03)
    assert med[80] / med[10] == pytest.approx(1.4, abs=0.03)


def test_checkpoints_grow():
    s = sc(steps=90, checkpoint_every=30, checkpoint_s=10.0, checkpoint_growth=0.5)
    ck = [float(f.step_time[0]) for f in frames(s) if f.step in (29, 59, 89)]
    assert ck[0] < ck[1] < ck[2]  # 10 s, 15 s, 20 s of save (+ noise across ranks)
    assert ck[2] - ck[0] == pytest.approx(10.0, abs=2.5)


def test_health_on_its_own_clock_keeps_reporting_through_a_long_step():
    s = sc(steps=20, checkpoint_every=10, checkpoint_s=60.0, health_interval_s=10.0)
    evs = list(simulate(s))
    long_step = next(ev for ev in evs if ev.frame is not None and ev.frame.step == 9)
    stamps = sorted({h.ts.timestamp() for h in long_step.health if h.node == "node-0000"})
    assert len(stamps) >= 5  # one every 10 s during the 60 s save, each with its own time
    assert all(b - a == pytest.approx(10.0, rel=0.15) for a, b in pairwise(stamps))
    assert all(h.interval_s == 10.0 for h in long_step.health)


def test_a_blocked_health_path_drains_node_by_node():
    block = {"kind": "health_delay", "onset_step": 20, "duration_steps": 20, "magnitude": 1.0}
    s = sc(steps=80, health_interval_s=5.0, faults=[block])
    arrivals = [(ev.ts, h.node, h.ts.timestamp()) for ev in simulate(s) for h in ev.health]
    late = [(at, node) for at, node, ts in arrivals if at - ts > 10.0]
    assert {node for _, node in late} == {f"node-{i:04d}" for i in range(4)}
    first = {}
    for at, node in late:
        first.setdefault(node, at)
    spread = max(first.values()) - min(first.values())
    assert spread >= 2.0  # one node a second, not all at once
    with pytest.raises(ValueError, match="health_interval_s"):
        sc(faults=[{"kind": "health_delay", "onset_step": 2}])


def test_group_slowdown_slows_every_gpu_of_its_nodes_together():
    s = sc(nodes=8, faults=[{"kind": "group_slowdown", "node": 2, "group_size": 3,
                             "onset_step": 20, "magnitude": 0.2}])  # fmt: skip
    fs = frames(s)
    node = np.arange(64) // 8
    group = (node >= 2) & (node <= 4)
    for f in fs[20:]:
        assert np.median(f.compute[group]) > 1.15 * np.median(f.compute[~group])
    assert all(np.median(f.compute[group]) < 1.05 * np.median(f.compute[~group]) for f in fs[:20])
    (t,) = s.truth()
    assert t.kind is FaultKind.GROUP_SLOWDOWN and "node-0002..node-0004" in t.detail
    with pytest.raises(ValueError, match="group_size"):
        sc(nodes=4, faults=[{"kind": "group_slowdown", "node": 2, "group_size": 3}])


def test_a_subsiding_ecc_storm_bursts_then_stops_without_a_crash():
    s = sc(nodes=4, steps=80, health_interval_steps=1, faults=[
        {"kind": "ecc_storm", "variant": "subsiding", "node": 1, "gpu": 3, "onset_step": 20,
         "duration_steps": 30, "magnitude": 100}])  # fmt: skip
    evs = list(simulate(s))
    reports = [(ev.step, h) for ev in evs for h in ev.health if h.node == "node-0001"]
    counts = [(step, h.gpus[3].ecc_corrected) for step, h in reports]
    during = [b - a for (_, a), (st, b) in pairwise(counts) if 21 <= st < 50]
    after = [b - a for (_, a), (st, b) in pairwise(counts) if st >= 52]
    assert max(during) > 30 and sum(d > 30 for d in during) < len(during)  # bursts
    assert max(after) < 5  # it stopped
    assert all(h.gpus[3].ecc_uncorrected == 0 and not h.gpus[3].xid_codes for _, h in reports)
    assert sum(ev.frame is not None for ev in evs) == 80  # no crash, every step ran
    assert s.faults[0].end_step == 49


def test_a_slow_onset_divergence_drifts_without_a_jump():
    s = sc(nodes=4, steps=120, faults=[{"kind": "divergence", "onset_step": 40,
                                        "magnitude": 1.5, "shape": "linear",
                                        "ramp_steps": 60}])  # fmt: skip
    loss = [float(np.nanmedian(f.loss[f.has_loss])) for f in frames(s)]
    jumps = [b / a for a, b in pairwise(loss[40:])]
    assert max(jumps) < 1.05  # no step jumps (a jump is 1.5x at once), only noise
    clean = [float(np.nanmedian(f.loss[f.has_loss])) for f in frames(sc(nodes=4, steps=120))]
    assert loss[100] / clean[100] == pytest.approx(1.5, abs=0.05)  # but it drifted by half
    assert loss[70] / clean[70] == pytest.approx(1.25, abs=0.05)  # along its ramp
    assert all(np.isfinite(loss))


def test_the_leader_says_its_waits_for_input_as_the_client_does():
    """A storage stall of every rank is said at each of its steps (dated at the step's
    start, after the step before); a stall of one other rank, or none, says nothing."""
    storage = sc(steps=80, faults=[{"kind": "cluster_slowdown", "variant": "storage",
                                    "onset_step": 40, "duration_steps": 10,
                                    "magnitude": 2.0}])  # fmt: skip
    waits = InputWaits(storage)
    said, last = [], 0
    for f in frames(storage):
        got = waits.during(f, last)
        if got is not None:
            at, event = got
            assert event.kind is JobEventKind.WAIT and event.step == last
            assert event.ts.timestamp() == pytest.approx(f.ts_start, abs=1e-5)
            assert f.ts_start < at < f.ts
            said.append(f.step)
        last = f.step
    assert said == list(range(40, 50))
    calm = sc(steps=80)
    quiet = InputWaits(calm)
    assert [f.step for f in frames(calm) if quiet.during(f, max(f.step - 1, 0))] == []
