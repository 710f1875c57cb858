"""The actuator's role (``stepguard actuator``) and its pure policy (:mod:`pipeline.policy`,
which reads nothing else): :class:`ActuatorSettings`, mode, confirmation, guardrails,
spares, holds."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from pipeline.io.settings._base import MODEL_CONFIG

__all__ = ["ActuatorSettings"]


class ActuatorSettings(BaseSettings):
    """What the actuator decides with: its mode (per action kind too), how long a
    WARNING must persist, the guardrails, the spare pool, how long an action is held."""

    model_config = MODEL_CONFIG

    #: Prometheus port of ``stepguard actuator`` (0: off; :mod:`pipeline.io.metrics`)
    actuator_metrics_port: int = Field(default=9109, ge=0, le=65535)
    actuator_mode: Literal["observe", "approve", "auto"] = "observe"
    #: per action kind, a mode overriding actuator_mode: ``kind=mode,...`` (e.g.
    #: ``replace_at_checkpoint=auto,restart=approve``); control --mode-for changes it
    actuator_action_modes: str = ""
    command_ttl_s: float = Field(default=300.0, gt=0)
    #: a command result older than this (its ``ts`` behind the job's event time) is not
    #: acted on; one dated beyond the clock + max_clock_skew_s neither
    result_max_age_s: float = Field(default=600.0, gt=0)
    #: an approval or control change dated longer ago than this is refused (even when
    #: no newer one is left on the topic); judged against when it reached the topic
    control_max_age_s: float = Field(default=3600.0, gt=0)
    #: a WARNING episode must persist this many steps before it confirms
    warning_confirm_steps: int = Field(default=20, ge=1)
    #: ... or this many seconds of event time (whichever comes first)
    warning_confirm_s: float = Field(default=300.0, gt=0)
    #: alerts older than this (event time vs newest seen) are ignored
    stale_alert_s: float = Field(default=600.0, gt=0)
    #: circuit breaker: at most this many nodes isolated per window ...
    guard_max_isolations: int = Field(default=3, ge=0)
    #: ... and at most this percentage of a job's nodes
    guard_max_isolation_pct: float = Field(default=5.0, ge=0, le=100)
    #: ... and at most this many across all jobs (invented job ids cannot bypass it)
    guard_max_isolations_global: int = Field(default=10, ge=0)
    guard_window_s: float = Field(default=3600.0, gt=0)
    guard_node_cooldown_s: float = Field(default=1800.0, ge=0)
    #: at most one RESTART/ROLLBACK per job per this many seconds (no restart loops)
    guard_relaunch_cooldown_s: float = Field(default=300.0, ge=0)
    #: node count of a job for the percentage guardrail until a control message says
    #: otherwise (0: unknown, only guard_max_isolations applies)
    guard_job_nodes: int = Field(default=0, ge=0)
    spare_nodes: str = ""
    #: without a spare: checkpoint and keep running degraded, or alert only
    no_spare_policy: Literal["checkpoint", "alert"] = "checkpoint"
    #: a held action nobody approved or rejected for this long expires (archived)
    hold_ttl_s: float = Field(default=1800.0, gt=0)
    #: hard cap of each of the actuator's memory maps (oldest dropped first); the
    #: normal bound is time (the guard window, cooldowns, stale and hold horizons)
    actuator_max_tracked: int = Field(default=10_000, ge=100)

    @field_validator("actuator_action_modes")
    @classmethod
    def _check_action_modes(cls, value: str) -> str:
        _action_mode_pairs(value)
        return value.strip()

    @property
    def action_modes(self) -> list[tuple[str, str]]:
        """(recommended action, mode) pairs of ``actuator_action_modes``."""
        return _action_mode_pairs(self.actuator_action_modes)

    @property
    def spare_pool(self) -> list[str]:
        return [n.strip() for n in self.spare_nodes.split(",") if n.strip()]


def _action_mode_pairs(text: str) -> list[tuple[str, str]]:
    """``kind=mode,...`` as pairs; an unknown kind or mode, or a kind twice, is refused."""
    kinds = ("none", "investigate", "isolate", "replace_at_checkpoint", "restart", "rollback")
    modes = ("observe", "approve", "auto")
    pairs: list[tuple[str, str]] = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        kind, sep, mode = (v.strip() for v in item.partition("="))
        if not sep or kind not in kinds or mode not in modes:
            raise ValueError(
                f"{item!r}: expected kind=mode, kind one of {', '.join(kinds)}, mode one of "
                f"{', '.join(modes)}"
            )
        if kind in dict(pairs):
            raise ValueError(f"{kind} is given twice")
        pairs.append((kind, mode))
    return pairs
