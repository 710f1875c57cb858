"""The pure parts of ``stepguard status`` and ``stepguard alerts``: folds, filters,
lines and tables (at 80 columns)."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from rich.console import Console

from pipeline.io.duration import parse_duration
from pipeline.io.kafka import Decoded
from pipeline.io.trust import sign
from pipeline.tools.alerts import (
    AlertFilter,
    alert_line,
    alerts_filter,
    by_event_time,
    signature_mark,
)
from pipeline.tools.status import (
    HeldRow,
    ServiceRow,
    StatusSnapshot,
    held_from,
    incidents_from,
    jobs_from,
    render_status,
    services_from_up,
)
from schemas import (
    ActionRecord,
    ActionState,
    ActuatorMode,
    Alert,
    AlertKind,
    AlertState,
    Command,
    CommandKind,
    EndReason,
    Evidence,
    Grade,
    JobEvent,
    JobEventKind,
    RecommendedAction,
)
from tests.clock import day_start
from tests.factories import ACTUATOR_KEY, WORKER_KEY, step_telemetry, test_key

T0 = day_start(hour=12)


def alert(fp="fp-a-0000001", seq=0, *, node="node-3", state=AlertState.FIRING,
          grade=Grade.CRITICAL, incident="inc-1", kind=AlertKind.STRAGGLER, job="job-1",
          ts=T0) -> Alert:  # fmt: skip
    return Alert(
        fingerprint=fp, seq=seq, kind=kind, grade=grade, state=state, job_id=job, node=node,
        rank=5, step=10 + seq, started_at=T0 - timedelta(seconds=30), ts=ts,
        evidence=Evidence(metric="compute_s", value=1.31, peer_median=1.0, deviation=8.5),
        recommended_action=RecommendedAction.ISOLATE, summary=f"{node} is slow",
        incident=incident,
    )  # fmt: skip


def test_jobs_last_step_age_and_end():
    def step(job, node, n, at):
        return step_telemetry(job=job, node=node, step=n).model_copy(
            update={"ts_start": at - timedelta(seconds=1), "ts_end": at}
        )

    steps = [step("a", "n0", 9, T0), step("a", "n1", 10, T0 + timedelta(seconds=2)),
             step("b", "n0", 3, T0 - timedelta(hours=1))]  # fmt: skip
    end = JobEvent(job_id="b", kind=JobEventKind.END, reason=EndReason.FAILED, ts=T0)
    other = JobEvent(job_id="zzz", kind=JobEventKind.END, ts=T0, reason=EndReason.COMPLETED)
    rows = jobs_from(steps, [end, other], T0 + timedelta(seconds=12))
    assert [(r.job_id, r.last_step, r.age_s, r.nodes, r.ended) for r in rows] == [
        ("a", 10, 10.0, 2, None),
        ("b", 3, 3612.0, 1, "failed"),
    ]
    restarted = JobEvent(job_id="b", kind=JobEventKind.START, ts=T0)
    assert jobs_from(steps, [end, restarted], T0)[1].ended is None


def test_a_job_relaunching_after_its_last_step_is_shown_relaunching_then_stuck():
    """Issue 44: from a relaunching command until the new run's first step the job is
    relaunching, not a silent job; past relaunch_max_s it is shown stuck."""
    last = step_telemetry(job="a", node="n0", step=10).model_copy(
        update={"ts_start": T0 - timedelta(seconds=1), "ts_end": T0}
    )

    def command(kind, at, cid="cmd-1"):
        return Command(command_id=cid, kind=kind, job_id="a", reason=("fp",),
                       mode=ActuatorMode.AUTO, issued_at=at,
                       expires_at=at + timedelta(minutes=5))  # fmt: skip

    before = command(CommandKind.RESTART, T0 - timedelta(seconds=5), "cmd-0")  # the old run's
    checkpoint = command(CommandKind.CHECKPOINT, T0 + timedelta(seconds=1), "cmd-2")
    restart = command(CommandKind.RESTART, T0 + timedelta(seconds=2))
    later = T0 + timedelta(seconds=92)
    assert jobs_from([last], [], later, [before, checkpoint])[0].relaunching_s is None
    (row,) = jobs_from([last], [], later, [before, checkpoint, restart])
    assert row.relaunching_s == 90.0

    def shown(now, max_s):
        snap = StatusSnapshot(at=now, bootstrap="b", services_from="s", services=[],
                              jobs=jobs_from([last], [], now, [restart]), incidents=[],
                              held=[], relaunch_max_s=max_s)  # fmt: skip
        console = Console(file=io.StringIO(), width=80, color_system=None, record=True)
        console.print(render_status(snap, 500))
        return console.export_text()

    assert "relaunching 1m30s" in shown(later, 1800.0)
    assert "relaunch stuck 31m" in shown(T0 + timedelta(minutes=31, seconds=2), 1800.0)


def test_incidents_group_firing_episodes_and_drop_resolved_ones():
    rows = incidents_from([
        alert("fp-a-0000001"), alert("fp-b-0000001", node="node-4", grade=Grade.WARNING),
        alert("fp-c-0000001", incident="inc-2"),
        alert("fp-c-0000001", 1, incident="inc-2", state=AlertState.RESOLVED),
        alert("fp-d-0000001", incident="", grade=Grade.WARNING, node="node-9"),
    ])  # fmt: skip
    assert [(r.incident, r.grade, r.nodes, r.episodes) for r in rows] == [
        ("inc-1", "critical", ["node-3", "node-4"], 2),
        ("fp-d-0000001", "warning", ["node-9"], 1),  # no incident key: its fingerprint
    ]
    # an update seen out of order does not bring a resolved episode back
    late = incidents_from(
        [alert("fp-c-0000001", 1, state=AlertState.RESOLVED), alert("fp-c-0000001")]
    )
    assert late == []


def test_held_actions_leave_out_decided_and_expired_ones():
    rec = ActionRecord(action_id="act-1", state=ActionState.HELD, job_id="j",
                       mode=ActuatorMode.APPROVE, reason=("fp",), ts=T0)  # fmt: skip
    records = {
        "act-1": rec,
        "act-2": rec.model_copy(update={"action_id": "act-2", "ts": T0 - timedelta(hours=2)}),
        "act-3": rec.model_copy(update={"action_id": "act-3", "state": ActionState.REJECTED}),
    }
    rows = held_from(records, T0 + timedelta(seconds=60), hold_ttl_s=1800)
    assert [(r.action_id, r.expires_in_s) for r in rows] == [("act-1", 1740.0)]


def test_alert_lines_say_everything_and_mark_what_no_worker_signed():
    workers = WORKER_KEY.verifier()
    actuators = ACTUATOR_KEY.verifier()
    good = sign(alert(), WORKER_KEY)
    line = alert_line(good, signature_mark(good, workers, actuators)).plain
    assert line == (
        "12:00:00 CRIT FIRING job-1 node-3/r5 straggler: node-3 is slow "
        "[compute_s=1.31 vs peers 1 (dev 8.5)] -> isolate [incident inc-1]"
    )
    assert signature_mark(alert(), workers, actuators) == "UNSIGNED"
    forged = sign(alert(), test_key("w-other"))
    assert signature_mark(forged, workers, actuators).startswith("BAD SIGNATURE: unknown key")
    # the actuator's own guardrail alerts are its to sign
    guard = sign(alert(kind=AlertKind.GUARDRAIL), ACTUATOR_KEY)
    assert signature_mark(guard, workers, actuators) == ""
    assert signature_mark(sign(alert(), ACTUATOR_KEY), workers, actuators).startswith("BAD")
    assert signature_mark(good, {}, {}).startswith("UNVERIFIED")
    assert alert_line(alert(), "UNSIGNED").plain.endswith(" UNSIGNED")


def test_filters_job_least_grade_and_age():
    keep = alerts_filter(job="job-1", grade="WARNING", since="5m", now=T0)
    assert keep(alert(grade=Grade.WARNING)) and keep(alert())
    assert not keep(alert(grade=Grade.INFO))
    assert not keep(alert(job="job-2"))
    assert not keep(alert(ts=T0 - timedelta(minutes=6)))
    assert AlertFilter()(alert(grade=Grade.INFO))
    with pytest.raises(ValueError, match="--grade"):
        alerts_filter(job=None, grade="loud", since=None)
    with pytest.raises(ValueError, match="--since"):
        alerts_filter(job=None, grade=None, since="5 minutes")
    assert parse_duration("90s") == timedelta(seconds=90) and parse_duration("1d").days == 1


def test_services_from_up_json_live_and_gone():
    doc = {"pid": 100, "services": {
        "worker-1": {"state": "running", "pid": 101, "restarts": 1, "uptime_s": 65.0,
                     "metrics_port": 9000},
        "broken": "not a dict",
    }}  # fmt: skip
    rows, notes = services_from_up(doc, alive=lambda pid: True, scrape=lambda p: {"records": 7})
    assert [(r.name, r.state, r.restarts, r.counters) for r in rows] == [
        ("worker-1", "running", 1, {"records": 7})
    ] and notes == []
    rows, notes = services_from_up(doc, alive=lambda pid: False, scrape=lambda p: {"x": 1})
    assert rows[0].state == "gone" and rows[0].counters == {} and "not running" in notes[0]
    assert services_from_up({}, alive=lambda pid: False)[0] == []


def test_the_status_tables_fit_80_columns():
    snap = StatusSnapshot(
        at=T0, bootstrap="127.0.0.1:9092", services_from="/x/.stepguard/up.json",
        services=[ServiceRow("executor-dry-run", "restart in 12s", 123456, 3, 4000.0, 9110,
                             {"records": 123456789, "alerts": 12, "commands": 4})],
        jobs=jobs_from([step_telemetry(job="llm-pretrain-70b-" + "x" * 40)], [], T0),
        incidents=incidents_from([alert(node=f"gpu-node-{i:04d}", fp=f"fp-{i:09d}")
                                  for i in range(6)]),
        held=[HeldRow("a" * 32, "llm-pretrain-70b", "isolate['gpu-node-0001'] restart[]",
                      "slow", T0, 100.0)],
        notes=["consumer groups: members unknown (this broker cannot describe groups)"],
    )  # fmt: skip
    buf = io.StringIO()
    Console(file=buf, width=80, color_system=None).print(render_status(snap, 500))
    out = buf.getvalue()
    assert max(len(line) for line in out.splitlines()) <= 80, out
    assert "a" * 32 in out  # the action id to copy is never cut
    assert (
        "gpu-node-0000,gpu-node-0001,gpu-node-0002,+3" in out.replace("\n", "").replace(" ", "")
        or "+3" in out
    )


def test_markup_in_job_ids_nodes_and_paths_is_shown_as_text_never_parsed():
    """Issue 22 item 14: a job id ``[/x]`` made rich raise MarkupError, and
    ``[link=...]`` put a link into the operator's terminal. Every string is text."""
    link = "[link=https://evil.example/]job[/link]"
    snap = StatusSnapshot(
        at=T0, bootstrap="127.0.0.1:9092", services_from="[bold]/x/up.json",
        services=[ServiceRow("[/x]", "[red]running", 1, 0, 5.0, None, {})],
        jobs=jobs_from([step_telemetry(job="[/x]"), step_telemetry(job=link)], [], T0),
        incidents=incidents_from([alert(job="[/x]", node="[link=https://e.example/]n[/link]",
                                        incident="[/i]")]),
        held=[HeldRow("[/a]", link, "isolate['[/n]']", "slow", T0, 100.0)],
        notes=["[/note]"],
    )  # fmt: skip
    console = Console(file=io.StringIO(), width=200, color_system=None, record=True)
    console.print(render_status(snap, 500))
    out = console.export_text()
    for literal in ("[/x]", link, "[bold]/x/up.json", "[red]running", "[/a]", "[/i]",
                    "isolate['[/n]']", "[/note]"):  # fmt: skip
        assert literal in out, (literal, out)
    assert not [s for s in console._record_buffer if s.style is not None and s.style.link]


