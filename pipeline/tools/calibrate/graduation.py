"""``stepguard calibrate --actions``: which action kinds have earned ``auto``?

Reads the archive's action records, human approvals and rejections, the commands the
actuator issued and the executors' results, and reports per action kind (the alert's
recommended action: ``replace_at_checkpoint``, ``restart`` ...) and fault kind (the
alert's kind: ``straggler``, ``hang`` ...):

- how many actions were held for a human, approved, rejected or left to expire;
- the approval rate (approved / decided) and the human latency (hold to decision,
  median and 90th percentile, from the approver's own timestamp);
- the commands carried out (NOTIFY excluded) and how many succeeded (an executor's
  last answer other than ``accepted``; ``failed`` and ``refused`` count against).

A kind is recommended for ``auto`` (``stepguard control --mode-for KIND=auto``) when,
over every fault kind, it has at least ``min_approvals`` approvals, at most
``max_rejections`` rejections (0: none) and at least ``min_success`` of at least
``min_outcomes`` executed commands succeeded (:class:`GraduationRules`).

Trust: only commands the actuator signed count (``commands.signed = 1``), and only
action records the actuator signed and approvals an operator signed (``signed != 0``,
migration 010; rows archived before it read -1 and count): a forged approval or
rejection on the approvals topic moves no kind towards auto, or away from it.
The SQL is the subset ClickHouse 18.16 and chDB share; the counting is done here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from pipeline.services.archive.backend import ArchiveBackend

__all__ = [
    "ACTING_KINDS",
    "GraduationReport",
    "GraduationRules",
    "KindStats",
    "Recommendation",
    "graduation_report",
    "render",
    "run_graduation",
]

#: recommended actions that issue more than a NOTIFY (the ones a mode matters for)
ACTING_KINDS = ("isolate", "replace_at_checkpoint", "restart", "rollback")
ALL = "*"  #: the fault-kind column of an action kind's total


@dataclass(frozen=True, slots=True, kw_only=True)
class GraduationRules:
    """When an action kind may move from approve to auto."""

    min_approvals: int = 5
    max_rejections: int = 0
    min_success: float = 0.95
    min_outcomes: int = 1

    def __post_init__(self) -> None:
        if self.min_approvals < 0:
            raise ValueError("min_approvals must be >= 0")
        if self.max_rejections < 0:
            raise ValueError("max_rejections must be >= 0")
        if not 0.0 <= self.min_success <= 1.0:
            raise ValueError("min_success must be within [0, 1]")
        if self.min_outcomes < 0:
            raise ValueError("min_outcomes must be >= 0")


@dataclass(slots=True)
class KindStats:
    action: str
    fault: str
    held: int = 0
    approved: int = 0
    rejected: int = 0
    expired: int = 0
    latencies_s: list[float] = field(default_factory=list)
    commands: int = 0  #: executed (a final result), NOTIFY excluded
    succeeded: int = 0
    auto_commands: int = 0  #: of ``commands``, issued in auto mode

    @property
    def approval_rate(self) -> float | None:
        decided = self.approved + self.rejected
        return self.approved / decided if decided else None

    @property
    def success_rate(self) -> float | None:
        return self.succeeded / self.commands if self.commands else None

    def latency(self, q: float) -> float | None:
        return float(np.percentile(self.latencies_s, q)) if self.latencies_s else None

    def add(self, other: KindStats) -> None:
        for name in ("held", "approved", "rejected", "expired", "commands", "succeeded",
                     "auto_commands"):  # fmt: skip
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.latencies_s.extend(other.latencies_s)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        del d["latencies_s"]
        d.update(
            approval_rate=self.approval_rate, success_rate=self.success_rate,
            latency_median_s=self.latency(50), latency_p90_s=self.latency(90),
        )  # fmt: skip
        return d


@dataclass(frozen=True, slots=True)
class Recommendation:
    action: str
    auto: bool
    why: str


@dataclass(frozen=True, slots=True)
class GraduationReport:
    since: datetime | None
    rules: GraduationRules
    rows: list[KindStats]  #: per (action kind, fault kind)
    totals: list[KindStats]  #: per action kind (fault ``*``)
    recommendations: list[Recommendation]
    #: action records or commands whose alert is not archived (counted nowhere else)
    unmatched: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "since": self.since.isoformat() if self.since else None,
            "rules": asdict(self.rules),
            "rows": [r.to_json() for r in self.rows],
            "totals": [r.to_json() for r in self.totals],
            "recommendations": [asdict(r) for r in self.recommendations],
            "unmatched": self.unmatched,
        }


def _alert_kinds(backend: ArchiveBackend, since_ms: int) -> dict[str, tuple[str, str]]:
    """Alert fingerprint -> (recommended action, fault kind), the latest update that
    recommended something."""
    _, rows = backend.query(
        "SELECT fingerprint, kind, recommended_action, seq FROM "
        f"{backend.database}.alerts FINAL WHERE ts_ms >= {{since:UInt64}} AND "
        "recommended_action != 'none' ORDER BY fingerprint, seq",
        {"since": since_ms},
    )
    return {fp: (action, kind) for fp, kind, action, _ in rows}


def graduation_report(
    backend: ArchiveBackend,
    rules: GraduationRules | None = None,
    *,
    since: datetime | None = None,
    jobs: Sequence[str] = (),
) -> GraduationReport:
    """Count the archive's history of actions (since ``since``, of ``jobs`` if given)
    per action kind and fault kind, and recommend the kinds ready for auto."""
    rules = rules or GraduationRules()
    db = backend.database
    since_ms = 0 if since is None else int(since.timestamp() * 1000)
    p = {"since": since_ms}
    wanted = set(jobs)
    kinds = _alert_kinds(backend, since_ms)
    stats: dict[tuple[str, str], KindStats] = {}
    unmatched = 0

    def of(fingerprints: Sequence[str]) -> KindStats | None:
        for fp in fingerprints:
            if fp in kinds:
                key = kinds[fp]
                return stats.setdefault(key, KindStats(*key))
        return None

    # actions: every state row; the hold's time and how it ended
    _, rows = backend.query(
        "SELECT action_id, state, job_id, reason, detail, ts_ms FROM "
        f"{db}.actions FINAL WHERE ts_ms >= {{since:UInt64}} AND signed != 0 "
        "ORDER BY action_id, ts_ms",
        p,
    )
    held: dict[str, tuple[list[str], int]] = {}
    ended: dict[str, str] = {}
    for aid, state, job, reason, detail, ts_ms in rows:
        if wanted and job not in wanted:
            continue
        if state == "held":
            held.setdefault(aid, (list(reason), int(ts_ms)))
        elif state in ("approved", "rejected"):
            ended.setdefault(aid, state)
        elif state == "cancelled" and str(detail).startswith("expired"):
            ended.setdefault(aid, "expired")
    _, rows = backend.query(
        "SELECT command_id, decision, ts_ms FROM "
        f"{db}.approvals FINAL WHERE ts_ms >= {{since:UInt64}} AND signed != 0 "
        "ORDER BY command_id, ts_ms",
        p,
    )
    decision: dict[str, tuple[str, int]] = {}
    for aid, dec, ts_ms in rows:
        decision.setdefault(aid, (dec, int(ts_ms)))  # the first decision counts
    for aid, (reason, held_ms) in held.items():
        s = of(reason)
        if s is None:
            unmatched += 1
            continue
        s.held += 1
        dec = decision.get(aid)
        how = ended.get(aid)
        if dec is not None:
            how = "approved" if dec[0] == "approve" else "rejected"
            s.latencies_s.append(max(0.0, (dec[1] - held_ms) / 1000))
        if how == "approved":
            s.approved += 1
        elif how == "rejected":
            s.rejected += 1
        elif how == "expired":
            s.expired += 1
    # executed commands and their outcomes
    _, rows = backend.query(
        "SELECT command_id, kind, job_id, reason, mode FROM "
        f"{db}.commands FINAL WHERE ts_ms >= {{since:UInt64}} AND signed = 1 "
        "AND kind != 'notify' ORDER BY command_id",
        p,
    )
    _, results = backend.query(
        # signed by a result writer's key only; the last by at_ms (migration 011: never
        # later than the archiver's receipt + the clock skew), not by the writer's ts
        "SELECT command_id, status, at_ms FROM "
        f"{db}.command_results FINAL WHERE ts_ms >= {{since:UInt64}} AND signed != 0 AND "
        "status != 'accepted' ORDER BY command_id, at_ms, ts_ms",
        p,
    )
    final: dict[str, str] = {}
    for cid, status, _ in results:
        final[cid] = status  # the executor's last answer
    for cid, _, job, reason, mode in rows:
        if (wanted and job not in wanted) or cid not in final:
            continue
        s = of(list(reason))
        if s is None:
            unmatched += 1
            continue
        s.commands += 1
        s.succeeded += final[cid] == "succeeded"
        s.auto_commands += mode == "auto"
    ordered = sorted(stats.values(), key=lambda s: (s.action, s.fault))
    totals: dict[str, KindStats] = {}
    for s in ordered:
        totals.setdefault(s.action, KindStats(s.action, ALL)).add(s)
    recs = [_recommend(t, rules) for t in totals.values() if t.action in ACTING_KINDS]
    return GraduationReport(since, rules, ordered, list(totals.values()), recs, unmatched)


def _recommend(t: KindStats, rules: GraduationRules) -> Recommendation:
    short: list[str] = []
    if t.approved < rules.min_approvals:
        short.append(f"{t.approved} approvals < {rules.min_approvals}")
    if t.rejected > rules.max_rejections:
        short.append(f"{t.rejected} rejections > {rules.max_rejections}")
    if t.commands < rules.min_outcomes:
        short.append(f"{t.commands} executed commands < {rules.min_outcomes}")
    elif (t.success_rate or 0.0) < rules.min_success:
        short.append(f"{100 * (t.success_rate or 0):.0f} % succeeded < "
                     f"{100 * rules.min_success:.0f} %")  # fmt: skip
    if short:
        return Recommendation(t.action, False, "keep approve: " + "; ".join(short))
    rate = 100 * (t.success_rate or 0.0)
    return Recommendation(
        t.action, True,
        f"auto: {t.approved} approvals, {t.rejected} rejections, {rate:.0f} % of "
        f"{t.commands} commands succeeded",
    )  # fmt: skip


def _fmt_s(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def render(report: GraduationReport, console: Any) -> None:
    """The report as tables and the control command that would graduate the kinds."""
    from rich.table import Table

    since = report.since.isoformat(timespec="seconds") if report.since else "the beginning"
    r = report.rules
    table = Table(
        title=f"Actions since {since}: approvals, human latency, outcomes (auto when >= "
        f"{r.min_approvals} approvals, <= {r.max_rejections} rejections, >= "
        f"{100 * r.min_success:.0f} % of >= {r.min_outcomes} commands succeeded)",
        title_justify="left",
    )
    for col in ("action", "fault", "held", "approved", "rejected", "expired", "approval",
                "latency p50 s", "p90 s", "commands", "succeeded", "auto cmds"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("action", "fault") else "right")
    every = sorted([*report.rows, *report.totals], key=lambda s: (s.action, s.fault == ALL))
    for s in every:
        table.add_row(
            s.action, s.fault, str(s.held), str(s.approved), str(s.rejected), str(s.expired),
            _pct(s.approval_rate), _fmt_s(s.latency(50)), _fmt_s(s.latency(90)),
            str(s.commands), _pct(s.success_rate), str(s.auto_commands),
            style="bold" if s.fault == ALL else None,
        )  # fmt: skip
    console.print(table)
    if report.unmatched:
        console.print(f"{report.unmatched} action(s) or command(s) without an archived alert")
    if not report.recommendations:
        console.print("no action kind has a history yet")
    for rec in report.recommendations:
        console.print(f"{rec.action}: {rec.why}")
    ready = [rec.action for rec in report.recommendations if rec.auto]
    if ready:
        flags = " ".join(f"--mode-for {k}=auto" for k in ready)
        console.print(f'to graduate: stepguard control {flags} --reason "calibrate --actions"')


def _open(settings: Any) -> ArchiveBackend:
    from pipeline.services.archive import open_backend

    return open_backend(settings)


def run_graduation(
    settings: Any,
    console: Any,
    *,
    since: datetime | None,
    jobs: Sequence[str] = (),
    rules: GraduationRules | None = None,
    json_path: Any = None,
) -> GraduationReport:
    """The body of ``stepguard calibrate --actions``."""
    from pipeline.services.archive import migrate

    backend = _open(settings)
    try:
        migrate(backend)
        report = graduation_report(backend, rules, since=since, jobs=jobs)
    finally:
        backend.close()
    render(report, console)
    if json_path is not None:
        json_path.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    return report
