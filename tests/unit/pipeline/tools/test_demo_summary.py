"""How the demo scores alerts against the simulator's truth (``match_alerts``), and what
it tells the services it starts (pure helpers of ``pipeline.tools.demo``)."""

from __future__ import annotations

from pipeline.tools.demo_summary import match_alerts
from schemas import AlertKind, AlertState, FaultKind, FaultTruth
from tests.factories import samples

BASE = samples()["decisions"]


def alert(kind: AlertKind, step: int, node: str | None = None):
    return BASE.model_copy(
        update={
            "fingerprint": f"{kind.value}-{step}-{node}",
            "kind": kind,
            "step": step,
            "node": node,
            "state": AlertState.FIRING,
        }
    )


def fault(kind: FaultKind, node: str, onset: int) -> FaultTruth:
    return FaultTruth(scenario="s", job_id="job-1", fault_id=f"{kind.value}-{node}", kind=kind,
                      node=node, onset_step=onset)  # fmt: skip


def test_a_job_hang_after_a_rank_died_belongs_to_the_fault_that_killed_it():

    truth = [fault(FaultKind.ECC_STORM, "node-0201", 590)]
    alerts = [
        alert(AlertKind.HARDWARE, 609, "node-0201"),
        alert(AlertKind.HANG, 630),  # the job stalled: XID 48 killed a rank at 620
        alert(AlertKind.HANG, 100),  # before the fault: false
    ]
    outcomes, traps, unmatched = match_alerts(truth, alerts)
    assert unmatched == 1 and traps == 0
    assert outcomes[0].detected_step == 609
    assert outcomes[0].alert_kinds == ["hang", "hardware"]


def test_a_job_hang_during_a_slow_node_is_still_a_false_alert():

    truth = [fault(FaultKind.STRAGGLER, "node-0005", 40)]
    alerts = [alert(AlertKind.STRAGGLER, 45, "node-0005"), alert(AlertKind.HANG, 50)]
    outcomes, _, unmatched = match_alerts(truth, alerts)
    assert unmatched == 1 and outcomes[0].alert_kinds == ["straggler"]


def test_the_job_is_back_dated_by_what_the_speed_up_gains():
    # the helper stepguard simulate shares (tests/unit/pipeline/tools/simulator/test_closed_loop.py)
    from pipeline.tools.simulator import back_dating_s, find_scenario

    sc = find_scenario("ci_smoke")
    expected = sc.steps * sc.nominal_step_s * 1.25
    assert back_dating_s(sc, 1.0) == 0.0  # real time: dated now
    assert back_dating_s(sc, 0.5) == 0.0  # slower than real time: never ahead
    assert abs(back_dating_s(sc, 8.0) - expected * 7 / 8) < 1e-9


def test_actuator_runs_auto_with_the_spares_and_guard_times_divided_by_the_speed():
    from pipeline.io.settings import load_settings
    from pipeline.tools.demo import _actuator_env
    from pipeline.tools.simulator import SimulatedJob, find_scenario

    settings = load_settings({})
    job = SimulatedJob(find_scenario("ci_smoke"))
    env = _actuator_env(settings, job, 8.0)
    assert env["STEPGUARD_ACTUATOR_MODE"] == "auto"
    assert env["STEPGUARD_SPARE_NODES"] == ",".join(job.spare_pool)
    assert env["STEPGUARD_GUARD_JOB_NODES"] == "16"
    assert (
        float(env["STEPGUARD_GUARD_RELAUNCH_COOLDOWN_S"]) == settings.guard_relaunch_cooldown_s / 8
    )
    assert float(env["STEPGUARD_GUARD_WINDOW_S"]) == settings.guard_window_s / 8
    # what the actuator reads back is valid settings
    assert load_settings(env).actuator_mode == "auto"


def test_children_get_the_demo_topics_and_the_callers_archive(tmp_path):
    from pipeline.io.settings import load_settings
    from pipeline.tools.demo import _base_env

    s = load_settings({}, topic_prefix="x.", consumer_group="g", chdb_path=tmp_path / "a")
    env = _base_env(s, {"PATH": "/bin", "STEPGUARD_CLICKHOUSE_DSN": "clickhouse://h/db"}, "r1")
    assert env["STEPGUARD_TOPIC_PREFIX"] == "x.demo-r1."
    assert env["STEPGUARD_CONSUMER_GROUP"] == "g.demo-r1"
    assert env["STEPGUARD_CHDB_PATH"] == str((tmp_path / "a").resolve())
    assert "STEPGUARD_CLICKHOUSE_DSN" not in env  # the settings say chDB
    assert env["PATH"] == "/bin"
