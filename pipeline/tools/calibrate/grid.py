"""``stepguard calibrate``: replay the archive through the detection core under a grid
of detector settings and score each setting against the labels.

A thin driver of :class:`~detectors.job.JobDetection` (like the worker, the demo
and ``stepguard compare``): each archived job's records (:mod:`pipeline.tools.calibrate.archive`)
are merged in event-time order and fed to a fresh core built with one grid point's
:class:`~detectors.config.DetectorConfig`; the core's clock is ticked at every record
and, across gaps, every ``tick_s`` seconds (the worker's timer). The alert updates it
returns are judged against the job's labels:

- a **true label** (a fault) is *detected* when a FIRING update names its node (or,
  for a job-level label, is a job-level alert of its kind) inside its window; its
  *delay* is the steps from its onset (a fault's injection, an incident's first
  archived alert) to that update;
- an **alert episode** (one fingerprint) is a *true positive* when it matches a true
  label, a *false positive* when it matches a false label or, in a fully labelled job
  (simulator truth), nothing at all; otherwise it is *unjudged* and counts nowhere. A
  job-level hang alert while a crashed node stalls the job is neither.

Per setting: precision (TP / (TP + FP) episodes), recall (detected / true labels), F1
and the median delay, overall and per kind (precision by the episode's alert kind,
recall and delay by the label's kind). The same for the *actions*: the alerts are also
fed to the actuator's own pure :class:`~pipeline.policy.Policy` (observe mode)
under the point's confirmation settings (:data:`ACTUATOR_SETTINGS`, WARNING persistence
in steps or seconds), and the episodes it would act on are judged the same way; grid
points that differ only there share one replay. The Pareto front keeps the settings no other
beats on precision, recall and delay at once; the recommendation is the best F1, then
the best action F1, then the shortest delays, then the fewest false positives, then
the fewest changes from the running settings.

Grid points run in worker processes (``concurrent.futures``, spawned: each receives the
jobs once, as plain data built here, never anything read from a topic).
"""

from __future__ import annotations

import itertools
import json
import math
import multiprocessing
import statistics
import time
import tomllib
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from detectors.config import DetectorConfig
from pipeline.io.detector_config import SETTING_NAMES, config_from_overrides, overrides_of
from pipeline.io.errors import ConfigError
from pipeline.policy import PolicyParams
from pipeline.tools.calibrate.archive import ArchivedJob
from pipeline.tools.calibrate.replay import (
    GRACE_STEPS,
    JobScore,
    _prf,
    actions,
    replay_core,
    score_job,
)
from schemas import ActuatorMode

__all__ = [
    "DEFAULT_GRID",
    "CalibrationResult",
    "PointResult",
    "calibrate",
    "diff_settings",
    "expand_grid",
    "load_grid",
    "pareto_front",
    "plot_front",
    "recommend",
]

#: Grid used without ``--grid``: the peer (straggler) threshold, its persistence, the
#: creep threshold and the hang factor; 3 x 3 x 2 x 3 = 54 settings.
DEFAULT_GRID: dict[str, list[Any]] = {
    "straggler_warning": [0.03, 0.05, 0.08],
    "straggler_min_steps": [2, 3, 5],
    "degradation_warning": [0.02, 0.04],
    "hang_factor": [2.0, 2.5, 3.5],
}
#: The actuator's confirmation settings a grid may vary too: how long a WARNING must
#: persist (steps of the job, or seconds of event time) before it becomes an action.
#: They need no new replay: the detector alerts of a setting are confirmed again under
#: each value by the actuator's own pure policy (observe mode).
ACTUATOR_SETTINGS: dict[str, type] = {"warning_confirm_steps": int, "warning_confirm_s": float}
#: Most grid points one calibration evaluates.
MAX_POINTS = 5000


# -- grid ------------------------------------------------------------------------------


def _check_values(key: str, values: Any, width: int) -> list[Any]:
    if not isinstance(values, list) or not values:
        raise ConfigError(f"grid {key!r}: expected a non-empty list of values")
    if width > 1 and not all(isinstance(v, list) and len(v) == width for v in values):
        raise ConfigError(f"grid {key!r}: every value must be a list of {width} numbers")
    return values


