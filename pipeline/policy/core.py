"""The :class:`Policy` façade: episodes and confirmation, modes, and the decision that
puts planning, guardrails, holds and the ledger together."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from pipeline.policy.guardrails import Guardrails, kind_of_detail
from pipeline.policy.holds import Holds
from pipeline.policy.ledger import Ledger
from pipeline.policy.memory import Cap, drop_front, touch
from pipeline.policy.params import Issued, Outcome, PolicyParams
from pipeline.policy.planning import Planner
from schemas import (
    ActionRecord,
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
    Grade,
    RecommendedAction,
)

__all__ = ["Policy", "action_id"]


@dataclass(slots=True)
class _Episode:
    job_id: str
    first_step: int | None
    last_seq: int
    touched: datetime  # ``now`` of its last update
    last: Alert | None = None
    acted: set[str] = field(default_factory=set)
    observed: set[str] = field(default_factory=set)


def action_id(fingerprint: str, action: RecommendedAction, node: str | None) -> str:
    """Id of one confirmed action (what ``stepguard approve`` takes)."""
    text = f"{fingerprint}\x1f{action.value}\x1f{node or ''}"
    return "act-" + hashlib.sha256(text.encode()).hexdigest()[:24]


class Policy:
    """Episodes, confirmation, modes, guardrails and the spare pool. Pure and picklable.

    Parameters
    ----------
    params
        Mode and thresholds; changed at runtime by :meth:`on_control`.
    """

    def __init__(self, params: PolicyParams) -> None:
        self._cap = Cap(params.max_tracked)
        self.ledger = Ledger(self._cap)
        self.guards = Guardrails(params, self._cap)
        self.planner = Planner(params, self._cap, self.guards)
        self.holds = Holds(self.ledger, params.hold_ttl_s)
        self._params = params
        self._episodes: dict[str, _Episode] = {}  # least recently updated first
        #: job -> (newest alert ts of the job, ``now`` when it last changed)
        self._newest_ts: dict[str, tuple[datetime, datetime]] = {}

    # -- the parts' shared state, by its old names ------------------------------------
    @property
    def params(self) -> PolicyParams:
        return self._params

    @params.setter
    def params(self, params: PolicyParams) -> None:
        self._params = self.guards.params = self.planner.params = params
        self._cap.max_tracked = params.max_tracked
        self.holds.hold_ttl_s = params.hold_ttl_s

    @property
    def spares(self) -> list[str]:
        return self.planner.spares

    @spares.setter
    def spares(self, spares: list[str]) -> None:
        self.planner.spares = spares

    @property
    def repair(self) -> dict[str, datetime]:
        """Nodes isolated twice within a window -> when marked (never spares again)."""
        return self.guards.repair

    @property
    def job_nodes(self) -> dict[str, int]:
        return self.guards.job_nodes

    @property
    def issued(self) -> dict[str, datetime]:
        """Command id -> when issued."""
        return self.ledger.issued

    @property
    def actions(self) -> dict[str, ActionRecord]:
        """Latest record per action id, oldest first."""
        return self.ledger.actions

    @property
    def evicted(self) -> int:
        """Entries dropped by the hard cap (``max_tracked``) rather than by age."""
        return self._cap.evicted

    @property
    def held(self) -> list[ActionRecord]:
        return self.ledger.held

    # -- inputs ------------------------------------------------------------------------
    def on_alert(self, alert: Alert, now: datetime) -> Outcome:
        """One alert update; see the module docstring for the meaning of ``now``."""
        out = self._housekeeping(now)
        if alert.kind is AlertKind.GUARDRAIL:
            out.note = "own guardrail alert"
            return out
        self.planner.learn(alert, now)
        # staleness per job: one alert dated in the future stales only its own job
        newest = self._newest_ts.get(alert.job_id)
        if newest is None or alert.ts > newest[0]:
            newest = (alert.ts, now)
            touch(self._newest_ts, alert.job_id, newest)
            self._cap(self._newest_ts)
        if alert.ts < newest[0] - timedelta(seconds=self.params.stale_alert_s):
            out.note = "stale"
            return out
        ep = self._episodes.get(alert.fingerprint)
        if ep is not None and alert.seq <= ep.last_seq:
            out.note = "duplicate"
            return out
        if alert.state is AlertState.RESOLVED:
            self._episodes.pop(alert.fingerprint, None)
            out.extend(self.holds.cancel(alert.fingerprint, now))
            out.note = out.note or "resolved"
            return out
        if ep is None:
            ep = _Episode(alert.job_id, alert.step, alert.seq, now)
        ep.touched = now
        touch(self._episodes, alert.fingerprint, ep)
        self._cap(self._episodes)
        ep.last_seq = alert.seq
        ep.last = alert
        if alert.step is not None and (ep.first_step is None or alert.step < ep.first_step):
            ep.first_step = alert.step
        return self._consider(alert, ep, now, out)

    def on_progress(self, job_id: str, step: int, ts: datetime, now: datetime) -> Outcome:
        """The job reached ``step`` at event time ``ts``: a WARNING episode that has
        persisted long enough since its last update confirms now (alerts are sent on
        transitions only, so persistence shows in the job's progress)."""
        out = self._housekeeping(now)
        for ep in list(self._episodes.values()):
            last = ep.last
            if ep.job_id != job_id or last is None or last.grade is not Grade.WARNING:
                continue
            probe = last.model_copy(update={"step": step, "ts": max(ts, last.ts)})
            decided = self._consider(probe, ep, now, Outcome())
            if decided.commands or decided.records or decided.alerts:
                out.extend(decided)
        return out

    def _consider(self, alert: Alert, ep: _Episode, now: datetime, out: Outcome) -> Outcome:
        if not self._confirmed(alert, ep):
            out.note = "not confirmed"
            return out
        action = alert.recommended_action
        if action is RecommendedAction.NONE:
            out.note = "no action recommended"
            return out
        if action is RecommendedAction.REBALANCE:  # advice to the job owner, no command
            out.note = "rebalance is advice for the job owner: nothing to act on"
            return out
        aid = action_id(alert.fingerprint, action, alert.node)
        prior = self.actions.get(aid)
        if aid in ep.acted or (prior is not None and prior.state is not ActionState.OBSERVED):
            out.note = "already decided"
            return out
        mode = self.params.mode_of(action)
        if mode is ActuatorMode.OBSERVE:
            if aid in ep.observed or prior is not None:
                out.note = "already observed"
                return out
            ep.observed.add(aid)
        else:
            ep.acted.add(aid)
        out.extend(self._decide(aid, alert, ep.first_step, now, mode, by=None))
        return out

    def on_approval(self, approval: Approval, now: datetime) -> Outcome:
        """A (verified) human decision on a held action: only the hold it names
        (``held_at``, when that hold began) is decided; an expired one is refused."""
        out = self._housekeeping(now)
        held = self.actions.get(approval.action_id)
        if held is None or held.state is not ActionState.HELD:
            out.note = "no such held action"
            now_in = "unknown to the actuator" if held is None else held.state.value
            out.refusal = f"action {approval.action_id} is not held ({now_in})"
            return out
        if approval.held_at != held.ts:  # bound to one hold: a replay decides no other
            out.note = "approval of another hold" if approval.held_at else "names no hold"
            out.refusal = f"{out.note}: this one has been held since {held.ts.isoformat()}"
            return out
        if approval.decision is ApprovalDecision.REJECT:
            out.records.append(
                self.ledger.record(held, ActionState.REJECTED, now, approval.reason, approval.by)
            )
            out.alerts.append(self.holds.notice(held, now, f"rejected by {approval.by}"))
            return out
        assert held.alert is not None  # held records always carry their alert
        if self.params.mode_of(held.alert.recommended_action) is ActuatorMode.OBSERVE:
            out.records.append(
                self.ledger.record(held, ActionState.REFUSED, now, "actuator is in observe mode")
            )
            out.alerts.append(self.holds.notice(held, now, "refused: observe mode"))
            return out
        self.planner.learn(held.alert, now)
        ep = self._episodes.get(held.alert.fingerprint)
        first_step = ep.first_step if ep is not None else held.alert.step
        for c in held.commands:  # a rollback target was fixed when the action was held
            if c.kind is CommandKind.ROLLBACK and c.checkpoint_step is not None:
                first_step = c.checkpoint_step + 1
        decided = self._decide(
            held.action_id, held.alert, first_step, now, ActuatorMode.APPROVE, approval.by
        )
        ended = f"approved by {approval.by}"
        for rec in decided.records:
            if rec.action_id == held.action_id and rec.state is not ActionState.APPROVED:
                ended += f" but {rec.state.value}: {rec.detail}"
        out.extend(decided)
        out.alerts.append(self.holds.notice(held, now, ended))
        return out

    def on_control(self, msg: ControlMessage, now: datetime, *, replay: bool = False) -> Outcome:
        """A (verified) runtime change of mode, thresholds, spares or job size.

        ``replay`` (the start-up rebuild): the state it sets is applied again, in order,
        but a one-shot action (``reset_breaker``) never closes a breaker that tripped
        after the message was sent: yesterday's reset does not undo today's trip.
        """
        self.params = self.params.with_control(msg)
        if msg.spare_nodes is not None:
            self.spares = [n for n in msg.spare_nodes if n not in self.repair]
        if msg.job_id is not None and msg.job_nodes is not None:
            touch(self.job_nodes, msg.job_id, msg.job_nodes)
            self._cap(self.job_nodes)
        out = Outcome(note="control applied")
        if msg.reset_breaker:
            out.alerts += self.guards.reset(msg.ts, now, replay=replay)
        return out

    def on_tick(self, now: datetime) -> Outcome:
        """Time passing without input: expire holds, close breakers, forget the old.

        The service calls it after every poll, so a hold expires on time even when
        nothing arrives.
        """
        out = self._housekeeping(now)
        out.note = out.note or "tick"
        return out

    # -- rebuilding from the output topics -------------------------------------------------
    def restore_command(self, cmd: Command) -> None:
        """Replay one command read back from the commands topic (start-up rebuild)."""
        self.ledger.issue(cmd.command_id, cmd.issued_at)
        self.guards.apply_issue(cmd, cmd.issued_at, self.spares)

    def restore_alert(self, alert: Alert, now: datetime) -> None:
        """Replay one (worker-signed) alert read back from the decisions topic at
        start-up: its episode (first step, last update) and the job's nodes are rebuilt
        as :meth:`on_alert` would keep them, but nothing is decided (what was decided is
        in the action records). A WARNING firing before the restart thus still confirms
        from the job's progress afterwards (:meth:`on_progress`)."""
        if alert.kind is AlertKind.GUARDRAIL:
            return
        self.planner.learn(alert, now)
        newest = self._newest_ts.get(alert.job_id)
        if newest is None or alert.ts > newest[0]:
            touch(self._newest_ts, alert.job_id, (alert.ts, now))
            self._cap(self._newest_ts)
        ep = self._episodes.get(alert.fingerprint)
        if ep is not None and alert.seq <= ep.last_seq:
            return
        if alert.state is AlertState.RESOLVED:
            self._episodes.pop(alert.fingerprint, None)
            return
        if ep is None:
            ep = _Episode(alert.job_id, alert.step, alert.seq, now)
        ep.touched, ep.last_seq, ep.last = now, alert.seq, alert
        if alert.step is not None and (ep.first_step is None or alert.step < ep.first_step):
            ep.first_step = alert.step
        touch(self._episodes, alert.fingerprint, ep)
        self._cap(self._episodes)

    def restore_record(self, record: ActionRecord) -> None:
        """Replay one action record (latest per id wins) read back at start-up.

        The refusal that tripped a breaker (per job or global) opens it again until
        its window ends (:meth:`prune` with ``full`` drops the ones already over).
        """
        self.ledger.keep(record)
        if record.state is not ActionState.REFUSED or record.alert is None:
            return
        kind = kind_of_detail(record.detail)
        if kind is not None:
            self.guards.restore_refusal(kind, record.alert, record.ts)

    # -- memory ------------------------------------------------------------------------
    @property
    def horizon_s(self) -> float:
        """Seconds anything is remembered: the longest a guardrail looks back."""
        p = self.params
        return max(
            p.window_s, p.node_cooldown_s, p.relaunch_cooldown_s, p.checkpoint_min_interval_s,
            p.command_ttl_s, p.stale_alert_s, p.warning_confirm_s, p.hold_ttl_s,
        )  # fmt: skip

    def prune(self, now: datetime, *, full: bool = False) -> None:
        """Forget what is older than :attr:`horizon_s` before ``now``.

        Maps are ordered oldest first, so pruning stops at the first entry still
        needed; ``full`` scans everything (after a start-up rebuild, whose records come
        partition by partition rather than in time order).
        """
        cut = now - timedelta(seconds=self.horizon_s)
        if full:
            self._episodes = {k: e for k, e in self._episodes.items() if e.touched >= cut}
            self._newest_ts = {k: v for k, v in self._newest_ts.items() if v[1] >= cut}
        drop_front(self._episodes, lambda e: e.touched < cut)
        drop_front(self._newest_ts, lambda v: v[1] < cut)
        self.ledger.prune(cut, full=full)
        self.guards.prune(cut, now, full=full)
        self.planner.prune(cut, full=full)

    def memory(self) -> dict[str, int]:
        """Entries per map (for logs and tests)."""
        g = self.guards
        return {
            "episodes": len(self._episodes), "issued": len(self.issued),
            "actions": len(self.actions), "held": len(self.ledger.holding),
            "isolations": len(g.isolations), "node_cooldowns": len(g.last_acted),
            "checkpoints": len(g.last_checkpoint),
            "relaunches": len(g.last_relaunch) + len(g.last_replacement),
            "breakers": len(g.breakers) + (g.global_breaker is not None),
            "repair": len(self.repair), "job_nodes": len(self.job_nodes),
            "newest_ts": len(self._newest_ts), "job_node_sets": len(self.planner.nodes),
        }  # fmt: skip

    # -- queries -----------------------------------------------------------------------
    def isolations_in_window(self, job_id: str | None, now: datetime) -> int:
        """Isolations of ``job_id`` (``None``: of every job) within the guard window."""
        return self.guards.isolations_in_window(job_id, now)

    def isolation_limit(self, job_id: str) -> int:
        return self.guards.isolation_limit(job_id)

    def breaker_open(self, job_id: str) -> bool:
        return job_id in self.guards.breakers

    @property
    def global_breaker_open(self) -> bool:
        return self.guards.global_breaker is not None

    # -- internals -----------------------------------------------------------------------
    def _confirmed(self, alert: Alert, ep: _Episode) -> bool:
        if alert.grade is Grade.CRITICAL:
            return True
        if alert.grade is not Grade.WARNING:
            return False
        steps = None if alert.step is None or ep.first_step is None else alert.step - ep.first_step
        if steps is not None and steps >= self.params.warning_confirm_steps:
            return True
        persisted = (alert.ts - alert.started_at).total_seconds()
        return persisted >= self.params.warning_confirm_s

    def _decide(
        self,
        aid: str,
        alert: Alert,
        first_step: int | None,
        now: datetime,
        mode: ActuatorMode,
        by: str | None,
    ) -> Outcome:
        out = Outcome()
        plan = self.planner.plan(alert, first_step, now, mode)
        refusal = self.guards.check(alert, plan.commands, plan.isolated, now)
        record = ActionRecord(
            action_id=aid, state=ActionState.OBSERVED, job_id=alert.job_id, mode=mode,
            commands=plan.commands, reason=(alert.fingerprint,), alert=alert,
            summary=plan.summary, by=by, ts=now,
        )  # fmt: skip
        if mode is ActuatorMode.OBSERVE:
            detail = f"would be refused: {refusal.text}" if refusal else "would be issued"
            out.records.append(self.ledger.record(record, ActionState.OBSERVED, now, detail))
            return out
        if refusal is not None:
            if refusal.trips and plan.isolated is not None:
                out.alerts += self.guards.trip(alert, refusal, now)
            out.records.append(self.ledger.record(record, ActionState.REFUSED, now, refusal.text))
            return out
        executable = [c for c in plan.commands if c.kind is not CommandKind.NOTIFY]
        if mode is ActuatorMode.APPROVE and by is None and executable:
            held = self.ledger.record(record, ActionState.HELD, now, "awaiting approval")
            out.records.append(held)
            out.alerts.append(self.holds.notice(held, now))
            notice = self.holds.command(held, now)
            if notice.command_id not in self.issued:
                self.ledger.issue(notice.command_id, now)
                out.commands.append(notice)
            return out
        if by is not None:
            out.records.append(self.ledger.record(record, ActionState.APPROVED, now, "", by))
        for cmd in plan.commands:
            if cmd.command_id in self.issued:
                continue
            self.ledger.issue(cmd.command_id, now)
            self.guards.apply_issue(cmd, now, self.spares)
            out.commands.append(cmd)
        if not out.commands:
            out.note = "already issued"
        elif by is None:  # an approved action has its APPROVED record
            out.issued.append(Issued(aid, mode))
        return out

    def _housekeeping(self, now: datetime) -> Outcome:
        """Before any input: expire holds, close breakers, forget what is past use."""
        out = self.holds.expire(now)
        out.alerts += self.guards.close_expired(now)
        self.prune(now)
        return out
