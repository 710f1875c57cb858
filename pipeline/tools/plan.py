"""``stepguard plan``: when does proactive fault tolerance pay, at a given scale?

A Monte-Carlo over fault traces of a whole job (thousands of replicates of, say, 21
days on 1,024 GPUs), each run through the policy rules that ``stepguard compare``
plays step by step (:data:`RULES`, shared by both so they cannot drift). A per-step
simulation of thousands of three-week traces is out of reach, so this is an
event-level model: each fault costs a closed-form amount of wall time, drawn per
event and summed per replicate with numpy.

Faults
------
- **crash** (fail-stop: a GPU, host or link dies). The job loses the work since its
  last checkpoint (uniform over the interval), waits until the failure is acted on,
  then relaunches (``restart_s``). Passive waits for the collective timeout
  (``comm_timeout_s``); active acts after its detection delay (``detect_crash_s``);
  hybrid after detection plus the human approval delay (``approval_delay_s``).
- **straggler** (fail-slow: one slow GPU or link holds every synchronous step). The
  job runs ``1 + slowdown`` times slower until the fault ends by itself
  (``straggler_mean_h``, capped at ``straggler_max_h``) or someone fixes it by hand
  (``manual_fix_h``, exponential). Passive never notices it; active detects it after
  ``detect_slow_s`` and replaces the node at the next checkpoint boundary (a relaunch
  without lost work), drawing a node from the spare pool; hybrid the same, after the
  approval delay.

Detection is not free: active also replaces healthy nodes on false alarms
(``false_replace_per_node_day``), each a relaunch and a spare; under hybrid a human
rejects them (an assumption: approvers catch false alarms).

Every replaced or crashed node stays out of the pool for ``repair_h``: the spare pool
a policy needs is the 95th percentile, over replicates, of the most nodes out at once.
Checkpoints cost ``save_s`` of wall time each. Overlapping faults are not merged (a
first-order model, like Young's and Daly's).

Default rates and their sources
-------------------------------
The defaults are published figures or labelled assumptions; replace them with your
site's own statistics (``--rates FILE``, JSON or TOML with any of :class:`Rates`'
fields).

- ``crash_per_gpu_hour`` = 419 / (54 days x 24 h x 16,384 GPUs) = 1.97e-5: Llama 3
  (Meta, "The Llama 3 Herd of Models", 2024, section 3.3.4) reports 419 unexpected
  interruptions in a 54-day snapshot of pre-training on 16,384 H100 GPUs, about 78 %
  of them attributed to confirmed or suspected hardware issues. A job of 1,024 GPUs
  then fails every ~49 hours, one of 16,384 every ~3 hours.
- stragglers: FALCON (Wu et al., "FALCON: Pinpointing and Mitigating Stragglers for
  Large-Scale Hybrid-Parallel Training", arXiv:2410.12588, 2024; at USENIX ATC 2025
  as "Greyhound") studied a shared production cluster of over 10,000 GPUs and found
  that fail-slows are common and last from tens of seconds to nearly ten hours
  (hence ``straggler_max_h`` = 10); ByteDance's five-month trace study ("Understanding
  Stragglers in Large Model Training Using What-if Analysis", OSDI 2025) likewise finds
  stragglers frequent and not always caused by hardware. Neither gives a per-GPU rate
  we can copy, so ``straggler_per_gpu_hour`` = the crash rate, ``slowdown`` = 0.3 and
  ``straggler_mean_h`` = 2 are **assumptions**.
- ``comm_timeout_s`` = 600: PyTorch's default NCCL process-group timeout (10 minutes).
- ``restart_s``, ``save_s``, ``detect_*``, ``approval_delay_s`` (``stepguard compare``'s
  default), ``manual_fix_h``, ``repair_h`` and ``false_replace_per_node_day`` are
  assumptions.

Checkpoint interval
-------------------
For each policy the interval that minimises the expected loss is searched on the
same replicates (common random numbers), and shown beside Young's estimate
``sqrt(2 C M)`` and Daly's higher-order one (C = ``save_s``, M = the job's mean time
between crashes). With crashes only, the model's optimum is ``sqrt(2 C M) - C``.

Examples
--------
>>> r = plan_one(1024, 21, 300, replicates=200, seed=1)
>>> r.policies["active"].lost_gpu_hours.mean < r.policies["passive"].lost_gpu_hours.mean
True
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.io.errors import ConfigError

__all__ = [
    "MAX_EVENTS",
    "POLICIES",
    "RULES",
    "PlanResult",
    "PolicyRules",
    "Rates",
    "SweepCell",
    "daly_interval_s",
    "load_rates",
    "plan_one",
    "sweep",
    "young_interval_s",
]

POLICIES = ("passive", "active", "hybrid")


@dataclass(frozen=True, slots=True)
class PolicyRules:
    """What a policy does about a fault: the rules ``stepguard compare`` plays per step
    and :func:`plan_one` per event."""

    #: the detection core and the actuator decide (slow nodes are noticed at all)
    detects: bool
    #: decisions take effect only after a human approval delay
    human_approval: bool
    #: a dead or hung job is relaunched by the collective timeout (nobody acts sooner)
    relaunch_on_timeout: bool


RULES: dict[str, PolicyRules] = {
    "passive": PolicyRules(detects=False, human_approval=False, relaunch_on_timeout=True),
    "active": PolicyRules(detects=True, human_approval=False, relaunch_on_timeout=False),
    "hybrid": PolicyRules(detects=True, human_approval=True, relaunch_on_timeout=False),
}

_CRASH_RATE = 419 / (54 * 24 * 16_384)
#: most fault events one plan draws (all replicates): memory stays in the hundreds of MB
MAX_EVENTS = 20_000_000


class Rates(BaseModel):
    """Fault statistics and response times (see the module docstring for sources)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    crash_per_gpu_hour: float = Field(_CRASH_RATE, ge=0)
    straggler_per_gpu_hour: float = Field(_CRASH_RATE, ge=0)
    slowdown: float = Field(0.3, gt=0, le=100)  #: mean extra step time while slowed
    straggler_mean_h: float = Field(2.0, gt=0)
    straggler_max_h: float = Field(10.0, gt=0)
    manual_fix_h: float = Field(6.0, gt=0)
    restart_s: float = Field(600.0, ge=0)
    save_s: float = Field(30.0, ge=0)
    comm_timeout_s: float = Field(600.0, ge=0)
    detect_crash_s: float = Field(60.0, ge=0)
    detect_slow_s: float = Field(120.0, ge=0)
    approval_delay_s: float = Field(300.0, ge=0)
    repair_h: float = Field(48.0, ge=0)
    false_replace_per_node_day: float = Field(0.0005, ge=0)
    gpus_per_node: int = Field(8, ge=1)