def expand_grid(grid: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, as setting overrides.

    A key names one setting (``"hang_factor": [2.0, 3.0]``) or several that move
    together, joined by commas (``"straggler_warning,degradation_warning": [[0.03,
    0.02], [0.05, 0.03]]``).

    >>> expand_grid({"hang_factor": [2, 3], "straggler_warning,straggler_exit":
    ...              [[0.03, 0.015], [0.05, 0.025]]})[1]
    {'hang_factor': 2, 'straggler_warning': 0.05, 'straggler_exit': 0.025}
    >>> expand_grid({"hang_factr": [2]})
    Traceback (most recent call last):
    ...
    pipeline.io.errors.ConfigError: grid 'hang_factr': 'hang_factr' is not a detector setting ...
    """
    axes: list[list[dict[str, Any]]] = []
    for key, values in grid.items():
        names = [n.strip() for n in key.split(",")]
        for n in names:
            if n not in SETTING_NAMES and n not in ACTUATOR_SETTINGS:
                raise ConfigError(
                    f"grid {key!r}: {n!r} is not a detector setting (see detectors/config.py)"
                    f" nor one of the actuator's {sorted(ACTUATOR_SETTINGS)}"
                )
        vals = _check_values(key, values, len(names))
        axes.append([dict(zip(names, v if len(names) > 1 else [v], strict=True)) for v in vals])
    total = math.prod(len(a) for a in axes) if axes else 0
    if total > MAX_POINTS:
        raise ConfigError(f"grid: {total} settings, over the limit of {MAX_POINTS}")
    return [{k: v for part in combo for k, v in part.items()} for combo in itertools.product(*axes)]


def split_overrides(overrides: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(detector settings, actuator settings) of a grid point."""
    det = {k: v for k, v in overrides.items() if k not in ACTUATOR_SETTINGS}
    act = {k: v for k, v in overrides.items() if k in ACTUATOR_SETTINGS}
    return det, act


def actuator_params(values: Mapping[str, Any]) -> PolicyParams:
    """Observe-mode actuator parameters with ``values`` (a ``ConfigError`` names a bad
    one)."""
    clean: dict[str, Any] = {}
    for name, value in values.items():
        kind = ACTUATOR_SETTINGS[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ConfigError(f"actuator setting {name!r}: expected a positive number")
        if kind is int and float(value) != int(value):
            raise ConfigError(f"actuator setting {name!r}: expected an integer, got {value!r}")
        clean[name] = kind(value)
    try:
        return PolicyParams(mode=ActuatorMode.OBSERVE, **clean)
    except ValueError as exc:
        raise ConfigError(f"actuator settings {clean}: {exc}") from exc


def load_grid(path: Path | None) -> dict[str, Any]:
    """A grid file (JSON, or TOML by its ``.toml`` suffix); the default grid when None."""
    if path is None:
        return dict(DEFAULT_GRID)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"--grid {path}: {exc.strerror}") from exc
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"--grid {path}: not valid {path.suffix or 'JSON'} ({exc})") from exc
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"--grid {path}: expected an object of setting -> values")
    return data


# -- replay ----------------------------------------------------------------------------


