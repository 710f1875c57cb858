"""The signals DetectorSuite grades: when each family is graded, and how each is graded.

A *signal* names one kind of finding (``"straggler"``, ``"hang"``, ...); each has its
own :class:`~detectors.episodes.GradePolicy` (alert kind, enter and exit thresholds,
minimum durations, recommended actions). The suite grades a family at its own
moment: :data:`TRAIN_SIGNALS` on training steps, :data:`STEP_SIGNALS` on every step,
:data:`CLOCK_SIGNALS` from ``tick`` and :data:`~detectors.hardware.health.HEALTH_SIGNALS` on
a node's health report. A signal graded at a moment and not found then counts as an
observation below its exit threshold.

The policies themselves are built from the thresholds by
:func:`detectors.config.grade_policies`, one for every signal named here.
"""

from __future__ import annotations

__all__ = ["CLOCK_SIGNALS", "FATAL_XIDS", "STEP_SIGNALS", "TRAIN_SIGNALS"]

#: Signals graded on TRAIN steps only.
TRAIN_SIGNALS = frozenset(
    {
        "straggler",
        "intermittent",
        "degradation",
        "data_stall",
        "nic_flap",
        "loss",
        "imbalance",
        "group",
        "loss_drift",
    }
)
#: Signals graded on every step.
STEP_SIGNALS = frozenset({"missing", "nonfinite"})
#: Signals graded by ``tick``.
CLOCK_SIGNALS = frozenset({"hang", "relaunch_stuck", "health_missing"})
#: XID codes that are critical at once: the default of ``DetectorConfig.fatal_xids``,
#: read by the hardware rules (:mod:`detectors.hardware.rules` says what each means).
FATAL_XIDS: frozenset[int] = frozenset({48, 64, 74, 79, 94, 95, 119, 120})