def load_rates(path: Path | None) -> Rates:
    """Defaults, overridden by a JSON or TOML file; a bad field is named."""
    if path is None:
        return Rates()
    try:
        text = path.read_text()
        data = tomllib.loads(text) if path.suffix == ".toml" else _json(text)
        return Rates.model_validate(data)
    except (OSError, ValueError, tomllib.TOMLDecodeError) as exc:
        if isinstance(exc, ValidationError):
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(file)"
            raise ConfigError(f"{path}: {where}: {first['msg']}") from exc
        raise ConfigError(f"{path}: {exc}") from exc


def _json(text: str) -> Any:
    import json

    return json.loads(text)


def young_interval_s(save_s: float, mtbf_s: float) -> float:
    """Young (1974): ``sqrt(2 C M)``.

    >>> round(young_interval_s(30, 3600 * 50))
    3286
    """
    return math.sqrt(2 * save_s * mtbf_s)


def daly_interval_s(save_s: float, mtbf_s: float) -> float:
    """Daly (2006), higher order: ``sqrt(2CM)(1 + sqrt(C/2M)/3 + C/18M) - C`` for
    ``C < 2M``, else ``M``.

    >>> round(daly_interval_s(30, 3600 * 50))
    3266
    """
    if save_s >= 2 * mtbf_s:
        return mtbf_s
    x = save_s / (2 * mtbf_s)
    return math.sqrt(2 * save_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - save_s


@dataclass(frozen=True, slots=True)
class Estimate:
    mean: float
    ci_low: float  #: 95 % confidence interval of the mean, over replicates
    ci_high: float
    p05: float  #: 5th and 95th percentile of one job's outcome
    p95: float

    @classmethod
    def of(cls, x: np.ndarray) -> Estimate:
        m = float(x.mean())
        half = 1.96 * float(x.std(ddof=1)) / math.sqrt(len(x)) if len(x) > 1 else 0.0
        lo, hi = np.percentile(x, [5, 95]) if len(x) else (m, m)
        return cls(m, m - half, m + half, float(lo), float(hi))


@dataclass(frozen=True, slots=True)
class PolicyPlan:
    policy: str
    lost_gpu_hours: Estimate
    goodput: Estimate
    best_interval_s: float
    best_lost_gpu_hours: float
    spare_nodes_p95: int
    remedied_stragglers: float  #: mean per job


@dataclass(frozen=True, slots=True)
class PlanResult:
    gpus: int
    days: float
    checkpoint_s: float
    replicates: int
    mtbf_h: float  #: the job's mean time between crashes
    young_s: float
    daly_s: float
    policies: dict[str, PolicyPlan]
    rates: dict[str, Any] = field(default_factory=dict)

    def winner(self, at_best: bool = False) -> str:
        key = (
            (lambda p: self.policies[p].best_lost_gpu_hours)
            if at_best
            else (lambda p: self.policies[p].lost_gpu_hours.mean)
        )
        return min(self.policies, key=key)

    def tied_with_winner(self) -> list[str]:
        """Policies whose 95 % CI of the mean loss overlaps the winner's."""
        w = self.policies[self.winner()].lost_gpu_hours
        return [
            p for p, v in self.policies.items()
            if p != self.winner() and v.lost_gpu_hours.ci_low <= w.ci_high
        ]  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["tied_with_winner"] = self.tied_with_winner()
        d["winner"] = self.winner()
        d["winner_at_best_interval"] = self.winner(at_best=True)
        return d


@dataclass(frozen=True, slots=True)
class _Traces:
    """Every replicate's faults, flattened: ``*_rep`` says whose each event is."""

    replicates: int
    horizon_s: float
    crash_rep: np.ndarray
    crash_t: np.ndarray
    crash_u: np.ndarray  #: phase within the checkpoint interval, U(0, 1)
    slow_rep: np.ndarray
    slow_t: np.ndarray
    slow_factor: np.ndarray  #: fraction of wall time lost while slowed
    slow_natural_s: np.ndarray  #: ends by itself / is fixed by hand after this
    slow_u: np.ndarray  #: wait for the next checkpoint boundary, U(0, 1)
    false_rep: np.ndarray  #: false alarms that an automatic policy acts on
    false_t: np.ndarray


def _draw(gpus: int, days: float, rates: Rates, replicates: int, seed: int) -> _Traces:
    rng = np.random.default_rng(seed)
    horizon_h = days * 24.0
    n_c = rng.poisson(rates.crash_per_gpu_hour * gpus * horizon_h, replicates)
    n_s = rng.poisson(rates.straggler_per_gpu_hour * gpus * horizon_h, replicates)
    reps = np.arange(replicates)
    crash_rep = np.repeat(reps, n_c)
    slow_rep = np.repeat(reps, n_s)
    ns = int(n_s.sum())
    extra = rng.exponential(rates.slowdown, ns)  # slow by 1 + extra
    natural = np.minimum(
        rng.exponential(rates.straggler_mean_h, ns), rates.straggler_max_h
    )  # fmt: skip
    fix = rng.exponential(rates.manual_fix_h, ns)
    nodes = math.ceil(gpus / rates.gpus_per_node)
    n_f = rng.poisson(rates.false_replace_per_node_day * nodes * days, replicates)
    return _Traces(
        replicates=replicates,
        horizon_s=horizon_h * 3600.0,
        crash_rep=crash_rep,
        crash_t=rng.uniform(0, horizon_h * 3600.0, int(n_c.sum())),
        crash_u=rng.uniform(0, 1, int(n_c.sum())),
        slow_rep=slow_rep,
        slow_t=rng.uniform(0, horizon_h * 3600.0, ns),
        slow_factor=extra / (1 + extra),
        slow_natural_s=np.minimum(natural, fix) * 3600.0,
        slow_u=rng.uniform(0, 1, ns),
        false_rep=np.repeat(reps, n_f),
        false_t=rng.uniform(0, horizon_h * 3600.0, int(n_f.sum())),
    )


def _response_s(rules: PolicyRules, rates: Rates, detect_s: float) -> float:
    """From a fault's onset to the decision taking effect (before a boundary wait)."""
    if not rules.detects:
        return math.inf
    return detect_s + (rates.approval_delay_s if rules.human_approval else 0.0)


def _crash_parts(tr: _Traces, rules: PolicyRules, rates: Rates) -> tuple[np.ndarray, np.ndarray]:
    """Per replicate: the loss that does not depend on the interval, and the factor of it."""
    if rules.relaunch_on_timeout:
        wait = rates.comm_timeout_s
    else:
        wait = _response_s(rules, rates, rates.detect_crash_s)
    if math.isinf(wait):  # nobody acts: the collective timeout still ends the job
        wait = rates.comm_timeout_s
    fixed = np.bincount(tr.crash_rep, minlength=tr.replicates) * (wait + rates.restart_s)
    per_interval = np.bincount(tr.crash_rep, weights=tr.crash_u, minlength=tr.replicates)
    return fixed.astype(float), per_interval


def _straggler_loss(
    tr: _Traces, rules: PolicyRules, rates: Rates, interval_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per straggler: seconds lost, and whether it was remedied by a replacement."""
    left = tr.horizon_s - tr.slow_t
    natural = np.minimum(tr.slow_natural_s, left)
    respond = _response_s(rules, rates, rates.detect_slow_s)
    if math.isinf(respond):
        return tr.slow_factor * natural, np.zeros(len(natural), dtype=bool)
    act = respond + tr.slow_u * interval_s
    replaced = act < natural
    lost = tr.slow_factor * np.where(replaced, act, natural) + replaced * rates.restart_s
    return lost, replaced


def _acts_on_false_alarms(rules: PolicyRules) -> bool:
    return rules.detects and not rules.human_approval


def _evaluate(
    tr: _Traces, rules: PolicyRules, rates: Rates, interval_s: float,
    crash: tuple[np.ndarray, np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Lost wall seconds per replicate at one interval, and the replaced stragglers."""
    fixed, per_interval = crash
    s_lost, replaced = _straggler_loss(tr, rules, rates, interval_s)
    events = fixed + per_interval * interval_s
    events += np.bincount(tr.slow_rep, weights=s_lost, minlength=tr.replicates)
    if _acts_on_false_alarms(rules):
        events += np.bincount(tr.false_rep, minlength=tr.replicates) * rates.restart_s
    events = np.minimum(events, tr.horizon_s)
    overhead = (tr.horizon_s - events) * rates.save_s / (interval_s + rates.save_s)
    return events + overhead, replaced


def _peak_out(tr: _Traces, replaced: np.ndarray, repair_s: float, false_alarms: bool) -> np.ndarray:
    """Most nodes out for repair at once, per replicate (crashed + replaced)."""
    f_rep, f_t = (tr.false_rep, tr.false_t) if false_alarms else (tr.false_rep[:0], tr.false_t[:0])
    rep = np.concatenate([tr.crash_rep, tr.slow_rep[replaced], f_rep])
    start = np.concatenate([tr.crash_t, tr.slow_t[replaced], f_t])
    if len(rep) == 0:
        return np.zeros(tr.replicates, dtype=int)
    reps = np.concatenate([rep, rep])
    times = np.concatenate([start, start + repair_s])
    delta = np.concatenate([np.ones(len(rep), int), -np.ones(len(rep), int)])
    order = np.lexsort((delta, times, reps))  # ends before starts at a tie
    level = np.cumsum(delta[order])  # each replicate's deltas sum to 0: no carry-over
    peak = np.zeros(tr.replicates, dtype=int)
    np.maximum.at(peak, reps[order], level)
    return peak


def _intervals(lo: float = 30.0, hi: float = 48 * 3600.0, n: int = 241) -> np.ndarray:
    return np.geomspace(lo, hi, n)


def plan_one(
    gpus: int,
    days: float,
    checkpoint_s: float,
    *,
    rates: Rates | None = None,
    replicates: int = 1000,
    seed: int = 0,
    grid: np.ndarray | None = None,
) -> PlanResult:
    """Expected loss of one job (``gpus`` for ``days``, a checkpoint every
    ``checkpoint_s`` seconds of wall time) under each policy."""
    if gpus < 1 or days <= 0 or checkpoint_s <= 0 or replicates < 2:
        raise ValueError(
            f"need gpus >= 1, days > 0, checkpoint_s > 0 and replicates >= 2, got "
            f"gpus={gpus}, days={days}, checkpoint_s={checkpoint_s}, replicates={replicates}"
        )
    rates = rates or Rates()
    per_job = (rates.crash_per_gpu_hour + rates.straggler_per_gpu_hour) * gpus * days * 24 + (
        rates.false_replace_per_node_day * math.ceil(gpus / rates.gpus_per_node) * days
    )
    if per_job * replicates > MAX_EVENTS:
        raise ValueError(
            f"about {per_job * replicates:,.0f} fault events to draw ({per_job:,.0f} per job x "
            f"{replicates} replicates), more than {MAX_EVENTS:,}: lower replicates"
        )
    tr = _draw(gpus, days, rates, replicates, seed)
    grid = _intervals() if grid is None else grid
    gpu_h = gpus / 3600.0
    mtbf_s = (
        math.inf if rates.crash_per_gpu_hour == 0 else 3600.0 / (rates.crash_per_gpu_hour * gpus)
    )
    out: dict[str, PolicyPlan] = {}
    for name in POLICIES:
        rules = RULES[name]
        crash = _crash_parts(tr, rules, rates)
        lost_s, replaced = _evaluate(tr, rules, rates, checkpoint_s, crash)
        means = np.array([_evaluate(tr, rules, rates, t, crash)[0].mean() for t in grid])
        best = int(np.argmin(means))
        peak = _peak_out(tr, replaced, rates.repair_h * 3600.0, _acts_on_false_alarms(rules))
        out[name] = PolicyPlan(
            policy=name,
            lost_gpu_hours=Estimate.of(lost_s * gpu_h),
            goodput=Estimate.of(1.0 - lost_s / tr.horizon_s),
            best_interval_s=float(grid[best]),
            best_lost_gpu_hours=float(means[best] * gpu_h),
            spare_nodes_p95=int(np.ceil(np.percentile(peak, 95))),
            remedied_stragglers=float(replaced.sum() / replicates),
        )  # fmt: skip
    return PlanResult(
        gpus=gpus,
        days=days,
        checkpoint_s=checkpoint_s,
        replicates=replicates,
        mtbf_h=mtbf_s / 3600.0,
        young_s=young_interval_s(rates.save_s, mtbf_s),
        daly_s=daly_interval_s(rates.save_s, mtbf_s),
        policies=out,
        rates=rates.model_dump(),
    )


@dataclass(frozen=True, slots=True)
class SweepCell:
    gpus: int
    days: float
    result: PlanResult


def sweep(
    gpus: Sequence[int],
    days: Sequence[float],
    checkpoint_s: float,
    *,
    rates: Rates | None = None,
    replicates: int = 400,
    seed: int = 0,
    progress: Callable[[int, int, str], None] | None = None,
) -> list[SweepCell]:
    """:func:`plan_one` for every scale and job length (fewer replicates, a coarser
    interval grid: the default sweep takes seconds)."""
    cells: list[SweepCell] = []
    total = len(gpus) * len(days)
    for g in gpus:
        for d in days:
            if progress is not None:
                progress(len(cells), total, f"{g} GPUs, {d:g} days")
            r = plan_one(g, d, checkpoint_s, rates=rates, replicates=replicates, seed=seed,
                         grid=_intervals(n=121))  # fmt: skip
            cells.append(SweepCell(g, d, r))
    if progress is not None:
        progress(total, total, "done")
    return cells
