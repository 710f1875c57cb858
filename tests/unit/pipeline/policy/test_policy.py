"""The actuator's pure policy: confirmation, modes, every guardrail, the spare pool."""

from __future__ import annotations

import pickle
from datetime import timedelta

import pytest

from pipeline.io.errors import ConfigError
from pipeline.io.settings import load_settings
from pipeline.policy import Policy, PolicyParams, action_id
from schemas import (
    ActionState,
    ActuatorMode,
    Alert,
    AlertKind,
    AlertState,
    Approval,
    ApprovalDecision,
    Command,
    CommandKind,
    ControlMessage,
    Evidence,
    Grade,
    RecommendedAction,
    command_id,
)
from tests.clock import day_start

T0 = day_start(hour=12)
RA = RecommendedAction


def alert(
    fp="fp-node3-a", *, seq=0, grade=Grade.CRITICAL, state=AlertState.FIRING, node="node-3",
    step=100, ts=T0, started=T0, action=RA.REPLACE_AT_CHECKPOINT, kind=AlertKind.STRAGGLER,
    job="job-1", in_steps=True,
) -> Alert:  # fmt: skip
    return Alert(
        fingerprint=fp, seq=seq, kind=kind, grade=grade, state=state, job_id=job, node=node,
        rank=None, step=step, started_at=started, ts=ts,
        node_in_steps=in_steps if node is not None else None,
        evidence=Evidence(metric="compute_s", value=0.5, deviation=9.0),
        recommended_action=action, summary=f"{kind.value} on {node}",
    )  # fmt: skip


def auto(**kw) -> Policy:
    base = dict(
        mode=ActuatorMode.AUTO,
        spare_nodes=("spare-0", "spare-1", "spare-2"),
        max_isolations=10,
        max_isolation_pct=100,
        node_cooldown_s=600,
        window_s=3600,
    )
    base.update(kw)
    return Policy(PolicyParams(**base))  # fmt: skip


def kinds(out):
    return [(c.kind, c.targets, c.replacements) for c in out.commands]


def control(**kw) -> ControlMessage:
    return ControlMessage(change_id="c", by="test", ts=T0, **kw)


# -- confirmation and episodes -------------------------------------------------------------
def test_critical_with_a_spare_replaces_the_node_at_the_next_checkpoint():
    out = auto().on_alert(alert(), T0)
    assert kinds(out) == [
        (CommandKind.CHECKPOINT, (), ()),
        (CommandKind.ISOLATE, ("node-3",), ("spare-0",)),
        (CommandKind.RESTART, ("node-3",), ("spare-0",)),
    ]
    cmd = out.commands[0]
    assert cmd.mode is ActuatorMode.AUTO and cmd.reason == ("fp-node3-a",)
    assert cmd.expires_at == T0 + timedelta(seconds=300) and cmd.signature is None


def test_commands_and_hold_notices_carry_the_grade_of_their_alert():
    out = auto().on_alert(alert(grade=Grade.CRITICAL), T0)
    assert out.commands and {c.grade for c in out.commands} == {Grade.CRITICAL}
    held = auto(mode=ActuatorMode.APPROVE).on_alert(alert(grade=Grade.CRITICAL), T0)
    [notice] = held.commands
    assert notice.kind is CommandKind.NOTIFY and notice.grade is Grade.CRITICAL


def test_replayed_and_repeated_updates_issue_nothing_twice():
    p = auto()
    assert len(p.on_alert(alert(), T0).commands) == 3
    assert p.on_alert(alert(), T0).note == "duplicate"  # same (fingerprint, seq)
    assert p.on_alert(alert(seq=1, step=101), T0).commands == []  # later update, same action


def test_warning_confirms_only_after_it_persists_for_the_configured_steps():
    p = auto(warning_confirm_steps=20, warning_confirm_s=1e9)
    for seq, step in enumerate([100, 105, 119]):
        out = p.on_alert(alert(seq=seq, step=step, grade=Grade.WARNING), T0)
        assert out.commands == [] and out.note == "not confirmed"
    assert len(p.on_alert(alert(seq=3, step=120, grade=Grade.WARNING), T0).commands) == 3


def test_warning_confirms_after_the_configured_seconds_of_event_time():
    p = auto(warning_confirm_steps=1000, warning_confirm_s=60)
    assert p.on_alert(alert(grade=Grade.WARNING, ts=T0 + timedelta(seconds=59)), T0).commands == []
    out = p.on_alert(alert(seq=1, grade=Grade.WARNING, ts=T0 + timedelta(seconds=60)), T0)
    assert len(out.commands) == 3


def test_info_never_acts_and_escalation_to_critical_acts_at_once():
    p = auto()
    assert p.on_alert(alert(grade=Grade.INFO), T0).commands == []
    assert len(p.on_alert(alert(seq=1, grade=Grade.CRITICAL), T0).commands) == 3


def test_stale_alerts_are_ignored():
    p = auto(stale_alert_s=600)
    p.on_alert(alert("fp-other-1", node="node-9", action=RA.INVESTIGATE, ts=T0), T0)
    out = p.on_alert(alert(ts=T0 - timedelta(seconds=601)), T0)
    assert out.commands == [] and out.note == "stale"


def test_a_future_dated_alert_of_one_job_does_not_stale_another_jobs_alerts():
    p = auto(stale_alert_s=600)
    future = T0 + timedelta(days=1)
    p.on_alert(alert("fp-a-future", node="node-9", action=RA.INVESTIGATE, ts=future), T0)
    out = p.on_alert(alert(job="job-b", node="node-3", ts=T0), T0)
    assert out.note != "stale" and len(out.commands) == 3
    # the future-dated job's own older alerts are judged against its own newest
    out = p.on_alert(alert("fp-a-later", job="job-1", node="node-4", ts=T0), T0)
    assert out.commands == [] and out.note == "stale"


def test_newest_alert_times_per_job_are_forgotten_past_the_horizon():
    p = auto()
    for i in range(50):
        p.on_alert(alert(f"fp-job-{i:05d}", job=f"job-{i}", action=RA.NONE), T0)
    assert p.memory()["newest_ts"] == 50
    later = T0 + timedelta(seconds=p.horizon_s + 1)
    p.on_tick(later)
    assert p.memory()["newest_ts"] == 0


