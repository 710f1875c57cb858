"""The actuator policy's parameters (:class:`PolicyParams`) and what one input leads to
(:class:`Outcome`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from pipeline.io.settings.actuator import ActuatorSettings
from schemas import ActionRecord, ActuatorMode, Alert, Command, ControlMessage, RecommendedAction

__all__ = ["Issued", "Outcome", "PolicyParams"]


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
    def from_settings(cls, settings: ActuatorSettings) -> PolicyParams:
        """The parameters ``settings`` give (a whole :class:`~pipeline.io.settings.Settings`
        is one too): the policy reads the actuator's role only."""
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
    #: why an operator's message (approval, control) was refused; its acknowledgement
    #: says so (empty: not refused, or not an operator's message)
    refusal: str = ""

    def extend(self, other: Outcome) -> None:
        self.commands += other.commands
        self.records += other.records
        self.alerts += other.alerts
        self.issued += other.issued
        self.note = self.note or other.note
        self.refusal = self.refusal or other.refusal
