"""The simulator: synchronous-training invariants, repeatability, faults and suite."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from detectors.frame import PHASE_CODES, StepFrame
from pipeline.tools.simulator import (
    Scenario,
    ScenarioError,
    SimEvent,
    SimulatedJob,
    SimulationError,
    load_suite,
    simulate,
)
from schemas import FaultKind, NodeHealth, Phase, decode, encode

TRAIN = PHASE_CODES[Phase.TRAIN]


def make(faults: Sequence[dict[str, Any]] = (), **kw: Any) -> Scenario:
    base: dict[str, Any] = {"name": "t", "nodes": 4, "steps": 60, "warmup_steps": 5, "seed": 7}
    base.update(kw)
    return Scenario.model_validate({**base, "faults": list(faults)})


def run(s: Scenario) -> list[SimEvent]:
    return list(simulate(s))


def frames(events: list[SimEvent]) -> list[StepFrame]:
    return [e.frame for e in events if e.frame is not None]


def health_of(events: list[SimEvent], node: str) -> list[NodeHealth]:
    return [h for e in events for h in e.health if h.node == node]


# -- synchronous training ------------------------------------------------------------


def test_every_rank_reports_the_same_step_time_and_consistent_waits() -> None:
    for f in frames(run(make(pp=2))):
        assert np.all(f.step_time == f.step_time[0])
        np.testing.assert_allclose(f.comm_wait, f.step_time - f.compute - f.data_wait)
        assert f.comm_wait.min() > 0
        assert f.n_ranks == 32
        assert f.ts == pytest.approx(f.ts_start + f.step_time[0])


def test_straggler_has_most_compute_least_comm_and_peers_wait_more() -> None:
    s = make([{"kind": "straggler", "node": 2, "gpu": 5, "onset_step": 30, "magnitude": 0.2}])
    fs = [f for f in frames(run(s)) if f.phase[0] == TRAIN]
    slow = 2 * 8 + 5
    before = [f for f in fs if f.step < 30]
    after = [f for f in fs if f.step >= 30]
    for f in after:
        assert int(np.argmax(f.compute)) == slow
        assert int(np.argmin(f.comm_wait)) == slow
    peers = np.arange(32) != slow
    comm_before = np.mean([f.comm_wait[peers].mean() for f in before])
    comm_after = np.mean([f.comm_wait[peers].mean() for f in after])
    assert comm_after > comm_before + 0.1
    assert np.mean([f.step_time[0] for f in after]) > np.mean([f.step_time[0] for f in before])


def test_event_time_advances_from_the_start_time() -> None:
    s = make(start_time="2026-03-01T12:00:00Z")
    evs = run(s)
    assert evs[0].frame is not None
    assert evs[0].frame.ts_start == pytest.approx(s.start_ts)
    ts = [e.ts for e in evs]
    assert ts == sorted(ts)
    fs = frames(evs)
    for a, b in itertools.pairwise(fs):
        assert b.ts_start == pytest.approx(a.ts)
        assert b.step == a.step + 1


def test_phases_warmup_eval_checkpoint_are_slower_for_everyone() -> None:
    s = make(steps=40, eval_every=10, checkpoint_every=20)
    fs = {f.step: f for f in frames(run(s))}
    assert fs[0].phase[0] == PHASE_CODES[Phase.WARMUP]
    assert fs[9].phase[0] == PHASE_CODES[Phase.EVAL]
    assert fs[19].phase[0] == PHASE_CODES[Phase.CHECKPOINT]
    train = np.median([f.step_time[0] for f in fs.values() if f.phase[0] == TRAIN])
    for k in (0, 9, 19):
        assert fs[k].step_time[0] > 1.5 * train


def test_topology_tensor_pipeline_and_data_groups() -> None:
    f = frames(run(make(nodes=8, pp=4, steps=1, warmup_steps=0)))[0]
    assert list(f.pp_stage[::8]) == [0, 1, 2, 3, 0, 1, 2, 3]
    assert list(f.dp_group[::8]) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert list(f.tp_group[::8]) == list(range(8))
    assert f.nodes[f.node_idx[63]] == "node-0007"
    assert f.has_loss.sum() == 16  # last stage of each replica
    assert f.has_grad_norm.all()


# -- repeatability -------------------------------------------------------------------


def test_seeded_runs_repeat_and_seeds_differ() -> None:
    spec = [{"kind": "nic_flap", "node": 1, "onset_step": 10, "magnitude": 0.3}]
    # one start for all three: each scenario defaults to the second it is made in, and
    # two made across a second's turn are dated a second apart
    start = datetime.now(UTC).replace(microsecond=0)
    a, b = run(make(spec, start_time=start)), run(make(spec, start_time=start))
    c = run(make(spec, seed=8, start_time=start))
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.ts == y.ts
        assert (x.frame is None) == (y.frame is None)
        if x.frame is not None and y.frame is not None:
            np.testing.assert_array_equal(x.frame.compute, y.frame.compute)
        assert [h.model_dump() for h in x.health] == [h.model_dump() for h in y.health]
    assert frames(a)[5].compute[0] != frames(c)[5].compute[0]


# -- every fault is visible in its signal --------------------------------------------


def test_degradation_creeps() -> None:
    spec = {"kind": "degradation", "node": 1, "onset_step": 10, "magnitude": 0.4}
    for shape in ("linear", "exp"):
        s = make([{**spec, "shape": shape, "ramp_steps": 40}])
        fs = {f.step: f for f in frames(run(s))}
        ratio = [fs[k].compute[8:16].mean() / fs[k].compute[16:].mean() for k in (12, 30, 55)]
        assert ratio[0] < ratio[1] < ratio[2]
        assert ratio[2] == pytest.approx(1.4, abs=0.05)
        assert s.faults[0].slowdown_at(50) == pytest.approx(0.4)
    lin, exp = (
        make([{**spec, "shape": sh, "ramp_steps": 40}]).faults[0].slowdown_at(30)
        for sh in ("linear", "exp")
    )
    assert exp < lin  # exponential creep starts slowly


def test_thermal_throttling_raises_temperature_lowers_clocks_and_slows_compute() -> None:
    s = make([{"kind": "thermal", "node": 3, "gpu": 2, "onset_step": 10, "magnitude": 0.25}])
    evs = run(s)
    late = health_of(evs, "node-0003")[-1]
    hot, cool = late.gpus[2], late.gpus[0]
    assert hot.temperature_c > 85 > cool.temperature_c
    assert hot.sm_clock_mhz < 0.8 * cool.sm_clock_mhz
    assert hot.throttle_reasons and not cool.throttle_reasons
    f = frames(evs)[-1]
    assert int(np.argmax(f.compute)) == 3 * 8 + 2


def test_nic_flap_shows_in_counters_and_step_spikes() -> None:
    s = make([{"kind": "nic_flap", "node": 1, "onset_step": 20, "magnitude": 0.5}], steps=80)
    evs = run(s)
    bad, good = health_of(evs, "node-0001"), health_of(evs, "node-0002")
    bad_retx = bad[-1].nic_retransmits - bad[0].nic_retransmits
    good_retx = good[-1].nic_retransmits - good[0].nic_retransmits
    assert bad_retx > 10 * max(good_retx, 1)
    assert bad[-1].nic_errors > good[-1].nic_errors
    times = np.array([f.step_time[0] for f in frames(evs) if f.phase[0] == TRAIN])
    assert times.max() > np.median(times) + 0.2


def test_data_stall_on_one_rank_makes_everyone_wait() -> None:
    s = make([{"kind": "data_stall", "node": 0, "gpu": 1, "onset_step": 20, "magnitude": 0.5}])
    f = frames(run(s))[-1]
    assert int(np.argmax(f.data_wait)) == 1
    assert int(np.argmin(f.comm_wait)) == 1
    assert np.median(f.comm_wait) > 0.4


def test_ecc_storm_then_uncorrectable_xid48_and_crash() -> None:
    spec = {"kind": "ecc_storm", "node": 2, "gpu": 4, "onset_step": 10, "duration_steps": 30}
    s = make([{**spec, "magnitude": 100, "hang_steps": 5}], steps=80)
    evs = run(s)
    reports = health_of(evs, "node-0002")
    corrected = [h.gpus[4].ecc_corrected for h in reports]
    assert corrected[-1] > 50 and corrected[-1] > 10 * reports[-1].gpus[3].ecc_corrected
    fatal = [h for h in reports if 48 in h.gpus[4].xid_codes]
    assert len(fatal) == 1 and fatal[0].gpus[4].ecc_uncorrected == 1
    assert max(f.step for f in frames(evs)) == 39  # step 40 never completes
    after = [e for e in evs if e.ts >= fatal[0].ts.timestamp()]
    assert all(e.frame is None for e in after)


def test_crash_stops_the_nodes_reports_and_hangs_the_job() -> None:
    s = make([{"kind": "crash", "node": 1, "onset_step": 30, "hang_steps": 8}])
    evs = run(s)
    last_frame = max(i for i, e in enumerate(evs) if e.frame is not None)
    assert evs[last_frame].frame is not None and evs[last_frame].frame.step == 29
    tail = evs[last_frame + 1 :]
    assert tail and all(e.frame is None for e in tail)
    assert tail[-1].ts - evs[last_frame].ts == pytest.approx(8 * s.nominal_step_s)
    crash_ts = evs[last_frame].ts
    assert not [h for e in tail for h in e.health if h.node == "node-0001"]
    assert [h for e in tail for h in e.health if h.node == "node-0002"]
    assert all(h.ts.timestamp() <= crash_ts for h in health_of(evs, "node-0001"))


def test_hang_yields_ticks_without_frames_then_resumes() -> None:
    s = make([{"kind": "hang", "onset_step": 30, "duration_steps": 6}])
    evs = run(s)
    i = next(i for i, e in enumerate(evs) if e.frame is None)
    assert evs[i - 1].frame is not None and evs[i - 1].frame.step == 29
    j = next(k for k in range(i, len(evs)) if evs[k].frame is not None)
    assert j - i == 24  # 6 nominal steps in quarter-step ticks
    assert all(b.ts > a.ts for a, b in zip(evs[i - 1 : j], evs[i : j + 1], strict=True))
    resumed = evs[j].frame
    assert resumed is not None and resumed.step == 30
    assert resumed.step_time[0] > 6 * s.nominal_step_s
    assert frames(evs)[-1].step == s.steps - 1


def test_divergence_spikes_loss_then_nan_and_exploding_grad_norm() -> None:
    s = make([{"kind": "divergence", "onset_step": 30, "magnitude": 3, "duration_steps": 5}])
    fs = {f.step: f for f in frames(run(s))}
    ok, spike, nan = fs[29], fs[31], fs[40]
    loss = lambda f: np.nanmean(f.loss[f.has_loss])  # noqa: E731
    assert loss(spike) > 2.5 * loss(ok)
    assert spike.grad_norm[0] > 10 * ok.grad_norm[0]
    assert np.isnan(nan.loss[nan.has_loss]).all() and nan.has_loss.any()


def test_traps_shift_everyone_or_stay_within_their_group() -> None:
    s = make(
        [
            {"kind": "stage_imbalance", "variant": "pipeline", "magnitude": 0.3},
            {"kind": "cluster_slowdown", "onset_step": 20, "duration_steps": 5, "magnitude": 1},
            {"kind": "single_step_blip", "node": 3, "onset_step": 40, "magnitude": 0.6},
            {"kind": "diurnal_temperature", "magnitude": 5, "period_s": 40},
        ],
        nodes=8,
        pp=4,
    )
    evs = run(s)
    fs = {f.step: f for f in frames(evs)}
    f = fs[30]
    assert f.compute[f.pp_stage == 3].mean() > 1.2 * f.compute[f.pp_stage == 1].mean()
    assert fs[22].data_wait.min() > 0.9 and fs[30].data_wait.max() < 0.1
    # node 3 and node 7 are both the last stage (of replicas 0 and 1)
    assert fs[40].compute[24:32].mean() > 1.4 * fs[40].compute[56:64].mean()
    assert fs[41].compute[24:32].mean() < 1.1 * fs[41].compute[56:64].mean()
    temps = [np.mean([g.temperature_c for g in h.gpus]) for h in health_of(evs, "node-0000")]
    assert max(temps) - min(temps) > 6


def test_sequence_length_imbalance_varies_across_replicas_per_step() -> None:
    spec = {"kind": "stage_imbalance", "variant": "sequence_length", "magnitude": 0.1}
    fs = frames(run(make([spec], nodes=8)))
    per_dp = np.array([[f.compute[f.dp_group == d].mean() for d in range(8)] for f in fs[10:]])
    assert (per_dp.std(axis=1) > 0.03).all()  # replicas differ every step ...
    slowest = per_dp.argmax(axis=1)
    assert len(set(slowest.tolist())) > 4  # ... but not the same replica each time


# -- messages ------------------------------------------------------------------------


def test_health_and_frames_round_trip_through_messages() -> None:
    s = make([{"kind": "divergence", "onset_step": 20, "duration_steps": 3}], steps=40)
    evs = run(s)
    hs = [h for e in evs for h in e.health]
    assert len({h.node for h in hs}) == 4 and all(len(h.gpus) == 8 for h in hs)
    assert all(decode(NodeHealth, encode(h)) == h for h in hs[:8])
    f = frames(evs)[-1]
    g = StepFrame.from_messages(f.to_messages())
    np.testing.assert_array_equal(g.compute, f.compute)
    np.testing.assert_array_equal(g.has_loss, f.has_loss)
    assert np.isnan(g.loss[g.has_loss]).all()


# -- closed loop ---------------------------------------------------------------------


def test_isolate_and_restart_resume_a_crashed_job_with_a_spare() -> None:
    s = make([{"kind": "crash", "node": 1, "onset_step": 30}], checkpoint_every=10, steps=50)
    job = SimulatedJob(s)
    while (ev := job.advance()) is not None and ev.frame is not None:
        pass
    assert job.last_step == 29 and job.last_checkpoint == 29
    with pytest.raises(SimulationError):
        job.restart(20)
    spare = job.isolate("node-0001")
    assert spare == "spare-000" and job.isolated == ["node-0001"]
    job.restart(job.last_checkpoint + 1)
    rest = list(job.events())
    fs = frames(rest)
    assert fs[0].step == 30 and fs[-1].step == 49
    assert "spare-000" in fs[0].nodes and "node-0001" not in fs[0].nodes
    gp = job.goodput()
    assert gp.useful_steps == 50 and 0 < gp.fraction < 0.9 and gp.stalled_s > 0


def test_rollback_loses_progress_and_checkpoint_on_request() -> None:
    job = SimulatedJob(make(steps=30))
    for _ in range(20):
        job.advance()
    job.checkpoint()
    ev = job.advance()
    assert ev is not None and ev.frame is not None
    assert ev.frame.phase[0] == PHASE_CODES[Phase.CHECKPOINT] and job.last_checkpoint == 20
    job.rollback(10)
    rest = frames(list(job.events()))
    assert rest[0].step == 10
    gp = job.goodput()
    assert gp.useful_steps == 30 and gp.executed_steps == 41


# -- suite ---------------------------------------------------------------------------


def test_suite_loads_and_covers_every_fault_and_trap() -> None:
    suite = load_suite()
    assert len(suite) >= 30
    kinds = {t.kind for s in suite for t in s.truth()}
    assert kinds == set(FaultKind)
    assert {s.nodes for s in suite} >= {64, 1024}
    assert min(s.nodes for s in suite) >= 64 and max(s.nodes for s in suite) <= 1024
    trap_only = [s for s in suite if s.is_trap_only]
    assert len(trap_only) >= 6
    mixed = [s for s in suite if s.has_faults and any(f.is_trap for f in s.faults)]
    assert len(mixed) >= 3
    straggler_mags = {f.magnitude for s in suite for f in s.faults if f.kind == "straggler"}
    assert {0.1, 0.2, 0.5} <= straggler_mags
    shapes = {f.shape for s in suite for f in s.faults if f.kind == "degradation"}
    assert shapes == {"linear", "exp"}
    assert len({s.seed for s in suite}) == len(suite)
    variants = {f.variant for s in suite for f in s.faults if f.kind == "stage_imbalance"}
    assert variants == {"pipeline", "sequence_length"}


def test_truth_labels_name_the_faulty_node_and_rank() -> None:
    s = make(
        [
            {"kind": "straggler", "node": 2, "gpu": 1, "onset_step": 5, "duration_steps": 10},
            {"kind": "crash", "node": 3, "onset_step": 50},
            {"kind": "hang", "onset_step": 40},
            {"kind": "single_step_blip", "node": 1, "onset_step": 7},
        ]
    )
    t = {x.fault_id: x for x in s.truth()}
    assert t["straggler-0"].node == "node-0002" and t["straggler-0"].rank == 17
    assert t["straggler-0"].end_step == 14 and not t["straggler-0"].is_trap
    assert t["crash-1"].rank is None and t["crash-1"].end_step is None
    assert t["hang-2"].node is None and t["hang-2"].end_step == 40
    assert t["single_step_blip-3"].is_trap and t["single_step_blip-3"].end_step == 7


def test_invalid_scenarios_are_refused_with_the_file_named(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("nodes: 2\nfaults:\n- {kind: straggler, node: 5}\n")
    with pytest.raises(ScenarioError, match=r"(?s)bad\.yaml.*node 5"):
        Scenario.from_yaml(p)
    p.write_text("nodes: 2\nsteps: 10\nbogus: 1\n")
    with pytest.raises(ScenarioError, match="bogus"):
        Scenario.from_yaml(p)
    with pytest.raises(ValueError, match="variant"):
        make([{"kind": "cluster_slowdown", "variant": "bogus"}])
    with pytest.raises(ValueError, match="tp"):
        make(tp=3)
    with pytest.raises(ScenarioError, match="unknown"):
        load_suite(names=["no-such-scenario"])


def test_steps_on_a_diverged_model_are_not_progress_until_rolled_back():
    div = [{"kind": "divergence", "onset_step": 30, "duration_steps": 5, "magnitude": 4.0}]
    passive = SimulatedJob(make(div, steps=60, checkpoint_every=20))
    for _ in passive.events():
        pass
    assert passive.goodput().useful_steps == 30  # everything after the onset was wasted

    active = SimulatedJob(make(div, steps=60, checkpoint_every=20))
    rolled, after = False, []
    for ev in active.events():
        if ev.frame is None:
            continue
        if rolled:
            after.append(ev.frame.loss[ev.frame.has_loss])
        if not rolled and ev.frame.step == 35:
            active.rollback(active.last_checkpoint + 1)  # last save before the onset
            rolled = True
    assert rolled and active.goodput().useful_steps == 60
    # the bad batches were skipped on the way back: the loss stays finite and low
    losses = np.concatenate(after)
    assert np.isfinite(losses).all() and losses.max() < 12.0
