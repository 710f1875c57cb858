"""DetectorSuite end to end on small synthetic jobs."""

import pickle
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from detectors.engine import DetectorConfig, DetectorSuite
from detectors.frame import StepFrame
from schemas import AlertKind, AlertState, GpuHealth, Grade, NodeHealth, Phase, RecommendedAction
from tests.clock import day_start


def frames(
    steps=60, n=64, seed=0, slow=None, onset=25, pp=None, factor=None, phase=None, stall=None
):
    """A synchronous job; ``slow`` maps rank -> slowdown, ``stall`` rank -> extra data
    wait (seconds), both from ``onset`` on."""
    rng = np.random.default_rng(seed)
    ts = 1_000.0
    for step in range(steps):
        compute = 1.0 + 0.01 * rng.standard_normal(n)
        if pp is not None:
            compute *= np.where(pp == pp.max(), 1.3, 1.0)
        if slow and step >= onset:
            for r, s in slow.items():
                compute[r] *= 1 + s
        if factor is not None:
            compute *= factor(step)
        data = 0.01 + 0.001 * rng.random(n)
        if stall and step >= onset:
            for r, s in stall.items():
                data[r] += s
        busy = compute + data
        comm = busy.max() + 0.05 - busy
        ts += busy.max() + 0.05
        ph = phase(step) if phase else Phase.TRAIN
        yield StepFrame.from_arrays(
            "job",
            step,
            ts,
            compute,
            comm,
            data,
            pp_stage=pp,
            phase=ph,
            loss=np.full(n, 3.0 - 0.001 * step),
            grad_norm=np.full(n, 1.0),
        )


def run(mon, fs):
    out = []
    for f in fs:
        out += mon.process_step(f)
    return out


def test_straggler_is_named_early_and_escalates():
    alerts = run(DetectorSuite("job"), frames(slow={21: 0.15}))
    assert [(a.kind, a.grade, a.node, a.rank) for a in alerts] == [
        (AlertKind.STRAGGLER, Grade.WARNING, "node-2", 21),
        (AlertKind.STRAGGLER, Grade.CRITICAL, "node-2", 21),
    ]
    assert alerts[0].step - 25 <= 5
    assert alerts[1].recommended_action is RecommendedAction.ISOLATE
    ev = alerts[0].evidence
    assert ev.metric == "compute_s" and ev.value > 1.1 and ev.peer_median == pytest.approx(1, 0.05)


def test_a_rank_waiting_on_its_data_loader_is_a_data_stall_not_a_straggler():
    """Its compute between the waits reads high too (cold caches, a core clocked down
    while it slept: +58 % in a real DDP job sleeping 0.2 s a step): the wait's cost,
    named by the data stall alone."""
    rng = np.random.default_rng(7)
    slow = {21: 0.0}
    fs = []
    for f in frames(steps=120, slow=slow, stall={21: 0.5}):
        fs.append(f)
        slow[21] = 0.5 + 0.3 * rng.random()  # noisy: steady at times, intermittent at others
    alerts = run(DetectorSuite("job"), fs)
    assert {(a.kind, a.rank) for a in alerts if a.state is AlertState.FIRING} == {
        (AlertKind.DATA_STALL, 21)
    }, [(a.kind, a.rank, a.step, a.evidence.detail) for a in alerts]


def test_whole_slow_node_is_one_node_level_finding():
    alerts = run(DetectorSuite("job"), frames(slow={r: 0.2 for r in range(8, 16)}))
    assert {(a.node, a.rank) for a in alerts} == {("node-1", None)}


def test_recovered_straggler_resolves():
    mon = DetectorSuite("job")
    fs = list(frames(steps=80, slow={5: 0.15}, onset=20))
    alerts = run(mon, fs[:40])
    healthy = list(frames(steps=80, seed=1))
    alerts += run(mon, healthy[40:])
    assert alerts[-1].state is AlertState.RESOLVED and alerts[-1].rank == 5


def test_stage_imbalance_is_one_info_rebalance_for_the_job_never_a_node():
    pp = np.repeat(np.arange(4), 16)
    alerts = run(DetectorSuite("job"), frames(pp=pp))  # the last stage 30 % slower from step 0
    assert [(a.kind, a.grade, a.node, a.rank) for a in alerts] == [
        (AlertKind.IMBALANCE, Grade.INFO, None, None)
    ]
    (a,) = alerts
    assert a.recommended_action is RecommendedAction.REBALANCE
    assert a.evidence.value == pytest.approx(0.3, abs=0.02)
    assert "stage 3" in a.evidence.detail and "since step 0" in a.evidence.detail