def test_incident_ids_are_shown_whole_where_an_operator_copies_them():
    """One display form (issue 41 item 3): the 24-hex key that `query incidents` prints
    and `report --incident` / `label` take, in `alerts` and in `status` alike."""
    from schemas.alerts import incident_key

    key = incident_key("job-1", "node-3", "straggler", 1_000)
    assert len(key) == 24
    assert alert_line(alert(incident=key)).plain.endswith(f"[incident {key}]")
    snap = StatusSnapshot(
        at=T0, bootstrap="127.0.0.1:9092", services_from="-", services=[], jobs=[],
        incidents=incidents_from([alert(incident=key)]), held=[],
    )  # fmt: skip
    buf = io.StringIO()
    Console(file=buf, width=80, color_system=None).print(render_status(snap, 500))
    assert key in buf.getvalue().replace("\n", "").replace(" ", "").replace("│", "")


def test_alerts_are_listed_by_the_time_they_show_not_by_arrival():
    """Issue 41: `alerts` printed in the broker's order (arrival) while each line shows
    the alert's event time: two workers, or a job whose clock leads, interleaved lines
    out of time order. The time a line shows orders them; arrival breaks a tie."""
    late = alert("fp-late-01", ts=T0 + timedelta(seconds=5))
    early = alert("fp-early-01", ts=T0 + timedelta(seconds=1))
    tie_b, tie_a = alert("fp-tie-b-01", ts=T0), alert("fp-tie-a-01", ts=T0)
    got = by_event_time([
        Decoded("d", 1, 7, 1_000, late), Decoded("d", 0, 3, 2_000, early),
        Decoded("d", 0, 4, 3_000, tie_b), Decoded("d", 1, 8, 2_500, tie_a),
    ])  # fmt: skip
    assert [d.message.fingerprint for d in got] == [
        "fp-tie-a-01",
        "fp-tie-b-01",
        "fp-early-01",
        "fp-late-01",
    ]
    lines = [alert_line(d.message).plain[:8] for d in got]  # type: ignore[arg-type]
    assert lines == sorted(lines)
