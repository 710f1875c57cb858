"""The plots of ``stepguard report``: one panel per kind of incident, as PNG bytes.

=================  ==========================================================  =======
incident kinds     panel                                                       needs
=================  ==========================================================  =======
straggler, ...     the culprit node's ranks against the step's peer median,    a node
(a slow node)      and the job's step time
hardware, thermal  the node's health signals: GPU temperature, SM clock, ECC   a node
                   errors (corrected, uncorrected) and XID events, and which
                   of them fired
hang, missing,     the job's step time with its phases, waits, restarts (a     -
data_stall, ...    new run or start), ends and restart/checkpoint commands
divergence         the loss (median of the ranks) and the gradient norm (max)  -
=================  ==========================================================  =======

A job-level incident of a node kind (no culprit node) gets the step-time panel. Every
value read from the archive (node, job, kinds, phases) is a query parameter, never SQL
text, and a plot label only as printable text without mathtext.
"""

from __future__ import annotations

import io
from bisect import bisect_right
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from pipeline.services.archive.backend import ArchiveBackend

__all__ = ["Incident", "Panel", "panels_for"]

#: a slow node: its ranks against their peers
SLOW_KINDS = frozenset({"straggler", "degradation", "network", "group", "imbalance"})
#: the node's own health readings
HARDWARE_KINDS = frozenset({"hardware", "thermal"})
#: the job stops or slows as a whole: its step time, phases, waits and restarts
HANG_KINDS = frozenset({"hang", "missing", "data_stall", "lifecycle"})
DIVERGENCE_KINDS = frozenset({"divergence"})
_MARGIN_STEPS = 60
_MARGIN_MS = 10 * 60 * 1000


@dataclass(frozen=True, slots=True)
class Incident:
    """Every episode of one culprit and one kind while any was open (Alert.incident)."""

    key: str
    kind: str
    node: str
    ranks: tuple[int, ...]
    episodes: int
    first_step: int
    last_step: int
    worst_grade: str
    resolved: bool
    fingerprints: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Panel:
    """One plot of an incident: what it shows, the PNG and a line on what it found."""

    kind: str  # "ranks", "hardware", "steps" or "divergence"
    title: str
    png: bytes
    caption: str


def panels_for(backend: ArchiveBackend, job: str, inc: Incident) -> list[Panel]:
    """The incident's panels (table above), at least one."""
    kinds = set(inc.kind.split("+"))
    out: list[Panel] = []
    if inc.node and kinds & (SLOW_KINDS | {"thermal"}):
        out.append(_ranks_vs_peers(backend, job, inc))
    if inc.node and kinds & HARDWARE_KINDS:
        out.append(_hardware(backend, job, inc))
    if kinds & DIVERGENCE_KINDS:
        out.append(_divergence(backend, job, inc))
    if kinds & HANG_KINDS or not out:
        out.append(_step_times(backend, job, inc))
    return out


def plain(text: str) -> str:
    """Text read from the archive as a plot label: printable, no mathtext."""
    return "".join(c if c.isprintable() else "?" for c in text).replace("$", r"\$")


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return buf.getvalue()


def _window(inc: Incident) -> dict[str, Any]:
    return {"lo": max(0, inc.first_step - _MARGIN_STEPS), "hi": inc.last_step + _MARGIN_STEPS}


def _title(what: str, inc: Incident) -> str:
    return plain(f"{what}: {inc.kind} on {inc.node or 'the job'} ({inc.worst_grade})")


def _shade(ax: Any, inc: Incident) -> None:
    ax.axvspan(inc.first_step - 0.5, inc.last_step + 0.5, color="orange", alpha=0.15,
               label="incident")  # fmt: skip


def _job_steps(backend: ArchiveBackend, job: str, inc: Incident) -> list[tuple[Any, ...]]:
    """Per step of the window: peer median compute, max step time, median step time,
    median loss, max grad norm, last time (ms), and its run."""
    db = backend.database
    _, rows = backend.query(
        "SELECT step, quantileExact(0.5)(compute_s), max(step_time_s), "
        "quantileExact(0.5)(step_time_s), quantileExact(0.5)(loss), max(grad_norm), "
        f"max(ts_ms), any(run) FROM {db}.steps FINAL "
        "WHERE job_id = {job:String} AND step BETWEEN {lo:UInt64} AND {hi:UInt64} "
        "GROUP BY step ORDER BY step",
        {"job": job, **_window(inc)},
    )
    return rows