def test_a_stage_slowing_mid_job_is_dated_from_its_onset():
    pp = np.repeat(np.arange(4), 16)
    slow = {r: 0.15 for r in range(16, 32)}  # stage 1 from step 40 on
    alerts = run(DetectorSuite("job"), frames_pp(steps=120, slow=slow, onset=40, pp=pp))
    assert [(a.kind, a.node) for a in alerts] == [(AlertKind.IMBALANCE, None)]
    assert "stage 1" in alerts[0].evidence.detail and "since step 40" in alerts[0].evidence.detail


def frames_pp(steps, slow, onset, pp):
    """A balanced pipeline job whose ``slow`` ranks slow from ``onset``."""
    rng = np.random.default_rng(5)
    ts = 1_000.0
    for step in range(steps):
        compute = 1.0 + 0.01 * rng.standard_normal(pp.shape[0])
        if step >= onset:
            for r, s in slow.items():
                compute[r] *= 1 + s
        comm = compute.max() + 0.05 - compute
        ts += compute.max() + 0.05
        yield StepFrame.from_arrays("job", step, ts, compute, comm, pp_stage=pp)


def test_traps_stay_silent():
    surge = lambda s: 1.5 if 30 <= s < 40 else 1.0  # noqa: E731 - cluster-wide slowdown
    assert run(DetectorSuite("job"), frames(factor=surge)) == []
    blip = {7: 0.5}
    assert run(DetectorSuite("job"), frames(slow=blip, onset=30, steps=31)) == []


def test_eval_and_checkpoint_steps_are_not_graded():
    phase = lambda s: Phase.EVAL if s % 10 == 9 else Phase.TRAIN  # noqa: E731
    slow_eval = lambda s: 3.0 if s % 10 == 9 else 1.0  # noqa: E731
    assert run(DetectorSuite("job"), frames(phase=phase, factor=slow_eval)) == []


def test_hang_is_flagged_by_tick_and_resolved_by_progress():
    mon = DetectorSuite("job")
    fs = list(frames(steps=30))
    run(mon, fs[:20])
    last = fs[19].ts
    assert mon.tick(last + 1.0) == []
    # 3 step times: flagged, but it may still be a long step the job did not announce
    (w,) = mon.tick(last + 3.0)
    assert (w.kind, w.grade, w.node) == (AlertKind.HANG, Grade.WARNING, None)
    assert w.recommended_action is RecommendedAction.INVESTIGATE
    # 8 step times (hang_critical_factor) passed and none completed: act
    (a,) = mon.tick(last + 9.0)
    assert (a.kind, a.grade, a.fingerprint) == (AlertKind.HANG, Grade.CRITICAL, w.fingerprint)
    assert a.recommended_action is RecommendedAction.RESTART
    (r,) = mon.process_step(fs[20])
    assert r.state is AlertState.RESOLVED and r.fingerprint == a.fingerprint


def test_a_first_unannounced_checkpoint_is_a_warning_never_a_restart():
    # ~1.08 s steps; after step 19 a checkpoint save nobody announced takes 6 s: while
    # it lasts it is a warning, and the step that ends it resolves it - no restart
    mon = DetectorSuite("job")
    fs = list(frames(steps=30))
    run(mon, fs[:20])
    last = fs[19].ts
    (w,) = [a for t in (3.0, 4.0, 5.0, 6.0) for a in mon.tick(last + t)]
    assert (w.grade, w.recommended_action) == (Grade.WARNING, RecommendedAction.INVESTIGATE)
    (r,) = mon.process_step(replace(fs[20], ts=last + 6.5))
    assert r.state is AlertState.RESOLVED


def test_a_long_step_seen_once_is_allowed_again_before_critical():
    # step 20 took ~11 s (a checkpoint, not announced, its period not yet learned):
    # the next silence is CRITICAL only past 1.5 x that, not at 8 step times
    fs = [f if f.step < 20 else replace(f, ts=f.ts + 10.0) for f in frames(steps=30)]
    mon = DetectorSuite("job")
    run(mon, fs)
    last = fs[-1].ts
    grades = [a.grade for t in (3.0, 10.0, 14.0) for a in mon.tick(last + t)]
    assert grades == [Grade.WARNING]
    assert [a.grade for a in mon.tick(last + 17.0)] == [Grade.CRITICAL]