def test_own_guardrail_alerts_are_not_acted_on():
    out = auto().on_alert(alert(kind=AlertKind.GUARDRAIL, action=RA.ISOLATE), T0)
    assert out.commands == [] and out.note == "own guardrail alert"


# -- action mapping --------------------------------------------------------------------
def test_rollback_targets_the_last_checkpoint_before_the_episode():
    p = auto()
    p.on_alert(alert(grade=Grade.WARNING, step=500, action=RA.ROLLBACK, node=None), T0)
    out = p.on_alert(alert(seq=1, step=510, action=RA.ROLLBACK, node=None), T0)
    assert [(c.kind, c.checkpoint_step) for c in out.commands] == [(CommandKind.ROLLBACK, 499)]


def test_restart_excludes_the_dead_node_and_names_a_spare():
    out = auto().on_alert(alert(kind=AlertKind.HANG, action=RA.RESTART), T0)
    assert kinds(out) == [
        (CommandKind.ISOLATE, ("node-3",), ("spare-0",)),
        (CommandKind.RESTART, ("node-3",), ("spare-0",)),
    ]


def test_restart_of_a_whole_hung_job_isolates_nothing_and_takes_no_spare():
    p = auto()
    out = p.on_alert(alert(kind=AlertKind.HANG, action=RA.RESTART, node=None), T0)
    assert kinds(out) == [(CommandKind.RESTART, (), ())]
    assert p.isolations_in_window("job-1", T0) == 0
    assert p.spares == ["spare-0", "spare-1", "spare-2"]


def test_investigate_only_notifies():
    out = auto().on_alert(alert(action=RA.INVESTIGATE), T0)
    assert kinds(out) == [(CommandKind.NOTIFY, ("node-3",), ())]


def test_rebalance_advice_is_never_acted_on_in_any_grade_or_mode():
    # structural imbalance: the job owner moves layers; no node is isolated, no notice
    for grade in (Grade.INFO, Grade.WARNING, Grade.CRITICAL):
        for mode in ActuatorMode:
            p = auto(mode=mode)
            a = alert(grade=grade, action=RA.REBALANCE, kind=AlertKind.IMBALANCE, node=None)
            out = p.on_alert(a, T0)
            out.extend(p.on_alert(a.model_copy(update={"seq": 1, "step": 200}), T0))
            assert out.commands == [] and out.records == [], (grade, mode)


def test_no_spare_checkpoints_and_keeps_running_degraded():
    p = auto(spare_nodes=())
    out = p.on_alert(alert(), T0)
    assert kinds(out) == [(CommandKind.CHECKPOINT, (), ()), (CommandKind.NOTIFY, ("node-3",), ())]
    assert p.isolations_in_window("job-1", T0) == 0


def test_no_spare_checkpoints_at_most_once_per_interval_per_job():
    p = auto(spare_nodes=(), checkpoint_min_interval_s=600)
    first = p.on_alert(alert("fp-a-000001", node="node-3"), T0)
    again = p.on_alert(alert("fp-b-000002", node="node-4"), T0 + timedelta(seconds=60))
    later = p.on_alert(alert("fp-c-000003", node="node-5"), T0 + timedelta(seconds=700))
    assert [c.kind for c in first.commands] == [CommandKind.CHECKPOINT, CommandKind.NOTIFY]
    assert [c.kind for c in again.commands] == [CommandKind.NOTIFY]
    assert [c.kind for c in later.commands] == [CommandKind.CHECKPOINT, CommandKind.NOTIFY]


def test_a_job_is_relaunched_at_most_once_per_cooldown():
    p = auto(relaunch_cooldown_s=300)
    hang = dict(node=None, action=RA.RESTART, kind=AlertKind.HANG)
    first = p.on_alert(alert("fp-hang-0001", **hang), T0)
    again = p.on_alert(alert("fp-hang-0002", **hang), T0 + timedelta(seconds=30))
    later = p.on_alert(alert("fp-hang-0003", **hang), T0 + timedelta(seconds=400))
    assert [c.kind for c in first.commands] == [CommandKind.RESTART]
    assert again.commands == [] and "relaunched 30s ago" in again.records[0].detail
    assert [c.kind for c in later.commands] == [CommandKind.RESTART]


def test_a_node_replacement_does_not_block_a_later_rollback():
    p = auto(relaunch_cooldown_s=300)
    p.on_alert(alert("fp-node3-0001", node="node-3"), T0)  # replace: checkpoint+isolate+restart
    div = dict(node=None, action=RA.ROLLBACK, kind=AlertKind.DIVERGENCE)
    out = p.on_alert(alert("fp-div-00001", **div), T0 + timedelta(seconds=60))
    assert [c.kind for c in out.commands] == [CommandKind.ROLLBACK]


def test_no_spare_with_alert_policy_only_notifies():
    out = auto(spare_nodes=(), no_spare_policy="alert").on_alert(alert(), T0)
    assert kinds(out) == [(CommandKind.NOTIFY, ("node-3",), ())]


# -- guardrails --------------------------------------------------------------------------
def test_circuit_breaker_refuses_the_isolation_over_the_limit_and_raises_one_alert():
    p = auto(max_isolations=2)
    for i in range(2):
        assert len(p.on_alert(alert(f"fp-node{i}-x", node=f"node-{i}"), T0).commands) == 3
    out = p.on_alert(alert("fp-node5-x", node="node-5"), T0)
    assert out.commands == []
    [rec] = out.records
    assert rec.state is ActionState.REFUSED and "circuit breaker" in rec.detail
    [guard] = out.alerts
    assert (guard.kind, guard.grade, guard.state) == (
        AlertKind.GUARDRAIL, Grade.CRITICAL, AlertState.FIRING,
    )  # fmt: skip
    assert guard.job_id == "job-1" and guard.evidence.value == 2
    # open: refuses further isolations without a second alert
    out = p.on_alert(alert("fp-node6-x", node="node-6"), T0 + timedelta(seconds=1))
    assert out.commands == [] and out.alerts == [] and "open" in out.records[0].detail
    assert p.breaker_open("job-1")
    # notifications still flow while it is open
    assert (
        len(p.on_alert(alert("fp-node7-x", node="node-7", action=RA.INVESTIGATE), T0).commands) == 1
    )
    # after the window it closes (a RESOLVED guardrail alert) and isolations resume
    later = T0 + timedelta(seconds=3601)
    out = p.on_alert(alert("fp-node8-x", node="node-8", ts=later), later)
    assert [a.state for a in out.alerts] == [AlertState.RESOLVED]
    assert len(out.commands) == 3