def _ranks_vs_peers(backend: ArchiveBackend, job: str, inc: Incident) -> Panel:
    db = backend.database
    steps = _job_steps(backend, job, inc)
    _, mine = backend.query(
        f"SELECT rank, step, compute_s FROM {db}.steps FINAL WHERE job_id = {{job:String}} "
        "AND node = {node:String} AND step BETWEEN {lo:UInt64} AND {hi:UInt64} "
        "ORDER BY rank, step",
        {"job": job, "node": inc.node, **_window(inc)},
    )
    # relative to the step's peer median: eval and checkpoint steps move everyone and
    # vanish, a slow rank stands out by its own percentage
    median = {int(r[0]): float(r[1]) for r in steps}
    by_rank: dict[int, tuple[list[int], list[float]]] = {}
    for rank, step, compute in mine:
        base = median.get(int(step))
        if not base:
            continue
        xs, ys = by_rank.setdefault(int(rank), ([], []))
        xs.append(int(step))
        ys.append(100.0 * (float(compute) / base - 1.0))
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True)
    for rank, (xs, ys) in sorted(by_rank.items()):
        style = {"lw": 2.0} if rank in inc.ranks else {"lw": 0.8, "alpha": 0.6}
        ax1.plot(xs, ys, label=f"rank {rank}", **style)
    ax1.axhline(0.0, color="k", ls="--", lw=1.2, label="peer median")
    ax1.set_ylabel("compute vs peer median (%)")
    ax1.set_title(_title("ranks vs peers", inc))
    ax1.legend(fontsize=7, ncol=3, loc="upper left")
    ax2.plot([r[0] for r in steps], [r[2] for r in steps], color="tab:red", label="step time")
    ax2.set_ylabel("step time (s)")
    ax2.set_xlabel("step")
    for ax in (ax1, ax2):
        _shade(ax, inc)
    inside = [
        y
        for xs, ys in (by_rank.get(r, ([], [])) for r in inc.ranks)
        for x, y in zip(xs, ys, strict=True)
        if inc.first_step <= x <= inc.last_step
    ]
    caption = (
        f"ranks {','.join(map(str, inc.ranks)) or 'all'} of {inc.node}: median "
        f"{sorted(inside)[len(inside) // 2]:+.0f} % against their peers during the incident"
        if inside
        else f"no step of {inc.node}'s ranks archived during the incident"
    )
    return Panel("ranks", _title("ranks vs peers", inc), _png(fig), caption)


def _alert_span_ms(backend: ArchiveBackend, job: str, inc: Incident) -> tuple[int, int]:
    _, rows = backend.query(
        f"SELECT min(ts_ms), max(ts_ms) FROM {backend.database}.alerts FINAL "
        "WHERE job_id = {job:String} AND signed != 0 "
        "AND (incident = {key:String} OR fingerprint = {key:String})",
        {"job": job, "key": inc.key},
    )
    lo, hi = (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)
    return lo, max(lo, hi)


