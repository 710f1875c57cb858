"""``stepguard alerts``: the decision stream, readable, filtered and followed.

Each alert is one line (time, grade, state, job, node/rank, kind, summary, evidence,
recommended action, incident), marked when no worker key signed it, in the order of the
time it shows (the alert's event time, :func:`by_event_time`; the archive's queries
order by the same clock). Reads the end of the decisions topic with
:class:`pipeline.tools.tail.TopicTail`."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.text import Text

from pipeline.io.duration import parse_duration
from pipeline.io.kafka import Decoded
from pipeline.io.settings import Settings
from pipeline.tools.status import GRADE_SHORT, GRADE_STYLE
from pipeline.tools.tail import DEFAULT_WINDOW, TopicTail, follow_reconnecting, quiet_client_logs
from schemas import (
    Alert,
    AlertKind,
    AlertState,
    Grade,
)

__all__ = [
    "AlertFilter",
    "alert_line",
    "alerts_filter",
    "by_event_time",
    "follow_alerts",
    "signature_mark",
]


@dataclass(frozen=True)
class AlertFilter:
    """Which alerts ``stepguard alerts`` shows: a job, a least grade, not older than."""

    job: str | None = None
    grade: Grade | None = None
    since: datetime | None = None

    def __call__(self, a: Alert) -> bool:
        if self.job and a.job_id != self.job:
            return False
        if self.grade is not None and a.grade.level < self.grade.level:
            return False
        return self.since is None or a.ts >= self.since


def signature_mark(
    a: Alert, worker_keys: Mapping[str, Any], actuator_keys: Mapping[str, Any]
) -> str:
    """``""`` when a worker key signed (or the actuator signed its guardrail alert), else
    what is wrong (``UNSIGNED``, ``BAD SIGNATURE: ...``, ``UNVERIFIED`` without keys)."""
    from pipeline.io.trust import signature_problem

    if a.signature is None:
        return "UNSIGNED"
    if not worker_keys and not actuator_keys:
        return "UNVERIFIED (no STEPGUARD_WORKER_PUBLIC_KEYS)"
    problem = signature_problem(a, worker_keys)
    guardrail = problem is not None and a.kind is AlertKind.GUARDRAIL
    if guardrail and signature_problem(a, actuator_keys) is None:
        return ""
    return "" if problem is None else f"BAD SIGNATURE: {problem}"


def by_event_time(items: list[Decoded]) -> list[Decoded]:
    """Alerts in the order of the time a line shows: the alert's event time (``ts``),
    then when the broker got it, its partition and offset. The broker's order alone
    interleaves workers (and jobs whose clocks lead the wall clock) by arrival, so a
    later alert could be printed above an earlier one."""

    def key(d: Decoded) -> tuple[datetime, int, int, int]:
        ts = d.message.ts if isinstance(d.message, Alert) else _EPOCH
        return (ts, d.timestamp_ms, d.partition, d.offset)

    return sorted(items, key=key)


_EPOCH = datetime.fromtimestamp(0, UTC)


def _evidence(a: Alert) -> str:
    e = a.evidence
    ref = (
        f" vs peers {e.peer_median:.3g}" if e.peer_median is not None
        else f" vs baseline {e.baseline:.3g}" if e.baseline is not None else ""
    )  # fmt: skip
    return f"{e.metric}={e.value:.3g}{ref} (dev {e.deviation:.3g})"


def alert_line(a: Alert, mark: str = "") -> Text:
    """One readable line (wrapped by the console when narrow): time, grade, state, job,
    node/rank, kind, summary, evidence, recommended action, incident, and the mark of
    a signature that is not a worker's.
    """
    text = Text()
    text.append(f"{a.ts.astimezone(UTC):%H:%M:%S} ")
    text.append(GRADE_SHORT[a.grade], style=GRADE_STYLE[a.grade])
    state_style = "bold" if a.state is AlertState.FIRING else "green"
    text.append(f" {a.state.value.upper()}", style=state_style)
    where = (a.node or "") + (f"/r{a.rank}" if a.rank is not None else "")
    text.append(f" {a.job_id}" + (f" {where}" if where else "") + f" {a.kind.value}: ")
    text.append(a.summary or "(no summary)")
    text.append(f" [{_evidence(a)}]", style="dim")
    if a.recommended_action.value != "none":
        text.append(f" -> {a.recommended_action.value}")
    if a.incident:
        # the whole key, as query incidents prints it and report/label take it
        text.append(f" [incident {a.incident}]", style="dim")
    if mark:
        text.append(f" {mark}", style="bold magenta reverse")
    return text


def follow_alerts(
    settings: Settings,
    console: Console,
    *,
    last: int,
    keep: AlertFilter,
    follow: bool,
    as_json: bool,
    stop: Callable[[], bool],
    window: int = DEFAULT_WINDOW,
    notice: Callable[[str], None] | None = None,
) -> int:
    """Print the last ``last`` alerts that pass ``keep`` (from the last ``window``
    records of each decisions partition), then, with ``follow``, each new one until
    ``stop()``, across broker restarts (``notice``, default the console, gets a line
    when the broker is lost and when it is back). Returns how many were printed."""
    from pipeline.io.trust import public_keys

    quiet_client_logs()
    worker_keys = public_keys(settings, "worker")
    actuator_keys = public_keys(settings, "actuator")
    shown = 0

    def show(items: list[Decoded]) -> None:
        nonlocal shown
        for d in items:
            a = d.message
            assert isinstance(a, Alert)
            if as_json:
                print(a.model_dump_json(), flush=True)
            else:
                line = alert_line(a, signature_mark(a, worker_keys, actuator_keys))
                console.print(line, highlight=False, soft_wrap=True)  # one line in a pipe
            shown += 1

    def first(tail: TopicTail) -> None:
        recent = [d for d in tail.tail(max(window, last)) if keep(d.message)]  # type: ignore[arg-type]
        show(by_event_time(recent)[-last:] if last else [])

    follow_reconnecting(
        settings, "decisions", first=first, follow=follow, stop=stop,
        each=lambda batch: show(by_event_time([d for d in batch if keep(d.message)])),  # type: ignore[arg-type]
        notice=notice or _stderr_line,
    )  # fmt: skip
    return shown


def _stderr_line(line: str) -> None:
    sys.stderr.write(f"stepguard alerts: {line}\n")
    sys.stderr.flush()


def alerts_filter(
    *, job: str | None, grade: str | None, since: str | None, now: datetime | None = None
) -> AlertFilter:
    """The filter of ``stepguard alerts``; ``ValueError`` naming the bad option."""
    least = None
    if grade is not None:
        try:
            least = Grade(grade.lower())
        except ValueError:
            raise ValueError(
                f"--grade: expected info, warning or critical; got {grade!r}"
            ) from None
    start = None
    if since is not None:
        try:
            start = (now or datetime.now(UTC)) - parse_duration(since)
        except ValueError as exc:
            raise ValueError(f"--since: {exc}") from None
    return AlertFilter(job=job or None, grade=least, since=start)