def test_isolations_spread_over_many_jobs_stop_at_the_global_budget_with_one_alert():
    p = auto(max_isolations=1, max_isolations_global=3, spare_nodes=(),
             no_spare_policy="checkpoint")  # fmt: skip
    restart = dict(action=RA.RESTART)
    isolated = 0
    guards = []
    for i in range(8):  # invented job ids, one isolation each: the per-job breaker never trips
        out = p.on_alert(
            alert(f"fp-glob-{i:04d}", job=f"fake-{i}", node=f"node-{i}", **restart), T0
        )
        isolated += sum(c.kind is CommandKind.ISOLATE for c in out.commands)
        guards += out.alerts
        if i >= 3:
            assert out.records[0].state is ActionState.REFUSED
            assert "global isolation budget" in out.records[0].detail
    assert isolated == 3
    [guard] = guards  # one guardrail alert, not one per job
    assert (guard.kind, guard.state) == (AlertKind.GUARDRAIL, AlertState.FIRING)
    assert "global isolation budget" in guard.summary and p.global_breaker_open
    assert not any(p.breaker_open(f"fake-{i}") for i in range(8))
    # it closes after the window (one RESOLVED alert) and isolations resume
    later = T0 + timedelta(seconds=3601)
    out = p.on_alert(alert("fp-glob-0009", job="fake-9", node="node-9", ts=later, **restart), later)
    assert [a.state for a in out.alerts] == [AlertState.RESOLVED]
    assert [c.kind for c in out.commands] == [CommandKind.ISOLATE, CommandKind.RESTART]


def test_reset_breaker_also_closes_the_global_budget():
    p = auto(max_isolations_global=0)
    assert [a.state for a in p.on_alert(alert(), T0).alerts] == [AlertState.FIRING]
    out = p.on_control(control(reset_breaker=True), T0)
    assert [a.state for a in out.alerts] == [AlertState.RESOLVED] and not p.global_breaker_open


def rebuilt(p: Policy, outs, controls=()) -> Policy:
    """A fresh policy restored from ``p``'s commands and records, then ``controls``
    replayed, as the actuator's start-up rebuild does."""
    q = Policy(p.params)
    for out in outs:
        for cmd in out.commands:
            q.restore_command(cmd)
        for rec in out.records:
            q.restore_record(rec)
    for msg in controls:
        q.on_control(msg, T0 + timedelta(seconds=60), replay=True)
    q.prune(T0 + timedelta(seconds=60), full=True)
    return q


def test_a_replayed_reset_breaker_does_not_close_a_breaker_that_tripped_after_it():
    p = auto(max_isolations=1)
    yesterday = ControlMessage(change_id="c0", by="t", ts=T0 - timedelta(days=1),
                               reset_breaker=True)  # fmt: skip
    outs = [p.on_alert(alert(), T0), p.on_alert(alert("fp-node5-x", node="node-5"), T0)]
    assert p.breaker_open("job-1")
    q = rebuilt(p, outs, [yesterday])
    assert q.breaker_open("job-1")  # reopened from the refusal; the old reset not replayed
    # the rebuilt breaker resolves under its original fingerprint when its window ends
    [guard] = outs[1].alerts
    later = T0 + timedelta(seconds=3601)
    [closed] = q.on_tick(later).alerts
    assert (closed.fingerprint, closed.state) == (guard.fingerprint, AlertState.RESOLVED)
    # a reset sent after the trip still holds after a restart
    after = ControlMessage(change_id="c1", by="t", ts=T0 + timedelta(seconds=30),
                           reset_breaker=True)  # fmt: skip
    assert not rebuilt(p, outs, [after]).breaker_open("job-1")
    # live, a reset closes whatever is open
    assert p.on_control(control(reset_breaker=True), T0 - timedelta(days=1)).alerts
    assert not p.breaker_open("job-1")


def test_the_global_budget_is_rebuilt_from_its_refusal():
    p = auto(max_isolations_global=1)
    outs = [
        p.on_alert(alert(), T0),
        p.on_alert(alert("fp-other-x", job="job-2", node="node-7"), T0),
    ]
    assert p.global_breaker_open and rebuilt(p, outs).global_breaker_open
    old = rebuilt(p, outs)
    old.prune(T0 + timedelta(seconds=3601), full=True)  # its window is over
    assert not old.global_breaker_open


def test_isolations_and_restarts_name_the_nodes_seen_in_alerts_of_their_job():
    p = auto()
    p.on_alert(alert("fp-seen-node1", node="node-1", action=RA.NONE), T0)
    p.on_alert(alert("fp-other-job", job="job-2", node="node-9", action=RA.NONE), T0)
    out = p.on_alert(alert(), T0)
    hints = {c.kind: c.job_nodes for c in out.commands}
    assert hints == {
        CommandKind.CHECKPOINT: None,
        CommandKind.ISOLATE: ("node-1", "node-3"),
        CommandKind.RESTART: ("node-1", "node-3"),
    }
    assert p.memory()["job_node_sets"] == 2
    p.on_tick(T0 + timedelta(seconds=p.horizon_s + 1))
    assert p.memory()["job_node_sets"] == 0


def test_circuit_breaker_counts_a_percentage_of_the_job():
    p = auto(max_isolations=10, max_isolation_pct=5.0, default_job_nodes=40)  # 5% of 40 = 2
    assert p.isolation_limit("job-1") == 2
    p.on_control(control(job_id="job-1", job_nodes=20), T0)  # 5% of 20 = 1
    assert p.isolation_limit("job-1") == 1
    assert len(p.on_alert(alert("fp-a-000001", node="node-1"), T0).commands) == 3
    out = p.on_alert(alert("fp-b-000002", node="node-2"), T0)
    assert out.commands == [] and out.alerts[0].kind is AlertKind.GUARDRAIL


def test_control_can_reset_an_open_breaker():
    p = auto(max_isolations=0)
    assert p.on_alert(alert(), T0).alerts
    out = p.on_control(control(reset_breaker=True, guard_max_isolations=1), T0)
    assert [a.state for a in out.alerts] == [AlertState.RESOLVED]
    assert len(p.on_alert(alert("fp-new-00001", node="node-4"), T0).commands) == 3


