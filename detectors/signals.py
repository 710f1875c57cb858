"""The signals JobMonitor grades: when each family is graded, and how each is graded.

A *signal* names one kind of finding (``"straggler"``, ``"hang"``, ...); each has its
own :class:`~detectors.grading.GradePolicy` (alert kind, enter and exit thresholds,
minimum durations, recommended actions). The monitor grades a family at its own
moment: :data:`TRAIN_SIGNALS` on training steps, :data:`STEP_SIGNALS` on every step,
:data:`CLOCK_SIGNALS` from ``tick`` and :data:`~detectors.hardware.HEALTH_SIGNALS` on
a node's health report. A signal graded at a moment and not found then counts as an
observation below its exit threshold.

Examples
--------
>>> from detectors.config import MonitorConfig
>>> from detectors.hardware import HEALTH_SIGNALS
>>> policies = grade_policies(MonitorConfig())
>>> families = TRAIN_SIGNALS | STEP_SIGNALS | CLOCK_SIGNALS | HEALTH_SIGNALS
>>> sorted(policies) == sorted(families)
True
>>> p = policies["straggler"]
>>> p.kind.value, p.enter, p.exit
('straggler', (None, 0.05, 0.1), 0.025)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from detectors.grading import GradePolicy
from schemas.alerts import AlertKind, RecommendedAction

if TYPE_CHECKING:
    from detectors.config import MonitorConfig

__all__ = ["CLOCK_SIGNALS", "STEP_SIGNALS", "TRAIN_SIGNALS", "grade_policies"]

_A = RecommendedAction

#: Signals graded on TRAIN steps only.
TRAIN_SIGNALS = frozenset(
    {"straggler", "intermittent", "degradation", "data_stall", "nic_flap", "loss"}
)
#: Signals graded on every step.
STEP_SIGNALS = frozenset({"missing", "nonfinite"})
#: Signals graded by ``tick``.
CLOCK_SIGNALS = frozenset({"hang", "health_missing"})


def grade_policies(config: MonitorConfig) -> dict[str, GradePolicy]:
    """The grading policy of every signal, from the thresholds of ``config``.

    Parameters
    ----------
    config
        The thresholds; see :class:`~detectors.config.MonitorConfig` for their units.

    Returns
    -------
    dict
        Signal name -> policy, for every signal of every family.

    Raises
    ------
    ValueError
        When thresholds of one signal are out of order (an exit above an enter
        threshold, enter thresholds not increasing).
    """
    cfg = config
    hold, cool = cfg.hold_steps, cfg.cooloff_steps
    return {
        "straggler": GradePolicy(
            AlertKind.STRAGGLER,
            enter=(None, cfg.straggler_warning, cfg.straggler_critical),
            exit=cfg.straggler_exit,
            min_obs=(1, cfg.straggler_min_steps, cfg.straggler_critical_steps),
            hold_obs=hold,
            cooloff_obs=cool,
            actions=(_A.INVESTIGATE, _A.REPLACE_AT_CHECKPOINT, _A.ISOLATE),
        ),
        "intermittent": GradePolicy(
            AlertKind.STRAGGLER,
            enter=(None, cfg.intermittent_warning, None),
            exit=cfg.intermittent_exit,
            min_obs=(1, 2, 1),
            hold_obs=hold,
            cooloff_obs=cool,
            actions=(_A.INVESTIGATE, _A.REPLACE_AT_CHECKPOINT, _A.REPLACE_AT_CHECKPOINT),
        ),
        "degradation": GradePolicy(
            AlertKind.DEGRADATION,
            enter=(None, cfg.degradation_warning, cfg.degradation_critical),
            exit=cfg.degradation_exit,
            min_obs=(1, 2, cfg.straggler_critical_steps),
            hold_obs=hold,
            cooloff_obs=cool,
            actions=(_A.INVESTIGATE, _A.REPLACE_AT_CHECKPOINT, _A.REPLACE_AT_CHECKPOINT),
        ),
        "data_stall": GradePolicy(
            AlertKind.DATA_STALL,
            enter=(None, cfg.data_stall_warning, cfg.data_stall_critical),
            exit=cfg.data_stall_exit,
            min_obs=(1, cfg.straggler_min_steps, cfg.straggler_critical_steps),
            hold_obs=hold,
            cooloff_obs=cool,
            actions=(_A.INVESTIGATE, _A.INVESTIGATE, _A.REPLACE_AT_CHECKPOINT),
        ),
        "nic_flap": GradePolicy(
            AlertKind.NETWORK,
            enter=(None, cfg.nic_warning, None),
            exit=cfg.nic_exit,
            min_obs=(1, 1, 1),
            hold_obs=hold,
            cooloff_obs=cool,
            actions=(_A.INVESTIGATE, _A.REPLACE_AT_CHECKPOINT, _A.ISOLATE),
        ),
        "missing": GradePolicy(
            AlertKind.MISSING,
            enter=(None, None, float(cfg.missing_steps)),
            exit=0.5,
            min_obs=(1, 1, 1),
            hold_obs=1,
            cooloff_obs=cool,
            actions=(_A.INVESTIGATE, _A.INVESTIGATE, _A.ISOLATE),
        ),
        "nonfinite": GradePolicy(
            AlertKind.DIVERGENCE,
            enter=(None, None, 1.0),
            exit=0.5,
            min_obs=(1, 1, 1),
            hold_obs=hold,
            cooloff_obs=cool,
            actions=(_A.ROLLBACK, _A.ROLLBACK, _A.ROLLBACK),
        ),
        "loss": GradePolicy(
            AlertKind.DIVERGENCE,
            enter=(None, cfg.div_warning_z, cfg.div_critical_z),
            exit=cfg.div_exit_z,
            min_obs=(2, 2, 2),
            hold_obs=hold,
            cooloff_obs=cool,
            actions=(_A.INVESTIGATE, _A.ROLLBACK, _A.ROLLBACK),
        ),
        "hang": GradePolicy(
            AlertKind.HANG,
            enter=(None, None, cfg.hang_factor),
            exit=min(1.0, cfg.hang_factor),
            min_obs=(1, 1, 1),
            hold_obs=1,
            cooloff_obs=0,
            actions=(_A.RESTART, _A.RESTART, _A.RESTART),
        ),
        "health_missing": GradePolicy(
            AlertKind.MISSING,
            enter=(None, None, cfg.health_missing_factor),
            exit=min(1.0, cfg.health_missing_factor),
            min_obs=(1, 1, 1),
            hold_obs=1,
            cooloff_obs=cool,
            actions=(_A.INVESTIGATE, _A.INVESTIGATE, _A.ISOLATE),
        ),
        "thermal": GradePolicy(
            AlertKind.THERMAL,
            enter=(None, cfg.thermal_warning_c, cfg.thermal_critical_c),
            exit=cfg.thermal_exit_c,
            min_obs=(2, 2, 3),
            hold_obs=3,
            cooloff_obs=cool,
            actions=(_A.INVESTIGATE, _A.INVESTIGATE, _A.REPLACE_AT_CHECKPOINT),
        ),
        "ecc_rate": GradePolicy(
            AlertKind.HARDWARE,
            enter=(None, cfg.ecc_z_warning, cfg.ecc_z_critical),
            exit=cfg.ecc_z_warning / 2,
            min_obs=(2, 2, 2),
            hold_obs=3,
            cooloff_obs=cool,
            actions=(_A.INVESTIGATE, _A.REPLACE_AT_CHECKPOINT, _A.REPLACE_AT_CHECKPOINT),
        ),
        "nvlink_errors": GradePolicy(
            AlertKind.HARDWARE,
            enter=(None, cfg.nvlink_z_warning, None),
            exit=cfg.nvlink_z_warning / 2,
            min_obs=(2, 2, 2),
            hold_obs=3,
            cooloff_obs=cool,
            actions=(_A.INVESTIGATE, _A.REPLACE_AT_CHECKPOINT, _A.REPLACE_AT_CHECKPOINT),
        ),
        "nic_errors": GradePolicy(
            AlertKind.NETWORK,
            enter=(None, cfg.nic_z_warning, None),
            exit=cfg.nic_z_warning / 2,
            min_obs=(1, 1, 1),
            hold_obs=3,
            cooloff_obs=cool,
            actions=(_A.INVESTIGATE, _A.INVESTIGATE, _A.REPLACE_AT_CHECKPOINT),
        ),
        "pcie_downtrain": GradePolicy(
            AlertKind.HARDWARE,
            enter=(None, cfg.pcie_loss_warning, None),
            exit=cfg.pcie_loss_warning / 2,
            min_obs=(2, 2, 2),
            hold_obs=3,
            cooloff_obs=cool,
            actions=(_A.INVESTIGATE, _A.REPLACE_AT_CHECKPOINT, _A.REPLACE_AT_CHECKPOINT),
        ),
        "nvlink_down": GradePolicy(
            AlertKind.HARDWARE,
            enter=(None, 1.0, None),
            exit=0.5,
            min_obs=(2, 2, 2),
            hold_obs=3,
            cooloff_obs=cool,
            actions=(_A.INVESTIGATE, _A.REPLACE_AT_CHECKPOINT, _A.REPLACE_AT_CHECKPOINT),
        ),
        "row_remap": GradePolicy(
            AlertKind.HARDWARE,
            enter=(None, 1.0, None),
            exit=0.5,
            min_obs=(1, 1, 1),
            hold_obs=3,
            cooloff_obs=cool,
            actions=(_A.INVESTIGATE, _A.REPLACE_AT_CHECKPOINT, _A.REPLACE_AT_CHECKPOINT),
        ),
        "clock_throttle": GradePolicy(
            AlertKind.HARDWARE,
            enter=(None, cfg.throttle_warning, None),
            exit=cfg.throttle_warning / 2,
            min_obs=(2, 2, 2),
            hold_obs=3,
            cooloff_obs=cool,
            actions=(_A.INVESTIGATE, _A.INVESTIGATE, _A.REPLACE_AT_CHECKPOINT),
        ),
        "power_cap": GradePolicy(
            AlertKind.HARDWARE,
            enter=(cfg.power_cap_info, None, None),
            exit=cfg.power_cap_info / 2,
            min_obs=(2, 2, 2),
            hold_obs=3,
            cooloff_obs=cool,
            actions=(_A.INVESTIGATE, _A.INVESTIGATE, _A.INVESTIGATE),
        ),
        "hw_fatal": GradePolicy(
            AlertKind.HARDWARE,
            enter=(None, None, 1.0),
            exit=0.5,
            min_obs=(1, 1, 1),
            hold_obs=1,
            cooloff_obs=cool,
            actions=(_A.ISOLATE, _A.ISOLATE, _A.ISOLATE),
        ),
    }
