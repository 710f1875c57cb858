"""Detection quality of ``DetectorSuite`` over the simulator suite, with two baselines.

Every scenario of ``pipeline/tools/simulator/scenarios`` runs through the detection core
(``detectors.job.JobDetection``) around a fresh ``detectors.engine.DetectorSuite``:
``on_health`` per health report, ``on_frame`` per frame, ``tick(ts)`` on every
event and every ``TICK_S`` (1 s) of event time between them, as the worker's timer
ticks whether records come or not (so a checkpoint's silence, or a hang's, is scored
as the production worker scores it), in the core's event-time order. Checkpoints and
evals are announced when they start (``JobEvent`` PHASE, as the client's hooks do)
unless the scenario says ``announce_phases: false``. The same frames also feed two
baselines measured in the same run:

- **static_threshold**: alert when a train step's wall time exceeds 1.5 x the median
  of the first 20 train steps, naming the rank with the largest step time. In
  synchronous training every rank has the same step time, so that rank (the first,
  rank 0) is arbitrary: this is what a step-time threshold can do, measured honestly.
- **relative_score** (in the style of NVIDIA's straggler detector): every 10 train
  steps, per-rank score = best rank's median compute time / the rank's median compute
  time; alert when score < 0.7, naming that rank. No peer groups, no temporal
  baseline, no health data.

Matching. A group fault (``group_slowdown``: the nodes of a rack or switch slowing
together) is matched by a job-level ``group`` alert or by an alert naming one of its
nodes; its episodes per fault say whether it was one incident or a storm of node ones.
A stage slowing mid-job (``stage_slowdown``) is structural: it is matched by
a job-level INFO ``imbalance`` alert (recommending ``rebalance``), and nothing else; the
same notice in a job built with a slower stage (a ``stage_imbalance`` trap of the
pipeline variant) is true advice, counted as neutral, never as a trap alert.

A FIRING alert update matches a fault when it names the fault's node (or a
rank on it) and its step lies in ``[onset, end + grace]`` (grace 20 steps; faults
without an end last to the end of the run). While no step completes (hang, crash) an
update's step is the step in progress. Faults of the whole job match by kind: a hang
by a job-level (node None) hang/missing alert, a divergence by a divergence alert on
any node. During a crash/ECC stall a job-level hang alert is correct but does not
name the node: it is counted neither as a detection nor as a false positive.
A fault is detected when any FIRING update matches it; a false positive is an alert
episode (distinct fingerprint with a FIRING update) that matches no fault. Per fault
kind: recall over the faults of that kind; precision over the episodes matched to it
plus the false positives in scenarios that contain that kind.

Usage::

    python benchmarks/detection_quality.py            # full suite, writes BENCHMARKS.md
    python benchmarks/detection_quality.py --quick    # representative subset
    python benchmarks/detection_quality.py --json out.json --scenarios crash_64n,hang_64n
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import river
from _common import write_section

from detectors.engine import DetectorSuite
from detectors.frame import PHASE_CODES, StepFrame
from detectors.job import JobDetection
from pipeline.tools.simulator import (
    FaultSpec,
    Scenario,
    load_suite,
    node_name,
    simulate,
)
from pipeline.tools.simulator.announce import InputWaits, phase_announcement
from schemas import Alert, FaultKind, JobEvent, NodeHealth, Phase

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"
GRACE_STEPS = 20
TRAIN = PHASE_CODES[Phase.TRAIN]
XID_FATAL = frozenset({48, 79, 94, 95})

#: Representative subset for ``--quick``: every fault kind and every trap, small jobs.
QUICK = (
    "straggler_rank_10pct_64n",
    "straggler_rank_20pct_128n_pp4",
    "degradation_linear_rank_64n",
    "thermal_rank_64n",
    "nic_flap_64n",
    "data_stall_rank_64n",
    "ecc_storm_128n",
    "crash_64n",
    "hang_64n",
    "divergence_64n",
    "trap_stage_imbalance_128n_pp4",
    "trap_single_step_blips_64n",
    "trap_diurnal_temperature_128n",
    "trap_storage_hiccup_256n",
    "trap_seq_len_imbalance_256n_pp2",
    "mixed_multi_fault_128n",
    "pcie_downtrain_width_128n",
    "nvlink_down_128n_pp2",
    "row_remap_64n",
    "drain_xid_128n_pp4",
    "clock_throttle_64n",
    # issue 23's shapes: one slow step in k, a stage slowing mid-job, a noisier node, and
    # health held back behind a checkpoint
    "intermittent_every5_60pct_64n",
    "stage_slowdown_mid_128n_pp4",
    "trap_noisy_node_128n",
    "trap_health_delay_ckpt_64n",
    # issue 43: work imbalance moving between ranks (sequence lengths, MoE routing), with
    # and without a straggler hidden in it, and persistent on one stage
    "trap_work_seq_len_moving_64n",
    "trap_work_moe_moving_64n",
    "trap_work_stage_persistent_128n_pp4",
    "work_moe_hidden_straggler_64n",
    "work_seq_len_hidden_straggler_64n",
    # a rack slowing together, an ECC storm that subsides, a loss that drifts up slowly
    "group_rack_slowdown_128n",
    "ecc_storm_subsides_128n",
    "divergence_slow_onset_64n",
    # issue 44: saves that double, judged by their trend; a hang between growing saves
    "trap_saves_doubling_64n",
    "hang_saves_growing_64n",
    # issue 44: an intermittent straggler at a period longer than the 48-step window
    "intermittent_every15_60pct_64n",
    # issue 44: contention only the waits show (a rank, a node in a pipeline), and a
    # node that always waits less while the whole job slows for another reason
    "straggler_hidden_20pct_64n",
    "straggler_hidden_node_15pct_128n_pp2",
    "trap_waits_skew_64n",
)

# Targets.
TARGET_F1 = 0.97
TARGET_STRAGGLER_MEDIAN_STEPS = 10
TARGET_DEGRADATION_SLOWDOWN = 0.10
TARGET_HANG_STEP_TIMES = 3.0
#: event seconds between the detection core's ticks: the worker's default timer
#: (``worker_tick_interval_s``), which ticks whether records come or not
TICK_S = 1.0
TARGET_FATAL_REPORTS = 1


class Detection(Protocol):
    def process_step(self, frame: StepFrame) -> list[Alert]: ...
    def process_health(self, msg: NodeHealth) -> list[Alert]: ...
    def tick(self, now: float) -> list[Alert]: ...


DetectionFactory = Callable[[str], Detection]


@dataclass(frozen=True, slots=True)
class Update:
    """One alert update as the benchmark saw it."""

    fingerprint: str
    kind: str
    grade: str
    firing: bool
    node: str | None
    rank: int | None
    step: int  #: step of the event it came with (step in progress while stalled)
    ts: float  #: event time it came with


# -- baselines -----------------------------------------------------------------------


class StaticThreshold:
    """Wall step time > factor x median of the first ``n_baseline`` train steps."""

    def __init__(self, factor: float = 1.5, n_baseline: int = 20) -> None:
        self.factor, self.n_baseline = factor, n_baseline
        self._first: list[float] = []
        self._episode: int | None = None

    def process_step(self, f: StepFrame) -> list[Update]:
        if f.phase[0] != TRAIN:
            return []
        t = float(f.step_time.max())
        if len(self._first) < self.n_baseline:
            self._first.append(t)
            return []
        if t <= self.factor * float(np.median(self._first)):
            self._episode = None
            return []
        i = int(np.argmax(f.step_time))  # all equal: the first rank, i.e. arbitrary
        if self._episode is None:
            self._episode = f.step
        rank = int(f.rank[i])
        return [
            Update(
                f"static-{self._episode}",
                "straggler",
                "warning",
                True,
                f.nodes[int(f.node_idx[i])],
                rank,
                f.step,
                f.ts,
            )
        ]


class RelativeScore:
    """NVIDIA-style relative performance score, reported every ``interval`` steps.

    Per report: each rank's median compute time over the interval's train steps;
    score = best rank's median / own median; alert when score < ``threshold``.
    """

    def __init__(self, threshold: float = 0.7, interval: int = 10) -> None:
        self.threshold, self.interval = threshold, interval
        self._buf: list[np.ndarray] = []
        self._open: dict[int, int] = {}  # rank -> first step of its open episode

    def process_step(self, f: StepFrame) -> list[Update]:
        if f.phase[0] != TRAIN:
            return []
        self._buf.append(f.compute)
        if len(self._buf) < self.interval:
            return []
        med = np.median(np.stack(self._buf), axis=0)
        self._buf = []
        score = med.min() / np.maximum(med, 1e-12)
        low = np.flatnonzero(score < self.threshold)
        ranks = {int(f.rank[i]): int(i) for i in low}
        self._open = {r: s for r, s in self._open.items() if r in ranks}
        out = []
        for r, i in ranks.items():
            first = self._open.setdefault(r, f.step)
            node = f.nodes[int(f.node_idx[i])]
            out.append(
                Update(f"rel-{r}-{first}", "straggler", "warning", True, node, r, f.step, f.ts)
            )
        return out


# -- running -------------------------------------------------------------------------


@dataclass(slots=True)
class Run:
    """What one scenario produced."""

    scenario: Scenario
    updates: dict[str, list[Update]]  #: method -> updates
    stall_start: dict[int, float]  #: step in progress -> ts the stall began
    fatal_reports: dict[str, float]  #: node -> ts of its fatal-XID health report
    reports: dict[str, list[float]]  #: node -> ts of every health report
    median_step_s: float
    wall_s: float
    last_step: int
    detection_s: float
    events: int


def run_scenario(scenario: Scenario, factory: DetectionFactory) -> Run:
    detection = JobDetection(scenario.job, suite=factory(scenario.job))
    static, rel = StaticThreshold(), RelativeScore()
    ups: dict[str, list[Update]] = {"detection": [], "static_threshold": [], "relative_score": []}
    stall_start: dict[int, float] = {}
    fatal: dict[str, float] = {}
    reports: dict[str, list[float]] = defaultdict(list)
    train_times: list[float] = []
    last_step, last_ts, n_events, spent = -1, scenario.start_ts, 0, 0.0
    gpus = scenario.gpus_per_node

    def conv(alerts: Iterable[Alert], step: int, ts: float) -> None:
        for a in alerts:
            node = a.node
            if node is None and a.rank is not None:
                node = node_name(a.rank // gpus)
            ups["detection"].append(
                Update(
                    a.fingerprint,
                    str(a.kind),
                    str(a.grade),
                    str(a.state) == "firing",
                    node,
                    a.rank,
                    step,
                    ts,
                )
            )

    next_tick = scenario.start_ts + TICK_S

    def tick_until(ts: float) -> None:
        # the worker's timer ticks whether records come or not (a checkpoint save, a
        # hang): so does this run, at the worker's default interval of event time
        nonlocal next_tick, spent
        while next_tick < ts:
            t0 = time.perf_counter()
            out = detection.tick(next_tick)
            spent += time.perf_counter() - t0
            conv(out, last_step + 1, next_tick)
            next_tick += TICK_S

    waits = InputWaits(scenario)
    for ev in simulate(scenario):
        n_events += 1
        f = ev.frame
        said: list[tuple[float, JobEvent]] = []
        if scenario.announce_phases and f is not None:  # as the player says them
            event = phase_announcement(scenario, f, max(last_step, 0))
            if event is not None:
                said.append((f.ts_start, event))
            wait = waits.during(f, max(last_step, 0))
            if wait is not None:
                said.append(wait)
        for at, event in said:
            tick_until(at)
            t0 = time.perf_counter()
            out = detection.on_lifecycle(event)
            spent += time.perf_counter() - t0
            conv(out, last_step + 1, at)
        tick_until(ev.ts)
        if f is not None:
            step = f.step
            last_step = step
            if f.phase[0] == TRAIN and len(train_times) < 10_000:
                train_times.append(float(f.step_time[0]))
            ups["static_threshold"] += static.process_step(f)
            ups["relative_score"] += rel.process_step(f)
        else:
            step = last_step + 1
            stall_start.setdefault(step, last_ts)
        for h in ev.health:
            reports[h.node].append(ev.ts)
            if any(XID_FATAL.intersection(g.xid_codes) for g in h.gpus):
                fatal.setdefault(h.node, ev.ts)
        t0 = time.perf_counter()
        out: list[Alert] = []
        for h in ev.health:
            out += detection.on_health(h)
        if f is not None:
            out += detection.on_frame(f)
        out += detection.tick(ev.ts)
        spent += time.perf_counter() - t0
        conv(out, step, ev.ts)
        last_ts = ev.ts
    return Run(
        scenario=scenario,
        updates=ups,
        stall_start=stall_start,
        fatal_reports=fatal,
        reports=dict(reports),
        median_step_s=float(np.median(train_times)) if train_times else math.nan,
        wall_s=last_ts - scenario.start_ts,
        last_step=last_step,
        detection_s=spent,
        events=n_events,
    )


# -- scoring -------------------------------------------------------------------------


@dataclass(slots=True)
class FaultResult:
    scenario: str
    fault_id: str
    kind: str
    magnitude: float
    detected: bool = False
    delay_steps: int | None = None
    delay_s: float | None = None
    delay_step_times: float | None = None  #: delay_s / median train step time
    slowdown_at_detection: float | None = None
    hang_flag_s: float | None = None  #: first hang/missing alert after the stall began
    fatal_reports: int | None = None  #: reports of the node until a fatal ECC alert
    episodes: int = 0
    by_kind: list[str] = field(default_factory=list)
    resolved: bool | None = None  #: a fault that ends: did its every episode resolve?
    subsides: bool = False  #: an ECC storm that stops on its own (no stall to flag)


@dataclass(slots=True)
class ScenarioScore:
    name: str
    nodes: int
    trap_only: bool
    faults: list[FaultResult]
    tp_episodes: dict[str, int]  #: fault kind -> episodes matched
    fp_episodes: int
    trap_window_fp: int  #: false positives inside a trap's window (mixed scenarios too)
    fp_examples: list[dict[str, Any]]
    neutral_episodes: int
    node_hours: float


def _window(f: FaultSpec, last_step: int) -> tuple[int, float]:
    end = f.end_step
    if end is None:
        return f.onset_step, math.inf
    return f.onset_step, min(end + GRACE_STEPS, max(last_step, end) + GRACE_STEPS)


def _names_node(u: Update, f: FaultSpec, gpus: int) -> bool:
    target = node_name(f.node) if f.node is not None else None
    if target is None:
        return False
    if u.node == target:
        return True
    return u.rank is not None and u.rank // gpus == f.node


def _names_member(u: Update, f: FaultSpec, run: Run) -> bool:
    """Does ``u`` name a node of group fault ``f``?"""
    if f.node is None:
        return False
    gpus = run.scenario.gpus_per_node
    members = {node_name(f.node + i) for i in range(f.group_size or 1)}
    return u.node in members or (
        u.rank is not None and u.rank // gpus in range(f.node, f.node + (f.group_size or 1))
    )


def _matches(u: Update, f: FaultSpec, run: Run) -> bool:
    lo, hi = _window(f, run.last_step)
    if not lo <= u.step <= hi:
        return False
    if f.kind == FaultKind.HANG:
        return u.node is None and u.kind in ("hang", "missing")
    if f.kind == FaultKind.DIVERGENCE:
        return u.kind == "divergence"
    if f.kind == FaultKind.STAGE_SLOWDOWN:  # structural: one INFO rebalance for the job
        return u.kind == "imbalance" and u.node is None and u.grade == "info"
    if f.kind == FaultKind.GROUP_SLOWDOWN:  # the group, or (a storm) one of its nodes
        return (u.kind == "group" and u.node is None) or _names_member(u, f, run)
    return _names_node(u, f, run.scenario.gpus_per_node)


def _neutral(u: Update, f: FaultSpec, run: Run) -> bool:
    """A job-level hang alert while a crashed node stalls the job: true, not naming."""
    if f.kind not in (FaultKind.CRASH, FaultKind.ECC_STORM) or u.node is not None:
        return False
    return u.kind in ("hang", "missing") and u.step >= f.crash_step


def _advised(us: Sequence[Update], s: Scenario) -> bool:
    """A job-level INFO rebalance notice in a job whose pipeline stages differ by
    construction (a ``stage_imbalance`` of the pipeline variant), or whose work is
    persistently unequal (a ``work_imbalance`` of the stage variant): true advice, the
    finding the design asks for, so neither a detection nor a false positive."""
    structural = any(
        (f.kind == FaultKind.STAGE_IMBALANCE and (f.variant or "pipeline") == "pipeline")
        or (f.kind == FaultKind.WORK_IMBALANCE and f.variant == "stage")
        for f in s.faults
    )
    return structural and all(
        u.kind == "imbalance" and u.node is None and u.grade == "info" for u in us
    )


def score(run: Run, method: str) -> ScenarioScore:
    s = run.scenario
    faults = [f for f in s.faults if not f.is_trap]
    ups = run.updates[method]
    firing = [u for u in ups if u.firing]
    episodes: dict[str, list[Update]] = defaultdict(list)
    for u in firing:
        episodes[u.fingerprint].append(u)
    results = []
    for f in faults:
        r = FaultResult(s.name, f.fault_id or "", f.kind.value, f.magnitude)
        hits = [u for u in firing if _matches(u, f, run)]
        r.episodes = len({u.fingerprint for u in hits})
        r.subsides = f.subsides
        if hits and f.end_step is not None and f.kind in (FaultKind.ECC_STORM,):
            ended = {u.fingerprint for u in ups if not u.firing}
            r.resolved = {u.fingerprint for u in hits} <= ended
        r.by_kind = sorted({u.kind for u in hits})
        if hits:
            first = hits[0]
            r.detected = True
            r.delay_steps = max(0, first.step - f.onset_step)
            stall = run.stall_start.get(f.crash_step if f.kind != FaultKind.HANG else f.onset_step)
            if f.kind in (FaultKind.CRASH, FaultKind.HANG) and stall is not None:
                r.delay_s = first.ts - stall
                r.delay_step_times = r.delay_s / run.median_step_s
            if f.kind in (FaultKind.DEGRADATION, FaultKind.STRAGGLER, FaultKind.THERMAL):
                r.slowdown_at_detection = f.slowdown_at(first.step)
        if f.kind in (FaultKind.CRASH, FaultKind.HANG, FaultKind.ECC_STORM):
            step = f.onset_step if f.kind == FaultKind.HANG else f.crash_step
            stall = run.stall_start.get(step)
            flags = [
                u
                for u in firing
                if u.kind in ("hang", "missing")
                and stall is not None
                and u.ts >= stall
                and u.step == step
                and (u.node is None or _names_node(u, f, s.gpus_per_node))
            ]
            if flags and stall is not None:
                r.hang_flag_s = flags[0].ts - stall
        if f.kind == FaultKind.ECC_STORM and f.node is not None:
            node = node_name(f.node)
            fatal_ts = run.fatal_reports.get(node)
            if fatal_ts is not None:
                open_crit = _open_critical(ups, node, fatal_ts, s.gpus_per_node, f)
                after = [
                    u
                    for u in firing
                    if u.ts >= fatal_ts
                    and _names_node(u, f, s.gpus_per_node)
                    and u.grade == "critical"
                ]
                if open_crit:
                    r.fatal_reports = 1
                elif after:
                    reps = run.reports.get(node, [])
                    r.fatal_reports = sum(1 for t in reps if fatal_ts <= t <= after[0].ts)
                    r.fatal_reports = max(1, r.fatal_reports)
        results.append(r)
    tp: dict[str, int] = defaultdict(int)
    fp, neutral, in_trap, examples = 0, 0, 0, []
    traps = [f for f in s.faults if f.is_trap]
    for fp_id, us in episodes.items():
        kinds = {f.kind.value for f in faults if any(_matches(u, f, run) for u in us)}
        if kinds:
            for k in kinds:
                tp[k] += 1
        elif any(_neutral(u, f, run) for f in faults for u in us) or _advised(us, s):
            neutral += 1
        else:
            fp += 1
            if any(_in_trap(u, t, run) for t in traps for u in us):
                in_trap += 1
            if len(examples) < 20:
                u = us[0]
                examples.append(
                    {
                        "fingerprint": fp_id,
                        "kind": u.kind,
                        "node": u.node,
                        "rank": u.rank,
                        "step": u.step,
                        "grade": u.grade,
                    }
                )
    return ScenarioScore(
        name=s.name,
        nodes=s.nodes,
        trap_only=s.is_trap_only,
        faults=results,
        tp_episodes=dict(tp),
        fp_episodes=fp,
        trap_window_fp=in_trap,
        fp_examples=examples,
        neutral_episodes=neutral,
        node_hours=s.nodes * run.wall_s / 3600.0,
    )


def _in_trap(u: Update, t: FaultSpec, run: Run) -> bool:
    lo, hi = _window(t, run.last_step)
    if not lo <= u.step <= hi:
        return False
    return t.node is None or _names_node(u, t, run.scenario.gpus_per_node)


def _open_critical(ups: Sequence[Update], node: str, ts: float, gpus: int, f: FaultSpec) -> bool:
    """Was a CRITICAL episode naming ``node`` already firing when the report came?"""
    state: dict[str, Update] = {}
    for u in ups:
        if u.ts > ts:
            break
        if _names_node(u, f, gpus):
            state[u.fingerprint] = u
    return any(u.firing and u.grade == "critical" for u in state.values())


# -- aggregation ---------------------------------------------------------------------


def _prf(tp_alerts: int, fp_alerts: int, detected: int, total: int) -> dict[str, float]:
    p = tp_alerts / (tp_alerts + fp_alerts) if tp_alerts + fp_alerts else 1.0
    r = detected / total if total else 1.0
    f1 = 2 * p * r / (p + r) if p + r else 0.0
    return {"precision": round(p, 4), "recall": round(r, 4), "f1": round(f1, 4)}


def _q(xs: Sequence[float], q: float) -> float | None:
    return round(float(np.quantile(np.asarray(xs, dtype=float), q)), 3) if xs else None


def aggregate(scores: Sequence[ScenarioScore]) -> dict[str, Any]:
    faults = [r for s in scores for r in s.faults]
    tp_all = sum(sum(s.tp_episodes.values()) for s in scores)
    fp_all = sum(s.fp_episodes for s in scores)
    node_h = sum(s.node_hours for s in scores)
    per: dict[str, Any] = {}
    for kind in sorted({r.kind for r in faults}):
        rs = [r for r in faults if r.kind == kind]
        tp = sum(s.tp_episodes.get(kind, 0) for s in scores)
        fp = sum(s.fp_episodes for s in scores if any(r.kind == kind for r in s.faults))
        det = [r for r in rs if r.detected]
        entry: dict[str, Any] = {
            "faults": len(rs),
            "detected": len(det),
            **_prf(tp, fp, len(det), len(rs)),
            "delay_steps_median": _q(
                [r.delay_steps for r in det if r.delay_steps is not None], 0.5
            ),
            "delay_steps_p95": _q([r.delay_steps for r in det if r.delay_steps is not None], 0.95),
            "episodes_per_fault": round(sum(r.episodes for r in rs) / len(rs), 2),
        }
        ds = [r.delay_s for r in det if r.delay_s is not None]
        if ds:
            entry["delay_s_median"] = _q(ds, 0.5)
            entry["delay_step_times_max"] = _q(
                [r.delay_step_times for r in det if r.delay_step_times is not None], 1.0
            )
        rv = [r.resolved for r in rs if r.resolved is not None]
        if rv:
            entry["resolved"] = f"{sum(rv)}/{len(rv)}"
        hf = [r.hang_flag_s for r in rs if r.hang_flag_s is not None]
        if kind in ("crash", "hang", "ecc_storm"):
            entry["hang_flagged"] = len(hf)
            entry["stalls"] = sum(not r.subsides for r in rs)  # storms that crash
            entry["hang_flag_s_max"] = _q(hf, 1.0)
        sd = [r.slowdown_at_detection for r in det if r.slowdown_at_detection is not None]
        if sd and kind in ("degradation", "thermal"):
            entry["slowdown_at_detection_max"] = _q(sd, 1.0)
        if kind == "ecc_storm":
            fr = [r.fatal_reports for r in rs if r.fatal_reports is not None]
            entry["fatal_reports_max"] = max(fr) if fr else None
            entry["fatal_flagged"] = len(fr)
        per[kind] = entry
    trap_alerts = sum(s.fp_episodes for s in scores if s.trap_only)
    return {
        "overall": _prf(tp_all, fp_all, sum(r.detected for r in faults), len(faults)),
        "faults": len(faults),
        "detected": sum(r.detected for r in faults),
        "alert_episodes": tp_all + fp_all,
        "false_positive_episodes": fp_all,
        "per_fault": per,
        "trap_alerts": trap_alerts,
        "trap_window_alerts": sum(s.trap_window_fp for s in scores),
        "false_alarms_per_1000_node_hours": round(1000.0 * fp_all / node_h, 3) if node_h else None,
        "node_hours": round(node_h, 2),
    }


def check_targets(
    agg: dict[str, Any], runs: Sequence[Run], scores: Sequence[ScenarioScore]
) -> dict[str, Any]:
    faults = [r for s in scores for r in s.faults]
    strag = [r for r in faults if r.kind == "straggler" and r.magnitude >= 0.1]
    strag_delays = [r.delay_steps if r.delay_steps is not None else math.inf for r in strag]
    strag_med = float(np.median(strag_delays)) if strag_delays else None
    degr = [r for r in faults if r.kind == "degradation"]
    degr_sd = [r.slowdown_at_detection if r.detected else math.inf for r in degr]
    degr_sd = [x if x is not None else math.inf for x in degr_sd]
    med_by = {run.scenario.name: run.median_step_s for run in runs}
    # an ECC storm that subsides stalls nothing and sends no fatal XID: no target of its own
    hangs = [r for r in faults if r.kind in ("hang", "crash", "ecc_storm") and not r.subsides]
    hang_ratio = [
        (r.hang_flag_s / med_by[r.scenario]) if r.hang_flag_s is not None else math.inf
        for r in hangs
    ]
    ecc = [r for r in faults if r.kind == "ecc_storm" and not r.subsides]
    ecc_reports = [r.fatal_reports if r.fatal_reports is not None else math.inf for r in ecc]

    def fmt(x: float | None) -> float | str | None:
        if x is None:
            return None
        return "missed" if math.isinf(x) else round(x, 3)

    t = {
        "overall_f1": {
            "target": f">= {TARGET_F1}",
            "value": agg["overall"]["f1"],
            "ok": agg["overall"]["f1"] >= TARGET_F1,
        },
        "trap_alerts": {"target": "0", "value": agg["trap_alerts"], "ok": agg["trap_alerts"] == 0},
        "straggler_median_delay_steps": {
            "target": f"<= {TARGET_STRAGGLER_MEDIAN_STEPS} (stragglers >= 10%)",
            "value": fmt(strag_med),
            "ok": strag_med is not None and strag_med <= TARGET_STRAGGLER_MEDIAN_STEPS,
        },
        "degradation_slowdown_at_detection_max": {
            "target": f"< {TARGET_DEGRADATION_SLOWDOWN:.0%}",
            "value": fmt(max(degr_sd)) if degr_sd else None,
            "per_fault": [fmt(x) for x in degr_sd],
            "ok": bool(degr_sd) and max(degr_sd) < TARGET_DEGRADATION_SLOWDOWN,
        },
        "hang_flag_step_times_max": {
            "target": f"< {TARGET_HANG_STEP_TIMES} x median step time (hang, crash, ECC crash)",
            "value": fmt(max(hang_ratio)) if hang_ratio else None,
            "seconds": [
                fmt(r.hang_flag_s) if r.hang_flag_s is not None else "missed" for r in hangs
            ],
            "ok": bool(hang_ratio) and max(hang_ratio) < TARGET_HANG_STEP_TIMES,
        },
        "fatal_ecc_reports_max": {
            "target": f"<= {TARGET_FATAL_REPORTS} report",
            "value": fmt(max(ecc_reports)) if ecc_reports else None,
            "ok": bool(ecc_reports) and max(ecc_reports) <= TARGET_FATAL_REPORTS,
        },
    }
    return t


# -- the benchmark -------------------------------------------------------------------


def _default_factory() -> DetectionFactory:
    def make(job_id: str) -> Detection:
        return DetectorSuite(job_id)

    return make


def evaluate(
    scenarios: Sequence[Scenario],
    factory: DetectionFactory,
    *,
    progress: Callable[[str], None] | None = None,
    jobs: int = 1,
) -> dict[str, Any]:
    """Run ``scenarios`` and score the detection suite and both baselines (``jobs`` > 1: the
    scenarios play in that many processes, the default detection suite only)."""
    runs: list[Run] = []
    scores: dict[str, list[ScenarioScore]] = {
        m: [] for m in ("detection", "static_threshold", "relative_score")
    }
    t_all = time.perf_counter()
    if jobs > 1:  # scenarios in worker processes, scored here in suite order
        import multiprocessing as mp

        with mp.get_context("fork").Pool(jobs) as pool:
            played = pool.imap(_run_default, scenarios)
            return _evaluated(scenarios, played, scores, runs, t_all, progress)
    played = (run_scenario(s, factory) for s in scenarios)
    return _evaluated(scenarios, played, scores, runs, t_all, progress)


def _run_default(s: Scenario) -> Run:
    return run_scenario(s, _default_factory())


def _evaluated(
    scenarios: Sequence[Scenario],
    played: Iterable[Run],
    scores: dict[str, list[ScenarioScore]],
    runs: list[Run],
    t_all: float,
    progress: Callable[[str], None] | None,
) -> dict[str, Any]:
    t0 = time.perf_counter()
    for i, (s, run) in enumerate(zip(scenarios, played, strict=True), 1):
        runs.append(run)
        for m, acc in scores.items():
            acc.append(score(run, m))
        sc = scores["detection"][-1]
        if progress:
            det = sum(r.detected for r in sc.faults)
            progress(
                f"[{i}/{len(scenarios)}] {s.name}: {s.nodes} nodes, {run.events} events, "
                f"detected {det}/{len(sc.faults)}, false-positive episodes {sc.fp_episodes}, "
                f"detection {run.detection_s:.1f}s, total {time.perf_counter() - t0:.1f}s"
            )
        t0 = time.perf_counter()
    result = aggregate(scores["detection"])
    result["targets"] = check_targets(result, runs, scores["detection"])
    result["baselines"] = {}
    for m in ("static_threshold", "relative_score"):
        a = aggregate(scores[m])
        result["baselines"][m] = {
            **a["overall"],
            "trap_alerts": a["trap_alerts"],
            "false_alarms_per_1000_node_hours": a["false_alarms_per_1000_node_hours"],
            "detected": a["detected"],
        }
    result["scenarios"] = [
        {
            "name": sc.name,
            "nodes": sc.nodes,
            "trap_only": sc.trap_only,
            "median_step_s": round(run.median_step_s, 4),
            "steps": run.last_step + 1,
            "events": run.events,
            "detection_s": round(run.detection_s, 2),
            "faults": [
                {k: getattr(r, k) for k in FaultResult.__slots__}  # type: ignore[attr-defined]
                for r in sc.faults
            ],
            "fp_episodes": sc.fp_episodes,
            "trap_window_fp": sc.trap_window_fp,
            "fp_examples": sc.fp_examples,
            "neutral_episodes": sc.neutral_episodes,
        }
        for sc, run in zip(scores["detection"], runs, strict=True)
    ]
    result["wall_s"] = round(time.perf_counter() - t_all, 1)
    result["detection_s"] = round(sum(r.detection_s for r in runs), 1)
    return result


def environment(command: str) -> dict[str, Any]:
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "river": river.__version__,
        "command": command,
    }


def _v(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"
    return str(x)


def markdown(result: dict[str, Any], env: dict[str, Any], suite: Sequence[Scenario]) -> str:
    ranks = sum(s.n_ranks * s.steps for s in suite)
    lines = [
        "## Detection quality",
        "",
        f"`{env['command']}` — {env['date']}; {env['machine']}, {env['cpus']} CPUs; "
        f"Python {env['python']}, numpy {env['numpy']}, river {env['river']}.",
        "",
        f"Suite: {len(suite)} scenarios ({sum(s.is_trap_only for s in suite)} trap-only), "
        f"{min(s.nodes for s in suite)}-{max(s.nodes for s in suite)} nodes x 8 GPUs, "
        f"{ranks / 1e6:.1f} M rank-steps, {result['node_hours']:.0f} simulated node-hours; "
        f"{result['faults']} injected faults. Run time {result['wall_s']} s "
        f"(detection {result['detection_s']} s). Grace after a fault ends: {GRACE_STEPS} steps.",
        "",
        "| target | goal | measured | met |",
        "|---|---|---|---|",
    ]
    for name, t in result["targets"].items():
        lines.append(
            f"| {name} | {t['target']} | {_v(t['value'])} | {'yes' if t['ok'] else '**no**'} |"
        )
    o = result["overall"]
    lines += [
        "",
        "| method | precision | recall | F1 | trap alerts | false alarms / 1000 node-h |",
        "|---|---|---|---|---|---|",
        f"| DetectorSuite | {o['precision']:.3f} | {o['recall']:.3f} | {o['f1']:.3f} | "
        f"{result['trap_alerts']} | {_v(result['false_alarms_per_1000_node_hours'])} |",
    ]
    for m, b in result["baselines"].items():
        lines.append(
            f"| {m} | {b['precision']:.3f} | {b['recall']:.3f} | {b['f1']:.3f} | "
            f"{b['trap_alerts']} | {_v(b['false_alarms_per_1000_node_hours'])} |"
        )
    lines += [
        "",
        "| fault | n | detected | precision | recall | F1 | delay steps (median / p95) | notes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k, e in result["per_fault"].items():
        notes = []
        if "delay_s_median" in e:
            notes.append(f"delay {e['delay_s_median']} s median")
        if "hang_flag_s_max" in e:
            notes.append(
                f"hang flagged {e['hang_flagged']}/{e.get('stalls', e['faults'])}, "
                f"max {_v(e['hang_flag_s_max'])} s"
            )
        if "slowdown_at_detection_max" in e:
            notes.append(f"slowdown at detection <= {e['slowdown_at_detection_max']:.1%}")
        if "fatal_reports_max" in e:
            notes.append(
                f"fatal XID flagged {e['fatal_flagged']}/{e.get('stalls', e['faults'])} "
                f"within {_v(e['fatal_reports_max'])} report(s)"
            )
        if "resolved" in e:
            notes.append(f"alert resolved after a storm that subsided: {e['resolved']}")
        notes.append(f"{e['episodes_per_fault']} episodes/fault")
        lines.append(
            f"| {k} | {e['faults']} | {e['detected']} | {e['precision']:.3f} | {e['recall']:.3f} | "
            f"{e['f1']:.3f} | {_v(e['delay_steps_median'])} / {_v(e['delay_steps_p95'])} | "
            f"{'; '.join(notes)} |"
        )
    lines += [
        "",
        f"False-positive episodes inside a trap's window (trap-only and mixed scenarios): "
        f"{result['trap_window_alerts']}.",
    ]
    fps = [(s["name"], s["fp_episodes"]) for s in result["scenarios"] if s["fp_episodes"]]
    lines += [
        "",
        "False-positive episodes by scenario: "
        + (", ".join(f"{n} {c}" for n, c in fps) or "none")
        + ".",
    ]
    missed = [
        f"{s['name']}/{f['fault_id']}"
        for s in result["scenarios"]
        for f in s["faults"]
        if not f["detected"]
    ]
    lines += ["", "Missed faults: " + (", ".join(missed) or "none") + "."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="representative subset (< 2 min)")
    ap.add_argument("--scenarios", help="comma-separated scenario names")
    ap.add_argument(
        "--reseed",
        type=int,
        default=0,
        help="add this to every scenario seed (a held-out draw of the same suite)",
    )
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    ap.add_argument("--jobs", type=int, default=1, help="play scenarios in this many processes")
    ap.add_argument("--md", type=Path, default=BENCHMARKS_MD, help="markdown file to update")
    ap.add_argument("--no-md", action="store_true", help="do not touch the markdown file")
    args = ap.parse_args(argv)
    names: Sequence[str] | None = None
    if args.scenarios:
        names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    elif args.quick:
        names = QUICK
    suite = load_suite(names=names)
    if args.reseed:
        suite = [s.model_copy(update={"seed": s.seed + args.reseed}) for s in suite]
    command = "python benchmarks/detection_quality.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    env = environment(command.strip())
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    say(f"detection quality: {len(suite)} scenarios")
    result = evaluate(suite, _default_factory(), progress=say, jobs=args.jobs)
    result["environment"] = env
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    md = markdown(result, env, suite)
    if not args.no_md:
        write_section("detection_quality", md, args.md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