def test_per_node_cooldown():
    p = auto(node_cooldown_s=600)
    assert p.on_alert(alert("fp-first-001"), T0).commands
    out = p.on_alert(alert("fp-second-01"), T0 + timedelta(seconds=599))
    assert out.commands == [] and "cooling down" in out.records[0].detail
    assert out.alerts == []  # a cooldown is not a breaker
    assert p.on_alert(alert("fp-third-001"), T0 + timedelta(seconds=600)).commands


def test_spares_are_used_once_and_a_twice_isolated_node_goes_to_repair():
    p = auto(spare_nodes=("spare-0", "spare-1"), node_cooldown_s=0)
    p.on_alert(alert("fp-a-000001", node="node-1"), T0)
    assert p.spares == ["spare-1"]
    # node-1 comes back as a spare, fails again within the window -> repair, never a spare
    p.on_control(control(spare_nodes=("node-1", "spare-1")), T0)
    out = p.on_alert(alert("fp-b-000002", node="node-2"), T0 + timedelta(seconds=1))
    assert kinds(out)[1] == (CommandKind.ISOLATE, ("node-2",), ("node-1",))
    out = p.on_alert(alert("fp-c-000003", node="node-1"), T0 + timedelta(seconds=2))
    assert kinds(out)[1] == (CommandKind.ISOLATE, ("node-1",), ("spare-1",))
    assert "node-1" in p.repair
    p.on_control(control(spare_nodes=("node-1",)), T0)
    assert p.spares == []
    out = p.on_alert(alert("fp-d-000004", node="node-4"), T0 + timedelta(seconds=3))
    # no spare left (node-1 is in repair); the replacements just checkpointed the job
    assert kinds(out) == [(CommandKind.NOTIFY, ("node-4",), ())]


# -- modes -------------------------------------------------------------------------------
def test_observe_mode_records_what_it_would_do_and_issues_nothing():
    p = auto(mode=ActuatorMode.OBSERVE)
    out = p.on_alert(alert(), T0)
    assert out.commands == []
    [rec] = out.records
    assert rec.state is ActionState.OBSERVED and rec.detail == "would be issued"
    assert [c.kind for c in rec.commands] == [
        CommandKind.CHECKPOINT, CommandKind.ISOLATE, CommandKind.RESTART,
    ]  # fmt: skip
    assert p.spares == ["spare-0", "spare-1", "spare-2"]  # nothing consumed
    assert p.on_alert(alert(seq=1), T0).records == []  # recorded once per action
    # switched to auto at runtime: the still-firing episode now acts
    p.on_control(control(mode=ActuatorMode.AUTO), T0)
    assert len(p.on_alert(alert(seq=2), T0).commands) == 3


def test_approve_mode_holds_until_approved():
    p = auto(mode=ActuatorMode.APPROVE)
    out = p.on_alert(alert(), T0)
    assert [c.kind for c in out.commands] == [CommandKind.NOTIFY]  # the hold, for people
    assert out.records[0].state is ActionState.HELD
    aid = out.records[0].action_id
    assert aid == action_id("fp-node3-a", RA.REPLACE_AT_CHECKPOINT, "node-3")
    assert [r.action_id for r in p.held] == [aid]
    ok = Approval(action_id=aid, decision=ApprovalDecision.APPROVE, by="sre", ts=T0, held_at=T0)
    out = p.on_approval(ok, T0 + timedelta(seconds=5))
    assert [r.state for r in out.records] == [ActionState.APPROVED]
    assert [(a.state, a.evidence.detail) for a in out.alerts] == [
        (AlertState.RESOLVED, "approved by sre")
    ]
    assert len(out.commands) == 3 and {c.mode for c in out.commands} == {ActuatorMode.APPROVE}
    assert out.commands[0].issued_at == T0 + timedelta(seconds=5)
    assert p.held == [] and p.on_approval(ok, T0).commands == []  # approving twice: nothing


# -- per-kind modes ---------------------------------------------------------------------
def test_a_kind_in_auto_acts_while_the_others_wait_for_approval():
    p = auto(mode=ActuatorMode.APPROVE,
             action_modes=((RA.REPLACE_AT_CHECKPOINT, ActuatorMode.AUTO),))  # fmt: skip
    out = p.on_alert(alert(), T0)  # straggler replacement: auto
    assert len(out.commands) == 3 and {c.mode for c in out.commands} == {ActuatorMode.AUTO}
    assert p.held == []
    restart = alert("fp-node5-r", node="node-5", action=RA.RESTART, kind=AlertKind.HANG)
    out = p.on_alert(restart, T0)  # restarts: the global approve
    assert [r.state for r in out.records] == [ActionState.HELD]
    assert [c.kind for c in out.commands] == [CommandKind.NOTIFY]
    assert out.records[0].mode is ActuatorMode.APPROVE


def test_a_kind_can_be_held_back_under_auto_and_observed_alone():
    p = auto(action_modes=((RA.RESTART, ActuatorMode.APPROVE),
                           (RA.REPLACE_AT_CHECKPOINT, ActuatorMode.OBSERVE)))  # fmt: skip
    out = p.on_alert(alert(), T0)
    assert out.commands == [] and [r.state for r in out.records] == [ActionState.OBSERVED]
    assert p.spares == ["spare-0", "spare-1", "spare-2"]
    restart = alert("fp-node5-r", node="node-5", action=RA.RESTART, kind=AlertKind.HANG)
    assert [r.state for r in p.on_alert(restart, T0).records] == [ActionState.HELD]


def test_a_global_observe_stops_every_kind_whatever_its_override():
    p = auto(mode=ActuatorMode.OBSERVE,
             action_modes=((RA.REPLACE_AT_CHECKPOINT, ActuatorMode.AUTO),))  # fmt: skip
    out = p.on_alert(alert(), T0)
    assert out.commands == [] and out.records[0].state is ActionState.OBSERVED


