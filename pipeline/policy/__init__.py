"""The actuator's decisions as a pure, picklable state machine (no I/O, no clocks).

:class:`Policy` turns alert updates, approvals and control messages into an
:class:`Outcome`: unsigned commands to publish, action records (observed, held,
refused ...) and its own guardrail alerts. The Kafka service around it only decodes,
calls, signs, publishes and commits.

Time: ``now`` (the caller's wall clock) stamps commands and drives the guardrail
windows and cooldowns, because executors compare ``expires_at`` with their own clock
and a rebuilt actuator reads the windows back from ``issued_at``. Event time
(``alert.ts``) decides staleness (against the newest alert of the same job, so one
alert dated in the future stales only its own job) and how long a WARNING has
persisted. Isolations are bounded per job (the circuit breaker) and across all jobs
(``max_isolations_global`` per window), so invented job ids do not bypass the bound.

Modes are per action kind: ``PolicyParams.action_modes`` overrides the global mode
for a kind (say auto for straggler replacement, approve for restarts), set at runtime
by a control message; a global OBSERVE still stops every kind.

Held actions (approve mode) are announced: a NOTIFY command for the webhook and a
GUARDRAIL alert on the decisions topic, both naming the action id and the held alert's
kind, grade, node, rank and age. Undecided after ``hold_ttl_s`` a hold expires: a
CANCELLED record whose detail starts with ``expired``; the GUARDRAIL alert resolves
whenever the hold ends (approved, rejected, expired, cancelled).

Memory: everything the policy keeps per episode, command, action, node or job is
stamped with ``now`` and forgotten :attr:`Policy.horizon_s` after (the longest of the
guard window, the cooldowns, the command TTL, the stale-alert, confirmation and hold
horizons), so inside that horizon no decision changes. Pruning runs on every input and
on :meth:`Policy.on_tick`. Repair marks (nodes that failed twice in a window) and job
sizes are kept past the horizon. Every map also has a hard cap, ``max_tracked`` entries
(oldest dropped first, counted in :attr:`Policy.evicted`): a backstop against an alert
storm, not the normal bound. An episode silent for longer than the horizon is
forgotten; should it fire again it is decided afresh (its command ids are the same, so
executors, which remember what they ran, skip them).

Examples
--------
>>> from datetime import UTC, datetime
>>> from schemas import (Alert, AlertKind, AlertState, Evidence, Grade,
...                      RecommendedAction)
>>> t = datetime(2026, 1, 1, tzinfo=UTC)
>>> policy = Policy(PolicyParams(mode=ActuatorMode.AUTO, spare_nodes=("spare-0",)))
>>> alert = Alert(fingerprint="fp-000001", seq=0, kind=AlertKind.HARDWARE,
...               grade=Grade.CRITICAL, state=AlertState.FIRING, job_id="j", node="n3",
...               step=10, started_at=t, ts=t,
...               evidence=Evidence(metric="ecc_uncorrected", value=1, deviation=1),
...               recommended_action=RecommendedAction.ISOLATE)
>>> [(c.kind.value, c.targets, c.replacements) for c in policy.on_alert(alert, t).commands]
[('checkpoint', (), ()), ('isolate', ('n3',), ('spare-0',)), ('restart', ('n3',), ('spare-0',))]
>>> policy.on_alert(alert, t).commands  # a replay issues nothing
[]
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal, TypeVar

from pipeline.io.settings import Settings
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
    Evidence,
    Grade,
    RecommendedAction,
    command_id,
    episode_fingerprint,
)

__all__ = ["Outcome", "Policy", "PolicyParams", "action_id"]

_ISOLATING = (RecommendedAction.ISOLATE, RecommendedAction.REPLACE_AT_CHECKPOINT)
#: commands whose targets executors check against the job's known nodes
_SCOPED = (CommandKind.ISOLATE, CommandKind.RESTART)
#: detail of the record of a hold that nobody decided in time (state CANCELLED)
EXPIRED = "expired"
#: start of the detail of an isolation refused by the budget across all jobs
GLOBAL_BUDGET = "global isolation budget"
#: most node names remembered per job (oldest first out); more: no hint on commands
MAX_JOB_NODE_NAMES = 4096
_V = TypeVar("_V")


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyParams:
    """Thresholds and mode; ``with_control`` applies a runtime change."""

    mode: ActuatorMode = ActuatorMode.OBSERVE
    command_ttl_s: float = 300.0
    warning_confirm_steps: int = 20
    warning_confirm_s: float = 300.0
    stale_alert_s: float = 600.0
    max_isolations: int = 3
    max_isolation_pct: float = 5.0
    #: isolations across all jobs per window (invented job ids do not bypass it)
    max_isolations_global: int = 10
    window_s: float = 3600.0
    node_cooldown_s: float = 1800.0
    spare_nodes: tuple[str, ...] = ()
    no_spare_policy: Literal["checkpoint", "alert"] = "checkpoint"
    #: without a spare, at most one protective checkpoint per job per this many seconds
    checkpoint_min_interval_s: float = 600.0
    #: at most one RESTART/ROLLBACK per job per this many seconds (no restart loops)
    relaunch_cooldown_s: float = 300.0
    default_job_nodes: int = 0
    #: a held action nobody approved or rejected for this long expires
    hold_ttl_s: float = 1800.0
    #: hard cap of every per-episode, per-command, per-action and per-node map
    max_tracked: int = 10_000
    #: per action kind, a mode that overrides ``mode`` (sorted pairs, one per kind);
    #: a global OBSERVE still stops every kind (the emergency brake)
    action_modes: tuple[tuple[RecommendedAction, ActuatorMode], ...] = ()

    def __post_init__(self) -> None:
        if self.command_ttl_s <= 0:
            raise ValueError("command_ttl_s must be positive")
        if self.hold_ttl_s <= 0:
            raise ValueError("hold_ttl_s must be positive")
        if self.max_tracked < 1:
            raise ValueError("max_tracked must be >= 1")
        if self.warning_confirm_steps < 1:
            raise ValueError("warning_confirm_steps must be >= 1")
        if self.max_isolations < 0:
            raise ValueError("max_isolations must be >= 0")
        if self.max_isolations_global < 0:
            raise ValueError("max_isolations_global must be >= 0")
        if not 0 <= self.max_isolation_pct <= 100:
            raise ValueError("max_isolation_pct must be within [0, 100]")
        if self.window_s <= 0:
            raise ValueError("window_s must be positive")
        kinds = [k for k, _ in self.action_modes]
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"action_modes names a kind twice: {kinds}")
        for kind, mode in self.action_modes:
            if not isinstance(kind, RecommendedAction) or not isinstance(mode, ActuatorMode):
                raise ValueError(
                    f"action_modes: ({kind!r}, {mode!r}) is not (RecommendedAction, ActuatorMode)"
                )

    def mode_of(self, action: RecommendedAction) -> ActuatorMode:
        """The mode an action of this kind is decided in.

        >>> p = PolicyParams(mode=ActuatorMode.APPROVE,
        ...                  action_modes=((RecommendedAction.REPLACE_AT_CHECKPOINT,
        ...                                 ActuatorMode.AUTO),))
        >>> p.mode_of(RecommendedAction.REPLACE_AT_CHECKPOINT).value, p.mode_of(
        ...     RecommendedAction.RESTART).value
        ('auto', 'approve')
        """
        if self.mode is ActuatorMode.OBSERVE:
            return self.mode
        return dict(self.action_modes).get(action, self.mode)

    @classmethod
    def from_settings(cls, settings: Settings) -> PolicyParams:
        return cls(
            mode=ActuatorMode(settings.actuator_mode),
            command_ttl_s=settings.command_ttl_s,
            warning_confirm_steps=settings.warning_confirm_steps,
            warning_confirm_s=settings.warning_confirm_s,
            stale_alert_s=settings.stale_alert_s,
            max_isolations=settings.guard_max_isolations,
            max_isolation_pct=settings.guard_max_isolation_pct,
            max_isolations_global=settings.guard_max_isolations_global,
            window_s=settings.guard_window_s,
            node_cooldown_s=settings.guard_node_cooldown_s,
            spare_nodes=tuple(settings.spare_pool),
            no_spare_policy=settings.no_spare_policy,
            relaunch_cooldown_s=settings.guard_relaunch_cooldown_s,
            default_job_nodes=settings.guard_job_nodes,
            hold_ttl_s=settings.hold_ttl_s,
            max_tracked=settings.actuator_max_tracked,
            action_modes=tuple(sorted(
                (RecommendedAction(k), ActuatorMode(m)) for k, m in settings.action_modes
            )),
        )  # fmt: skip

    def with_control(self, msg: ControlMessage) -> PolicyParams:
        changes: dict[str, object] = {}
        for ours, theirs in (
            ("mode", "mode"),
            ("warning_confirm_steps", "warning_confirm_steps"),
            ("warning_confirm_s", "warning_confirm_s"),
            ("stale_alert_s", "stale_alert_s"),
            ("max_isolations", "guard_max_isolations"),
            ("max_isolation_pct", "guard_max_isolation_pct"),
            ("window_s", "guard_window_s"),
            ("node_cooldown_s", "guard_node_cooldown_s"),
            ("no_spare_policy", "no_spare_policy"),
        ):
            value = getattr(msg, theirs)
            if value is not None:
                changes[ours] = value
        if msg.action_modes is not None:
            modes = dict(self.action_modes)
            for kind, mode in msg.action_modes.items():
                if mode == "default":
                    modes.pop(kind, None)
                else:
                    modes[kind] = ActuatorMode(mode)
            changes["action_modes"] = tuple(sorted(modes.items()))
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Issued:
    """An action carried out at once, its commands published with no record."""

    action_id: str
    mode: ActuatorMode


@dataclass(slots=True)
class Outcome:
    """What one input led to: commands (unsigned), action records, guardrail alerts."""

    commands: list[Command] = field(default_factory=list)
    records: list[ActionRecord] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)
    #: actions whose commands went out with no action record of their own (auto mode,
    #: or a NOTIFY-only plan): counted beside the records (``actions_total``)
    issued: list[Issued] = field(default_factory=list)
    #: why nothing happened, when nothing happened (for logs and tests)
    note: str = ""

    def extend(self, other: Outcome) -> None:
        self.commands += other.commands
        self.records += other.records
        self.alerts += other.alerts
        self.issued += other.issued
        self.note = self.note or other.note


@dataclass(slots=True)
class _Episode:
    job_id: str
    first_step: int | None
    last_seq: int
    touched: datetime  # ``now`` of its last update
    last: Alert | None = None
    acted: set[str] = field(default_factory=set)
    observed: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _Breaker:
    fingerprint: str
    open_until: datetime
    step: int | None
    node: str | None
    job: str  # the job it guards, or the job whose isolation tripped the global budget
    everywhere: bool = False  # the global isolation budget rather than one job's


@dataclass(slots=True)
class _Nodes:
    touched: datetime  # ``now`` of the last alert that named one
    names: dict[str, None] = field(default_factory=dict)  # oldest first


@dataclass(frozen=True, slots=True)
class _Plan:
    commands: tuple[Command, ...]
    isolated: str | None  # the node removed from the job, if any
    replacement: str | None
    summary: str


def action_id(fingerprint: str, action: RecommendedAction, node: str | None) -> str:
    """Id of one confirmed action (what ``stepguard approve`` takes)."""
    text = f"{fingerprint}\x1f{action.value}\x1f{node or ''}"
    return "act-" + hashlib.sha256(text.encode()).hexdigest()[:24]


def _touch(d: dict[str, _V], key: str, value: _V) -> None:
    """Set ``d[key]`` and move it to the end: dicts stay ordered oldest first."""
    d.pop(key, None)
    d[key] = value


def _drop_front(d: dict[str, _V], stale: Callable[[_V], bool]) -> None:
    """Drop entries from the front (oldest) while they are stale."""
    while d:
        key = next(iter(d))
        if not stale(d[key]):
            return
        del d[key]


class Policy:
    """Episodes, confirmation, modes, guardrails and the spare pool. Pure and picklable.

    Parameters
    ----------
    params
        Mode and thresholds; changed at runtime by :meth:`on_control`.
    """

    def __init__(self, params: PolicyParams) -> None:
        self.params = params
        self.spares: list[str] = list(params.spare_nodes)
        #: nodes isolated twice within a window -> when marked (never spares again)
        self.repair: dict[str, datetime] = {}
        self.job_nodes: dict[str, int] = {}
        #: command id -> when issued
        self.issued: dict[str, datetime] = {}
        #: latest record per action id, oldest first
        self.actions: dict[str, ActionRecord] = {}
        #: entries dropped by the hard cap (``max_tracked``) rather than by age
        self.evicted = 0
        self._holding: dict[str, datetime] = {}  # held action id -> held since
        self._episodes: dict[str, _Episode] = {}  # least recently updated first
        #: job -> (newest alert ts of the job, ``now`` when it last changed)
        self._newest_ts: dict[str, tuple[datetime, datetime]] = {}
        #: (issued_at, job, node) of every isolation, oldest first
        self._isolations: list[tuple[datetime, str, str]] = []
        self._last_acted: dict[str, datetime] = {}
        self._last_checkpoint: dict[str, datetime] = {}
        self._last_relaunch: dict[str, datetime] = {}
        self._breakers: dict[str, _Breaker] = {}
        self._global_breaker: _Breaker | None = None
        #: job -> the nodes named in (worker-signed) alerts of the job
        self._nodes: dict[str, _Nodes] = {}

    # -- inputs ------------------------------------------------------------------------
    def on_alert(self, alert: Alert, now: datetime) -> Outcome:
        """One alert update; see the module docstring for the meaning of ``now``."""
        out = self._housekeeping(now)
        if alert.kind is AlertKind.GUARDRAIL:
            out.note = "own guardrail alert"
            return out
        if alert.node is not None:
            self._learn_node(alert.job_id, alert.node, now)
        # staleness per job: one alert dated in the future stales only its own job
        newest = self._newest_ts.get(alert.job_id)
        if newest is None or alert.ts > newest[0]:
            newest = (alert.ts, now)
            _touch(self._newest_ts, alert.job_id, newest)
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
            out.extend(self._cancel_held(alert.fingerprint, now))
            out.note = out.note or "resolved"
            return out
        if ep is None:
            ep = _Episode(alert.job_id, alert.step, alert.seq, now)
        ep.touched = now
        _touch(self._episodes, alert.fingerprint, ep)
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
        """A (verified) human decision on a held action (an expired one is refused)."""
        out = self._housekeeping(now)
        held = self.actions.get(approval.action_id)
        if held is None or held.state is not ActionState.HELD:
            out.note = "no such held action"
            return out
        if approval.decision is ApprovalDecision.REJECT:
            out.records.append(
                self._record(held, ActionState.REJECTED, now, approval.reason, approval.by)
            )
            out.alerts.append(self._hold_notice(held, now, f"rejected by {approval.by}"))
            return out
        assert held.alert is not None  # held records always carry their alert
        if self.params.mode_of(held.alert.recommended_action) is ActuatorMode.OBSERVE:
            out.records.append(
                self._record(held, ActionState.REFUSED, now, "actuator is in observe mode")
            )
            out.alerts.append(self._hold_notice(held, now, "refused: observe mode"))
            return out
        if held.alert.node is not None:
            self._learn_node(held.job_id, held.alert.node, now)
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
        out.alerts.append(self._hold_notice(held, now, ended))
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
            _touch(self.job_nodes, msg.job_id, msg.job_nodes)
            self._cap(self.job_nodes)
        out = Outcome(note="control applied")
        if msg.reset_breaker:

            def resets(b: _Breaker) -> bool:
                return not replay or self._tripped_at(b) <= msg.ts

            for job in [j for j, b in self._breakers.items() if resets(b)]:
                out.alerts.append(self._resolve_breaker(job, now))
            if self._global_breaker is not None and resets(self._global_breaker):
                out.alerts.append(self._resolve_global_breaker(now))
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
        self._issue(cmd.command_id, cmd.issued_at)
        self._apply_issue(cmd, cmd.issued_at)

    def restore_record(self, record: ActionRecord) -> None:
        """Replay one action record (latest per id wins) read back at start-up.

        The refusal that tripped a breaker (per job or global) opens it again until
        its window ends (:meth:`prune` with ``full`` drops the ones already over).
        """
        self._keep_record(record)
        if record.state is not ActionState.REFUSED or record.alert is None:
            return
        a, until = record.alert, record.ts + timedelta(seconds=self.params.window_s)
        if record.detail.startswith("circuit breaker:"):
            fp = episode_fingerprint(a.job_id, AlertKind.GUARDRAIL.value, None, None,
                                     int(record.ts.timestamp()))  # fmt: skip
            b = self._breakers.get(a.job_id)
            if b is None or b.open_until < until:
                _touch(self._breakers, a.job_id, _Breaker(fp, until, a.step, a.node, a.job_id))
                self._cap(self._breakers)
        elif record.detail.startswith(GLOBAL_BUDGET + ":"):
            b = self._global_breaker
            if b is None or b.open_until < until:
                fp = episode_fingerprint("*", "global-" + AlertKind.GUARDRAIL.value, None,
                                         None, int(record.ts.timestamp()))  # fmt: skip
                self._global_breaker = _Breaker(fp, until, a.step, a.node, a.job_id, True)

    def _tripped_at(self, b: _Breaker) -> datetime:
        return b.open_until - timedelta(seconds=self.params.window_s)

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
            self.issued = {k: t for k, t in self.issued.items() if t >= cut}
            self._episodes = {k: e for k, e in self._episodes.items() if e.touched >= cut}
            self.actions = {
                k: r for k, r in self.actions.items()
                if r.ts >= cut or r.state is ActionState.HELD
            }  # fmt: skip
            for d in (self._last_acted, self._last_checkpoint, self._last_relaunch):
                for key in [k for k, t in d.items() if t < cut]:
                    del d[key]
            self._newest_ts = {k: v for k, v in self._newest_ts.items() if v[1] >= cut}
            self._nodes = {k: v for k, v in self._nodes.items() if v.touched >= cut}
            # breakers rebuilt from records whose window is over: closed long ago
            self._breakers = {k: b for k, b in self._breakers.items() if b.open_until > now}
            if self._global_breaker is not None and self._global_breaker.open_until <= now:
                self._global_breaker = None
        _drop_front(self.issued, lambda t: t < cut)
        _drop_front(self._episodes, lambda e: e.touched < cut)
        # a hold leaves by expiring (hold_ttl_s <= horizon), never by pruning
        _drop_front(self.actions, lambda r: r.ts < cut and r.state is not ActionState.HELD)
        for d in (self._last_acted, self._last_checkpoint, self._last_relaunch):
            _drop_front(d, lambda t: t < cut)
        _drop_front(self._newest_ts, lambda v: v[1] < cut)
        _drop_front(self._nodes, lambda v: v.touched < cut)
        stale = bisect.bisect_left(self._isolations, cut, key=lambda i: i[0])
        del self._isolations[:stale]

    def memory(self) -> dict[str, int]:
        """Entries per map (for logs and tests)."""
        return {
            "episodes": len(self._episodes), "issued": len(self.issued),
            "actions": len(self.actions), "held": len(self._holding),
            "isolations": len(self._isolations), "node_cooldowns": len(self._last_acted),
            "checkpoints": len(self._last_checkpoint), "relaunches": len(self._last_relaunch),
            "breakers": len(self._breakers) + (self._global_breaker is not None),
            "repair": len(self.repair), "job_nodes": len(self.job_nodes),
            "newest_ts": len(self._newest_ts), "job_node_sets": len(self._nodes),
        }  # fmt: skip

    # -- queries -----------------------------------------------------------------------
    @property
    def held(self) -> list[ActionRecord]:
        return [self.actions[a] for a in self._holding]

    def isolations_in_window(self, job_id: str | None, now: datetime) -> int:
        """Isolations of ``job_id`` (``None``: of every job) within the guard window."""
        since = now - timedelta(seconds=self.params.window_s)
        return sum(
            1 for ts, job, _ in self._isolations if (job_id is None or job == job_id) and ts > since
        )

    def isolation_limit(self, job_id: str) -> int:
        size = self.job_nodes.get(job_id, self.params.default_job_nodes)
        limit = self.params.max_isolations
        if size > 0 and self.params.max_isolation_pct > 0:
            # rounded up, like Kubernetes' maxUnavailable: a small job may still lose
            # one node per window (5 % of 16 nodes allows 1, not 0)
            limit = min(limit, math.ceil(size * self.params.max_isolation_pct / 100 - 1e-9))
        elif size > 0:
            limit = 0
        return limit

    def breaker_open(self, job_id: str) -> bool:
        return job_id in self._breakers

    @property
    def global_breaker_open(self) -> bool:
        return self._global_breaker is not None

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
        plan = self._plan(alert, first_step, now, mode)
        refusal = self._guard(alert, plan, now)
        record = ActionRecord(
            action_id=aid, state=ActionState.OBSERVED, job_id=alert.job_id, mode=mode,
            commands=plan.commands, reason=(alert.fingerprint,), alert=alert,
            summary=plan.summary, by=by, ts=now,
        )  # fmt: skip
        if mode is ActuatorMode.OBSERVE:
            detail = f"would be refused: {refusal}" if refusal else "would be issued"
            out.records.append(self._record(record, ActionState.OBSERVED, now, detail))
            return out
        if refusal is not None:
            opens = refusal.startswith("circuit breaker:") and alert.job_id not in self._breakers
            if opens and plan.isolated is not None:
                out.alerts.extend(self._open_breaker(alert, now, refusal))
            trips = refusal.startswith(GLOBAL_BUDGET) and self._global_breaker is None
            if trips and plan.isolated is not None:
                out.alerts.append(self._open_global_breaker(alert, now, refusal))
            out.records.append(self._record(record, ActionState.REFUSED, now, refusal))
            return out
        executable = [c for c in plan.commands if c.kind is not CommandKind.NOTIFY]
        if mode is ActuatorMode.APPROVE and by is None and executable:
            held = self._record(record, ActionState.HELD, now, "awaiting approval")
            out.records.append(held)
            out.alerts.append(self._hold_notice(held, now))
            notice = self._hold_command(held, now)
            if notice.command_id not in self.issued:
                self._issue(notice.command_id, now)
                out.commands.append(notice)
            return out
        if by is not None:
            out.records.append(self._record(record, ActionState.APPROVED, now, "", by))
        for cmd in plan.commands:
            if cmd.command_id in self.issued:
                continue
            self._issue(cmd.command_id, now)
            self._apply_issue(cmd, now)
            out.commands.append(cmd)
        if not out.commands:
            out.note = "already issued"
        elif by is None:  # an approved action has its APPROVED record
            out.issued.append(Issued(aid, mode))
        return out

    def _plan(
        self, alert: Alert, first_step: int | None, now: datetime, mode: ActuatorMode
    ) -> _Plan:
        action, node, fp = alert.recommended_action, alert.node, alert.fingerprint
        expires = now + timedelta(seconds=self.params.command_ttl_s)
        known = self._nodes.get(alert.job_id)
        hint = None if known is None else tuple(known.names)
        # what was seen, not what to do: the Slurm drain reason names it
        detail = alert.evidence.detail
        cause = (f"{alert.kind.value}: {detail}" if detail else alert.summary)[:500] or None

        def cmd(
            kind: CommandKind,
            targets: tuple[str, ...] = (),
            replacements: tuple[str, ...] = (),
            checkpoint_step: int | None = None,
            summary: str = "",
        ) -> Command:
            return Command(
                command_id=command_id([fp], kind.value, list(targets)), kind=kind,
                job_id=alert.job_id, targets=targets, replacements=replacements,
                checkpoint_step=checkpoint_step, reason=(fp,), mode=mode, issued_at=now,
                expires_at=expires, summary=(summary or alert.summary)[:500],
                job_nodes=hint if targets and kind in _SCOPED else None,
                cause=cause, incident=alert.incident or None, grade=alert.grade,
            )  # fmt: skip

        nodes = (node,) if node else ()
        if action is RecommendedAction.ROLLBACK:
            to = None if first_step is None else max(0, first_step - 1)
            text = f"roll back to the last checkpoint at or before step {to}: {alert.summary}"
            return _Plan(
                (cmd(CommandKind.ROLLBACK, checkpoint_step=to, summary=text),), None, None, text
            )
        if action is RecommendedAction.RESTART:
            # a relaunch that excludes no node (a job-wide hang) needs no replacement
            spare = self._spare(node) if node else None
            repl = (spare,) if spare else ()
            text = f"restart excluding {node or 'nothing'}" + (
                f", bringing in {spare}" if spare else ""
            )
            cmds = (cmd(CommandKind.RESTART, nodes, repl, summary=text),)
            if node:
                cmds = (cmd(CommandKind.ISOLATE, nodes, repl, summary=text), *cmds)
            return _Plan(cmds, node, spare, text)
        if action in _ISOLATING and node:
            spare = self._spare(node)
            if spare:
                text = f"replace {node} with {spare} at the next checkpoint boundary"
                return _Plan(
                    (
                        cmd(CommandKind.CHECKPOINT, summary=text),
                        cmd(CommandKind.ISOLATE, nodes, (spare,), summary=text),
                        cmd(CommandKind.RESTART, nodes, (spare,), summary=text),
                    ),
                    node,
                    spare,
                    text,
                )
            recent = self._last_checkpoint.get(alert.job_id)
            fresh = recent is not None and (now - recent).total_seconds() < (
                self.params.checkpoint_min_interval_s
            )
            if self.params.no_spare_policy == "checkpoint" and not fresh:
                text = f"no spare for {node}: checkpoint and keep running degraded"
                return _Plan(
                    (
                        cmd(CommandKind.CHECKPOINT, summary=text),
                        cmd(CommandKind.NOTIFY, nodes, summary=text),
                    ),
                    None,
                    None,
                    text,
                )
            text = f"no spare for {node}: alert only" + (
                " (a checkpoint was taken moments ago)" if fresh else ""
            )
            return _Plan((cmd(CommandKind.NOTIFY, nodes, summary=text),), None, None, text)
        text = f"investigate: {alert.summary}"
        return _Plan((cmd(CommandKind.NOTIFY, nodes, summary=text),), None, None, text)

    def _learn_node(self, job: str, node: str, now: datetime) -> None:
        """``node`` was named in an alert of ``job`` (a hint executors check targets by)."""
        seen = self._nodes.get(job) or _Nodes(now)
        seen.touched = now
        _touch(seen.names, node, None)
        while len(seen.names) > MAX_JOB_NODE_NAMES:
            del seen.names[next(iter(seen.names))]
        _touch(self._nodes, job, seen)
        self._cap(self._nodes)

    def _spare(self, node: str | None) -> str | None:
        for spare in self.spares:
            if spare != node and spare not in self.repair:
                return spare
        return None

    def _guard(self, alert: Alert, plan: _Plan, now: datetime) -> str | None:
        """Why the plan may not run now, or ``None``."""
        if not any(c.kind is not CommandKind.NOTIFY for c in plan.commands):
            return None
        # a relaunch that replaces a node is governed by the circuit breaker; one that
        # only relaunches (hang, divergence) must not loop
        relaunch = (CommandKind.RESTART, CommandKind.ROLLBACK)
        relaunches = plan.isolated is None and any(c.kind in relaunch for c in plan.commands)
        last = self._last_relaunch.get(alert.job_id)
        if relaunches and last is not None:
            since = (now - last).total_seconds()
            if since < self.params.relaunch_cooldown_s:
                cool = self.params.relaunch_cooldown_s
                return f"job {alert.job_id} relaunched {since:.0f}s ago (< {cool:.0f}s)"
        node = alert.node
        if node is not None and node in self._last_acted:
            since = (now - self._last_acted[node]).total_seconds()
            if since < self.params.node_cooldown_s:
                cool = self.params.node_cooldown_s
                return f"node {node} is cooling down ({since:.0f}s < {cool:.0f}s)"
        if plan.isolated is None:
            return None
        job = alert.job_id
        if job in self._breakers:
            return f"circuit breaker open for job {job}"
        count, limit = self.isolations_in_window(job, now), self.isolation_limit(job)
        if count + 1 > limit:
            return (
                f"circuit breaker: {count} isolations in the last {self.params.window_s:.0f}s, "
                f"limit {limit}"
            )
        if self._global_breaker is not None:
            return f"{GLOBAL_BUDGET} exhausted (breaker open)"
        total, budget = self.isolations_in_window(None, now), self.params.max_isolations_global
        if total + 1 > budget:
            return (
                f"{GLOBAL_BUDGET}: {total} isolations across all jobs in the last "
                f"{self.params.window_s:.0f}s, limit {budget}"
            )
        return None

    def _apply_issue(self, cmd: Command, now: datetime) -> None:
        """Bookkeeping of an issued command: ledger, cooldowns, spares, repair marks."""
        if cmd.kind is CommandKind.CHECKPOINT:
            _touch(self._last_checkpoint, cmd.job_id, now)
            self._cap(self._last_checkpoint)
        if cmd.kind in (CommandKind.RESTART, CommandKind.ROLLBACK) and not cmd.targets:
            # only relaunches that replace no node count: a node replacement's restart
            # is the circuit breaker's business and must not block a later rollback
            _touch(self._last_relaunch, cmd.job_id, now)
            self._cap(self._last_relaunch)
        for node in cmd.targets:
            if cmd.kind is not CommandKind.NOTIFY:
                _touch(self._last_acted, node, max(now, self._last_acted.get(node, now)))
                self._cap(self._last_acted)
        for spare in cmd.replacements:
            if spare in self.spares:
                self.spares.remove(spare)
        if cmd.kind is not CommandKind.ISOLATE:
            return
        since = now - timedelta(seconds=self.params.window_s)
        for node in cmd.targets:
            previous = [ts for ts, _, n in self._isolations if n == node and ts > since]
            bisect.insort(self._isolations, (now, cmd.job_id, node), key=lambda i: i[0])
            if previous:
                _touch(self.repair, node, now)  # oldest mark first out at the cap
                self._cap(self.repair)
                if node in self.spares:
                    self.spares.remove(node)
        excess = len(self._isolations) - self.params.max_tracked
        if excess > 0:
            del self._isolations[:excess]
            self.evicted += excess

    def _open_breaker(self, alert: Alert, now: datetime, why: str) -> list[Alert]:
        job = alert.job_id
        count, limit = self.isolations_in_window(job, now), self.isolation_limit(job)
        fp = episode_fingerprint(job, AlertKind.GUARDRAIL.value, None, None, int(now.timestamp()))
        self._breakers[job] = _Breaker(
            fp, now + timedelta(seconds=self.params.window_s), alert.step, alert.node, job
        )
        return [
            self._breaker_alert(self._breakers[job], AlertState.FIRING, 0, now, count, limit, why)
        ]

    def _open_global_breaker(self, alert: Alert, now: datetime, why: str) -> Alert:
        """Trip the global isolation budget: one guardrail alert for all jobs."""
        total, budget = self.isolations_in_window(None, now), self.params.max_isolations_global
        fp = episode_fingerprint("*", "global-" + AlertKind.GUARDRAIL.value, None, None,
                                 int(now.timestamp()))  # fmt: skip
        self._global_breaker = b = _Breaker(
            fp, now + timedelta(seconds=self.params.window_s), alert.step, alert.node,
            alert.job_id, everywhere=True,
        )  # fmt: skip
        return self._breaker_alert(b, AlertState.FIRING, 0, now, total, budget, why)

    def _breaker_alert(
        self, b: _Breaker, state: AlertState, seq: int, now: datetime, count: int, limit: int,
        why: str,
    ) -> Alert:  # fmt: skip
        what = (
            f"actuator {GLOBAL_BUDGET} (all jobs; tripped by job {b.job})"
            if b.everywhere else f"actuator circuit breaker for job {b.job}"
        )  # fmt: skip
        return Alert(
            fingerprint=b.fingerprint, seq=seq, kind=AlertKind.GUARDRAIL, grade=Grade.CRITICAL,
            state=state, job_id=b.job, node=b.node, step=b.step,
            started_at=b.open_until - timedelta(seconds=self.params.window_s), ts=now,
            evidence=Evidence(metric="isolations_in_window", value=float(count),
                              deviation=float(count) / max(limit, 1), detail=why),
            recommended_action=RecommendedAction.INVESTIGATE,
            summary=f"{what}: {why}",
        )  # fmt: skip

    def _resolve_breaker(self, job: str, now: datetime) -> Alert:
        count, limit = self.isolations_in_window(job, now), self.isolation_limit(job)
        b = self._breakers.pop(job)
        return self._breaker_alert(b, AlertState.RESOLVED, 1, now, count, limit, "closed")

    def _resolve_global_breaker(self, now: datetime) -> Alert:
        b = self._global_breaker
        assert b is not None
        self._global_breaker = None
        total, budget = self.isolations_in_window(None, now), self.params.max_isolations_global
        return self._breaker_alert(b, AlertState.RESOLVED, 1, now, total, budget, "closed")

    def _close_expired_breakers(self, now: datetime) -> Outcome:
        out = Outcome()
        for job, b in list(self._breakers.items()):
            if now >= b.open_until or len(self._breakers) > self.params.max_tracked:
                out.alerts.append(self._resolve_breaker(job, now))
        if self._global_breaker is not None and now >= self._global_breaker.open_until:
            out.alerts.append(self._resolve_global_breaker(now))
        return out

    def _housekeeping(self, now: datetime) -> Outcome:
        """Before any input: expire holds, close breakers, forget what is past use."""
        out = self._expire_held(now)
        out.extend(self._close_expired_breakers(now))
        self.prune(now)
        return out

    def _expire_held(self, now: datetime) -> Outcome:
        out = Outcome()
        ttl = self.params.hold_ttl_s
        for aid, since in list(self._holding.items()):
            if (now - since).total_seconds() >= ttl:
                held = self.actions[aid]
                why = f"{EXPIRED}: neither approved nor rejected within {ttl:.0f}s"
                out.records.append(self._record(held, ActionState.CANCELLED, now, why))
                out.alerts.append(self._hold_notice(held, now, why))
        return out

    def _cancel_held(self, fingerprint: str, now: datetime) -> Outcome:
        out = Outcome()
        for rec in self.held:
            if fingerprint in rec.reason:
                out.records.append(
                    self._record(rec, ActionState.CANCELLED, now, "episode resolved")
                )
                out.alerts.append(self._hold_notice(rec, now, "cancelled: episode resolved"))
        return out

    def _hold_text(self, held: ActionRecord) -> tuple[str, float]:
        """What a person needs to decide on a hold, and the held alert's age (s)."""
        a, aid = held.alert, held.action_id
        if a is None:  # records always carry their alert; older ones may not
            what, age = "alert", 0.0
        else:
            age = max(0.0, (a.ts - a.started_at).total_seconds())
            where = f"node {a.node}" if a.node else "the whole job"
            rank = "" if a.rank is None else f" rank {a.rank}"
            what = f"{a.kind.value} {a.grade.value} on {where}{rank}, firing for {age:.0f}s"
        return (
            f"waiting for approval: {aid} ({what}) in job {held.job_id}: {held.summary}; "
            f"`stepguard approve {aid}` or `stepguard reject {aid} --reason ...` "
            f"within {self.params.hold_ttl_s:.0f}s"
        ), age

    def _hold_notice(self, held: ActionRecord, now: datetime, ended: str = "") -> Alert:
        """The decisions-topic side of a hold: FIRING while held, RESOLVED once it ends
        (``ended`` says how). ``held`` is the HELD record."""
        text, age = self._hold_text(held)
        a = held.alert
        return Alert(
            fingerprint="held-" + held.action_id.removeprefix("act-"), seq=1 if ended else 0,
            kind=AlertKind.GUARDRAIL, grade=a.grade if a else Grade.WARNING,
            state=AlertState.RESOLVED if ended else AlertState.FIRING, job_id=held.job_id,
            node=a.node if a else None, rank=a.rank if a else None, step=a.step if a else None,
            started_at=held.ts, ts=now,
            evidence=Evidence(metric="held_alert_age_s", value=age, deviation=0.0,
                              detail=ended or f"action {held.action_id} awaits approval"),
            recommended_action=RecommendedAction.INVESTIGATE,
            summary=f"{ended}: {held.action_id}" if ended else text,
        )  # fmt: skip

    def _hold_command(self, held: ActionRecord, now: datetime) -> Command:
        """The NOTIFY that carries a hold to people (the webhook executor posts it)."""
        text, _ = self._hold_text(held)
        a = held.alert
        targets = (a.node,) if a is not None and a.node else ()
        return Command(
            command_id=command_id(held.reason, f"notify-held:{held.action_id}", targets),
            kind=CommandKind.NOTIFY, job_id=held.job_id, targets=targets,
            reason=held.reason, mode=ActuatorMode.APPROVE, issued_at=now,
            expires_at=now + timedelta(seconds=self.params.hold_ttl_s), summary=text[:500],
            grade=a.grade if a is not None else None,
        )  # fmt: skip

    def _issue(self, cid: str, now: datetime) -> None:
        _touch(self.issued, cid, now)
        self._cap(self.issued)

    def _cap(self, d: dict[str, _V], also: dict[str, datetime] | None = None) -> None:
        """The hard cap: drop the oldest entries of ``d`` (and their keys in ``also``)."""
        while len(d) > self.params.max_tracked:
            key = next(iter(d))
            del d[key]
            if also is not None:
                also.pop(key, None)
            self.evicted += 1

    def _keep_record(self, rec: ActionRecord) -> None:
        _touch(self.actions, rec.action_id, rec)
        if rec.state is ActionState.HELD:
            _touch(self._holding, rec.action_id, rec.ts)
        else:
            self._holding.pop(rec.action_id, None)
        self._cap(self.actions, also=self._holding)  # an evicted action is not held

    def _record(
        self,
        base: ActionRecord,
        state: ActionState,
        now: datetime,
        detail: str,
        by: str | None = None,
    ) -> ActionRecord:
        rec = base.model_copy(
            update={"state": state, "detail": detail, "ts": now, "by": by or base.by}
        )
        self._keep_record(rec)
        return rec
