"""stepguard calibrate --actions: approval rate, human latency and outcomes per action
kind and fault kind, and the kinds ready for auto (on each archive backend)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from typer.testing import CliRunner

from pipeline.io.trust import SigningKey, sign
from pipeline.policy import Policy, PolicyParams
from pipeline.services.archive.rows import rows_for
from pipeline.tools.calibrate.graduation import GraduationRules, graduation_report
from schemas import (
    ActuatorMode,
    Alert,
    AlertKind,
    AlertState,
    Approval,
    ApprovalDecision,
    CommandKind,
    CommandResult,
    CommandStatus,
    Evidence,
    Grade,
    Message,
    RecommendedAction,
)
from tests.clock import day_start

T0 = day_start(hour=12)
KEY = SigningKey.generate("actuator-test")
OPERATOR = SigningKey.generate("operator-test")
#: results count only signed (the archive keeps an unverified one as signed = 0)
EXECUTOR = SigningKey.generate("executor-test")


def _alert(i: int, kind: AlertKind, action: RecommendedAction, job: str) -> Alert:
    return Alert(
        fingerprint=f"fp-{kind.value}-{i:04d}", seq=0, kind=kind, grade=Grade.CRITICAL,
        state=AlertState.FIRING, job_id=job, node=f"node-{i}", step=10, started_at=T0,
        ts=T0 + timedelta(minutes=i), node_in_steps=True,  # a member: the policy may act
        evidence=Evidence(metric="compute_s", value=1, deviation=9), recommended_action=action,
    )  # fmt: skip


class History:
    """Runs the actuator's own policy in approve mode and keeps what the archiver would
    have stored: alerts, action records and commands signed by the actuator, approvals
    signed by an operator, results."""

    def __init__(self) -> None:
        spares = tuple(f"spare-{i}" for i in range(200))
        self.policy = Policy(PolicyParams(
            mode=ActuatorMode.APPROVE, spare_nodes=spares, max_isolations=1000,
            max_isolations_global=1000, max_isolation_pct=100, node_cooldown_s=0,
            relaunch_cooldown_s=0, checkpoint_min_interval_s=0,
        ))  # fmt: skip
        self.messages: list[Message] = []
        self.n = 0

    def act(self, kind: AlertKind, action: RecommendedAction, decision: ApprovalDecision | None,
            latency_s: float, outcome: CommandStatus | None = CommandStatus.SUCCEEDED,
            job: str = "job-1") -> None:  # fmt: skip
        self.n += 1
        a = _alert(self.n, kind, action, job)
        now = a.ts
        out = self.policy.on_alert(a, now)
        self.messages += [a, *(sign(r, KEY) for r in out.records)]
        [held] = out.records
        if decision is None:
            return
        when = now + timedelta(seconds=latency_s)
        ap = Approval(action_id=held.action_id, decision=decision, by="sre", ts=when,
                      held_at=held.ts)  # fmt: skip
        out = self.policy.on_approval(ap, when)
        self.messages += [sign(ap, OPERATOR), *(sign(r, KEY) for r in out.records)]
        for cmd in out.commands:
            self.messages.append(sign(cmd, KEY))
            if outcome is not None and cmd.kind is not CommandKind.NOTIFY:
                self.messages.append(sign(CommandResult(
                    command_id=cmd.command_id, job_id=cmd.job_id, executor="dry-run",
                    status=outcome, ts=when + timedelta(seconds=5),
                ), EXECUTOR))  # fmt: skip

    def store(self, backend) -> None:
        pairs = [(m, int(T0.timestamp() * 1000)) for m in self.messages]
        for table, cols in rows_for(pairs, list(range(len(pairs)))).items():
            backend.insert(table, cols)


RA, AK, AD = RecommendedAction, AlertKind, ApprovalDecision


def test_a_kind_graduates_on_approvals_without_rejection_and_successful_outcomes(archive):
    h = History()
    for i in range(6):  # straggler replacement: 6 approvals, every command succeeded
        h.act(AK.STRAGGLER, RA.REPLACE_AT_CHECKPOINT, AD.APPROVE, latency_s=60 * (i + 1))
    for _ in range(5):  # restarts: approved, but one rejection
        h.act(AK.HANG, RA.RESTART, AD.APPROVE, latency_s=30)
    h.act(AK.HANG, RA.RESTART, AD.REJECT, latency_s=600)
    for _ in range(6):  # rollbacks: approved, but a fifth of the commands failed
        h.act(AK.DIVERGENCE, RA.ROLLBACK, AD.APPROVE, latency_s=10)
    h.act(AK.DIVERGENCE, RA.ROLLBACK, AD.APPROVE, latency_s=10, outcome=CommandStatus.FAILED)
    h.act(AK.HARDWARE, RA.ISOLATE, AD.APPROVE, latency_s=10)  # too few approvals
    h.act(AK.HARDWARE, RA.ISOLATE, None, latency_s=0)  # still held: not decided
    h.store(archive)

    report = graduation_report(archive, GraduationRules(min_approvals=5))
    rows = {(r.action, r.fault): r for r in report.rows}
    s = rows[("replace_at_checkpoint", "straggler")]
    assert (s.held, s.approved, s.rejected, s.approval_rate) == (6, 6, 0, 1.0)
    assert s.latency(50) == pytest.approx(210.0)  # 60..360 s
    assert s.commands == 18 and s.success_rate == 1.0  # checkpoint, isolate, restart each
    r = rows[("restart", "hang")]
    assert (r.approved, r.rejected) == (5, 1) and r.approval_rate == pytest.approx(5 / 6)
    assert rows[("rollback", "divergence")].success_rate == pytest.approx(6 / 7)
    i = rows[("isolate", "hardware")]
    assert (i.held, i.approved) == (2, 1)
    recs = {x.action: x for x in report.recommendations}
    assert recs["replace_at_checkpoint"].auto
    assert not recs["restart"].auto and "1 rejections > 0" in recs["restart"].why
    assert not recs["rollback"].auto and "86 % succeeded < 95 %" in recs["rollback"].why
    assert not recs["isolate"].auto and "1 approvals < 5" in recs["isolate"].why
    assert report.unmatched == 0
    # the rules are configurable: one rejection allowed, 80 % success enough
    lenient = graduation_report(
        archive, GraduationRules(min_approvals=5, max_rejections=1, min_success=0.8)
    )
    assert {x.action for x in lenient.recommendations if x.auto} == {
        "replace_at_checkpoint", "restart", "rollback",
    }  # fmt: skip


def test_unsigned_commands_and_other_jobs_do_not_count(archive):
    h = History()
    for _ in range(5):
        h.act(AK.STRAGGLER, RA.REPLACE_AT_CHECKPOINT, AD.APPROVE, latency_s=5)
    h.act(AK.STRAGGLER, RA.REPLACE_AT_CHECKPOINT, AD.REJECT, latency_s=5, job="job-2")
    # a forged, unsigned command claiming a failure of job-1's straggler fix
    forged = next(m for m in h.messages if hasattr(m, "command_id") and hasattr(m, "kind"))
    unsigned = forged.model_copy(update={"command_id": "forged-0001", "signature": None,
                                         "key_id": None})  # fmt: skip
    h.messages += [unsigned, CommandResult(command_id="forged-0001", job_id="job-1",
                   executor="x", status=CommandStatus.FAILED, ts=T0)]  # fmt: skip
    h.store(archive)
    everything = graduation_report(archive, GraduationRules(min_approvals=5))
    [total] = everything.totals
    assert (total.approved, total.rejected, total.commands) == (5, 1, 15)
    assert not everything.recommendations[0].auto
    one_job = graduation_report(archive, GraduationRules(min_approvals=5), jobs=["job-1"])
    assert one_job.recommendations[0].auto
    later = graduation_report(archive, since=T0 + timedelta(days=1))
    assert later.rows == [] and later.recommendations == []


def test_unsigned_action_records_and_approvals_do_not_count(archive):
    """Whoever can write the approvals or actions topic cannot graduate a kind (forged
    approvals of held actions) nor hold one back (a forged rejection)."""
    h = History()
    for _ in range(5):  # replacements: 5 signed approvals, ready for auto
        h.act(AK.STRAGGLER, RA.REPLACE_AT_CHECKPOINT, AD.APPROVE, latency_s=5)
    n_signed = len(h.messages)
    h.act(AK.HANG, RA.RESTART, AD.APPROVE, latency_s=5)  # restarts: one real approval
    for m in h.messages[:n_signed]:  # a forged rejection of a real replacement action
        if isinstance(m, Approval):
            h.messages.append(m.model_copy(update={
                "decision": AD.REJECT, "ts": m.ts - timedelta(seconds=1),
                "signature": None, "key_id": None,
            }))  # fmt: skip
            break
    restart = next(m for m in h.messages[n_signed:] if hasattr(m, "state"))
    for i in range(6):  # forged holds and approvals that would make restart "ready"
        aid = f"act-forged-{i:04d}"
        h.messages += [
            restart.model_copy(update={"action_id": aid, "signature": None, "key_id": None}),
            Approval(action_id=aid, decision=AD.APPROVE, by="forger", ts=restart.ts),
        ]
    h.store(archive)
    report = graduation_report(archive, GraduationRules(min_approvals=5))
    rows = {(r.action, r.fault): r for r in report.rows}
    s = rows[("replace_at_checkpoint", "straggler")]
    assert (s.held, s.approved, s.rejected) == (5, 5, 0)
    r = rows[("restart", "hang")]
    assert (r.held, r.approved, r.rejected) == (1, 1, 0)
    recs = {x.action: x for x in report.recommendations}
    assert recs["replace_at_checkpoint"].auto
    assert not recs["restart"].auto and "1 approvals < 5" in recs["restart"].why


def test_rules_are_validated():
    with pytest.raises(ValueError, match="min_success"):
        GraduationRules(min_success=95)
    with pytest.raises(ValueError, match="min_approvals"):
        GraduationRules(min_approvals=-1)


def test_cli_calibrate_actions_prints_the_report_and_the_control_command(
    archive, monkeypatch, tmp_path
):
    from pipeline.tools.calibrate import graduation

    h = History()
    for _ in range(3):
        h.act(AK.STRAGGLER, RA.REPLACE_AT_CHECKPOINT, AD.APPROVE, latency_s=5)
    h.store(archive)

    class Shared:  # the test's archive, left open for the fixture to drop
        def __getattr__(self, name):
            return getattr(archive, name)

        def close(self):
            pass

    monkeypatch.setattr(graduation, "_open", lambda settings: Shared())
    from pipeline.cli.app import app

    out = tmp_path / "g.json"
    result = CliRunner().invoke(
        app, ["calibrate", "--actions", "--min-approvals", "3", "--out", str(out)],
        env={"COLUMNS": "200"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "stepguard control --mode-for replace_at_checkpoint=auto" in result.output
    data = json.loads(out.read_text())
    assert data["rules"]["min_approvals"] == 3
    assert data["recommendations"][0]["auto"] is True


def test_cli_calibrate_actions_refuses_replay_options():
    from pipeline.cli.app import app

    result = CliRunner().invoke(app, ["calibrate", "--actions", "--apply"])
    assert result.exit_code != 0 and "--actions" in result.output
