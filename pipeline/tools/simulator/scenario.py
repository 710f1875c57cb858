"""Scenario configuration: a job, its noise model and the faults and traps injected.

A scenario is a YAML file in ``pipeline/tools/simulator/scenarios/``. Every field has a
default, so a scenario only states what differs from an ordinary healthy job.

Examples
--------
>>> s = Scenario.model_validate({"name": "demo", "nodes": 2, "steps": 20,
...     "faults": [{"kind": "straggler", "node": 1, "gpu": 3, "onset_step": 5,
...                 "magnitude": 0.2}]})
>>> s.n_ranks, s.dp, s.faults[0].fault_id
(16, 2, 'straggler-0')
>>> t = s.truth()[0]
>>> t.node, t.rank, t.onset_step, t.end_step
('node-0001', 11, 5, None)
>>> round(s.faults[0].slowdown_at(4), 3), round(s.faults[0].slowdown_at(5), 3)
(0.0, 0.2)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from pipeline.io.errors import ConfigError
from schemas.truth import FaultKind, FaultTruth

__all__ = [
    "JOB_STOPPING_KINDS",
    "SCENARIO_DIR",
    "TRAP_KINDS",
    "FaultSpec",
    "Scenario",
    "ScenarioError",
    "Shape",
    "load_suite",
    "node_name",
]

#: Where the bundled scenario suite lives.
SCENARIO_DIR = Path(__file__).parent / "scenarios"

#: Fault kinds that are normal behaviour and must not alert.
TRAP_KINDS: frozenset[FaultKind] = frozenset(
    {
        FaultKind.STAGE_IMBALANCE,
        FaultKind.CLUSTER_SLOWDOWN,
        FaultKind.DIURNAL_TEMPERATURE,
        FaultKind.SINGLE_STEP_BLIP,
        FaultKind.HEALTH_DELAY,
        FaultKind.NOISY_NODE,
        FaultKind.WORK_IMBALANCE,
    }
)

#: Faults that stop the whole job (synchronous training: nobody completes a step).
JOB_STOPPING_KINDS: frozenset[FaultKind] = frozenset(
    {FaultKind.CRASH, FaultKind.ECC_STORM, FaultKind.HANG}
)


#: Allowed ``variant`` per kind (None: the first named one).
_VARIANTS: dict[FaultKind, tuple[str | None, ...]] = {
    FaultKind.STAGE_IMBALANCE: (None, "pipeline", "sequence_length"),
    FaultKind.CLUSTER_SLOWDOWN: (None, "storage", "compute", "power_cap"),
    FaultKind.PCIE_DOWNTRAIN: (None, "width", "gen"),
    FaultKind.ROW_REMAP: (None, "pending", "failure"),
    FaultKind.CLOCK_THROTTLE: (None, "thermal", "hw_slowdown", "power_cap"),
    FaultKind.HEALTH_DELAY: (None, "window", "stall"),
    FaultKind.ECC_STORM: (None, "subsiding"),
    FaultKind.WORK_IMBALANCE: (None, "sequence_length", "moe", "stage"),
    FaultKind.DATA_STALL: (None, "bursts"),
    FaultKind.STRAGGLER: (None, "compute", "hidden"),
    FaultKind.NOISY_NODE: (None, "compute", "waits"),
}


class ScenarioError(ConfigError):
    """A scenario file or definition is invalid; the message names the file/field."""


class Shape(StrEnum):
    """How a slowdown evolves after onset."""

    STEP = "step"  #: full magnitude at once
    LINEAR = "linear"  #: linear ramp to the magnitude over ``ramp_steps``
    EXP = "exp"  #: exponential creep (slow start, fast end) over ``ramp_steps``


def node_name(index: int) -> str:
    """The name of the node in slot ``index`` at the start of a job."""
    return f"node-{index:04d}"


class FaultSpec(BaseModel):
    """One injected fault or trap.

    Meaning of ``magnitude`` per kind:

    ==================== =====================================================================
    straggler            fractional compute slowdown (0.2: +20 %); ``hidden``: slower, its
                         compute clock normal (a CPU hog on its cores): only waits show it
    degradation          slowdown reached at the end of the ramp (``shape``, ``ramp_steps``)
    thermal              fractional SM-clock loss (compute grows by 1/(1-m) - 1)
    nic_flap             seconds added to a step when the NIC flaps (``probability`` per step)
    data_stall           seconds of data-loader wait added on the rank (``variant:
                         bursts``: on the first half of every ``every_steps`` steps
                         only, default 16: a prefetch queue that drains and refills)
    ecc_storm            peak corrected-ECC errors per health report; the uncorrectable
                         error, XID 48 and crash come ``duration_steps`` (30) after onset;
                         ``variant: subsiding``: bursts of up to ``magnitude`` corrected
                         errors in about half the reports for ``duration_steps``, then
                         they stop (no uncorrectable error, no crash: the alert must
                         resolve and nothing be isolated once it has)
    crash                unused; the node dies at ``onset_step`` and the job hangs
    hang                 unused; the job hangs ``duration_steps`` nominal steps (10)
    divergence           loss spike factor; NaN ``duration_steps`` steps after onset;
                         with a ``shape`` other than ``step`` a slow-onset drift: the loss
                         rises towards ``magnitude`` x along the shape over
                         ``ramp_steps`` (default 200) and the grad norm grows with it
                         (up to 3x), NaN only when ``duration_steps`` is set
    stage_imbalance      extra compute of the heaviest stage (``variant: pipeline``) or
                         the sigma of per-step replica noise (``sequence_length``)
    cluster_slowdown     (reached along ``shape`` over ``ramp_steps``: a ramp, not only
                         a step) seconds of data wait on every rank (``storage``), fractional
                         compute slowdown of every rank (``compute``), or SM-clock loss
                         of every GPU under a facility power cap (``power_cap``: clock
                         reason ``sw_power_cap`` everywhere, compute 1/(1-m) - 1 slower)
    pcie_downtrain       the GPU's (or node's) PCIe link trained to ``magnitude`` lanes
                         (``width``, default 8 of 16) or generation (``gen``, default 4
                         of 5); step times do not move
    nvlink_down          NVLink links down (default 1) with a burst of CRC/replay errors
    row_remap            a row remap pending (XID 63, ``pending``) or failed (XID 64,
                         ``failure``) from onset on
    drain_xid            the XID ``magnitude`` (e.g. 79, 94, 95, 119, 120, 74) once
    clock_throttle       fractional SM-clock loss with the clock reason of ``variant``
                         (``thermal``: sw_thermal_slowdown, +8 C; ``hw_slowdown``;
                         ``power_cap``: sw_power_cap on this GPU or node alone)
    diurnal_temperature  amplitude in degrees C over ``period_s``
    single_step_blip     fractional compute slowdown for exactly one step
    intermittent         fractional compute slowdown on one step in ``every_steps`` (a
                         periodic throttle, a neighbour's cron job), or on a random
                         ``probability`` fraction of steps when ``every_steps`` is unset
    stage_slowdown       fractional compute slowdown of every rank of pipeline stage
                         ``stage`` from ``onset_step`` on (structural: rebalance, not a
                         node fault); ``node`` unset
    group_slowdown       fractional compute slowdown of every GPU of ``group_size``
                         consecutive node slots from ``node`` on (a rack: its cooling,
                         power shelf or leaf switch), from ``onset_step``; one fault of
                         the group, not of any node
    health_delay         trap: the health path is blocked (``window``: from onset for
                         ``duration_steps``; ``stall``: while the job is stalled), then
                         drains ``magnitude`` nodes per second (0: at once); needs
                         ``health_interval_s`` (:mod:`pipeline.tools.simulator.health_path`)
    noisy_node           trap: the node's compute noise is ``magnitude`` x the job's,
                         its mean unchanged (noisier, not slower); ``waits``: its ranks
                         always wait ``magnitude`` x the collective less, the step no slower
    work_imbalance       trap: ranks get unequal work and take proportionally longer
                         (every rank then reports its tokens and FLOPs, see
                         ``Scenario.tokens_per_rank``): ``sequence_length`` (default):
                         each replica's tokens vary every step, log-normal with sigma
                         ``magnitude``; ``moe``: a random ``probability`` fraction of the
                         ranks (an expert's hot ranks) get ``1 + magnitude`` x the tokens,
                         a new draw every ``every_steps`` (25) steps; ``stage``: every
                         rank of pipeline stage ``stage`` does ``1 + magnitude`` x the
                         FLOPs per token, from onset on (persistent)
    ==================== =====================================================================

    A flapping NIC slows the collectives of the whole job (everyone's comm wait rises
    with the step time, as synchronous training requires); the node itself is named by
    its NIC error and retransmit counters in NodeHealth.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: FaultKind
    fault_id: str | None = Field(default=None, description="Default: '<kind>-<index>'.")
    node: NonNegativeInt | None = Field(default=None, description="Node slot at job start.")
    gpu: NonNegativeInt | None = Field(default=None, description="Local GPU; None: node.")
    onset_step: NonNegativeInt = 0
    duration_steps: PositiveInt | None = Field(default=None, description="None: to the end.")
    magnitude: float = 0.0
    shape: Shape = Shape.STEP
    ramp_steps: PositiveInt | None = None
    probability: float = Field(default=0.3, ge=0.0, le=1.0)
    variant: str | None = None
    period_s: float = Field(default=600.0, gt=0)
    factors: tuple[float, ...] | None = None
    every_steps: PositiveInt | None = Field(
        default=None, description="intermittent: one slow step in this many."
    )
    stage: NonNegativeInt | None = Field(default=None, description="stage_slowdown: the stage.")
    group_size: PositiveInt | None = Field(
        default=None, description="group_slowdown: node slots in the group, from node."
    )
    hang_steps: PositiveInt = Field(
        default=60,
        description="crash/ecc_storm: how long (nominal steps) the job hangs before the "
        "scenario ends, unless the job is restarted.",
    )
    detail: str = ""

    @property
    def is_trap(self) -> bool:
        return self.kind in TRAP_KINDS

    @property
    def end_step(self) -> int | None:
        """Last step the fault is active (inclusive), None while it lasts to the end."""
        if self.subsides:
            return self.onset_step + (self.duration_steps or 30) - 1
        if self.kind in (FaultKind.CRASH, FaultKind.ECC_STORM, FaultKind.DIVERGENCE):
            return None
        if self.kind in (FaultKind.HANG, FaultKind.SINGLE_STEP_BLIP):
            return self.onset_step
        if self.duration_steps is None:
            return None
        return self.onset_step + self.duration_steps - 1

    @property
    def subsides(self) -> bool:
        """An ECC storm that stops on its own (no crash)."""
        return self.kind == FaultKind.ECC_STORM and self.variant == "subsiding"

    @property
    def crash_step(self) -> int:
        """crash: the step that never completes; ecc_storm: the step of the XID 48."""
        if self.kind == FaultKind.ECC_STORM:
            return self.onset_step + (self.duration_steps or 30)
        return self.onset_step

    def active(self, step: int) -> bool:
        end = self.end_step
        return step >= self.onset_step and (end is None or step <= end)

    def ramp_at(self, step: int) -> float:
        """Share of ``magnitude`` reached at ``step`` under ``shape`` (0 when inactive):
        1 at once for ``step``, a linear or exponential ramp over ``ramp_steps``
        (default: the duration, else 200) otherwise."""
        if not self.active(step):
            return 0.0
        if self.shape == Shape.STEP:
            return 1.0
        ramp = self.ramp_steps or self.duration_steps or 200
        x = min(1.0, (step - self.onset_step) / float(ramp))
        if self.shape == Shape.LINEAR:
            return x
        return (math.exp(4.0 * x) - 1.0) / (math.exp(4.0) - 1.0)

    def slowdown_at(self, step: int) -> float:
        """Fractional compute slowdown this fault causes at ``step`` (0 when none).

        Used by the simulator and by the benchmark to report the slowdown a
        degradation had reached when it was detected.
        """
        if not self.active(step):
            return 0.0
        m = self.magnitude
        if self.kind == FaultKind.THERMAL:
            ramp = min(1.0, (step - self.onset_step + 1) / float(self.ramp_steps or 10))
            loss = min(m * ramp, 0.9)
            return 1.0 / (1.0 - loss) - 1.0
        if self.kind == FaultKind.CLOCK_THROTTLE:
            return 1.0 / (1.0 - min(m, 0.9)) - 1.0
        if self.kind == FaultKind.INTERMITTENT:
            k = self.every_steps
            return m if k is not None and (step - self.onset_step) % k == k - 1 else 0.0
        if self.kind not in (
            FaultKind.STRAGGLER,
            FaultKind.DEGRADATION,
            FaultKind.SINGLE_STEP_BLIP,
            FaultKind.STAGE_SLOWDOWN,
            FaultKind.GROUP_SLOWDOWN,
        ):
            return 0.0
        if self.shape == Shape.STEP:
            return m
        ramp = self.ramp_steps or self.duration_steps or 200
        x = min(1.0, (step - self.onset_step) / float(ramp))
        if self.shape == Shape.LINEAR:
            return m * x
        k = 4.0  # exponential creep: e^(kx)-1 normalised to reach m at x=1
        return m * (math.exp(k * x) - 1.0) / (math.exp(k) - 1.0)


class Scenario(BaseModel):
    """A seeded, fully specified simulated training job.

    Topology: ``nodes`` x ``gpus_per_node`` ranks, ``rank = node * gpus + gpu``;
    tensor parallelism ``tp`` inside a node, ``pp`` pipeline stages, and
    ``dp = ranks / (tp * pp)`` data-parallel replicas (``dp_group`` is the replica
    index, replicas are laid out contiguously: rank = (dp * pp + stage) * tp + t).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    description: str = ""
    seed: int = 0
    job_id: str | None = Field(default=None, description="Default: the scenario name.")
    nodes: PositiveInt
    gpus_per_node: PositiveInt = 8
    tp: PositiveInt = 8
    pp: PositiveInt = 1
    steps: PositiveInt = 300
    start_time: AwareDatetime = Field(
        default_factory=lambda: datetime.now(UTC).replace(microsecond=0),
        description="When step 0 starts. Default: now (a scenario is dated from the moment "
        "it is made; the same object always plays the same records).",
    )
    health_interval_steps: PositiveInt = 10
    health_interval_s: float | None = Field(
        default=None,
        gt=0,
        description="Health on the nodes' own clocks every this many seconds "
        "(pipeline.tools.simulator.health_path); None: every health_interval_steps steps.",
    )
    health_delay_s: NonNegativeFloat = Field(
        default=0.0, description="Mean delivery delay of a health report (own clock only)."
    )
    warmup_steps: NonNegativeInt = 10
    warmup_extra: NonNegativeFloat = 1.0
    eval_every: NonNegativeInt = 0
    eval_factor: float = Field(default=2.0, ge=1.0)
    checkpoint_every: NonNegativeInt = 0
    checkpoint_s: NonNegativeFloat = 6.0
    announce_phases: bool = Field(
        default=True,
        description="The job announces each checkpoint save and eval when it starts, as "
        "the client's hooks do (StepExporter.phase, the PyTorch guard's checkpoint and "
        "phase, the Lightning and HF callbacks), and its leader says its waits for "
        "input that last a step (the guard's loader, InputWait). False: a job that "
        "saves without saying so, whose first save reads as a hang for as long as it "
        "lasts.",
    )
    checkpoint_growth: NonNegativeFloat = Field(
        default=0.0,
        description="Each checkpoint save takes this fraction of checkpoint_s longer "
        "than the one before (a model and optimizer state that grow).",
    )
    checkpoint_factor: float = Field(
        default=1.0,
        ge=1.0,
        le=4.0,
        description="Each checkpoint save takes this many times the one before, on top "
        "of checkpoint_growth (2.0: saves that double, a storage filling up).",
    )
    relaunch_s: float | None = Field(
        default=None,
        gt=0,
        description="Seconds a relaunch (RESTART, ROLLBACK) takes before the new run's "
        "first step: a scheduler queue, a container start, loading the checkpoint. "
        "None: 10 nominal step times.",
    )
    base_compute_s: float = Field(default=0.9, gt=0)
    compute_noise: NonNegativeFloat = 0.015
    rank_spread: NonNegativeFloat = 0.01
    jitter_prob: float = Field(default=2e-5, ge=0, le=1)
    data_wait_s: NonNegativeFloat = 0.01
    collective_s: NonNegativeFloat = 0.06
    tick_fraction: float = Field(default=0.25, gt=0, le=1)
    spares: NonNegativeInt = 4
    loss_start: float = Field(default=10.0, gt=0)
    loss_floor: float = Field(default=2.0, gt=0)
    loss_tau_steps: float = Field(default=400.0, gt=0)
    tokens_per_rank: PositiveInt | None = Field(
        default=None,
        description="Every rank reports the tokens (and FLOPs) of each step, this many "
        "on a balanced step; None: no work reported, unless a work_imbalance fault "
        "needs it (then 4096).",
    )
    flops_per_token: float = Field(default=6e9, gt=0, le=1e15)
    faults: tuple[FaultSpec, ...] = ()

    @field_validator("faults")
    @classmethod
    def _name_faults(cls, faults: tuple[FaultSpec, ...]) -> tuple[FaultSpec, ...]:
        """Give every fault an id ('<kind>-<index>') so truth and simulator agree."""
        return tuple(
            f if f.fault_id else f.model_copy(update={"fault_id": f"{f.kind.value}-{i}"})
            for i, f in enumerate(faults)
        )

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        if self.gpus_per_node % self.tp:
            raise ValueError(f"tp={self.tp} must divide gpus_per_node={self.gpus_per_node}")
        if self.n_ranks % (self.tp * self.pp):
            raise ValueError(f"ranks={self.n_ranks} not divisible by tp*pp={self.tp * self.pp}")
        ids = set()
        for f in self.faults:
            fid = f.fault_id or ""
            if fid in ids:
                raise ValueError(f"duplicate fault_id {fid!r}")
            ids.add(fid)
            if f.node is not None and f.node >= self.nodes:
                raise ValueError(f"fault {fid}: node {f.node} >= nodes={self.nodes}")
            if f.gpu is not None and f.gpu >= self.gpus_per_node:
                raise ValueError(f"fault {fid}: gpu {f.gpu} >= {self.gpus_per_node}")
            needs_node = f.kind in (
                FaultKind.STRAGGLER,
                FaultKind.DEGRADATION,
                FaultKind.THERMAL,
                FaultKind.NIC_FLAP,
                FaultKind.DATA_STALL,
                FaultKind.ECC_STORM,
                FaultKind.CRASH,
                FaultKind.SINGLE_STEP_BLIP,
                FaultKind.PCIE_DOWNTRAIN,
                FaultKind.NVLINK_DOWN,
                FaultKind.ROW_REMAP,
                FaultKind.DRAIN_XID,
                FaultKind.CLOCK_THROTTLE,
                FaultKind.INTERMITTENT,
                FaultKind.NOISY_NODE,
            )
            if needs_node and f.node is None:
                raise ValueError(f"fault {fid}: kind {f.kind.value} needs a node")
            needs_gpu = (FaultKind.DATA_STALL, FaultKind.ECC_STORM, FaultKind.ROW_REMAP,
                         FaultKind.DRAIN_XID)  # fmt: skip
            if f.kind in needs_gpu and f.gpu is None:
                raise ValueError(f"fault {fid}: kind {f.kind.value} needs a gpu")
            allowed = _VARIANTS.get(f.kind, (None,))
            if f.variant not in allowed:
                raise ValueError(f"fault {fid}: variant {f.variant!r} not in {allowed}")
            if f.kind == FaultKind.STAGE_SLOWDOWN and (f.stage is None or f.stage >= self.pp):
                raise ValueError(f"fault {fid}: stage_slowdown needs a stage < pp={self.pp}")
            if f.kind == FaultKind.GROUP_SLOWDOWN and (
                f.node is None or f.group_size is None or f.node + f.group_size > self.nodes
            ):
                raise ValueError(f"fault {fid}: group_slowdown needs node + group_size <= nodes")
            if f.kind == FaultKind.HEALTH_DELAY and self.health_interval_s is None:
                raise ValueError(f"fault {fid}: health_delay needs health_interval_s")
            if (
                f.kind == FaultKind.WORK_IMBALANCE
                and f.variant == "stage"
                and (f.stage is None or f.stage >= self.pp)
            ):
                raise ValueError(f"fault {fid}: work_imbalance stage needs stage < pp")
            if f.onset_step >= self.steps:
                raise ValueError(f"fault {fid}: onset_step beyond steps={self.steps}")
        return self

    # -- derived topology -------------------------------------------------------------
    @property
    def n_ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def dp(self) -> int:
        return self.n_ranks // (self.tp * self.pp)

    @property
    def work_tokens(self) -> int | None:
        """Tokens a rank processes on a balanced step, when the job reports work."""
        if self.tokens_per_rank is not None:
            return self.tokens_per_rank
        if any(f.kind == FaultKind.WORK_IMBALANCE for f in self.faults):
            return 4096
        return None

    @property
    def job(self) -> str:
        return self.job_id or self.name

    @property
    def start_ts(self) -> float:
        return self.start_time.timestamp()

    @property
    def stage_factors(self) -> tuple[float, ...]:
        """Per-stage compute factor (pipeline imbalance trap), 1.0 when balanced."""
        for f in self.faults:
            if f.kind == FaultKind.STAGE_IMBALANCE and (f.variant or "pipeline") == "pipeline":
                if f.factors is not None:
                    if len(f.factors) != self.pp:
                        raise ScenarioError(f"{self.name}: factors needs {self.pp} entries")
                    return f.factors
                m = f.magnitude
                out = [1.0] * self.pp
                if self.pp > 1:
                    out[0] = 1.0 + 0.5 * m  # embedding
                    out[-1] = 1.0 + m  # output layer + loss
                else:
                    out[0] = 1.0 + m
                return tuple(out)
        return (1.0,) * self.pp

    @property
    def nominal_step_s(self) -> float:
        """A healthy train step: the slowest stage's compute plus waits, plus noise."""
        slowest = self.base_compute_s * max(self.stage_factors)
        return slowest * (1.0 + 3.0 * self.compute_noise) + self.data_wait_s + self.collective_s

    @property
    def has_faults(self) -> bool:
        return any(not f.is_trap for f in self.faults)

    @property
    def is_trap_only(self) -> bool:
        return not self.has_faults

    # -- ground truth -----------------------------------------------------------------
    def truth(self) -> list[FaultTruth]:
        """One FaultTruth per injected fault or trap."""
        out = []
        for f in self.faults:
            rank = None
            if f.node is not None and f.gpu is not None:
                rank = f.node * self.gpus_per_node + f.gpu
            detail = f.detail
            if not detail:
                bits = [f"shape={f.shape.value}"] if f.kind == FaultKind.DEGRADATION else []
                if f.variant:
                    bits.append(f"variant={f.variant}")
                if f.kind == FaultKind.ECC_STORM and not f.subsides:
                    bits.append(f"uncorrectable+xid48 at step {self._crash_step(f)}")
                if f.kind == FaultKind.GROUP_SLOWDOWN and f.node is not None:
                    last = f.node + (f.group_size or 1) - 1
                    bits.append(f"group {node_name(f.node)}..{node_name(last)}")
                detail = ", ".join(bits)
            out.append(
                FaultTruth(
                    scenario=self.name,
                    job_id=self.job,
                    fault_id=f.fault_id or "",
                    kind=f.kind,
                    is_trap=f.is_trap,
                    node=node_name(f.node) if f.node is not None else None,
                    rank=rank,
                    onset_step=f.onset_step,
                    end_step=f.end_step,
                    magnitude=f.magnitude,
                    detail=detail,
                )
            )
        return out

    @staticmethod
    def _crash_step(f: FaultSpec) -> int:
        return f.crash_step

    # -- loading ----------------------------------------------------------------------
    @classmethod
    def from_yaml(cls, path: str | Path) -> Scenario:
        """Load one scenario; errors name the file."""
        p = Path(path)
        try:
            data: Any = yaml.safe_load(p.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ScenarioError(f"{p}: {exc}") from exc
        if not isinstance(data, dict):
            raise ScenarioError(f"{p}: expected a mapping at top level")
        data.setdefault("name", p.stem)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ScenarioError(f"{p}: {exc}") from exc


def load_suite(
    directory: str | Path | None = None, names: Sequence[str] | None = None
) -> list[Scenario]:
    """Every ``*.yaml`` scenario in ``directory`` (default: the bundled suite), by name.

    ``names`` keeps only the scenarios with those names (in the order given).
    """
    d = Path(directory) if directory is not None else SCENARIO_DIR
    suite = [Scenario.from_yaml(p) for p in sorted(d.glob("*.yaml"))]
    seen: set[str] = set()
    for s in suite:
        if s.name in seen:
            raise ScenarioError(f"{d}: duplicate scenario name {s.name!r}")
        seen.add(s.name)
    if names is None:
        return suite
    by_name = {s.name: s for s in suite}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise ScenarioError(f"unknown scenario(s): {', '.join(missing)}")
    return [by_name[n] for n in names]