# -- scoring ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PointResult:
    """One setting, scored over every job."""

    index: int
    overrides: dict[str, Any]  #: the grid point (settings changed from the defaults)
    precision: float
    recall: float
    f1: float
    delay_median: float | None  #: steps, over detected true labels
    tp: int
    fp: int
    detected: int
    true_labels: int
    unjudged: int
    per_kind: dict[str, dict[str, Any]]
    rank_steps: int
    replay_s: float
    error: str | None = None
    #: the same for the actions the actuator would take (confirmation applied)
    action_precision: float = 0.0
    action_recall: float = 0.0
    action_f1: float = 0.0
    action_delay_median: float | None = None
    actions: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _aggregate(index: int, overrides: dict[str, Any], scores: Sequence[JobScore],
               rank_steps: int, spent: float) -> PointResult:  # fmt: skip
    tp = sum(sum(s.tp.values()) for s in scores)
    fp = sum(sum(s.fp.values()) for s in scores)
    found = [f for s in scores for f in s.found]
    detected = sum(1 for f in found if f[1])
    delays = [f[2] for f in found if f[2] is not None]
    kinds = sorted({k for s in scores for k in (*s.tp, *s.fp)} | {f[0] for f in found})
    per_kind = {}
    for k in kinds:
        ktp = sum(s.tp.get(k, 0) for s in scores)
        kfp = sum(s.fp.get(k, 0) for s in scores)
        kf = [f for f in found if f[0] == k]
        kdet = sum(1 for f in kf if f[1])
        kd = [f[2] for f in kf if f[2] is not None]
        p, r, f1 = _prf(ktp, kfp, kdet, len(kf))
        per_kind[k] = {
            # a kind with no episode has no precision, one with no label no recall
            "precision": p if ktp + kfp else None, "recall": r if kf else None,
            "f1": f1 if ktp + kfp and kf else None, "tp": ktp, "fp": kfp,
            "labels": len(kf), "detected": kdet,
            "delay_median": statistics.median(kd) if kd else None,
        }  # fmt: skip
    p, r, f1 = _prf(tp, fp, detected, len(found))
    return PointResult(
        index=index, overrides=overrides, precision=p, recall=r, f1=f1,
        delay_median=statistics.median(delays) if delays else None, tp=tp, fp=fp,
        detected=detected, true_labels=len(found),
        unjudged=sum(s.unjudged for s in scores), per_kind=per_kind,
        rank_steps=rank_steps, replay_s=round(spent, 3),
    )  # fmt: skip


def evaluate(
    points: Sequence[tuple[int, dict[str, Any]]], jobs: Sequence[ArchivedJob],
    base: Mapping[str, Any] | None = None, base_actuator: Mapping[str, Any] | None = None,
    tick_s: float = 1.0, grace: int = GRACE_STEPS,
) -> list[PointResult]:  # fmt: skip
    """Score grid points that share their detector settings: every job is replayed once
    under ``base`` + those settings, and its alerts confirmed under each point's actuator
    settings. A setting the detectors or the actuator refuse (an exit above an enter
    threshold) comes back with ``error``."""
    det_overrides = split_overrides(points[0][1])[0]
    out: list[PointResult] = []
    try:
        config = config_from_overrides({**(base or {}), **det_overrides})
    except ConfigError as exc:
        return [_refused(i, ov, str(exc)) for i, ov in points]
    t0 = time.perf_counter()
    replays = [replay_core(j, config, tick_s) for j in jobs]
    scores = [score_job(j, r.updates, grace) for j, r in zip(jobs, replays, strict=True)]
    spent = time.perf_counter() - t0
    rank_steps = sum(j.rank_steps for j in jobs)
    for index, overrides in points:
        try:
            params = actuator_params({**(base_actuator or {}), **split_overrides(overrides)[1]})
        except ConfigError as exc:
            out.append(_refused(index, overrides, str(exc)))
            continue
        acted = [
            score_job(j, actions(j, r, params), grace) for j, r in zip(jobs, replays, strict=True)
        ]
        point = _aggregate(index, overrides, scores, rank_steps, spent)
        a = _aggregate(index, overrides, acted, rank_steps, spent)
        out.append(replace(
            point, action_precision=a.precision, action_recall=a.recall, action_f1=a.f1,
            action_delay_median=a.delay_median, actions=a.tp + a.fp,
        ))  # fmt: skip
        spent = 0.0  # the replay is counted once, with the group's first point
    return out


def _refused(index: int, overrides: dict[str, Any], why: str) -> PointResult:
    return PointResult(index, overrides, 0.0, 0.0, 0.0, None, 0, 0, 0, 0, 0, {}, 0, 0.0,
                       error=why)  # fmt: skip


# -- worker processes ------------------------------------------------------------------

_JOBS: list[ArchivedJob] = []
_OPTS: dict[str, Any] = {}


def _init(jobs: list[ArchivedJob], opts: dict[str, Any]) -> None:
    global _JOBS, _OPTS
    _JOBS, _OPTS = jobs, opts


def _evaluate_in_worker(points: list[tuple[int, dict[str, Any]]]) -> list[PointResult]:
    return evaluate(points, _JOBS, **_OPTS)