def test_missing_node_is_flagged():
    mon = DetectorSuite("job")
    fs = list(frames(steps=20))
    run(mon, fs[:10])
    alerts = []
    for f in fs[10:]:
        keep = f.node_idx != 3
        g = StepFrame.from_arrays(
            "job",
            f.step,
            f.ts,
            f.compute[keep],
            f.comm_wait[keep],
            f.data_wait[keep],
            rank=f.rank[keep],
            node_names=[f"node-{i}" for i in (0, 1, 2, 4, 5, 6, 7)],
        )
        alerts += mon.process_step(g)
    assert [(a.kind, a.node, a.rank, a.grade) for a in alerts] == [
        (AlertKind.MISSING, "node-3", None, Grade.CRITICAL)
    ]


def test_nan_loss_is_critical_at_once_with_rollback():
    mon = DetectorSuite("job")
    fs = list(frames(steps=40))
    run(mon, fs[:39])
    f = fs[39]
    bad = StepFrame.from_arrays(
        "job", f.step, f.ts, f.compute, f.comm_wait, f.data_wait, grad_norm=np.full(64, np.inf)
    )
    (a,) = mon.process_step(bad)
    assert (a.kind, a.grade) == (AlertKind.DIVERGENCE, Grade.CRITICAL)
    assert a.recommended_action is RecommendedAction.ROLLBACK


def test_health_fatal_xid_is_critical_at_once_and_names_the_node():
    mon = DetectorSuite("job")
    g = GpuHealth(
        index=0,
        temperature_c=60,
        power_w=300,
        sm_clock_mhz=1980,
        utilization_pct=90,
        xid_codes=(79,),
    )
    msg = NodeHealth(job_id="job", node="node-9", ts=day_start(), gpus=(g,))
    (a,) = mon.process_health(msg)
    assert (a.kind, a.grade, a.node) == (AlertKind.HARDWARE, Grade.CRITICAL, "node-9")
    assert a.recommended_action is RecommendedAction.ISOLATE
    other = msg.model_copy(update={"job_id": "other"})
    assert mon.process_health(other) == []


def test_silent_health_node_is_missing():
    mon = DetectorSuite("job")
    t0 = day_start()
    g = GpuHealth(index=0, temperature_c=60, power_w=300, sm_clock_mhz=1980, utilization_pct=90)
    for i in range(6):
        for n in ("a", "b", "c"):
            if n == "c" and i > 2:
                continue
            mon.process_health(
                NodeHealth(job_id="job", node=n, ts=t0 + timedelta(seconds=10 * i), gpus=(g,))
            )
    (a,) = mon.tick((t0 + timedelta(seconds=50)).timestamp())
    assert (a.kind, a.node) == (AlertKind.MISSING, "c")


def test_pickle_round_trip_continues_identically():
    fs = list(frames(steps=60, slow={3: 0.2}, onset=30))
    a, b = DetectorSuite("job"), None
    run(a, fs[:28])
    b = pickle.loads(pickle.dumps(a))
    assert [x.model_dump() for x in run(a, fs[28:])] == [x.model_dump() for x in run(b, fs[28:])]


def test_score_step_reads_state_only():
    mon = DetectorSuite("job")
    fs = list(frames(steps=40, slow={3: 0.2}, onset=20))
    run(mon, fs[:30])
    before = pickle.dumps(mon)
    scores = mon.score_step(fs[30])
    assert pickle.dumps(mon) == before
    assert any(f.rank == 3 for f in scores.findings)


def test_frames_of_another_job_are_rejected():
    f = next(frames(steps=1))
    with pytest.raises(ValueError, match="job"):
        DetectorSuite("other").process_step(f)


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="warmup_steps"):
        DetectorConfig(warmup_steps=0)
    with pytest.raises(ValueError, match="straggler_exit"):
        DetectorConfig(straggler_exit=-1.0)
    with pytest.raises(ValueError, match="exit"):
        DetectorConfig(straggler_exit=0.5)
    with pytest.raises(ValueError, match="job_id"):
        DetectorSuite("")


def test_alerts_raised_while_the_job_relaunches_name_its_last_step():
    """restarted() resets the hang clock's step, but a hardware alert or a stuck
    relaunch raised during the relaunch still names the step the job had reached, not
    step 0."""
    mon = DetectorSuite("job", DetectorConfig(relaunch_max_s=100.0))
    last = None
    for f in frames(steps=30):
        mon.process_step(f)
        last = f
    mon.restarted(last.ts + 1, removed_nodes=())
    hot = GpuHealth(index=0, temperature_c=60, power_w=300, sm_clock_mhz=1980,
                    utilization_pct=90, xid_codes=(79,))  # fmt: skip
    at = datetime.fromtimestamp(last.ts + 2, UTC)
    (a,) = mon.process_health(NodeHealth(job_id="job", node="node-9", ts=at, gpus=(hot,)))
    assert a.step == 29
    hangs = [x for t in range(3, 200) for x in mon.tick(last.ts + t) if x.kind is AlertKind.HANG]
    assert hangs and hangs[0].step == 30 and "(relaunch_stuck)" in hangs[0].summary


