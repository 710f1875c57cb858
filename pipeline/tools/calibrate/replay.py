"""Replaying an archived job through the detection core and scoring it against its labels.

:func:`replay_core` feeds a job's steps, health and ticks to :class:`detectors.job.JobDetection`
in event-time order; :func:`actions` confirms its alerts with the actuator's pure policy;
:func:`score_job` judges the updates against the job's labels (a label matched within
:data:`GRACE_STEPS` steps is a true positive; neutral updates count neither way).
:mod:`~pipeline.tools.calibrate.grid` drives these over a grid of settings.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from detectors.config import DetectorConfig
from detectors.frame import StepFrame
from detectors.job import JobDetection
from pipeline.policy import Policy, PolicyParams
from pipeline.tools.calibrate.archive import ArchivedJob, Label
from schemas import Alert

#: Steps after a label's end (or either side of an incident) an alert still speaks of it.
GRACE_STEPS = 20
#: Synthetic clock ticks in one gap between records, at most (a long-idle archive).
_MAX_GAP_TICKS = 10_000

__all__ = [
    "GRACE_STEPS",
    "Update",
    "Replayed",
    "replay",
    "replay_core",
    "play",
    "actions",
    "JobScore",
    "score_job",
]


@dataclass(frozen=True, slots=True)
class Update:
    """One FIRING alert update as the replay saw it."""

    fingerprint: str
    kind: str
    node: str | None
    step: int  #: the alert's step, or the step in progress when it has none


def _inputs(job: ArchivedJob) -> Iterator[tuple[float, int, Any]]:
    """The job's records merged on event time (lifecycle, commands, results, health,
    then steps at one instant)."""
    streams = [
        ((e.ts.timestamp(), 0, i, e) for i, e in enumerate(job.events)),
        ((c.issued_at.timestamp(), 1, i, c) for i, c in enumerate(job.commands)),
        ((r.ts.timestamp(), 2, i, r) for i, r in enumerate(job.results)),
        ((h.ts.timestamp(), 3, i, h) for i, h in enumerate(job.health)),
        ((f.ts, 4, i, f) for i, f in enumerate(job.frames)),
    ]
    for ts, order, _, rec in heapq.merge(*(sorted(s, key=lambda x: x[:3]) for s in streams)):
        yield ts, order, rec


@dataclass(slots=True)
class Replayed:
    """What one replay of a job produced."""

    updates: list[Update]  #: FIRING alert updates
    #: every alert update and every completed step, in order, for the actuator:
    #: (alert, None) or (None, frame step and event time)
    stream: list[tuple[Alert | None, tuple[int, float] | None]]


def replay(job: ArchivedJob, config: DetectorConfig, tick_s: float = 1.0) -> list[Update]:
    """The FIRING alert updates the detection core raises on ``job`` under ``config``."""
    return replay_core(job, config, tick_s).updates


def replay_core(job: ArchivedJob, config: DetectorConfig, tick_s: float = 1.0) -> Replayed:
    """Drive a fresh :class:`JobDetection` over ``job``'s records (module docstring)."""
    det = JobDetection(job.job_id, config)
    out = Replayed([], [])
    step = -1  # last completed step

    def keep(alerts: Sequence[Alert]) -> None:
        for a in alerts:
            out.stream.append((a, None))
            if a.state.value == "firing":
                s = a.step if a.step is not None and a.step >= 0 else step + 1
                out.updates.append(Update(a.fingerprint, a.kind.value, a.node, s))

    def frame(rec: StepFrame, ts: float) -> None:
        nonlocal step
        step = rec.step
        out.stream.append((None, (step, ts)))

    play(det, _inputs(job), keep, tick_s=tick_s, on_frame=frame)
    return out


#: What :func:`play` does with a record, by the order code it comes with (records at one
#: instant are taken in this order).
LIFECYCLE, COMMAND, RESULT, HEALTH, FRAME, STEP = range(6)