# -- the whole calibration -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CalibrationResult:
    """Every setting scored, the front, the recommendation."""

    running: dict[str, Any]  #: the running detector settings (overrides of the defaults)
    running_actuator: dict[str, Any]  #: the running actuator confirmation settings
    points: list[PointResult]  #: index 0 is the running settings themselves
    front: list[int]  #: indices of the Pareto front
    recommended: int  #: index of the recommended setting
    jobs: int
    rank_steps: int  #: per replay of every job
    replays: int  #: replays of every job (one per distinct detector setting)
    labels: dict[str, int]  #: labels per source
    wall_s: float

    @property
    def best(self) -> PointResult:
        return self.points[self.recommended]

    def settings_of(self, index: int) -> DetectorConfig:
        det = split_overrides(self.points[index].overrides)[0]
        return config_from_overrides({**self.running, **det})

    def actuator_of(self, index: int) -> dict[str, Any]:
        """The actuator confirmation settings of point ``index`` (running ones included)."""
        return {**self.running_actuator, **split_overrides(self.points[index].overrides)[1]}

    @property
    def replay_rank_steps_per_s(self) -> float:
        """Rank-steps replayed per wall second, all processes together."""
        return self.replays * self.rank_steps / self.wall_s if self.wall_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "running": self.running, "running_actuator": self.running_actuator,
            "recommended": self.recommended, "front": self.front,
            "recommended_settings": overrides_of(self.settings_of(self.recommended)),
            "recommended_actuator": self.actuator_of(self.recommended),
            "jobs": self.jobs, "rank_steps": self.rank_steps, "labels": self.labels,
            "wall_s": round(self.wall_s, 3),
            "replay_rank_steps_per_s": round(self.replay_rank_steps_per_s, 1),
            "points": [p.to_json() for p in self.points],
        }  # fmt: skip


def _dominates(a: PointResult, b: PointResult) -> bool:
    da = math.inf if a.delay_median is None else a.delay_median
    db = math.inf if b.delay_median is None else b.delay_median
    ge = a.precision >= b.precision and a.recall >= b.recall and da <= db
    gt = a.precision > b.precision or a.recall > b.recall or da < db
    return ge and gt


def pareto_front(points: Sequence[PointResult]) -> list[int]:
    """Indices of the settings no other beats on precision, recall and delay at once
    (settings with equal results are all on it)."""
    ok = [p for p in points if p.error is None]
    return [p.index for p in ok if not any(_dominates(q, p) for q in ok)]


def _changes(p: PointResult, running: Mapping[str, Any]) -> int:
    return sum(1 for k, v in p.overrides.items() if running.get(k, _default(k)) != v)


def _default(name: str) -> Any:
    if name in ACTUATOR_SETTINGS:
        return getattr(PolicyParams(), name)
    return getattr(DetectorConfig(), name)


def recommend(points: Sequence[PointResult], running: Mapping[str, Any]) -> int:
    """Best alert F1, then best action F1 (the actuator's confirmation), then the
    shortest median delay of alerts and of actions, then the fewest false positives,
    then the fewest changes from the ``running`` settings, then the first."""
    ok = [p for p in points if p.error is None]
    if not ok:
        raise ConfigError("calibrate: every setting of the grid was refused by the detectors")

    def key(p: PointResult) -> tuple[float, float, float, float, int, int, int]:
        delay = math.inf if p.delay_median is None else p.delay_median
        act = math.inf if p.action_delay_median is None else p.action_delay_median
        return (-p.f1, -p.action_f1, delay, act, p.fp, _changes(p, running), p.index)

    return min(ok, key=key).index


