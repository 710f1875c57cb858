"""``stepguard report``: an HTML post-mortem of one job from the archive.

For each incident (every episode of one culprit and one kind while any was open:
``Alert.incident``) it plots the culprit node's ranks' compute time relative to the
step's peer median around the incident, and the job's step time; then the
alert/command timeline and a summary table. Plots are PNG files next to the HTML; the
terminal gets a plain-text summary.
"""

from __future__ import annotations

import hashlib
import html
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from pipeline.services.archive.backend import ArchiveBackend
from pipeline.services.archive.queries import run_query

__all__ = ["Incident", "ReportResult", "incidents", "render_report"]


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
class ReportResult:
    html_path: Path
    images: list[Path]
    text: str


def incidents(backend: ArchiveBackend, job: str, incident: str | None = None) -> list[Incident]:
    """The job's incidents (the ``incidents`` query); ``incident`` keeps the one with
    that key or holding an episode with that fingerprint."""
    _, rows = run_query(backend, "incidents", job=job)
    grades = {0: "info", 1: "warning", 2: "critical"}
    found = [
        Incident(
            str(r[0]),
            str(r[1]),
            str(r[2]),
            tuple(int(x) for x in r[3]),
            int(r[4]),
            int(r[5]),
            int(r[6]),
            grades.get(int(r[7]), "?"),
            bool(r[8]),
            tuple(str(x) for x in r[9]),
        )
        for r in rows
    ]
    if incident:
        found = [i for i in found if incident == i.key or incident in i.fingerprints]
    return found


def _plot_incident(backend: ArchiveBackend, job: str, inc: Incident, out: Path) -> Path:
    db = backend.database
    lo, hi = max(0, inc.first_step - 60), inc.last_step + 60
    # job and node are values from outside (the command line, the archive): they are
    # query parameters, never SQL text
    window = {"job": job, "node": inc.node, "lo": lo, "hi": hi}
    _, peer = backend.query(
        f"SELECT step, quantileExact(0.5)(compute_s), max(step_time_s) FROM {db}.steps FINAL "
        "WHERE job_id = {job:String} AND step BETWEEN {lo:UInt64} AND {hi:UInt64} "
        "GROUP BY step ORDER BY step",
        window,
    )
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True)
    if inc.node:
        _, mine = backend.query(
            f"SELECT rank, step, compute_s FROM {db}.steps FINAL WHERE job_id = {{job:String}} "
            "AND node = {node:String} AND step BETWEEN {lo:UInt64} AND {hi:UInt64} "
            "ORDER BY rank, step",
            window,
        )
        # relative to the step's peer median: eval and checkpoint steps move everyone
        # and vanish, a slow rank stands out by its own percentage
        median = {int(r[0]): float(r[1]) for r in peer}
        by_rank: dict[int, tuple[list[int], list[float]]] = {}
        for rank, step, compute in mine:
            base = median.get(int(step))
            if not base:
                continue
            xs, ys = by_rank.setdefault(int(rank), ([], []))
            xs.append(int(step))
            ys.append(100.0 * (float(compute) / base - 1.0))
        for rank, (xs, ys) in sorted(by_rank.items()):
            style = {"lw": 2.0} if rank in inc.ranks else {"lw": 0.8, "alpha": 0.6}
            ax1.plot(xs, ys, label=f"rank {rank}", **style)
    ax1.axhline(0.0, color="k", ls="--", lw=1.2, label="peer median")
    ax1.set_ylabel("compute vs peer median (%)")
    title = f"{inc.kind} on {inc.node or 'job'} ({inc.worst_grade}), incident {inc.key}"
    ax1.set_title(_plain(title))
    ax1.legend(fontsize=7, ncol=3, loc="upper left")
    ax2.plot([r[0] for r in peer], [r[2] for r in peer], color="tab:red", label="step time")
    ax2.set_ylabel("step time (s)")
    ax2.set_xlabel("step")
    for ax in (ax1, ax2):
        ax.axvspan(inc.first_step, inc.last_step, color="orange", alpha=0.15)
    fig.tight_layout()
    path = out / f"incident-{_file_part(inc.key)}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _plain(text: str) -> str:
    """Text read from the archive as a plot label: printable, no mathtext."""
    return "".join(c if c.isprintable() else "?" for c in text).replace("$", r"\$")


def _file_part(key: str) -> str:
    """An incident key (read from the archive) as a file name part: never a path."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", key)[:64]
    if safe != key:  # keep distinct keys distinct
        safe += "-" + hashlib.sha256(key.encode()).hexdigest()[:12]
    return safe


def _ranks(ranks: tuple[int, ...]) -> str:
    return ",".join(str(r) for r in ranks) if ranks else "all"


def _table(cols: list[str], rows: list[tuple[Any, ...]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r) + "</tr>" for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def render_report(
    backend: ArchiveBackend, job: str, out_html: Path, incident: str | None = None
) -> ReportResult:
    out_html.parent.mkdir(parents=True, exist_ok=True)
    found = incidents(backend, job, incident)
    images = [_plot_incident(backend, job, inc, out_html.parent) for inc in found]
    tl_cols, timeline = run_query(backend, "incident_timeline", job=job)
    cmd_cols, commands = run_query(backend, "command_outcomes", job=job)
    summary_rows = [
        (i.key, i.kind, i.node or "(job)", _ranks(i.ranks), i.episodes, i.first_step,
         i.last_step, i.worst_grade, "resolved" if i.resolved else "open")
        for i in found
    ]  # fmt: skip
    summary_cols = ["incident", "kind", "culprit", "ranks", "episodes", "first step",
                    "last step", "grade", "state"]  # fmt: skip
    parts = [
        "<!doctype html><meta charset='utf-8'>",
        f"<title>stepguard report: {html.escape(job)}</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}</style>",
        f"<h1>stepguard report: {html.escape(job)}</h1>",
        f"<h2>Incidents ({len(found)})</h2>",
        _table(summary_cols, summary_rows),
        "<h2>Plots</h2>",
        *(f"<p><img src='{html.escape(p.name)}' alt='{html.escape(p.stem)}'></p>" for p in images),
        "<h2>Timeline</h2>",
        _table(tl_cols, timeline),
        "<h2>Commands</h2>",
        _table(cmd_cols, commands) if commands else "<p>No commands were issued.</p>",
    ]
    out_html.write_text("\n".join(parts) + "\n")
    lines = [f"job {job}: {len(found)} incident(s)"]
    lines += [
        f"  {i.kind:<12} {i.node or '(job)':<12} steps {i.first_step}-{i.last_step} "
        f"{i.worst_grade:<8} {'resolved' if i.resolved else 'open':<8} "
        f"{i.episodes} episode(s){', ranks ' + _ranks(i.ranks) if i.ranks else ''}"
        for i in found
    ]
    lines.append(f"  {len(commands)} command(s); report: {out_html}")
    return ReportResult(out_html, images, "\n".join(lines))