def _hardware(backend: ArchiveBackend, job: str, inc: Incident) -> Panel:
    start, end = _alert_span_ms(backend, job, inc)
    _, rows = backend.query(
        "SELECT ts_ms, gpu, temperature_c, sm_clock_mhz, ecc_corrected, ecc_uncorrected, "
        f"xid_codes FROM {backend.database}.health FINAL WHERE node = {{node:String}} "
        "AND ts_ms BETWEEN {lo:UInt64} AND {hi:UInt64} ORDER BY ts_ms, gpu",
        {"node": inc.node, "lo": max(0, start - _MARGIN_MS), "hi": end + _MARGIN_MS},
    )
    fig, axes = plt.subplots(4, 1, figsize=(9, 8), sharex=True)
    t_temp, t_clock, t_ecc, t_xid = axes
    by_gpu: dict[int, list[tuple[float, float, float]]] = {}
    ecc: dict[float, list[int]] = {}
    xids: list[tuple[float, int]] = []
    for ts_ms, gpu, temp, clock, corrected, uncorrected, codes in rows:
        minute = (int(ts_ms) - start) / 60_000
        by_gpu.setdefault(int(gpu), []).append((minute, float(temp), float(clock)))
        totals = ecc.setdefault(minute, [0, 0])
        totals[0] += int(corrected)
        totals[1] += int(uncorrected)
        xids += [(minute, int(c)) for c in codes]
    for gpu, points in sorted(by_gpu.items()):
        t_temp.plot([p[0] for p in points], [p[1] for p in points], lw=1, label=f"GPU {gpu}")
        t_clock.plot([p[0] for p in points], [p[2] for p in points], lw=1)
    minutes = sorted(ecc)
    t_ecc.plot(minutes, [ecc[m][0] for m in minutes], label="ECC corrected")
    t_ecc.plot(minutes, [ecc[m][1] for m in minutes], color="tab:red", label="ECC uncorrected")
    if xids:
        t_xid.scatter([x[0] for x in xids], [x[1] for x in xids], marker="x", color="tab:red")
    t_temp.set_ylabel("temperature (°C)")
    t_temp.set_title(_title("hardware signals", inc))
    if by_gpu:
        t_temp.legend(fontsize=7, ncol=4, loc="upper left")
    t_clock.set_ylabel("SM clock (MHz)")
    t_ecc.set_ylabel("ECC errors")
    t_ecc.legend(fontsize=7, loc="upper left")
    t_xid.set_ylabel("XID code")
    t_xid.set_xlabel("minutes from the first alert")
    for ax in axes:
        ax.axvspan(0, (end - start) / 60_000 or 0.05, color="orange", alpha=0.15)
    return Panel("hardware", _title("hardware signals", inc), _png(fig),
                 _fired(inc.node, by_gpu, ecc, xids))  # fmt: skip