def play(
    det: JobDetection,
    inputs: Iterable[tuple[float, int, Any]],
    keep: Callable[[Sequence[Alert]], None],
    *,
    tick_s: float = 1.0,
    on_frame: Callable[[StepFrame, float], None] | None = None,
) -> None:
    """Drive ``det`` over ``inputs`` in event time, as the worker would: records in the
    order given, as ``(event time, order code, record)`` (:data:`LIFECYCLE`,
    :data:`COMMAND`, :data:`RESULT`, :data:`HEALTH`, :data:`FRAME`: an assembled
    :class:`StepFrame`, :data:`STEP`: one node's step message, assembled by the core),
    the clock ticked every ``tick_s`` of event time across a gap between records (at
    most :data:`_MAX_GAP_TICKS` per gap) and at each record, then flushed. Every alert
    update goes to ``keep``; each completed frame, with its event time, to
    ``on_frame``. The one driver of the archive's replay and ``stepguard replay``."""
    last: float | None = None
    for ts, order, rec in inputs:
        if last is not None and ts - last > tick_s:
            n = min(int((ts - last) / tick_s), _MAX_GAP_TICKS)
            for k in range(1, n + 1):
                keep(det.tick(last + k * tick_s))
        if order == LIFECYCLE:
            keep(det.on_lifecycle(rec))
        elif order == COMMAND:
            keep(det.on_command(rec, now=ts))
        elif order == RESULT:
            keep(det.on_result(rec))
        elif order == HEALTH:
            keep(det.on_health(rec))
        elif order == FRAME:
            keep(det.on_frame(rec))
            if on_frame is not None:
                on_frame(rec, ts)
        else:
            done = det.on_step(rec)
            keep(done.alerts)
            if on_frame is not None:
                for f in done.frames:
                    on_frame(f, f.ts)
        keep(det.tick(ts))
        last = ts if last is None else max(last, ts)
    keep(det.flush())


def actions(job: ArchivedJob, replayed: Replayed, params: PolicyParams) -> list[Update]:
    """The actions the actuator's policy (observe mode, ``params``) would take on the
    replayed alerts: one update per action, at the step it was confirmed."""
    policy = Policy(params)
    out: list[Update] = []
    for alert, progress in replayed.stream:
        if alert is not None:
            outcome = policy.on_alert(alert, alert.ts)
        else:
            assert progress is not None
            at = datetime.fromtimestamp(progress[1], UTC)
            outcome = policy.on_progress(job.job_id, progress[0], at, at)
        for rec in outcome.records:
            a = rec.alert
            if a is None:
                continue
            step = a.step if a.step is not None and a.step >= 0 else 0
            out.extend(Update(fp, a.kind.value, a.node, step) for fp in rec.reason[:1])
    return out


def _matches(u: Update, lab: Label, last_step: int, grace: int) -> bool:
    lo, hi = lab.window(last_step, grace)
    if not lo <= u.step <= hi:
        return False
    if lab.node is None:  # the whole job: a hang, a divergence, a job-level incident
        if lab.kind in ("hang", "missing"):
            return u.node is None and u.kind in ("hang", "missing")
        return u.kind == lab.kind
    return u.node == lab.node


def _neutral(u: Update, labels: Sequence[Label]) -> bool:
    return (
        u.node is None
        and u.kind in ("hang", "missing")
        and any(lab.stops_job and u.step >= lab.onset_step for lab in labels)
    )


@dataclass(slots=True)
class JobScore:
    """One job under one setting."""

    tp: dict[str, int] = field(default_factory=lambda: defaultdict(int))  #: by alert kind
    fp: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    unjudged: int = 0
    #: (label kind, detected, delay steps or None) per true label
    found: list[tuple[str, bool, int | None]] = field(default_factory=list)


def score_job(job: ArchivedJob, updates: Sequence[Update], grace: int = GRACE_STEPS) -> JobScore:
    """Judge ``updates`` against ``job``'s labels (module docstring)."""
    last = job.last_step
    episodes: dict[str, list[Update]] = defaultdict(list)
    for u in updates:
        episodes[u.fingerprint].append(u)
    score = JobScore()
    for us in episodes.values():
        kind = us[0].kind
        hits = {lab.truth for lab in job.labels for u in us if _matches(u, lab, last, grace)}
        if True in hits:
            score.tp[kind] += 1
        elif False in hits:
            score.fp[kind] += 1
        elif not job.fully_labelled:
            score.unjudged += 1
        elif not any(_neutral(u, job.labels) for u in us):
            score.fp[kind] += 1  # a fully labelled job: an alert of nothing is false
    for lab in job.labels:
        if not lab.truth:
            continue
        first = next((u for u in updates if _matches(u, lab, last, grace)), None)
        delay = None if first is None else max(0, first.step - lab.onset_step)
        score.found.append((lab.kind, first is not None, delay))
    return score


def _prf(tp: int, fp: int, detected: int, total: int) -> tuple[float, float, float]:
    p = tp / (tp + fp) if tp + fp else 1.0
    r = detected / total if total else 1.0
    f1 = 2 * p * r / (p + r) if p + r else 0.0
    return round(p, 4), round(r, 4), round(f1, 4)
