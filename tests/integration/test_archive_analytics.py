"""The demo path into both archive backends, then every analyst query and the report."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console

from pipeline.io.duration import parse_duration
from pipeline.services.archive import rows_for
from pipeline.services.archive.queries import QUERIES, run_query
from pipeline.services.archive.retention import prune
from pipeline.tools.demo import run_demo
from pipeline.tools.report import render_report
from pipeline.tools.simulator import find_scenario
from tests.conftest import fresh_archive, fresh_settings
from tests.factories import EXECUTOR_KEY, JOB_CONTROLLER_KEY, samples

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=["chdb", "server"])
def smoke_run(request, broker_settings, _chdb_session):
    """One demo run per backend, shared by the read-only tests of this module."""
    scenario = find_scenario("ci_smoke")
    with fresh_archive(request.param, _chdb_session) as archive:
        summary = run_demo(
            fresh_settings(broker_settings),
            scenario,
            console=Console(quiet=True),
            backend=archive,
        )
        yield scenario, summary, archive


def test_demo_detects_the_straggler_replaces_it_and_archives_every_topic(smoke_run):
    scenario, summary, archive = smoke_run
    assert summary.faults_injected == 1
    assert summary.faults_detected == 1
    assert summary.trap_alerts == 0
    slow = summary.faults[0]
    assert slow.node == "node-0005" and slow.delay_steps is not None and slow.delay_steps <= 10
    # closed loop: the actuator replaced exactly the slow node, the job obeyed
    assert summary.isolated_nodes == ["node-0005"] and summary.false_isolations == 0
    assert any("isolate node-0005->spare-000" in a for a in summary.actions_applied)
    # where the wall time went: every stage, in order, adding up to the whole
    stages = summary.phase_seconds
    assert list(stages) == ["setup", "start", "play", "settle", "archive", "stop"], stages
    assert all(v >= 0 for v in stages.values()) and stages["play"] > 0, stages
    assert sum(stages.values()) == pytest.approx(summary.wall_seconds, abs=0.1)
    db = archive.database
    _, rows = archive.query(
        f"SELECT count(), uniqExact(step) FROM {db}.steps FINAL WHERE job_id = '{summary.job_id}'"
    )
    # a step replayed after a restart replaces its first run: one row per rank and step
    assert rows[0][0] == rows[0][1] * scenario.n_ranks
    assert rows[0][1] == scenario.steps
    _, rows = archive.query(f"SELECT count() FROM {db}.fault_truth FINAL")
    assert rows[0][0] == 2


def test_rank_slowdown_names_the_straggler(smoke_run):
    _, summary, archive = smoke_run
    cols, rows = run_query(archive, "rank_slowdown", job=summary.job_id, limit=30)
    top = [dict(zip(cols, r, strict=True)) for r in rows]
    culprit = Counter((r["node"], r["rank"]) for r in top).most_common(1)[0]
    # slow from step 60 until the actuator replaced the node (at 8x on the production
    # services, detection + the next checkpoint boundary leave it slow for ~10 steps)
    assert culprit[0] == ("node-0005", 5 * 8 + 3) and culprit[1] >= 5
    slow = [r["slowdown"] for r in top if r["rank"] == 43]
    assert 0.2 < sorted(slow)[len(slow) // 2] < 0.45


def test_detection_delay_matches_the_demo_summary(smoke_run):
    _, summary, archive = smoke_run
    cols, rows = run_query(archive, "detection_delay", job=summary.job_id)
    got = {r[cols.index("fault_id")]: r[cols.index("delay_steps")] for r in rows}
    assert got == {"slow-rank": summary.faults[0].delay_steps}


def test_lost_gpu_hours_are_positive_for_the_straggler(smoke_run):
    _, summary, archive = smoke_run
    cols, rows = run_query(archive, "lost_gpu_hours", job=summary.job_id)
    (row,) = rows
    lost = row[cols.index("lost_gpu_hours")]
    # a 30 % slower rank on 128 ranks costs ~0.3 s x 128 per step: at least the ten
    # steps to detection, and less than if it had run slow to the end (~1 GPU-hour)
    assert 0.05 < lost < 1.5


def test_timeline_top_nodes_and_command_outcomes_run(smoke_run):
    _, summary, archive = smoke_run
    _, timeline = run_query(archive, "incident_timeline", job=summary.job_id)
    assert any("straggler" in str(r[1]) and "node-0005" in str(r[2]) for r in timeline)
    assert any("command isolate" in str(r[1]) and "node-0005" in str(r[2]) for r in timeline)
    _, top = run_query(archive, "top_nodes", limit=3)
    # the query runs over its default window (the simulator dates the job from now)
    assert isinstance(top, list)
    cols, outcomes = run_query(archive, "command_outcomes", job=summary.job_id)
    by_kind = {r[cols.index("kind")]: r[cols.index("status")] for r in outcomes}
    assert by_kind.get("isolate") == "succeeded" and by_kind.get("checkpoint") == "succeeded"


def test_report_renders_one_file_with_its_plots_inline(smoke_run, tmp_path):
    _, summary, archive = smoke_run
    result = render_report(archive, summary.job_id, tmp_path / "r" / "report.html")
    panels = [p for ps in result.panels.values() for p in ps]
    assert panels, "a panel per incident"
    html = result.html_path.read_text()
    assert [p.name for p in result.html_path.parent.iterdir()] == ["report.html"]
    for panel in panels:
        assert len(panel.png) > 5000
    assert html.count("src='data:image/png;base64,") == len(panels)
    assert "node-0005" in html and "straggler" in result.text


def test_every_query_takes_its_values_as_parameters(smoke_run):
    _, _, archive = smoke_run
    for name in QUERIES.keys() - {"top_nodes"}:  # top_nodes spans every job
        # an injection attempt is just a job id that matches nothing
        assert run_query(archive, name, job="x' OR '1'='1", limit=1)[1] == [], name


def test_prune_drops_only_whole_days_stored_before_the_cutoff(archive):
    """Partitions are by when the archive stored a row (migration 013): a row stored 40
    days ago goes, one its writer dated 40 days back but stored today stays."""
    now = datetime.now(UTC)
    base = samples()["decisions"]
    old = base.model_copy(update={"ts": now - timedelta(days=40)})
    dated_back = base.model_copy(update={"fingerprint": "e" * 24, "ts": now - timedelta(days=40)})
    new = base.model_copy(update={"fingerprint": "f" * 24, "ts": now})
    for table, cols in rows_for([(old, 0)]).items():
        archive.insert(table, {**cols, "received": [now - timedelta(days=40)]})
    for table, cols in rows_for([(dated_back, 0), (new, 0)]).items():
        archive.insert(table, cols)  # received: DEFAULT now()
    assert parse_duration("30d") == timedelta(days=30)
    would = prune(archive, parse_duration("30d"), dry_run=True)
    assert [t for t, _ in would] == ["alerts"]
    prune(archive, parse_duration("30d"))
    _, rows = archive.query(
        f"SELECT fingerprint FROM {archive.database}.alerts FINAL ORDER BY fingerprint"
    )
    assert rows == [("e" * 24,), ("f" * 24,)]
    with pytest.raises(ValueError, match="expected a number and a unit"):
        parse_duration("soon")


def test_the_straggler_is_one_incident_and_the_run_ended_completed(smoke_run):
    _, summary, archive = smoke_run
    cols, rows = run_query(archive, "incidents", job=summary.job_id)
    incidents = [dict(zip(cols, r, strict=True)) for r in rows]
    on_culprit = [i for i in incidents if i["culprit"] == "node-0005"]
    slow = [i for i in on_culprit if "straggler" in i["kind"]]
    assert len(slow) == 1, incidents  # one slow node, one incident
    assert list(slow[0]["ranks"]) == [43] and slow[0]["resolved"] == 1
    cols, runs = run_query(archive, "job_runs", job=summary.job_id)
    (run,) = [dict(zip(cols, r, strict=True)) for r in runs]
    assert run["end_reason"] == "completed" and run["last_step"] >= summary.steps_completed - 1


def _timeline_archive(archive):
    """One job's history as the services archive it: a held action approved, a second
    one that expired, a signed command two executors answered, and forgeries (an
    unsigned command with a result, an unsigned alert on another node, an unsigned
    action record and an unsigned rejection of the held action)."""
    from pipeline.io.trust import SigningKey, sign
    from schemas import ActionState, ApprovalDecision, CommandStatus

    s = samples()
    t0 = s["commands"].issued_at
    actuator, worker = SigningKey.generate("act"), SigningKey.generate("wrk")
    operator = SigningKey.generate("op")
    alert = sign(s["decisions"].model_copy(update={"ts": t0}), worker)
    forged_alert = s["decisions"].model_copy(
        update={"fingerprint": "f" * 24, "node": "node-9", "summary": "forged"}
    )
    held = sign(s["actions"], actuator)
    forged_action = s["actions"].model_copy(
        update={"action_id": "act-forged-00000000000000000", "summary": "forged",
                "detail": "forged"}
    )  # fmt: skip
    approved = sign(
        held.model_copy(
            update={"state": ActionState.APPROVED, "by": "sre@example.com",
                    "ts": t0 + timedelta(seconds=2)}
        ),
        actuator,
    )  # fmt: skip
    expired = sign(
        held.model_copy(
            update={"action_id": "act-expired-0000000000000000", "state": ActionState.CANCELLED,
                    "detail": "expired after 600 s", "ts": t0 + timedelta(seconds=9)}
        ),
        actuator,
    )  # fmt: skip
    approval = sign(s["approvals"].model_copy(update={"ts": t0 + timedelta(seconds=1)}),
                    operator)  # fmt: skip
    forged_rejection = s["approvals"].model_copy(
        update={"decision": ApprovalDecision.REJECT, "by": "forger", "reason": "forged",
                "ts": t0 + timedelta(seconds=7)}
    )  # fmt: skip
    command = sign(s["commands"].model_copy(update={"issued_at": t0 + timedelta(seconds=3)}),
                   actuator)  # fmt: skip
    forged = s["commands"].model_copy(update={"command_id": "cmd-forged", "summary": "forged"})

    def result(executor, status, seconds, cid=command.command_id):
        return s["results"].model_copy(
            update={"command_id": cid, "executor": executor, "status": status,
                    "detail": f"{executor} {status}", "ts": t0 + timedelta(seconds=seconds)}
        )  # fmt: skip

    results = [  # signed by their writers' roles: the archive counts only signed results
        sign(result("job-controller", CommandStatus.ACCEPTED, 4), JOB_CONTROLLER_KEY),
        sign(result("job-controller", CommandStatus.SUCCEEDED, 5), JOB_CONTROLLER_KEY),
        sign(result("slurm", CommandStatus.FAILED, 6), EXECUTOR_KEY),
        result("slurm", CommandStatus.REFUSED, 4, cid="cmd-forged"),
    ]
    messages = [alert, forged_alert, held, approved, expired, approval, command, forged,
                forged_action, forged_rejection, *results]  # fmt: skip
    for table, cols in rows_for([(m, 0) for m in messages], list(range(len(messages)))).items():
        archive.insert(table, cols)
    return command


def test_timeline_has_actions_approvals_and_every_result_and_ignores_unsigned(archive):
    command = _timeline_archive(archive)
    cols, rows = run_query(archive, "incident_timeline", job="job-1")
    what = [r[cols.index("what")] for r in rows]
    assert what == [
        "alert straggler warning firing", "action held", "approval approve", "action approved",
        "command isolate (auto)", "result accepted", "result succeeded", "result failed",
        "action expired",
    ]  # fmt: skip
    text = " ".join(str(v) for r in rows for v in r)
    assert "forged" not in text and "node-9" not in text and "refused" not in text
    assert "forger" not in text and "approval reject" not in what
    cols, rows = run_query(archive, "command_outcomes", job="job-1")
    got = [(r[cols.index("command_id")], r[cols.index("executor")], r[cols.index("status")])
           for r in rows]  # fmt: skip
    assert got == [
        (command.command_id, "job-controller", "succeeded"),
        (command.command_id, "slurm", "failed"),
    ]
    cols, rows = run_query(archive, "incidents", job="job-1")
    assert [r[cols.index("culprit")] for r in rows] == ["node-3"]


def test_queries_order_by_event_time_and_count_what_they_say(archive):
    """Issue 41: within one second the archive's queries ordered by an id's spelling
    (a restart listed before the isolation it followed, a relaunched run before the
    first), a relaunch at the instant of its command came before it, and
    detection_delay's `matching` counted alert updates, not alerts."""
    from pipeline.io.trust import SigningKey, sign
    from schemas import CommandKind, EndReason, JobEvent, JobEventKind

    s = samples()
    actuator, worker = SigningKey.generate("act"), SigningKey.generate("wrk")
    t0 = datetime.now(UTC).replace(microsecond=0)  # all within one second of it
    at = [t0 + timedelta(milliseconds=ms) for ms in (100, 200, 700, 700, 800)]
    first = sign(s["commands"].model_copy(
        update={"command_id": "cmd-zzzz-isolate", "issued_at": at[1]}), actuator)  # fmt: skip
    second = sign(s["commands"].model_copy(
        update={"command_id": "cmd-aaaa-restart", "kind": CommandKind.RESTART,
                "issued_at": at[2]}), actuator)  # fmt: skip
    runs = [
        JobEvent(job_id="job-1", kind=JobEventKind.START, ts=at[0], run="run-b", source="n0"),
        # the relaunch the restart caused, dated the same millisecond as the command
        JobEvent(job_id="job-1", kind=JobEventKind.START, ts=at[3], run="run-a", source="n0"),
        JobEvent(job_id="job-1", kind=JobEventKind.END, ts=at[4], run="run-a", source="n0",
                 reason=EndReason.COMPLETED, step=400),
    ]  # fmt: skip
    # one alert episode, three updates of it (firing at step 104, 105, 106)
    updates = [
        sign(s["decisions"].model_copy(update={"seq": n, "step": 104 + n, "ts": at[0]}), worker)
        for n in range(3)
    ]
    messages = [first, second, *runs, *updates, s["truth"]]
    for table, cols in rows_for([(m, 0) for m in messages], list(range(len(messages)))).items():
        archive.insert(table, cols)

    cols, rows = run_query(archive, "command_outcomes", job="job-1")
    assert [r[cols.index("command_id")] for r in rows] == ["cmd-zzzz-isolate", "cmd-aaaa-restart"]
    cols, rows = run_query(archive, "job_runs", job="job-1")
    assert [r[cols.index("run")] for r in rows] == ["run-b", "run-a"]
    cols, rows = run_query(archive, "incident_timeline", job="job-1")
    what = [r[cols.index("what")] for r in rows]
    # the relaunch (the second start) after the command that caused it
    starts = [i for i, w in enumerate(what) if w == "job start"]
    assert (
        starts[0]
        < what.index("command isolate (auto)")
        < what.index("command restart (auto)")
        < starts[1]
    ), what
    cols, rows = run_query(archive, "detection_delay", job="job-1")
    (row,) = [dict(zip(cols, r, strict=True)) for r in rows]
    assert row["matching"] == 1 and row["first_alert_step"] == 104, row  # one alert
