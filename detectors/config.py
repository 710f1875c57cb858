"""DetectorConfig: every threshold of the detectors, in one frozen object.

Built once (the worker reads it from settings) and passed to
:class:`~detectors.engine.DetectorSuite`; every value is checked on construction, the
threshold orderings through :meth:`DetectorConfig.policies`, so a bad configuration
fails at start-up, naming the argument, and never halfway through a job.

Examples
--------
>>> cfg = DetectorConfig(straggler_warning=0.08)
>>> cfg.straggler_warning, cfg.straggler_critical
(0.08, 0.1)
>>> cfg.policies()["straggler"].enter
(None, 0.08, 0.1)
>>> DetectorConfig(nic_window=0)
Traceback (most recent call last):
...
ValueError: nic_window must be >= 1, got 0
>>> DetectorConfig(straggler_exit=0.2)
Traceback (most recent call last):
...
ValueError: exit must be <= the lowest enter threshold, got 0.2
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from detectors.episodes import GradePolicy
from detectors.signals import FATAL_XIDS
from schemas.alerts import AlertKind, RecommendedAction

__all__ = ["DetectorConfig", "grade_policies"]


@dataclass(frozen=True, kw_only=True)
class DetectorConfig:
    """Every threshold of the detectors, in one frozen object.

    Units: *fraction* = relative to the peer median (0.05 = 5 %); *z* = robust MAD
    units; *steps* / *reports* = consecutive observations of the subject.

    ==============================  =====================================================
    Peer comparison
    ``mad_floor_rel``               MAD floor as a fraction of the peer median (0.01)
    ``min_group_size``              smaller pipeline stages fall back to the whole job
    ``replica_correction``          subtract the replica's common mode (``dp_group`` =
                                    model replica) measured on its other nodes
    ``straggler_z``                 z of the slowdown excess needed to count at all
                                    (or a smoothed-excess z of ``degradation_z``)
    ``straggler_warning``           slowdown (fraction, above the rank's own baseline)
    ``straggler_critical``          ... for CRITICAL
    ``straggler_exit``              episode resolves below this
    ``straggler_min_steps``         steps above ``straggler_warning`` before firing
    ``straggler_critical_steps``    steps above ``straggler_critical`` before CRITICAL
    ``culprit_comm_max``            a culprit's comm-wait excess (fraction of step time)
                                    must not exceed this (culprits do not wait) unless
                                    it is within ``straggler_z`` of its peers' noise
    ``node_fraction``               share of a node's ranks flagged -> one node finding
    ``intermittent_z``              a step is *slow* for a rank at this z over its own
                                    baseline, ``intermittent_excess`` above peers, not
                                    waiting (:mod:`detectors.steps.intermittent`)
    ``intermittent_window``         train steps remembered per rank (<= 64)
    ``intermittent_min_slow``       slow steps in the window before a rank scores
    ``intermittent_min_pulses``     evenly spaced pulses (slow after not slow) that
                                    name a rank at any period, past the window (8)
    ``intermittent_max_fraction``   above this share of slow steps it is a straggler's
    ``intermittent_warning``        average slowdown the slow steps cost (fraction x
                                    excess) for WARNING; ``intermittent_exit`` resolves
    ``data_stall_z`` / ``_warning`` data-wait excess (fraction of step time) of one rank
    ``data_stall_critical``         ... for CRITICAL; ``data_stall_exit`` to resolve
    ``data_stall_hold_steps``       steps below exit before a data stall resolves: a
                                    loader that stalls in bursts is one episode while
                                    it lasts. Its remedy is the input path's
                                    (investigate at every grade, never replace the
                                    node: a bad disk or NIC of the node raises its own
                                    hardware alert)
    ``nic_z`` / ``nic_spike``       comm-wait excess of a node's ranks that is a spike
    ``nic_window``                  steps the spike fraction is counted over
    ``nic_warning`` / ``nic_exit``  spike fraction to fire / to resolve
    ``imbalance_info``              a pipeline stage's mean compute gap over the other
                                    stages (fraction) for an INFO ``rebalance`` notice
                                    (:mod:`detectors.steps.imbalance`); never an isolation
    ``imbalance_exit``              ... resolves below this (and ends the "since" streak)
    ``imbalance_alpha``             EW weight of one step in a stage's mean gap
    ``imbalance_min_steps``         TRAIN steps learned before the gap is scored, and
                                    steps at or above ``imbalance_info`` before firing
    ``group_window``                nodes whose node-level slowdown findings began
                                    within this many steps of each other ...
    ``group_min_nodes``             ... this many or more, are one ``group`` finding
                                    (:mod:`detectors.steps.group`), graded like a
                                    straggler's WARNING, recommending investigation
    Temporal baselines
    ``warmup_steps``                TRAIN steps a rank learns before it is scored
    ``baseline_alpha``              EW weight of the per-rank baselines (slow);
                                    ``baseline_alpha_up`` when above (default equal)
    ``learn_gate_z``                values beyond this z are not learned
    ``first_step_floor``            a rank slower than its stage's typical baseline by
                                    more than this (fraction) over its warm-up ...
    ``first_step_z``                ... and by this many robust sigmas (the ranks'
                                    spread and the warm-up mean's own error) is slow
                                    from its first step (so is a node, by its ranks'
                                    median): its baseline starts at the stage's
                                    typical value (:mod:`detectors.steps.first_step`)
    ``early_floor`` / ``early_z``   while its baseline warms, a rank computing this
                                    much (fraction) *and* this many robust sigmas above
                                    its step's peers, not waiting, is a straggler from
                                    the first step (:mod:`detectors.steps.early`)
    ``early_min_peers``             ... among at least this many peers
    ``waits_floor`` / ``waits_z``   a rank its stage peers wait on: their comm wait
                                    above its own, less what its compute clock
                                    explains, by this fraction of the step *and* this
                                    many robust sigmas (:mod:`detectors.steps.waits`)
    ``waits_step_slow``             ... only while the step is this much (fraction)
                                    slower than the job's own recent steps
    ``waits_warmup``                ... learned from at least this many steps
    ``waits_last_span``             a rank that arrived last in its stage in so many
    ``waits_last_p``                of its last this-many steps that its usual rate
                                    makes it less likely than ``waits_last_p`` (and
                                    by ``waits_floor`` of the step) is waited on,
                                    whatever the step's pace
    ``cusum_k`` / ``cusum_clip``    CUSUM allowance and per-step clip (z units)
    ``degradation_z``               smoothed-excess z that marks a creep (or, above
                                    ``straggler_warning``, a noisy straggler) ...
    ``degradation_cusum``           ... or CUSUM level (z units) that does
    ``degradation_warning``         smoothed slowdown excess (fraction) that fires
    ``degradation_critical``        ... for CRITICAL; ``degradation_exit`` to resolve
    Hangs and missing data
    ``hang_factor``                 no step for this many median step times: WARNING,
                                    and CRITICAL when a long step the job announced
                                    or learned is overrun (2.5, so a hang is flagged
                                    before 3 x the median step time)
    ``hang_critical_factor``        ... CRITICAL otherwise only after this many (8;
                                    never fewer than ``hang_factor``),
                                    or 1.5 x the job's longest recent long step: a
                                    first, unannounced checkpoint save looks like a
                                    hang while it lasts (:meth:`HangDetector.graded`)
    ``hang_window`` / ``hang_min_steps``  steps of the median / needed before scoring
    ``relaunch_max_s``              after :meth:`DetectorSuite.restarted` the job is
                                    *relaunching* until its new run's first step, for
                                    at most this many seconds (1800, 30 minutes: what
                                    NeMo allows a first step); past it a ``relaunch_stuck`` alert
                                    (WARNING, investigate: never a second RESTART).
                                    A relaunch is never a hang
    ``restart_grace_steps``         kept for old configurations (the relaunch grace
    ``restart_grace_min_s``         before relaunching was a state); unused
    ``missing_steps``               steps a rank is absent while others report
    ``missing_forget_steps``        a rank absent longer left the job
    ``health_missing_factor``       node health silent for this many of its declared
                                    intervals while most nodes report (2.5: two
                                    missed reports; a checkpoint save can stretch one
                                    interval, and a crashed node is still named while
                                    the job hangs)
    Divergence
    ``div_window`` / ``div_warmup`` rolling window of loss / grad norm, warm-up
    ``div_warning_z`` / ``div_critical_z``  one-sided robust z of loss or grad norm
    ``div_exit_z``                  resolves below this
    ``drift_warning``               the loss's recent median this far (fraction) above
                                    the best it reached: a slow-onset divergence
                                    (:mod:`detectors.training.drift`); half resolves
    ``drift_min_steps``             steps above ``drift_warning`` before WARNING
    Hardware
    ``hw_warmup_reports``           reports per GPU before baselines score
    ``thermal_warning_c``           °C above fleet and own offset, while throttling
    ``thermal_critical_c`` / ``thermal_exit_c``
    ``thermal_extreme_c``           excess that counts even without throttling signs
    ``clock_drop``                  SM-clock drop (fraction) that counts as throttling
    ``ecc_z_warning``               Poisson z of the corrected-ECC count of one report
                                    against max(own, fleet) rate (2 reports)
    ``ecc_z_critical``
    ``nvlink_z_warning``            ... of NVLink errors (2 reports)
    ``nic_z_warning``               ... of NIC errors + retransmits (1 report)
    ``pcie_loss_warning``           PCIe bandwidth fraction lost to a downtrained link
                                    (2 reports; NVLink links down and a pending row
                                    remap warn at once, fixed thresholds)
    ``throttle_warning``            short-run fraction of reports with a thermal/HW
                                    slowdown clock reason above own and fleet usual
    ``power_cap_info``              ... with a power-cap reason (info only)
    ``fatal_xids``                  XIDs critical at once (with any uncorrectable ECC)
    ``fatal_latch_reports``         reports a hard-rule episode stays open
    Grading
    ``hold_steps``                  observations below exit before resolving
    ``cooloff_steps``               a re-fire this soon re-opens the same episode
    ==============================  =====================================================
    """

    mad_floor_rel: float = 0.01
    replica_correction: bool = True
    min_group_size: int = 8
    straggler_z: float = 3.0
    straggler_warning: float = 0.05
    straggler_critical: float = 0.10
    straggler_exit: float = 0.025
    straggler_min_steps: int = 3
    straggler_critical_steps: int = 8
    culprit_comm_max: float = 0.02
    node_fraction: float = 0.5
    intermittent_z: float = 5.0
    intermittent_excess: float = 0.08
    intermittent_window: int = 48
    intermittent_min_slow: int = 5
    intermittent_min_pulses: int = 8
    intermittent_max_fraction: float = 0.75
    intermittent_warning: float = 0.03
    intermittent_exit: float = 0.01
    data_stall_z: float = 4.0
    data_stall_warning: float = 0.05
    data_stall_critical: float = 0.25
    data_stall_exit: float = 0.025
    data_stall_hold_steps: int = 30
    nic_z: float = 4.0
    nic_spike: float = 0.05
    nic_window: int = 20
    nic_warning: float = 0.25
    nic_exit: float = 0.1
    imbalance_info: float = 0.10
    imbalance_exit: float = 0.05
    imbalance_alpha: float = 0.05
    imbalance_min_steps: int = 20
    group_window: int = 5
    group_min_nodes: int = 3
    warmup_steps: int = 20
    baseline_alpha: float = 0.005
    baseline_alpha_up: float = 0.005
    learn_gate_z: float = 3.0
    first_step_floor: float = 0.05
    first_step_z: float = 5.0
    early_floor: float = 0.30
    early_z: float = 5.0
    early_min_peers: int = 4
    waits_floor: float = 0.10
    waits_z: float = 4.0
    waits_step_slow: float = 0.05
    waits_warmup: int = 8
    waits_last_span: int = 10
    waits_last_p: float = 3e-4
    cusum_k: float = 1.0
    cusum_clip: float = 4.0
    degradation_z: float = 5.0
    degradation_cusum: float = 15.0
    degradation_warning: float = 0.02
    degradation_critical: float = 0.10
    degradation_exit: float = 0.01
    hang_factor: float = 2.5
    hang_critical_factor: float = 8.0
    hang_window: int = 50
    hang_min_steps: int = 5
    restart_grace_steps: float = 20.0
    restart_grace_min_s: float = 30.0
    relaunch_max_s: float = 1800.0
    missing_steps: int = 2
    missing_forget_steps: int = 50
    health_missing_factor: float = 2.5
    div_window: int = 50
    div_warmup: int = 20
    div_warning_z: float = 8.0
    div_critical_z: float = 20.0
    div_exit_z: float = 4.0
    drift_warning: float = 0.05
    drift_min_steps: int = 5
    hw_warmup_reports: int = 5
    thermal_warning_c: float = 8.0
    thermal_critical_c: float = 15.0
    thermal_exit_c: float = 4.0
    thermal_extreme_c: float = 20.0
    clock_drop: float = 0.05
    ecc_z_warning: float = 6.0
    ecc_z_critical: float = 50.0
    nvlink_z_warning: float = 6.0
    nic_z_warning: float = 10.0
    pcie_loss_warning: float = 0.2
    throttle_warning: float = 0.5
    power_cap_info: float = 0.5
    fatal_xids: frozenset[int] = FATAL_XIDS
    fatal_latch_reports: int = 30
    hold_steps: int = 5
    cooloff_steps: int = 30

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int | float):
                continue
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"{f.name} must be finite and >= 0, got {v!r}")
        for name in (
            "min_group_size",
            "nic_window",
            "imbalance_min_steps",
            "group_window",
            "warmup_steps",
            "hang_window",
            "hang_min_steps",
            "missing_steps",
            "missing_forget_steps",
            "div_window",
            "div_warmup",
            "drift_min_steps",
            "hw_warmup_reports",
            "hold_steps",
            "data_stall_hold_steps",
            "fatal_latch_reports",
            "early_min_peers",
            "waits_warmup",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.relaunch_max_s <= 0:
            raise ValueError(f"relaunch_max_s must be > 0, got {self.relaunch_max_s!r}")
        if self.group_min_nodes < 2:
            raise ValueError(f"group_min_nodes must be >= 2, got {self.group_min_nodes!r}")
        if not 0 < self.node_fraction <= 1:
            raise ValueError(f"node_fraction must be in (0, 1], got {self.node_fraction!r}")
        if not 2 <= self.waits_last_span <= 30:
            raise ValueError(f"waits_last_span must be in [2, 30], got {self.waits_last_span!r}")
        for name in ("baseline_alpha", "baseline_alpha_up", "imbalance_alpha", "waits_last_p"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)!r}")
        if self.div_warmup > self.div_window:
            raise ValueError("div_warmup must be <= div_window")
        self.policies()  # validates every threshold ordering

    def policies(self) -> dict[str, GradePolicy]:
        """The grading policy of every signal (:func:`grade_policies`)."""
        return grade_policies(self)


_A = RecommendedAction


def grade_policies(config: DetectorConfig) -> dict[str, GradePolicy]:
    """The grading policy of every signal, from the thresholds of ``config``.

    Examples
    --------
    >>> from detectors.hardware.health import HEALTH_SIGNALS
    >>> from detectors.signals import CLOCK_SIGNALS, STEP_SIGNALS, TRAIN_SIGNALS
    >>> policies = grade_policies(DetectorConfig())
    >>> families = TRAIN_SIGNALS | STEP_SIGNALS | CLOCK_SIGNALS | HEALTH_SIGNALS
    >>> sorted(policies) == sorted(families)
    True
    >>> p = policies["straggler"]
    >>> p.kind.value, p.enter, p.exit
    ('straggler', (None, 0.05, 0.1), 0.025)

    Parameters
    ----------
    config
        The thresholds; see :class:`~detectors.config.DetectorConfig` for their units.

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
            hold_obs=cfg.data_stall_hold_steps,
            cooloff_obs=cool,
            # the input path's (loader, storage), not the node's: its hardware alerts
            # name a bad disk or NIC of its own
            actions=(_A.INVESTIGATE, _A.INVESTIGATE, _A.INVESTIGATE),
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
        "imbalance": GradePolicy(
            AlertKind.IMBALANCE,
            enter=(cfg.imbalance_info, None, None),
            exit=cfg.imbalance_exit,
            min_obs=(cfg.imbalance_min_steps, 1, 1),
            hold_obs=cfg.imbalance_min_steps,
            cooloff_obs=cool,
            actions=(_A.REBALANCE, _A.REBALANCE, _A.REBALANCE),
        ),
        "group": GradePolicy(
            AlertKind.GROUP,
            enter=(None, cfg.straggler_warning, None),
            exit=cfg.straggler_exit,
            min_obs=(1, cfg.straggler_min_steps, 1),
            hold_obs=hold,
            cooloff_obs=cool,
            actions=(_A.INVESTIGATE, _A.INVESTIGATE, _A.INVESTIGATE),
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
        "loss_drift": GradePolicy(
            AlertKind.DIVERGENCE,
            enter=(None, cfg.drift_warning, None),
            exit=cfg.drift_warning / 2,
            min_obs=(1, cfg.drift_min_steps, 1),
            hold_obs=hold,
            cooloff_obs=cool,
            actions=(_A.INVESTIGATE, _A.INVESTIGATE, _A.INVESTIGATE),
        ),
        "hang": GradePolicy(
            AlertKind.HANG,
            enter=(None, cfg.hang_factor, max(cfg.hang_factor, cfg.hang_critical_factor)),
            exit=min(1.0, cfg.hang_factor),
            min_obs=(1, 1, 1),
            hold_obs=1,
            cooloff_obs=0,
            actions=(_A.INVESTIGATE, _A.INVESTIGATE, _A.RESTART),
        ),
        "relaunch_stuck": GradePolicy(
            AlertKind.HANG,
            enter=(None, 1.0, None),
            exit=0.5,
            min_obs=(1, 1, 1),
            hold_obs=1,
            cooloff_obs=0,
            # a relaunch that does not come back needs a person, never a second RESTART
            actions=(_A.INVESTIGATE, _A.INVESTIGATE, _A.INVESTIGATE),
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