def test_a_rack_slowing_together_is_one_group_alert_never_node_isolations():
    rack = {r: 0.2 for r in range(16, 48)}  # nodes 2-5 of 16, every GPU, from step 25
    alerts = run(DetectorSuite("job"), frames(steps=80, n=128, slow=rack))
    assert [(a.kind, a.grade, a.node) for a in alerts] == [(AlertKind.GROUP, Grade.WARNING, None)]
    (a,) = alerts
    assert a.recommended_action is RecommendedAction.INVESTIGATE
    assert "node-2, node-3, node-4, node-5" in a.evidence.detail and a.evidence.value == 4


def test_a_slow_loss_drift_warns_before_it_spikes():
    mon = DetectorSuite("job")
    alerts = []
    for f in frames(steps=200):
        rise = 1 + 0.005 * max(0, f.step - 120)  # 0.5 % a step from step 120, no jump
        g = StepFrame.from_arrays(
            "job", f.step, f.ts, f.compute, f.comm_wait, f.data_wait,
            loss=f.loss * rise, grad_norm=f.grad_norm,
        )  # fmt: skip
        alerts += mon.process_step(g)
    drift = [a for a in alerts if "above the best it reached" in a.evidence.detail]
    assert [(a.kind, a.grade, a.recommended_action) for a in drift[:1]] == [
        (AlertKind.DIVERGENCE, Grade.WARNING, RecommendedAction.INVESTIGATE)
    ]
    assert 120 < drift[0].step < 150
    assert run(DetectorSuite("job"), frames(steps=200)) == []  # a falling loss: nothing


def test_a_processed_step_leaves_no_cycle_behind():
    # a step's scores refer to its context and back: left as a cycle, every step's
    # arrays waited for the cycle collector (33 x the memory per rank at 131k ranks)
    import gc

    from detectors.protocol import StepScores

    suite = DetectorSuite("job")
    gc.collect()
    gc.disable()
    try:
        run(suite, frames(steps=30))
        # type(), not isinstance(): isinstance reads __class__, and some of what
        # gc holds warn on that read (torch's deprecated reduce_op under CI)
        alive = sum(type(o) is StepScores for o in gc.get_objects())
    finally:
        gc.enable()
    assert alive == 0


def busy_core_frames(steps=90, onset=40, slow=0.4, seed=0):
    """Four ranks (two nodes) time-sliced on shared cores, as a CPU DDP job measures
    them: compute jitter of a few percent, comm wait that is mostly scheduling noise
    (10-100 ms of a ~110 ms step, independent per rank), and rank 3 ``slow`` slower
    from ``onset``."""
    rng = np.random.default_rng(seed)
    ts = 1_000.0
    for step in range(steps):
        compute = 0.024 * (1 + 0.04 * rng.standard_normal(4))
        if step >= onset:
            compute[3] *= 1 + slow
        comm = rng.uniform(0.01, 0.10, 4)
        ts += 0.11
        yield StepFrame.from_arrays("job", step, ts, compute, comm, np.full(4, 0.002),
                                    ranks_per_node=2, step_time=np.full(4, 0.11))  # fmt: skip


@pytest.mark.parametrize("seed", range(8))
def test_a_compute_straggler_among_ranks_sharing_busy_cores_is_named_within_twenty_steps(seed):
    # comm wait that is noise must not read as "the culprit waits too": gated on
    # comm excess alone, the culprit was cleared on every other step (2 of these 8
    # seeds never named, the others 16 to 48 steps late)
    alerts = run(DetectorSuite("job"), busy_core_frames(seed=seed))
    firing = [a for a in alerts if a.state is AlertState.FIRING]
    assert firing, "the straggler was never named"
    first = firing[0]
    assert (first.kind, first.rank) == (AlertKind.STRAGGLER, 3), first
    assert 40 <= first.step <= 60, first.step


@pytest.mark.parametrize("seed", range(8))
def test_ranks_sharing_busy_cores_raise_nothing_without_a_fault(seed):
    alerts = run(DetectorSuite("job"), busy_core_frames(slow=0.0, seed=seed))
    assert [(a.kind, a.rank, a.step) for a in alerts] == []
