"""``stepguard status`` and ``stepguard alerts``: what is running and what is firing.

Both read the broker, never the archive, so they work from any shell that reaches the
broker (no chDB or ClickHouse access needed), and every read is bounded:

- **services**: ``<state dir>/up.json`` while ``stepguard up`` runs (state, pid,
  restarts, uptime; counters scraped from each metrics port); otherwise the broker's
  consumer groups of ``STEPGUARD_CONSUMER_GROUP`` (members when the broker can describe
  groups: Tansu cannot, and the table says so);
- **jobs**: the last ``window`` records of each partition of the steps topic (its last
  step, the age of that step's end event time, nodes heard from), of the lifecycle
  topic (ended or not) and of the commands topic (a relaunching command the actuator
  signed after the job's last step: the job is *relaunching*, or *relaunch stuck* past
  the detector setting ``relaunch_max_s``, as the worker sees it);
- **incidents**: the last ``window`` records of each decisions partition; an episode is
  firing when its latest update there is FIRING; firing episodes are grouped by their
  incident key;
- **held actions**: the actions topic rebuilt as ``stepguard pending`` does (a held
  action past ``STEPGUARD_HOLD_TTL_S`` counts as expired, not held).

``stepguard alerts`` prints the decision stream as lines a person reads (``--json``:
the raw JSON, one message a line), from the last N updates, and keeps following with
``--follow``. Each line says whether a worker key signed the alert: an unsigned or
wrongly signed alert is shown, marked, never hidden (the actuator does not act on it).

Reading the end of a partition: Tansu's end offsets (ListOffsets LATEST) are wrong when
a batch holds several records (docs/backends.md), but the high watermark in a fetch response is
right, so :class:`TopicTail` starts at the reported end less N, and once a fetch tells
it the real high watermark it moves to that less N; it keeps at most N records per
partition whatever happens.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from pipeline.io.detector_config import load_detector_config
from pipeline.io.errors import BrokerError
from pipeline.io.kafka import client_config, reach
from pipeline.io.settings import Settings
from pipeline.io.trust import public_keys, signature_problem
from pipeline.tools.tail import DEFAULT_WINDOW, quiet_client_logs, read_tail
from schemas import (
    ActionRecord,
    ActionState,
    Alert,
    AlertState,
    Command,
    Grade,
    JobEvent,
    JobEventKind,
    StepTelemetry,
)
from schemas.commands import RELAUNCHING

__all__ = [
    "GRADE_SHORT",
    "GRADE_STYLE",
    "StatusSnapshot",
    "collect_status",
    "incidents_from",
    "jobs_from",
    "render_status",
]

log = logging.getLogger(__name__)


GRADE_STYLE = {Grade.INFO: "cyan", Grade.WARNING: "yellow", Grade.CRITICAL: "bold red"}
GRADE_SHORT = {Grade.INFO: "INFO", Grade.WARNING: "WARN", Grade.CRITICAL: "CRIT"}


# -- what the snapshot holds -------------------------------------------------------------


@dataclass
class ServiceRow:
    name: str
    state: str
    pid: int | None = None
    restarts: int = 0
    uptime_s: float | None = None
    metrics_port: int | None = None
    counters: dict[str, float] = field(default_factory=dict)


@dataclass
class JobRow:
    job_id: str
    last_step: int
    last_step_at: datetime
    age_s: float
    nodes: int
    ended: str | None = None  # the END reason, when the lifecycle tail has one
    #: seconds since a signed relaunching command issued after the job's last step
    relaunching_s: float | None = None


@dataclass
class IncidentRow:
    incident: str
    job_id: str
    kind: str
    grade: str
    nodes: list[str]
    ranks: list[int]
    episodes: int
    since: datetime
    updated: datetime
    action: str
    summary: str


@dataclass
class HeldRow:
    action_id: str
    job_id: str
    commands: str
    summary: str
    since: datetime
    expires_in_s: float


@dataclass
class StatusSnapshot:
    at: datetime
    bootstrap: str
    services_from: str
    services: list[ServiceRow]
    jobs: list[JobRow]
    incidents: list[IncidentRow]
    held: list[HeldRow]
    notes: list[str] = field(default_factory=list)
    #: how long a relaunch may take before it is stuck (the detector setting)
    relaunch_max_s: float = 1800.0

    def to_json(self) -> dict[str, Any]:
        def fix(value: Any) -> Any:
            if isinstance(value, datetime):
                return value.isoformat()
            if isinstance(value, dict):
                return {k: fix(v) for k, v in value.items()}
            if isinstance(value, list):
                return [fix(v) for v in value]
            return value

        out: dict[str, Any] = fix(asdict(self))
        return out


# -- pure folds --------------------------------------------------------------------------


def jobs_from(
    steps: Iterable[StepTelemetry],
    events: Iterable[JobEvent],
    now: datetime,
    commands: Iterable[Command] = (),
) -> list[JobRow]:
    """One row per job seen: its last step and how long ago that step ended (event
    time), most recent first; ``ended`` from the latest END event after that step;
    ``relaunching_s`` from the first of ``commands`` (the caller's, verified) that
    relaunches the job after that step.
    """
    last: dict[str, StepTelemetry] = {}
    nodes: dict[str, set[str]] = {}
    for msg in steps:
        cur = last.get(msg.job_id)
        if cur is None or (msg.ts_end, msg.step) > (cur.ts_end, cur.step):
            last[msg.job_id] = msg
        seen = nodes.setdefault(msg.job_id, set())
        if len(seen) < 100_000:
            seen.add(msg.node)
    ended: dict[str, JobEvent] = {}
    for ev in events:
        if ev.job_id in last:
            if ev.kind is JobEventKind.END:
                ended[ev.job_id] = ev
            elif ev.kind is JobEventKind.START:
                ended.pop(ev.job_id, None)
    relaunch: dict[str, datetime] = {}
    for cmd in commands:
        msg = last.get(cmd.job_id)
        if cmd.kind in RELAUNCHING and msg is not None and cmd.issued_at > msg.ts_end:
            relaunch[cmd.job_id] = min(cmd.issued_at, relaunch.get(cmd.job_id, cmd.issued_at))
    rows = [
        JobRow(
            job_id=job,
            last_step=msg.step,
            last_step_at=msg.ts_end,
            age_s=max(0.0, (now - msg.ts_end).total_seconds()),
            nodes=len(nodes[job]),
            ended=_end_reason(ended.get(job)),
            relaunching_s=(
                max(0.0, (now - relaunch[job]).total_seconds()) if job in relaunch else None
            ),
        )
        for job, msg in last.items()
    ]
    rows.sort(key=lambda r: r.age_s)
    return rows


def _end_reason(ev: JobEvent | None) -> str | None:
    if ev is None:
        return None
    return ev.reason.value if ev.reason is not None else "ended"


def incidents_from(alerts: Iterable[Alert]) -> list[IncidentRow]:
    """The firing incidents: episodes whose latest update is FIRING, grouped by their
    incident key (the fingerprint when an alert has none), worst grade first.
    """
    latest: dict[str, Alert] = {}
    for a in alerts:
        cur = latest.get(a.fingerprint)
        if cur is None or (a.seq, a.ts) >= (cur.seq, cur.ts):
            latest[a.fingerprint] = a
    groups: dict[str, list[Alert]] = {}
    for a in latest.values():
        if a.state is AlertState.FIRING:
            groups.setdefault(a.incident or a.fingerprint, []).append(a)
    rows = []
    for key, eps in groups.items():
        worst = max(eps, key=lambda a: (a.grade.level, a.ts))
        newest = max(eps, key=lambda a: a.ts)
        rows.append(
            IncidentRow(
                incident=key,
                job_id=worst.job_id,
                kind=worst.kind.value,
                grade=worst.grade.value,
                nodes=sorted({a.node for a in eps if a.node}),
                ranks=sorted({a.rank for a in eps if a.rank is not None})[:64],
                episodes=len(eps),
                since=min(a.started_at for a in eps),
                updated=newest.ts,
                action=worst.recommended_action.value,
                summary=newest.summary,
            )
        )
    rows.sort(key=lambda r: (-Grade(r.grade).level, r.since))
    return rows


def held_from(
    records: Mapping[str, ActionRecord], now: datetime, hold_ttl_s: float
) -> list[HeldRow]:
    """Actions still held (the latest record says HELD and the hold has not expired)."""
    rows = []
    for rec in records.values():
        if rec.state is not ActionState.HELD:
            continue
        left = hold_ttl_s - (now - rec.ts).total_seconds()
        if left <= 0:
            continue
        kinds = " ".join(f"{c.kind.value}{list(c.targets) or ''}" for c in rec.commands)
        rows.append(HeldRow(rec.action_id, rec.job_id, kinds, rec.summary, rec.ts, left))
    return rows


# -- services ------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def services_from_up(
    doc: Mapping[str, Any],
    alive: Callable[[int], bool] = _alive,
    scrape: Callable[[int], dict[str, float] | None] | None = None,
) -> tuple[list[ServiceRow], list[str]]:
    """The services of an ``up.json`` document; a note when ``up`` itself is gone."""
    notes = []
    up_pid = doc.get("pid")
    gone = not isinstance(up_pid, int) or not alive(up_pid)
    if gone:
        notes.append(f"stepguard up (pid {up_pid}) is not running: up.json shows its last state")
    rows = []
    services = doc.get("services")
    for name, s in (services if isinstance(services, dict) else {}).items():
        if not isinstance(s, dict):
            continue
        port = s.get("metrics_port") if isinstance(s.get("metrics_port"), int) else None
        counters = (scrape(port) or {}) if (scrape and port and not gone) else {}
        rows.append(
            ServiceRow(
                name=str(name),
                state="gone" if gone else str(s.get("state", "?")),
                pid=s.get("pid") if isinstance(s.get("pid"), int) else None,
                restarts=int(s.get("restarts") or 0),
                uptime_s=s.get("uptime_s"),
                metrics_port=port,
                counters=counters,
            )
        )
    return rows, notes


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def _group_id(item: Any) -> str:
    """A group's id from kafka-python's list/describe answers (dicts or tuples)."""
    if isinstance(item, tuple) and item:
        return str(item[0])
    return str(_field(item, "group_id") or _field(item, "group") or "?")


def services_from_groups(settings: Settings) -> tuple[list[ServiceRow], list[str]]:
    """The consumer groups of this deployment, as services (members if the broker can
    describe groups). Never raises: what cannot be read is a note."""
    from kafka import KafkaAdminClient

    notes: list[str] = []
    try:
        admin = KafkaAdminClient(**client_config(settings))
    except Exception as exc:
        return [], [f"consumer groups: cannot connect ({type(exc).__name__}: {exc})"]
    try:
        try:
            listed = admin.list_groups()
        except Exception as exc:  # a broker without ListGroups
            return [], [f"consumer groups: the broker cannot list them ({exc})"]
        base = settings.consumer_group
        found = {_group_id(g) for g in listed}
        names = sorted(n for n in found if n == base or n.startswith(base + "."))
        members: dict[str, int] = {}
        try:
            for desc in admin.describe_groups(names) if names else []:
                members[_group_id(desc)] = len(_field(desc, "members") or ())
        except Exception:  # Tansu: describe_groups raises (docs/backends.md)
            notes.append("consumer groups: members unknown (this broker cannot describe groups)")
        rows = [
            ServiceRow(
                name=name.removeprefix(base + ".") if name != base else "worker",
                state=f"{members[name]} member(s)" if name in members else "group",
            )
            for name in names
        ]
        if not names:
            notes.append(f"no consumer group {base}* on the broker (nothing has consumed yet)")
        notes.append("services from the broker's consumer groups (no stepguard up here)")
        return rows, notes
    finally:
        admin.close()


# -- collecting --------------------------------------------------------------------------


def collect_status(
    settings: Settings,
    *,
    window: int = DEFAULT_WINDOW,
    now: datetime | None = None,
    scrape: Callable[[int], dict[str, float] | None] | None = None,
) -> StatusSnapshot:
    """Everything ``stepguard status`` shows, read from the broker (and up.json)."""
    from pipeline.services.actuator.records import latest_actions

    reach(settings)  # one line within seconds when there is no broker, not a minute of retries
    notes: list[str] = []
    up_file = settings.state_dir / "up.json"
    services: list[ServiceRow]
    if up_file.is_file():
        try:
            doc = json.loads(up_file.read_text())
        except (OSError, ValueError) as exc:
            doc = {}
            notes.append(f"{up_file}: unreadable ({exc})")
        services, more = services_from_up(doc if isinstance(doc, dict) else {}, scrape=scrape)
        source = str(up_file)
    else:
        services, more = services_from_groups(settings)
        source = "consumer groups"
    notes += more
    steps = [d.message for d in read_tail(settings, "steps", window)]
    events = [d.message for d in read_tail(settings, "lifecycle", window)]
    keys = public_keys(settings, "actuator")
    signed = [  # a relaunch only the actuator's signed command shows (as the worker)
        d.message
        for d in read_tail(settings, "commands", window)
        if isinstance(d.message, Command) and signature_problem(d.message, keys) is None
    ]
    alerts = [d.message for d in read_tail(settings, "decisions", window)]
    now = now or datetime.now(UTC)
    held = held_from(latest_actions(settings), now, settings.hold_ttl_s)
    return StatusSnapshot(
        at=now, bootstrap=settings.kafka_bootstrap, services_from=source, services=services,
        jobs=jobs_from(steps, events, now, signed),  # type: ignore[arg-type]
        relaunch_max_s=load_detector_config(settings.detector_config).relaunch_max_s,
        incidents=incidents_from(alerts),  # type: ignore[arg-type]
        held=held, notes=notes,
    )  # fmt: skip


# -- rendering ---------------------------------------------------------------------------


def _age(seconds: float) -> str:
    """
    >>> _age(4.2), _age(125), _age(7300)
    ('4s', '2m05s', '2h01m')
    """
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _short(values: list[Any], most: int = 3) -> str:
    shown = ", ".join(str(v) for v in values[:most])
    return shown + (f", +{len(values) - most}" if len(values) > most else "")


def _plain(*cells: str | Text) -> list[Text]:
    """Cells as plain text: a job id, node, kind or path read from a topic or a file is
    never parsed as rich markup (``[/x]`` would raise, ``[link=...]`` would inject a
    link into the terminal)."""
    return [c if isinstance(c, Text) else Text(c) for c in cells]


def render_status(snap: StatusSnapshot, window: int) -> RenderableType:
    """Four tables that fit 80 columns (long cells wrap). Every string shown comes
    from a topic, up.json or the broker: all of it is plain text, never markup."""
    parts: list[RenderableType] = []
    head = Text(f"stepguard status: {snap.bootstrap}, {snap.at:%H:%M:%S} UTC", style="bold")
    parts.append(head)

    svc = Table(title=Text(f"services ({snap.services_from})"), title_justify="left")
    for col in ("service", "state", "pid", "rst", "up"):
        svc.add_column(col, no_wrap=col != "state", overflow="fold")
    for col in ("rec", "alerts", "cmd"):
        svc.add_column(col, justify="right", overflow="fold")
    for s in snap.services:
        c = s.counters

        def num(key: str, c: dict[str, float] = c) -> str:
            return f"{c[key]:,.0f}" if key in c else ""

        svc.add_row(*_plain(s.name, s.state, str(s.pid or ""), str(s.restarts) if s.pid else "",
                            _age(s.uptime_s) if s.uptime_s else "", num("records"),
                            num("alerts"), num("commands")))  # fmt: skip
    parts.append(svc)

    jobs = Table(title=f"jobs (last {window} step records per partition)", title_justify="left")
    for col in ("job", "last step", "age", "nodes", "state"):
        right = col in ("last step", "nodes")
        jobs.add_column(col, justify="right" if right else "left", overflow="fold")
    for j in snap.jobs:
        state = Text(j.ended or "")
        if not j.ended and j.relaunching_s is not None:
            stuck = j.relaunching_s >= snap.relaunch_max_s
            state = Text(
                f"{'relaunch stuck' if stuck else 'relaunching'} {_age(j.relaunching_s)}",
                style="red" if stuck else "yellow",
            )
        silent = j.age_s > 300 and not j.ended and j.relaunching_s is None
        age = Text(_age(j.age_s), style="red" if silent else "")
        jobs.add_row(*_plain(j.job_id, str(j.last_step), age, str(j.nodes), state))
    parts.append(jobs if snap.jobs else Text("jobs: none in the steps topic's tail"))

    inc = Table(title="firing incidents", title_justify="left")
    for col in ("grade", "job", "kind", "nodes", "since", "action", "incident"):
        inc.add_column(col, no_wrap=col in ("grade", "since"), overflow="fold")
    for i in snap.incidents:
        grade = Grade(i.grade)
        where = _short(i.nodes) or (f"ranks {_short(i.ranks)}" if i.ranks else "job")
        inc.add_row(*_plain(Text(GRADE_SHORT[grade], style=GRADE_STYLE[grade]), i.job_id,
                            i.kind, where, f"{i.since:%H:%M:%S}", i.action,
                            i.incident))  # fmt: skip
    parts.append(inc if snap.incidents else Text("firing incidents: none", style="green"))

    held = Table(title="held actions (stepguard approve/reject ID)", title_justify="left")
    for col in ("job", "commands", "expires", "action id"):
        held.add_column(col, no_wrap=col == "action id", overflow="fold")
    for h in snap.held:
        held.add_row(*_plain(h.job_id, h.commands, f"in {_age(h.expires_in_s)}", h.action_id))
    parts.append(held if snap.held else Text("held actions: none"))
    for note in snap.notes:
        parts.append(Text(f"note: {note}", style="dim"))
    return Group(*parts)


# -- alerts ----------------------------------------------------------------------------------


def run_status(
    settings: Settings,
    console: Console,
    *,
    follow: bool,
    every_s: float,
    window: int,
    as_json: bool,
    stop: Any,
) -> None:
    """``stepguard status``: one snapshot (a table, or ``--json``), or with ``follow``
    a table refreshed in place every ``every_s`` until ``stop`` (an Event) is set."""
    from rich.live import Live

    from pipeline.tools.up_board import scrape

    quiet_client_logs()

    def snapshot() -> StatusSnapshot:
        return collect_status(settings, window=window, scrape=scrape)

    if as_json and not follow:
        print(json.dumps(snapshot().to_json(), indent=2))
        return
    if not follow:
        console.print(render_status(snapshot(), window))
        return
    with Live(console=console, auto_refresh=False, screen=False) as live:
        while not stop.is_set():
            try:
                live.update(render_status(snapshot(), window), refresh=True)
            except BrokerError as exc:  # the broker went away: say so, keep trying
                line = f"stepguard status: broker lost: {exc}; retrying every {every_s:g} s"
                live.update(Text(line + " (Ctrl-C stops)", style="red"), refresh=True)
            stop.wait(every_s)