def test_control_sets_and_clears_per_kind_modes_and_they_survive_a_pickle():
    p = auto(mode=ActuatorMode.APPROVE)
    p.on_control(control(action_modes={"replace_at_checkpoint": "auto", "restart": "approve"}), T0)
    assert p.params.action_modes == (
        (RA.REPLACE_AT_CHECKPOINT, ActuatorMode.AUTO), (RA.RESTART, ActuatorMode.APPROVE),
    )  # fmt: skip
    p.on_control(control(mode=ActuatorMode.AUTO), T0)  # other fields keep the overrides
    assert dict(p.params.action_modes)[RA.RESTART] is ActuatorMode.APPROVE
    p.on_control(control(action_modes={"restart": "default"}), T0)
    assert p.params.action_modes == ((RA.REPLACE_AT_CHECKPOINT, ActuatorMode.AUTO),)
    assert pickle.loads(pickle.dumps(p)).params == p.params
    assert len(p.on_alert(alert(), T0).commands) == 3


def test_per_kind_modes_are_validated():
    with pytest.raises(ValueError, match="twice"):
        PolicyParams(action_modes=((RA.RESTART, ActuatorMode.AUTO),
                                   (RA.RESTART, ActuatorMode.APPROVE)))  # fmt: skip
    with pytest.raises(ValueError, match="action_modes"):
        PolicyParams(action_modes=(("restart", "auto"),))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="action_modes"):
        control(action_modes={"reboot": "auto"})
    with pytest.raises(ValueError, match="action_modes"):
        control(action_modes={"restart": "sometimes"})


def test_held_action_of_a_kind_switched_to_observe_is_refused_on_approval():
    p = auto(mode=ActuatorMode.APPROVE)
    aid = p.on_alert(alert(), T0).records[0].action_id
    p.on_control(control(action_modes={"replace_at_checkpoint": "observe"}), T0)
    ok = Approval(action_id=aid, decision=ApprovalDecision.APPROVE, by="sre", ts=T0, held_at=T0)
    out = p.on_approval(ok, T0)
    assert out.commands == [] and out.records[0].state is ActionState.REFUSED


def test_approve_mode_reject_and_notifications_need_no_approval():
    p = auto(mode=ActuatorMode.APPROVE)
    assert len(p.on_alert(alert("fp-inv-00001", action=RA.INVESTIGATE), T0).commands) == 1
    aid = p.on_alert(alert(), T0).records[0].action_id
    no = Approval(
        action_id=aid, decision=ApprovalDecision.REJECT, by="sre", reason="fp", ts=T0, held_at=T0
    )
    out = p.on_approval(no, T0)
    assert out.commands == [] and out.records[0].state is ActionState.REJECTED
    assert out.records[0].detail == "fp" and out.records[0].by == "sre"


def test_resolved_episode_cancels_its_held_action():
    p = auto(mode=ActuatorMode.APPROVE)
    aid = p.on_alert(alert(), T0).records[0].action_id
    out = p.on_alert(alert(seq=1, state=AlertState.RESOLVED), T0)
    assert [(r.action_id, r.state) for r in out.records] == [(aid, ActionState.CANCELLED)]
    ok = Approval(action_id=aid, decision=ApprovalDecision.APPROVE, by="sre", ts=T0, held_at=T0)
    assert p.on_approval(ok, T0).commands == []


def test_approval_rechecks_the_guardrails():
    p = auto(mode=ActuatorMode.APPROVE, max_isolations=1)
    held = [p.on_alert(alert(f"fp-n{i}-0000", node=f"node-{i}"), T0).records[0] for i in range(2)]
    ok = [Approval(action_id=h.action_id, decision=ApprovalDecision.APPROVE, by="s", ts=T0,
                   held_at=T0) for h in held]  # fmt: skip
    assert len(p.on_approval(ok[0], T0).commands) == 3
    out = p.on_approval(ok[1], T0)
    assert out.commands == [] and out.records[0].state is ActionState.REFUSED
    assert out.alerts[0].kind is AlertKind.GUARDRAIL


# -- state -------------------------------------------------------------------------------
def test_rebuilt_from_issued_commands_a_policy_repeats_nothing_and_keeps_its_ledger():
    first = auto(max_isolations=1)
    issued = first.on_alert(alert(), T0).commands
    fresh = auto(max_isolations=1)
    for cmd in issued:
        fresh.restore_command(cmd)
    assert fresh.on_alert(alert(), T0).commands == []  # replayed decision
    assert fresh.spares == ["spare-1", "spare-2"]
    out = fresh.on_alert(alert("fp-other-001", node="node-8"), T0)
    assert out.commands == [] and out.alerts  # the restored isolation still counts


def test_policy_pickles_mid_episode():
    p = auto(warning_confirm_steps=10, warning_confirm_s=1e9)
    p.on_alert(alert(grade=Grade.WARNING, step=100), T0)
    q = pickle.loads(pickle.dumps(p))
    assert len(q.on_alert(alert(seq=1, grade=Grade.WARNING, step=110), T0).commands) == 3


def test_params_from_settings_and_validation():
    s = load_settings({}, actuator_mode="approve", spare_nodes="a, b", guard_max_isolations=2)
    params = PolicyParams.from_settings(s)
    assert params.mode is ActuatorMode.APPROVE and params.spare_nodes == ("a", "b")
    assert params.max_isolations == 2
    with pytest.raises(ValueError, match="window_s"):
        PolicyParams(window_s=0)


@pytest.mark.parametrize(
    "module",
    [
        "pipeline.policy",
        "pipeline.policy.guardrails",
        "pipeline.policy.ledger",
        "pipeline.policy.memory",
        "pipeline.io.trust",
        "pipeline.services.actuator.executors",
    ],
)
def test_docstring_examples_run(module):
    import doctest
    import importlib

    mod = importlib.import_module(module)
    failed, _ = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert failed == 0


def test_a_warning_confirms_from_the_jobs_progress_without_a_new_update():
    p = auto(warning_confirm_steps=20, warning_confirm_s=10_000)
    assert p.on_alert(alert(grade=Grade.WARNING, step=100), T0).commands == []
    assert p.on_progress("job-1", 110, T0, T0).commands == []
    assert p.on_progress("job-2", 130, T0, T0).commands == []  # another job's progress
    out = p.on_progress("job-1", 120, T0, T0)
    assert [c.kind for c in out.commands] == [
        CommandKind.CHECKPOINT, CommandKind.ISOLATE, CommandKind.RESTART,
    ]  # fmt: skip
    assert p.on_progress("job-1", 121, T0, T0).commands == []  # decided once


