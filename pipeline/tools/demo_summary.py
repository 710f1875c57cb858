"""What ``stepguard demo`` reports: the outcome of each fault, the summary, and the
matching of alerts to the faults injected (pure; :mod:`pipeline.tools.demo` runs the demo)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from pipeline.services.actuator.kinds import EXECUTOR_KINDS
from schemas import (
    ActionRecord,
    ActionState,
    Alert,
    AlertKind,
    AlertState,
    Command,
    CommandKind,
    CommandResult,
    CommandStatus,
    FaultKind,
    FaultTruth,
)

__all__ = [
    "DEFAULT_SPEED",
    "CommandOutcomes",
    "DemoSummary",
    "FaultOutcome",
    "command_outcomes",
    "match_alerts",
    "print_summary",
    "write_json",
]

#: The demo plays its job this many times faster than real time.
DEFAULT_SPEED = 8.0


@dataclass
class FaultOutcome:
    fault_id: str
    kind: str
    node: str | None
    onset_step: int
    detected: bool
    detected_step: int | None
    delay_steps: int | None
    alert_kinds: list[str]


@dataclass
class DemoSummary:
    scenario: str
    job_id: str
    nodes: int
    ranks: int
    steps_completed: int
    faults_injected: int
    faults_detected: int
    traps: int
    trap_alerts: int
    false_alerts: int
    false_isolations: int
    goodput: float
    wall_seconds: float
    messages_published: int
    archived_rows: int
    dead_letters: int
    alerts_by_grade: dict[str, int]
    faults: list[FaultOutcome] = field(default_factory=list)
    commands: dict[str, int] = field(default_factory=dict)
    #: nodes whose isolation the job applied (a succeeded result, not a dry run)
    isolated_nodes: list[str] = field(default_factory=list)
    actions_applied: list[str] = field(default_factory=list)
    #: commands the job applied, refused (and why), and left unanswered
    #: (:func:`command_outcomes`); actions the actuator refused, and why
    applied: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    unanswered: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    speed: float = DEFAULT_SPEED
    #: wall seconds the job took to play (``wall_seconds`` adds start-up and the end)
    played_seconds: float = 0.0
    #: restarts of each service that needed one (a supervised crash, not a failure)
    service_restarts: dict[str, int] = field(default_factory=dict)
    #: wall seconds of each stage, in order: ``setup`` (keys, plan, children spawned),
    #: ``start`` (every service up and each worker assigned), ``play``, ``settle``
    #: (detection and the actuator done), ``archive`` (the archive's end), ``stop``
    #: (the children stopped); they add up to ``wall_seconds``
    phase_seconds: dict[str, float] = field(default_factory=dict)
    #: when the job's clock started (ISO 8601): when it was played, on the stack's
    #: clock, never before the stack started
    job_started_at: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


#: Executors that apply nothing (their results say what would have been done).
DRY_RUN_EXECUTORS = frozenset(k.name for k in EXECUTOR_KINDS.values() if k.dry_run)


@dataclass
class CommandOutcomes:
    """What came of the commands: applied, refused (and why), not answered."""

    applied: list[str] = field(default_factory=list)
    isolated: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    unanswered: list[str] = field(default_factory=list)


def _what(cmd: Command) -> str:
    return f"{cmd.kind.value} {list(cmd.targets)}" if cmd.targets else cmd.kind.value


def command_outcomes(
    commands: list[Command], results: list[CommandResult], actions: list[ActionRecord]
) -> CommandOutcomes:
    """What the job did with each command, from the executors' results (a dry run
    applies nothing; NOTIFY is not applied to a job), and the actions the actuator
    refused (a guardrail), with why.

    >>> from datetime import UTC, datetime
    >>> from schemas import ActuatorMode
    >>> t = datetime(2026, 1, 1, tzinfo=UTC)
    >>> def cmd(cid, kind, node):
    ...     return Command(command_id=cid, kind=kind, job_id="j", targets=(node,),
    ...                    reason=("fp",), mode=ActuatorMode.AUTO, issued_at=t)
    >>> def res(cid, status, executor="simulated-job", detail=""):
    ...     return CommandResult(command_id=cid, job_id="j", executor=executor,
    ...                          status=status, detail=detail, ts=t)
    >>> cmds = [cmd("cmd-1", CommandKind.ISOLATE, "n1"), cmd("cmd-2", CommandKind.ISOLATE, "n2"),
    ...         cmd("cmd-3", CommandKind.RESTART, "n3")]
    >>> out = command_outcomes(cmds, [res("cmd-1", CommandStatus.SUCCEEDED),
    ...     res("cmd-2", CommandStatus.SUCCEEDED, "dry-run"),
    ...     res("cmd-3", CommandStatus.REFUSED, detail="no checkpoint yet")], [])
    >>> out.isolated
    ['n1']
    >>> out.refused
    ["restart ['n3'] (cmd-3): refused by simulated-job: no checkpoint yet"]
    >>> out.unanswered  # a dry run applies nothing
    ["isolate ['n2'] (cmd-2)"]
    """
    by_command: dict[str, list[CommandResult]] = {}
    for r in results:
        if r.executor not in DRY_RUN_EXECUTORS:
            by_command.setdefault(r.command_id, []).append(r)
    out = CommandOutcomes()
    for cmd in commands:
        if cmd.kind is CommandKind.NOTIFY:
            continue
        got = by_command.get(cmd.command_id, [])
        done = [r for r in got if r.status is CommandStatus.SUCCEEDED]
        ended = [r for r in got if r.status in (CommandStatus.REFUSED, CommandStatus.FAILED)]
        what = f"{_what(cmd)} ({cmd.command_id})"
        if done:
            out.applied.append(f"{what} by {done[0].executor}")
            if cmd.kind is CommandKind.ISOLATE:
                out.isolated += [n for n in cmd.targets if n not in out.isolated]
        elif ended:
            r = ended[-1]
            why = f": {r.detail}" if r.detail else ""
            out.refused.append(f"{what}: {r.status.value} by {r.executor}{why}")
        else:
            out.unanswered.append(what)
    for rec in actions:
        if rec.state is ActionState.REFUSED:
            kinds = " + ".join(c.kind.value for c in rec.commands) or "action"
            out.refused.append(f"{kinds} ({rec.action_id}): refused by the actuator: {rec.detail}")
    return out


#: Faults that leave a rank dead: nothing completes until the job is restarted.
_STALLS_THE_JOB = frozenset({FaultKind.CRASH, FaultKind.ECC_STORM})


def match_alerts(
    truth: list[FaultTruth], alerts: list[Alert], grace_steps: int = 30
) -> tuple[list[FaultOutcome], int, int]:
    """Match firing alert episodes to faults: same node (or job-level for job-wide
    faults) and a step inside [onset, end + grace]. A fault that kills a rank (crash,
    and the XID 48 that ends an ECC storm) stops the whole job until a restart, so a
    job-level hang in its window is its consequence, not a false alert. Returns
    outcomes, alerts on traps, and firing episodes that match no fault."""
    firing = [a for a in alerts if a.state is AlertState.FIRING]
    first_by_fp: dict[str, Alert] = {}
    for a in sorted(firing, key=lambda a: (a.step or 0, a.seq)):
        first_by_fp.setdefault(a.fingerprint, a)
    episodes = list(first_by_fp.values())
    matched: set[str] = set()
    outcomes = []
    for f in (t for t in truth if not t.is_trap):
        end = (f.end_step if f.end_step is not None else 10**12) + grace_steps
        hits = [
            a
            for a in episodes
            if f.onset_step <= (a.step or 0) <= end
            and (
                f.node is None
                or a.node == f.node
                or (f.kind in _STALLS_THE_JOB and not a.node and a.kind is AlertKind.HANG)
            )
        ]
        if f.node is None:  # job-wide faults (hang, divergence) accept job-level alerts
            hits = [a for a in hits if a.kind.value in ("hang", "missing", "divergence")]
        matched.update(a.fingerprint for a in hits)
        first = min(hits, key=lambda a: a.step or 0) if hits else None
        outcomes.append(
            FaultOutcome(
                fault_id=f.fault_id, kind=f.kind.value, node=f.node, onset_step=f.onset_step,
                detected=first is not None, detected_step=first.step if first else None,
                delay_steps=(first.step or 0) - f.onset_step if first else None,
                alert_kinds=sorted({a.kind.value for a in hits}),
            )
        )  # fmt: skip
    trap_nodes = {t.node for t in truth if t.is_trap and t.node}
    unmatched = [a for a in episodes if a.fingerprint not in matched]
    trap_alerts = sum(1 for a in unmatched if a.node in trap_nodes)
    return outcomes, trap_alerts, len(unmatched)


def print_summary(summary: DemoSummary, console: Console) -> None:
    table = Table(title=f"stepguard demo: {summary.scenario} (job {summary.job_id})")
    for col in ("fault", "kind", "node", "onset", "detected at", "delay (steps)", "alerts"):
        table.add_column(col)
    for o in summary.faults:
        table.add_row(
            o.fault_id, o.kind, o.node or "(job)", str(o.onset_step),
            str(o.detected_step) if o.detected else "[red]missed",
            "" if o.delay_steps is None else str(o.delay_steps), ", ".join(o.alert_kinds),
        )  # fmt: skip
    console.print(table)
    console.print(
        f"{summary.nodes} nodes x {summary.ranks // max(summary.nodes, 1)} GPUs, "
        f"{summary.steps_completed} steps at {summary.speed:g}x; faults detected "
        f"{summary.faults_detected}/{summary.faults_injected}; alerts on traps "
        f"{summary.trap_alerts}; unmatched alerts {summary.false_alerts}; alerts by grade "
        f"{summary.alerts_by_grade}; goodput {summary.goodput:.3f}; "
        f"{summary.messages_published} messages, {summary.archived_rows} archived rows, "
        f"{summary.dead_letters} dead letters; {summary.wall_seconds:.1f} s"
        + (" (" + ", ".join(f"{k} {v:.1f}" for k, v in summary.phase_seconds.items()) + ")"
           if summary.phase_seconds else "")
    )  # fmt: skip
    cmds = ", ".join(f"{n} {k}" for k, n in sorted(summary.commands.items())) or "none"
    console.print(
        f"commands issued: {cmds}; applied by the job (its results): "
        f"{len(summary.applied)}, refused: {len(summary.refused)}, no result: "
        f"{len(summary.unanswered)}; isolated {summary.isolated_nodes or 'no node'} "
        f"(false isolations {summary.false_isolations})"
    )
    for line in summary.refused:
        console.print(f"  refused: {line}")
    for line in summary.unanswered:
        console.print(f"  no result: {line}")
    for line in summary.actions_applied:
        console.print(f"  job applied {line}")
    if summary.service_restarts:
        console.print(f"  service restarts: {summary.service_restarts}")
    for n in summary.notes:
        console.print(f"  - {n}")
    console.print(
        f"next: stepguard report --job {summary.job_id} --out report.html   "
        f"stepguard query incident_timeline --job {summary.job_id}"
    )


def write_json(summary: DemoSummary, path: Path) -> None:
    path.write_text(json.dumps(summary.to_json(), indent=2, default=str) + "\n")