def _fired(
    node: str,
    by_gpu: dict[int, list[tuple[float, float, float]]],
    ecc: dict[float, list[int]],
    xids: list[tuple[float, int]],
) -> str:
    """Which of the node's signals fired, in words."""
    if not by_gpu:
        return f"no health report of {node} archived around the incident"
    said = []
    if xids:
        said.append("XID " + ", ".join(str(c) for c in sorted({x[1] for x in xids})))
    corrected = max((v[0] for v in ecc.values()), default=0)
    uncorrected = max((v[1] for v in ecc.values()), default=0)
    if uncorrected:
        said.append(f"ECC uncorrected {uncorrected}")
    if corrected:
        said.append(f"ECC corrected {corrected}")
    temps = [p[1] for points in by_gpu.values() for p in points]
    clocks = sorted(p[2] for points in by_gpu.values() for p in points)
    said.append(f"temperature up to {max(temps):.0f} °C")
    if clocks and clocks[0] < 0.9 * clocks[len(clocks) // 2]:
        said.append(f"SM clock down to {clocks[0]:.0f} MHz (median {clocks[len(clocks) // 2]:.0f})")
    return f"{node}: " + "; ".join(said)


def _markers(
    backend: ArchiveBackend, job: str, steps: list[tuple[Any, ...]]
) -> list[tuple[int, str, str]]:
    """(step, label, colour) of the job's lifecycle events, new runs and restart or
    checkpoint commands in the window; an event without a step is placed at the last
    step archived before it."""
    if not steps:
        return []
    db = backend.database
    lo_ms, hi_ms = int(steps[0][6]) - _MARGIN_MS, int(steps[-1][6]) + _MARGIN_MS
    times = [int(r[6]) for r in steps]

    def step_at(ts_ms: int) -> int:
        return int(steps[max(0, bisect_right(times, ts_ms) - 1)][0])

    marks: list[tuple[int, str, str]] = []
    params = {"job": job, "lo": max(0, lo_ms), "hi": hi_ms}
    _, events = backend.query(
        f"SELECT kind, phase, reason, step, ts_ms FROM {db}.job_events FINAL "
        "WHERE job_id = {job:String} AND ts_ms BETWEEN {lo:UInt64} AND {hi:UInt64} "
        "ORDER BY ts_ms, kind",
        params,
    )
    colour = {"phase": "tab:green", "wait": "tab:purple", "start": "tab:blue", "end": "k"}
    for kind, phase, reason, step, ts_ms in events:
        at = int(step) if int(step) >= 0 else step_at(int(ts_ms))
        label = {"phase": f"phase {phase}", "wait": "wait", "start": "start",
                 "end": f"end {reason}"}.get(str(kind), str(kind))  # fmt: skip
        marks.append((at, label, colour.get(str(kind), "tab:gray")))
    _, commands = backend.query(
        f"SELECT kind, ts_ms FROM {db}.commands FINAL WHERE job_id = {{job:String}} "
        "AND signed = 1 AND ts_ms BETWEEN {lo:UInt64} AND {hi:UInt64} ORDER BY ts_ms, kind",
        params,
    )
    marks += [(step_at(int(ts)), f"command {kind}", "tab:red") for kind, ts in commands]
    runs = [(int(r[0]), str(r[7])) for r in steps]
    marks += [
        (step, f"restart (run {run})", "tab:blue")
        for (_, before), (step, run) in pairwise(runs)
        if run != before
    ]
    return sorted(marks)


def _step_times(backend: ArchiveBackend, job: str, inc: Incident) -> Panel:
    steps = _job_steps(backend, job, inc)
    marks = _markers(backend, job, steps)
    fig, ax = plt.subplots(1, 1, figsize=(9, 4))
    xs = [int(r[0]) for r in steps]
    # a gap in the archived steps (the job stood still) stays a gap, not a line across
    gaps = {b for a, b in pairwise(xs) if b - a > 1}
    line_x: list[float] = []
    line_max: list[float] = []
    line_median: list[float] = []
    for r in steps:
        if int(r[0]) in gaps:
            line_x.append(float("nan"))
            line_max.append(float("nan"))
            line_median.append(float("nan"))
        line_x.append(int(r[0]))
        line_max.append(float(r[2]))
        line_median.append(float(r[3]))
    ax.plot(line_x, line_max, color="tab:red", lw=1.2, label="step time (max)")
    ax.plot(line_x, line_median, color="tab:gray", lw=0.8, label="median")
    seen: set[str] = set()
    for step, label, colour in marks:
        ax.axvline(step, color=colour, ls=":", lw=1.2)
        if label not in seen and len(seen) < 12:
            ax.annotate(plain(label), (step, 1.0), xycoords=("data", "axes fraction"),
                        rotation=90, fontsize=7, va="top", ha="right", color=colour)  # fmt: skip
            seen.add(label)
    _shade(ax, inc)
    ax.set_xlabel("step")
    ax.set_ylabel("step time (s)")
    ax.set_title(_title("step times", inc))
    ax.legend(fontsize=7, loc="upper left")
    gap = max((b - a for a, b in pairwise(xs)), default=0)
    caption = (
        f"{len(steps)} steps archived around the incident; "
        f"{len(marks)} marker(s): " + ", ".join(sorted({m[1] for m in marks})[:8])
        if marks
        else f"{len(steps)} steps archived around the incident; no phase, wait or restart"
    )
    if gap > 1:
        caption += f"; the longest gap between archived steps is {gap} steps"
    return Panel("steps", _title("step times", inc), _png(fig), caption)


def _divergence(backend: ArchiveBackend, job: str, inc: Incident) -> Panel:
    steps = _job_steps(backend, job, inc)
    loss = [(int(r[0]), float(r[4])) for r in steps if r[4] is not None]
    grad = [(int(r[0]), float(r[5])) for r in steps if r[5] is not None]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True)
    ax1.plot([p[0] for p in loss], [p[1] for p in loss], color="tab:blue", label="loss (median)")
    ax2.plot([p[0] for p in grad], [p[1] for p in grad], color="tab:purple",
             label="grad norm (max)")  # fmt: skip
    if grad and min(p[1] for p in grad) > 0:
        ax2.set_yscale("log")
    ax1.set_ylabel("loss")
    ax2.set_ylabel("gradient norm")
    ax2.set_xlabel("step")
    ax1.set_title(_title("loss and gradient norm", inc))
    for ax in (ax1, ax2):
        _shade(ax, inc)
        ax.legend(fontsize=7, loc="upper left")
    before = [v for s, v in loss if s < inc.first_step]
    during = [v for s, v in loss if inc.first_step <= s <= inc.last_step]
    caption = (
        f"loss {before[-1]:.4g} before, up to {max(during):.4g} during the incident"
        if before and during
        else "no loss archived around the incident"
        if not loss
        else f"{len(loss)} steps with a loss around the incident"
    )
    return Panel("divergence", _title("loss and gradient norm", inc), _png(fig), caption)