# -- held actions: announced, expiring -------------------------------------------------
def test_a_hold_is_announced_to_the_webhook_and_on_the_decisions_topic():
    p = auto(mode=ActuatorMode.APPROVE)
    fired = alert(ts=T0 + timedelta(seconds=42)).model_copy(update={"rank": 27})
    out = p.on_alert(fired, T0 + timedelta(seconds=45))
    [held] = out.records
    [notify] = out.commands
    [notice] = out.alerts
    aid = held.action_id
    assert notify.kind is CommandKind.NOTIFY and notify.targets == ("node-3",)
    assert notify.expires_at == T0 + timedelta(seconds=45 + 1800)  # as long as the hold
    for text in (notify.summary, notice.summary):
        assert text.startswith(f"waiting for approval: {aid}")
        assert "straggler critical on node node-3 rank 27, firing for 42s" in text
    assert (notice.kind, notice.grade, notice.state) == (
        AlertKind.GUARDRAIL, Grade.CRITICAL, AlertState.FIRING,
    )  # fmt: skip
    assert (notice.node, notice.rank, notice.evidence.value) == ("node-3", 27, 42.0)
    assert p.on_alert(notice, T0).note == "own guardrail alert"  # read back: ignored
    assert p.on_alert(fired.model_copy(update={"seq": 1}), T0).commands == []  # once


def test_a_hold_nobody_decides_expires_with_an_archived_record():
    p = auto(mode=ActuatorMode.APPROVE, hold_ttl_s=1800)
    aid = p.on_alert(alert(), T0).records[0].action_id
    assert p.on_tick(T0 + timedelta(seconds=1799)).records == []
    out = p.on_tick(T0 + timedelta(seconds=1800))
    [expired] = out.records
    assert (expired.action_id, expired.state) == (aid, ActionState.CANCELLED)
    assert expired.detail.startswith("expired") and expired.alert is not None
    assert [(a.state, a.seq) for a in out.alerts] == [(AlertState.RESOLVED, 1)]
    assert p.held == [] and p.on_tick(T0 + timedelta(seconds=1801)).records == []
    ok = Approval(action_id=aid, decision=ApprovalDecision.APPROVE, by="sre", ts=T0, held_at=T0)
    late = p.on_approval(ok, T0 + timedelta(seconds=1802))
    assert late.commands == [] and late.note == "no such held action"


def test_an_approval_after_the_ttl_finds_the_hold_expired_even_without_a_tick():
    p = auto(mode=ActuatorMode.APPROVE, hold_ttl_s=60)
    aid = p.on_alert(alert(), T0).records[0].action_id
    ok = Approval(action_id=aid, decision=ApprovalDecision.APPROVE, by="sre", ts=T0, held_at=T0)
    out = p.on_approval(ok, T0 + timedelta(seconds=61))
    assert out.commands == [] and [r.state for r in out.records] == [ActionState.CANCELLED]
    assert out.records[0].detail.startswith("expired")


def test_a_rebuilt_hold_older_than_the_ttl_expires_at_the_first_tick():
    first = auto(mode=ActuatorMode.APPROVE)
    held = first.on_alert(alert(), T0).records[0]
    fresh = auto(mode=ActuatorMode.APPROVE)
    fresh.restore_record(held)
    assert [r.action_id for r in fresh.held] == [held.action_id]
    [expired] = fresh.on_tick(T0 + timedelta(hours=5)).records
    assert expired.state is ActionState.CANCELLED and expired.detail.startswith("expired")


def test_a_resolved_episode_resolves_its_hold_notice():
    p = auto(mode=ActuatorMode.APPROVE)
    p.on_alert(alert(), T0)
    out = p.on_alert(alert(seq=1, state=AlertState.RESOLVED), T0)
    assert [(a.kind, a.state) for a in out.alerts] == [(AlertKind.GUARDRAIL, AlertState.RESOLVED)]


# -- bounded memory --------------------------------------------------------------------
class _Unpruned(Policy):
    """The reference: remembers everything forever."""

    def prune(self, now, *, full=False):
        pass


def _decisions(out):
    return (
        [(c.command_id, c.kind, c.targets, c.replacements, c.issued_at) for c in out.commands],
        [(r.action_id, r.state, r.detail) for r in out.records],
        [(a.fingerprint, a.seq, a.state) for a in out.alerts],
    )


