"""How the demo scores alerts against the simulator's truth (``match_alerts``), and what
it tells the services it starts (pure helpers of ``pipeline.tools.demo``)."""

from __future__ import annotations

from pipeline.tools.demo_summary import match_alerts
from schemas import AlertKind, AlertState, FaultKind, FaultTruth
from tests.factories import T0, samples

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


def test_the_summary_counts_what_the_job_applied_and_says_what_was_refused():
    """Issue 41 item 4: the summary said `isolated [node-0010, node-0032, node-0050]`
    from the commands issued while the job applied two, and a refused restart was not
    mentioned. It now counts the job's own results (a dry run applies nothing)."""
    from io import StringIO

    from rich.console import Console

    from pipeline.tools.demo_summary import DemoSummary, command_outcomes, print_summary
    from schemas import (
        ActionRecord,
        ActionState,
        ActuatorMode,
        Command,
        CommandKind,
        CommandResult,
        CommandStatus,
    )

    def cmd(cid, kind, node):
        return Command(command_id=cid, kind=kind, job_id="j", targets=(node,), reason=("fp",),
                       mode=ActuatorMode.AUTO, issued_at=T0)  # fmt: skip

    def res(cid, status, executor="simulated-job", detail=""):
        return CommandResult(command_id=cid, job_id="j", executor=executor, status=status,
                             detail=detail, ts=T0)  # fmt: skip

    cmds = [
        cmd(f"cmd-{n}", CommandKind.ISOLATE, n) for n in ("node-0010", "node-0032", "node-0050")
    ]
    cmds.append(cmd("cmd-r", CommandKind.RESTART, "node-0050"))
    results = [res(c.command_id, CommandStatus.SUCCEEDED, "dry-run") for c in cmds]
    why = "no checkpoint to restart from"
    results += [res("cmd-node-0010", CommandStatus.SUCCEEDED),
                res("cmd-node-0032", CommandStatus.SUCCEEDED),
                res("cmd-r", CommandStatus.REFUSED, detail=why)]  # fmt: skip
    guard = ActionRecord(action_id="act-guard", state=ActionState.REFUSED, job_id="j",
                         mode=ActuatorMode.AUTO, commands=(cmds[0],), reason=("fp",),
                         detail="circuit breaker open", ts=T0)  # fmt: skip
    done = command_outcomes(cmds, results, [guard])
    assert done.isolated == ["node-0010", "node-0032"]
    assert done.unanswered == ["isolate ['node-0050'] (cmd-node-0050)"]
    assert done.refused == [
        "restart ['node-0050'] (cmd-r): refused by simulated-job: no checkpoint to restart from",
        "isolate (act-guard): refused by the actuator: circuit breaker open",
    ]
    summary = DemoSummary(
        scenario="s", job_id="j", nodes=64, ranks=512, steps_completed=1, faults_injected=0,
        faults_detected=0, traps=0, trap_alerts=0, false_alerts=0, false_isolations=0,
        goodput=1.0, wall_seconds=1.0, messages_published=1, archived_rows=1, dead_letters=0,
        alerts_by_grade={}, commands={"isolate": 3, "restart": 1},
        isolated_nodes=done.isolated, applied=done.applied, refused=done.refused,
        unanswered=done.unanswered,
    )  # fmt: skip
    out = StringIO()
    print_summary(summary, Console(file=out, width=200))
    text = out.getvalue()
    assert "isolated ['node-0010', 'node-0032']" in text
    assert "applied by the job (its results): 2, refused: 2, no result: 1" in text
    assert "refused: restart ['node-0050'] (cmd-r): refused by simulated-job" in text


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