def calibrate(
    jobs: Sequence[ArchivedJob],
    grid: Mapping[str, Any],
    *,
    running: DetectorConfig | None = None,
    running_actuator: Mapping[str, Any] | None = None,
    processes: int = 1,
    tick_s: float = 1.0,
    grace: int = GRACE_STEPS,
    progress: Callable[[int, int], None] | None = None,
) -> CalibrationResult:
    """Replay ``jobs`` under the running settings and every point of ``grid``.

    ``running_actuator``: the actuator's running confirmation settings
    (:data:`ACTUATOR_SETTINGS`; its defaults when omitted). Points that share their
    detector settings share one replay. ``processes`` > 1 spreads the replays over that
    many spawned processes; ``progress`` is called with (points done, points).
    """
    if not jobs:
        raise ConfigError("calibrate: no archived job with steps to replay (check --job/--since)")
    if processes < 1:
        raise ConfigError(f"--processes must be >= 1, got {processes}")
    base = overrides_of(running or DetectorConfig())
    base_act = {k: getattr(PolicyParams(), k) for k in ACTUATOR_SETTINGS}
    base_act.update(running_actuator or {})
    actuator_params(base_act)  # a bad running value fails here, named
    points = [{}, *expand_grid(grid)]  # index 0: the running settings as they are
    groups: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for i, ov in enumerate(points):
        det = split_overrides(ov)[0]
        groups[json.dumps({**base, **det}, sort_keys=True, default=str)].append((i, ov))
    opts = {"base": base, "base_actuator": base_act, "tick_s": tick_s, "grace": grace}
    results: list[PointResult | None] = [None] * len(points)
    done = 0
    t0 = time.perf_counter()

    def collect(batch: list[PointResult]) -> None:
        nonlocal done
        for r in batch:
            results[r.index] = r
        done += len(batch)
        if progress is not None:
            progress(done, len(points))

    if processes == 1 or len(groups) == 1:
        for group in groups.values():
            collect(evaluate(group, jobs, **opts))
    else:
        ctx = multiprocessing.get_context("spawn")
        workers = min(processes, len(groups))
        with ProcessPoolExecutor(workers, ctx, _init, (list(jobs), opts)) as pool:
            futures = [pool.submit(_evaluate_in_worker, g) for g in groups.values()]
            for fut in as_completed(futures):
                collect(fut.result())
    wall = time.perf_counter() - t0
    running_all = {**base, **base_act}
    # an override equal to the running value is no change: show the point as it runs
    scored = [
        replace(r, overrides={k: v for k, v in r.overrides.items()
                              if running_all.get(k, _default(k)) != v})
        for r in results if r is not None
    ]  # fmt: skip
    labels: dict[str, int] = defaultdict(int)
    for j in jobs:
        for k, v in j.label_counts.items():
            labels[k] += v
    ok_groups = [g for g in groups.values() if (r := results[g[0][0]]) and r.error is None]
    replays = len(ok_groups)
    return CalibrationResult(
        running=base, running_actuator=base_act, points=scored, front=pareto_front(scored),
        recommended=recommend(scored, running_all), jobs=len(jobs),
        rank_steps=sum(j.rank_steps for j in jobs), replays=replays, labels=dict(labels),
        wall_s=wall,
    )  # fmt: skip


def diff_settings(running: DetectorConfig, proposed: DetectorConfig) -> list[tuple[str, Any, Any]]:
    """(setting, running value, proposed value) for every setting that differs."""
    out = []
    for f in fields(DetectorConfig):
        a, b = getattr(running, f.name), getattr(proposed, f.name)
        if a != b:
            out.append((f.name, a, b))
    return out


def plot_front(result: CalibrationResult, path: Path) -> Path:
    """Precision against recall of every setting (colour: median delay), the Pareto
    front joined, the running settings and the recommendation marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [p for p in result.points if p.error is None]
    delays = [p.delay_median if p.delay_median is not None else math.nan for p in ok]
    fig, ax = plt.subplots(figsize=(6.5, 5))
    sc = ax.scatter([p.recall for p in ok], [p.precision for p in ok], c=delays,
                    cmap="viridis_r", s=28, alpha=0.8)  # fmt: skip
    fig.colorbar(sc, ax=ax, label="median delay (steps)")
    front = sorted((result.points[i] for i in result.front), key=lambda p: p.recall)
    ax.plot([p.recall for p in front], [p.precision for p in front], "k--", lw=1,
            label="Pareto front")  # fmt: skip
    run, best = result.points[0], result.best
    ax.scatter([run.recall], [run.precision], marker="s", s=90, facecolors="none",
               edgecolors="tab:red", label="running")  # fmt: skip
    ax.scatter([best.recall], [best.precision], marker="*", s=200, c="tab:orange",
               edgecolors="k", label="recommended")  # fmt: skip
    ax.set_xlabel("recall (true labels detected)")
    ax.set_ylabel("precision (episodes that were real)")
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"{len(ok)} settings on {result.jobs} job(s)")
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