def _traffic(seed=7, jobs=10, hours=8, every_s=20):
    """Alerts of many episodes on many jobs and nodes: new episodes of every action,
    WARNINGs that confirm later, updates and replays of recent episodes, resolutions."""
    import random

    rng = random.Random(seed)
    recent: list[Alert] = []
    steps = dict.fromkeys(range(jobs), 0)
    for i in range(hours * 3600 // every_s):
        now = T0 + timedelta(seconds=i * every_s)
        recent = [a for a in recent if (now - a.started_at).total_seconds() < 1200]
        j = rng.randrange(jobs)
        steps[j] += rng.randrange(1, 30)
        roll = rng.random()
        if recent and roll < 0.15:  # a replay of a recent update
            yield rng.choice(recent), now
            continue
        if recent and roll < 0.3:  # a later update, maybe the end, of a recent episode
            prev = rng.choice(recent)
            state = AlertState.RESOLVED if rng.random() < 0.4 else AlertState.FIRING
            upd = prev.model_copy(update={"seq": prev.seq + 1, "ts": now, "state": state,
                                          "grade": Grade.CRITICAL})  # fmt: skip
            recent.remove(prev)
            if state is AlertState.FIRING:
                recent.append(upd)
            yield upd, now
            continue
        action = rng.choice([RA.INVESTIGATE, RA.REPLACE_AT_CHECKPOINT, RA.RESTART, RA.ROLLBACK])
        node = None if action is RA.ROLLBACK else f"j{j}-n{rng.randrange(16)}"
        grade = Grade.WARNING if rng.random() < 0.3 else Grade.CRITICAL
        new = alert(f"fp-{i:08d}", job=f"job-{j}", node=node, step=steps[j], ts=now,
                    started=now, action=action, grade=grade)  # fmt: skip
        recent.append(new)
        yield new, now


def test_memory_stays_bounded_over_hours_and_no_decision_changes():
    kw = dict(spare_nodes=tuple(f"spare-{i}" for i in range(400)), max_isolations=3,
              node_cooldown_s=1800, window_s=3600, warning_confirm_s=300)  # fmt: skip
    pruned, reference = auto(**kw), auto(**kw)
    reference.__class__ = _Unpruned
    peak: dict[str, int] = {}
    isolated: dict[str, int] = {}
    for a, now in _traffic():
        outs = []
        for p in (pruned, reference):
            out = p.on_alert(a, now)
            out.extend(p.on_progress(a.job_id, a.step, a.ts, now))
            out.extend(p.on_tick(now))
            outs.append(_decisions(out))
        assert outs[0] == outs[1], (a.fingerprint, now)
        for cmd in outs[0][0]:
            if cmd[1] is CommandKind.ISOLATE:
                isolated[cmd[0]] = isolated.get(cmd[0], 0) + 1
        if now - T0 > timedelta(hours=2):
            for k, v in pruned.memory().items():
                peak[k] = max(peak.get(k, 0), v)
    per_horizon = 3600 // 20  # inputs within one horizon (3600 s)
    assert pruned.horizon_s == 3600
    assert peak["episodes"] <= per_horizon and peak["issued"] <= 4 * per_horizon
    assert peak["actions"] <= per_horizon and peak["isolations"] <= per_horizon
    assert peak["node_cooldowns"] <= 160 and peak["checkpoints"] <= 10
    assert pruned.evicted == 0  # time did the bounding, not the cap
    big = reference.memory()
    assert big["episodes"] > 4 * peak["episodes"] and big["issued"] > 4 * peak["issued"]
    assert isolated and set(isolated.values()) == {1}  # no episode isolated twice
    assert any(rec.state is ActionState.REFUSED for rec in reference.actions.values())


def test_the_breaker_still_counts_its_whole_window_while_other_jobs_churn():
    p = auto(max_isolations=2, window_s=3600, node_cooldown_s=0)
    assert p.on_alert(alert("fp-a-000001", node="node-1"), T0).commands
    churn = T0
    for i in range(200):  # other jobs' episodes for 50 minutes: pruning runs throughout
        churn = T0 + timedelta(seconds=15 * i)
        churned = alert(f"fp-x{i:06d}", job=f"other-{i}", node=f"o{i}", ts=churn,
                        action=RA.INVESTIGATE)  # fmt: skip
        assert p.on_alert(churned, churn).commands
    at = T0 + timedelta(minutes=55)
    assert p.on_alert(alert("fp-b-000002", node="node-2", ts=at), at).commands
    out = p.on_alert(alert("fp-c-000003", node="node-3", ts=at), at)
    assert out.commands == [] and "2 isolations in the last 3600s" in out.records[0].detail
    later = T0 + timedelta(seconds=3601)  # the first isolation left the window
    assert p.isolations_in_window("job-1", later) == 1


def test_repair_marks_outlive_the_horizon_but_are_capped_oldest_first():
    p = auto(spare_nodes=(), node_cooldown_s=0, max_tracked=3, no_spare_policy="alert")
    for i in range(5):  # node-i isolated twice within a window -> repair
        for seq in range(2):
            t = T0 + timedelta(hours=10 * i, seconds=seq)
            p.restore_command(isolation(f"fp-{i}-{seq}-00", f"node-{i}", t))
    p.on_tick(T0 + timedelta(hours=45))
    assert list(p.repair) == ["node-2", "node-3", "node-4"]  # 0 and 1: oldest, dropped
    assert p.evicted >= 2
    p.on_control(control(spare_nodes=("node-4", "node-9")), T0)
    assert p.spares == ["node-9"]  # remembered after 5+ hours of pruning


def isolation(fp, node, ts) -> Command:
    return Command(
        command_id=command_id([fp], "isolate", [node]), kind=CommandKind.ISOLATE,
        job_id="job-1", targets=(node,), reason=(fp,), mode=ActuatorMode.AUTO, issued_at=ts,
        expires_at=ts + timedelta(seconds=300),
    )  # fmt: skip


def test_the_hard_cap_bounds_an_alert_storm_within_the_horizon():
    p = auto(max_tracked=50, spare_nodes=())
    for i in range(500):
        now = T0 + timedelta(seconds=i)
        p.on_alert(alert(f"fp-{i:08d}", node=f"n{i}", ts=now, action=RA.INVESTIGATE), now)
    assert max(p.memory().values()) <= 50 and p.evicted > 0


# -- per-kind modes on the command line (control, pending) ---------------------------------
def test_control_mode_for_options_become_action_modes():
    import typer

    from pipeline.cli.actuator import _action_modes

    assert _action_modes(None) is None
    assert _action_modes(["replace_at_checkpoint=auto", "restart = default"]) == {
        "replace_at_checkpoint": "auto", "restart": "default",
    }  # fmt: skip
    for bad in ("restart", "reboot=auto", "restart=sometimes"):
        with pytest.raises(typer.BadParameter, match="KIND=MODE"):
            _action_modes([bad])


def test_pending_header_folds_only_signed_fresh_control_changes():
    from pipeline.cli.actuator import fold_control, modes_line
    from pipeline.io.trust import SigningKey, sign

    op, other = SigningKey.generate("op-1"), SigningKey.generate("intruder")
    base = PolicyParams(mode=ActuatorMode.APPROVE)

    def change(cid, minutes, key=op, **kw):
        msg = ControlMessage(change_id=cid, by="sre", ts=T0 + timedelta(minutes=minutes), **kw)
        return sign(msg, key)

    msgs = [
        change("a", 1, action_modes={"replace_at_checkpoint": "auto"}),
        change("b", 2, key=other, mode=ActuatorMode.AUTO),  # not an operator's key
        change("c", 0, action_modes={"restart": "auto"}),  # older than the last applied
        change("d", 3, action_modes={"restart": "observe"}),
        change("d", 4, mode=ActuatorMode.OBSERVE),  # a change id already applied
    ]
    params, ignored = fold_control(base, msgs, op.verifier())
    assert ignored == 3 and params.mode is ActuatorMode.APPROVE
    assert params.action_modes == (
        (RA.REPLACE_AT_CHECKPOINT, ActuatorMode.AUTO), (RA.RESTART, ActuatorMode.OBSERVE),
    )  # fmt: skip
    assert modes_line(params) == (
        "actuator mode approve; per-kind overrides: replace_at_checkpoint=auto, restart=observe"
    )
    assert modes_line(base) == "actuator mode approve; per-kind overrides: none"


def test_per_kind_modes_come_from_the_settings_and_bad_ones_are_named():
    modes = "replace_at_checkpoint=auto, restart=observe"
    s = load_settings(
        {"STEPGUARD_ACTUATOR_MODE": "approve", "STEPGUARD_ACTUATOR_ACTION_MODES": modes}
    )
    params = PolicyParams.from_settings(s)
    assert params.action_modes == (
        (RA.REPLACE_AT_CHECKPOINT, ActuatorMode.AUTO), (RA.RESTART, ActuatorMode.OBSERVE),
    )  # fmt: skip
    for bad in ("restart=sometimes", "reboot=auto", "restart", "restart=auto,restart=approve"):
        with pytest.raises(ConfigError, match="STEPGUARD_ACTUATOR_ACTION_MODES"):
            load_settings({"STEPGUARD_ACTUATOR_ACTION_MODES": bad})


def test_an_isolation_targets_only_a_node_the_jobs_steps_showed():
    """Issue 22 item 3: the alert's own node is not added to the job's nodes before
    planning. A health alert naming a node the job's steps never showed is an alert only;
    a member's isolation carries the members (not the outsider) for the executors."""
    p = auto()
    outsider = alert("fp-outsider", node="node-99", kind=AlertKind.HARDWARE, in_steps=False)
    out = p.on_alert(outsider, T0)
    assert [(c.kind, c.targets) for c in out.commands] == [(CommandKind.NOTIFY, ("node-99",))]
    assert p.spares == ["spare-0", "spare-1", "spare-2"]  # nothing taken from the job
    member = alert("fp-member3", node="node-3", kind=AlertKind.HARDWARE)
    [iso] = [c for c in p.on_alert(member, T0).commands if c.kind is CommandKind.ISOLATE]
    assert iso.targets == ("node-3",) and iso.job_nodes == ("node-3",)
    # a rank's alert is evidence of the steps too (its steps came from that node)
    ranked = alert("fp-ranked4", node="node-4", in_steps=None).model_copy(update={"rank": 33})
    assert CommandKind.ISOLATE in [c.kind for c in p.on_alert(ranked, T0).commands]


def test_a_node_replacement_counts_for_the_relaunch_cooldown_of_restarts():
    """Issue 25 bug 2: the relaunch cooldown ignored node-replacement restarts, so the
    false hang of the relaunch after a replacement went through as a second RESTART."""
    p = auto(relaunch_cooldown_s=300)
    replaced = p.on_alert(alert("fp-node3-0001", node="node-3"), T0)
    assert CommandKind.RESTART in [c.kind for c in replaced.commands]
    hang = dict(node=None, action=RA.RESTART, kind=AlertKind.HANG)
    again = p.on_alert(alert("fp-hang-0001", **hang), T0 + timedelta(seconds=20))
    assert again.commands == [] and "relaunched 20s ago" in again.records[0].detail
    later = p.on_alert(alert("fp-hang-0002", **hang), T0 + timedelta(seconds=400))
    assert [c.kind for c in later.commands] == [CommandKind.RESTART]


def test_an_approval_decides_only_the_hold_it_names():
    """Issue 22: an approval was not bound to one hold: replayed once the action record
    aged out, it approved a later hold of the same action."""
    p = auto(mode=ActuatorMode.APPROVE, hold_ttl_s=60)
    aid = p.on_alert(alert(), T0).records[0].action_id
    unbound = Approval(action_id=aid, decision=ApprovalDecision.APPROVE, by="sre", ts=T0)
    assert p.on_approval(unbound, T0).note == "names no hold"
    p.on_tick(T0 + timedelta(seconds=61))  # the first hold expires undecided
    later = T0 + timedelta(seconds=p.horizon_s + 100)  # its record has aged out
    again = p.on_alert(alert(seq=1, ts=later), later)  # the episode fires again: held
    [rehold] = [r for r in again.records if r.state is ActionState.HELD]
    old = Approval(action_id=aid, decision=ApprovalDecision.APPROVE, by="sre", ts=T0,
                   held_at=T0)  # the first hold's approval, replayed  # fmt: skip
    assert p.on_approval(old, later).note == "approval of another hold"
    ok = old.model_copy(update={"held_at": rehold.ts})
    assert len(p.on_approval(ok, later).commands) == 3


def test_an_episode_read_back_after_a_restart_still_confirms_from_progress():
    """Issue 22 item 9: the actuator did not rebuild episodes when it restarted; alerts
    are sent on transitions only, so a WARNING firing before the restart never
    confirmed afterwards."""
    warning = alert("fp-warn-0001", grade=Grade.WARNING, step=100)
    before = auto(warning_confirm_steps=20, warning_confirm_s=10_000)
    assert before.on_alert(warning, T0).commands == []  # not confirmed yet
    after = auto(warning_confirm_steps=20, warning_confirm_s=10_000)  # a restarted actuator
    after.restore_alert(warning, T0 + timedelta(seconds=5))
    assert after.on_alert(warning, T0 + timedelta(seconds=6)).note == "duplicate"
    out = after.on_progress("job-1", 125, T0 + timedelta(seconds=30), T0 + timedelta(seconds=30))
    assert CommandKind.ISOLATE in [c.kind for c in out.commands]


# -- what the metrics count (issue 24: actions_total stayed empty in auto mode) -----------
def test_an_action_carried_out_at_once_is_reported_as_issued_with_its_mode():
    """Auto mode publishes commands and no action record: the outcome still names the
    action (``actions_total{state="issued"}``), once; approve mode's APPROVED record is
    the count there, so an approved action is not also ``issued``."""
    p = auto()
    out = p.on_alert(alert(), T0)
    aid = action_id("fp-node3-a", RA.REPLACE_AT_CHECKPOINT, "node-3")
    assert out.records == [] and len(out.commands) == 3
    assert [(i.action_id, i.mode) for i in out.issued] == [(aid, ActuatorMode.AUTO)]
    assert p.on_alert(alert(seq=1, step=101), T0).issued == []  # nothing twice
    gated = auto(mode=ActuatorMode.APPROVE)
    held = gated.on_alert(alert(), T0)
    assert held.issued == [] and [r.state for r in held.records] == [ActionState.HELD]
    approval = Approval(action_id=aid, decision=ApprovalDecision.APPROVE, by="op", ts=T0,
                        held_at=T0)  # fmt: skip
    approved = gated.on_approval(approval, T0)
    assert approved.commands and approved.issued == []
    assert ActionState.APPROVED in [r.state for r in approved.records]
