"""``stepguard report``: one self-contained HTML post-mortem of a job from the archive.

For each incident (every episode of one culprit node, whatever its cause, while any
was open: ``Alert.incident``) a panel per kind of cause (:mod:`.report_panels`:
stragglers, their ranks against their peers; hardware, the node's signals that fired;
hangs, the step time with phases, waits and restarts; divergence, loss and gradient
norm), its causes in order (``thermal (step 120) -> straggler (step 131)``), then the
alert/command timeline and the commands with every executor's result. The images
are inline (``data:`` URIs): the one file is the whole report, to forward as it is.
A job the archive has nothing of is an error (:class:`UnknownJobError`), not an empty
report. The terminal gets a plain-text summary.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.io.errors import StepguardError
from pipeline.services.archive.backend import ArchiveBackend
from pipeline.services.archive.queries import run_query
from pipeline.tools.report_panels import Incident, Panel, panels_for

__all__ = ["Incident", "ReportResult", "UnknownJobError", "incidents", "render_report"]


class UnknownJobError(StepguardError):
    """The archive holds nothing of the job a report was asked for."""


@dataclass(frozen=True, slots=True)
class ReportResult:
    html_path: Path
    panels: dict[str, list[Panel]]  # incident key -> its panels, inline in the HTML
    text: str
    commands: int  # commands issued for the job
    results: int  # executors' results of them (one per command and executor)


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


def _ranks(ranks: tuple[int, ...]) -> str:
    return ",".join(str(r) for r in ranks) if ranks else "all"


def _table(cols: list[str], rows: list[tuple[Any, ...]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r) + "</tr>" for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


_CHAIN = re.compile(r"incident chain: (.+?)(?:;|$)")
_STEP = re.compile(r"^step (\d+):")


def _chain(inc: Incident, timeline: list[tuple[Any, ...]]) -> str:
    """The incident's causes in order (``thermal (step 120) -> straggler (step
    131)``), from the newest alert update of its culprit within its steps whose
    evidence names the chain; empty for a one-cause incident."""
    found = ""
    for row in timeline:
        what, subject, detail = str(row[1]), str(row[2]), str(row[3])
        if not what.startswith("alert ") or not subject.startswith(inc.node or "\x00"):
            continue
        step = _STEP.match(detail)
        if step is None or not inc.first_step <= int(step.group(1)) <= inc.last_step:
            continue
        m = _CHAIN.search(detail)
        if m is not None:
            found = m.group(1).strip()
    return found


def _job_exists(backend: ArchiveBackend, job: str) -> bool:
    """Whether the archive holds any step, alert, lifecycle event or command of ``job``."""
    db = backend.database
    for table in ("steps", "alerts", "job_events", "commands"):
        _, rows = backend.query(
            f"SELECT count() FROM {db}.{table} WHERE job_id = {{job:String}}", {"job": job}
        )
        if rows and int(rows[0][0]) > 0:
            return True
    return False


def _causes(backend: ArchiveBackend, job: str, inc: Incident, chain: str) -> str:
    """The incident's causes in order: the chain its alerts name, else each kind of
    its alerts with the first step it fired at (``straggler (step 60)``)."""
    if chain:
        return chain
    _, rows = backend.query(
        f"SELECT kind, min(step) AS began FROM {backend.database}.alerts FINAL "
        "WHERE job_id = {job:String} AND signed != 0 "
        "AND (incident = {key:String} OR fingerprint = {key:String}) "
        "GROUP BY kind ORDER BY began, kind",
        {"job": job, "key": inc.key},
    )
    return " -> ".join(f"{kind} (step {began})" for kind, began in rows) or inc.kind


def _figure(panel: Panel) -> str:
    data = base64.b64encode(panel.png).decode("ascii")
    return (
        f"<figure class='panel {panel.kind}'><img src='data:image/png;base64,{data}' "
        f"alt='{html.escape(panel.title)}'><figcaption>{html.escape(panel.caption)}"
        "</figcaption></figure>"
    )


_STYLE = (
    "<style>body{font-family:sans-serif;margin:2em;max-width:1100px}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;"
    "font-size:13px}figure{margin:1em 0}img{max-width:100%}"
    "figcaption{font-size:13px;color:#333}</style>"
)


def render_report(
    backend: ArchiveBackend, job: str, out_html: Path, incident: str | None = None
) -> ReportResult:
    """Write the report of ``job`` (or of one incident of it) to ``out_html``: one
    file, images inline. :class:`UnknownJobError` when the archive has nothing of
    ``job``, or no incident ``incident``."""
    if not _job_exists(backend, job):
        raise UnknownJobError(f"job {job!r} is not in the archive")
    found = incidents(backend, job, incident)
    if incident and not found:
        raise UnknownJobError(f"job {job!r} has no incident {incident!r}")
    tl_cols, timeline = run_query(backend, "incident_timeline", job=job)
    cmd_cols, outcomes = run_query(backend, "command_outcomes", job=job)
    causes = {i.key: _causes(backend, job, i, _chain(i, timeline)) for i in found}
    panels = {i.key: panels_for(backend, job, i) for i in found}
    # command_outcomes has a row per command and executor that answered
    n_commands = len({r[cmd_cols.index("command_id")] for r in outcomes})
    n_results = sum(1 for r in outcomes if r[cmd_cols.index("executor")])
    summary_rows = [
        (i.key, i.kind, i.node or "(job)", _ranks(i.ranks), i.episodes, i.first_step,
         i.last_step, i.worst_grade, "resolved" if i.resolved else "open", causes[i.key])
        for i in found
    ]  # fmt: skip
    summary_cols = ["incident", "kind", "culprit", "ranks", "episodes", "first step",
                    "last step", "grade", "state", "causes"]  # fmt: skip
    sections = []
    for i in found:
        sections.append(
            f"<section class='incident' id='incident-{html.escape(i.key)}'>"
            f"<h3>{html.escape(i.kind)} on {html.escape(i.node or 'the job')}, steps "
            f"{i.first_step}-{i.last_step} ({html.escape(i.worst_grade)}, "
            f"{'resolved' if i.resolved else 'open'})</h3>"
            f"<p>causes: {html.escape(causes[i.key])}</p>"
            + "".join(_figure(p) for p in panels[i.key])
            + "</section>"
        )
    parts = [
        "<!doctype html><meta charset='utf-8'>",
        f"<title>stepguard report: {html.escape(job)}</title>",
        _STYLE,
        f"<h1>stepguard report: {html.escape(job)}</h1>",
        f"<h2>Incidents ({len(found)})</h2>",
        _table(summary_cols, summary_rows) if found else "<p>No incident.</p>",
        *sections,
        "<h2>Timeline</h2>",
        _table(tl_cols, timeline),
        f"<h2>Commands ({n_commands} issued, {n_results} executor result(s))</h2>",
        _table(cmd_cols, outcomes) if outcomes else "<p>No commands were issued.</p>",
    ]
    out_html.parent.mkdir(parents=True, exist_ok=True)
    out_html.write_text("\n".join(parts) + "\n")
    lines = [f"job {job}: {len(found)} incident(s)"]
    lines += [
        f"  {i.kind:<12} {i.node or '(job)':<12} steps {i.first_step}-{i.last_step} "
        f"{i.worst_grade:<8} {'resolved' if i.resolved else 'open':<8} "
        f"{i.episodes} episode(s){', ranks ' + _ranks(i.ranks) if i.ranks else ''}"
        f"; causes {causes[i.key]}"
        for i in found
    ]
    lines.append(f"  {n_commands} command(s), {n_results} executor result(s); report: {out_html}")
    return ReportResult(out_html, panels, "\n".join(lines), n_commands, n_results)
