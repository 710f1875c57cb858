"""``stepguard label``: an operator's verdict on an incident, archived.

A label says whether an incident (every episode of one culprit and one kind, the
``incident`` column of the ``alerts`` table) was a real fault. It goes straight into
the archive's ``labels`` table through the configured backend (server or chDB), with
who gave it, when and why; ``stepguard calibrate`` reads the latest verdict per
incident as ground truth.

Why a row and not a signed message on a topic: nothing acts on a label; calibration
only scores thresholds with it, and its recommendation goes through a person
(``--dry-run``) before it is applied. Whoever can write the archive can already
change every row calibration reads (alerts, steps, approvals), so a signature on the
label alone would protect nothing; the archive's own access control is the boundary.
Every verdict is kept (a changed mind is a new row), so the history stays auditable.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from pipeline.io.errors import ConfigError
from pipeline.services.archive.backend import ArchiveBackend
from schemas.labels import IncidentLabel

__all__ = ["LabelVerdict", "UnknownIncidentError", "incident_labels", "label_incident"]


class UnknownIncidentError(ConfigError):
    """The incident id names no incident of the archive's alerts."""


@dataclass(frozen=True, slots=True)
class LabelVerdict:
    """The latest verdict on one incident."""

    incident: str
    job_id: str
    verdict: bool
    by: str
    note: str
    ts_ms: int


def label_incident(
    backend: ArchiveBackend,
    incident: str,
    verdict: bool,
    *,
    by: str,
    note: str = "",
    now: datetime | None = None,
) -> IncidentLabel:
    """Archive ``verdict`` on ``incident`` (which must exist in the alerts table)."""
    db = backend.database
    _, rows = backend.query(
        f"SELECT job_id, count() AS n FROM {db}.alerts WHERE incident = {{incident:String}} "
        "AND incident != '' GROUP BY job_id ORDER BY n DESC, job_id LIMIT 1",
        {"incident": incident},
    )
    if not rows:
        raise UnknownIncidentError(
            f"INCIDENT {incident!r}: no alert of the archive belongs to it "
            f"(see `stepguard query incidents --job J`)"
        )
    ts = (now or datetime.now(UTC)).astimezone(UTC)
    try:
        label = IncidentLabel(
            incident=incident, job_id=str(rows[0][0]), verdict=verdict, by=by, note=note, ts=ts
        )
    except ValueError as exc:
        raise ConfigError(f"label: {exc}") from exc
    ms = int(ts.timestamp() * 1000)
    backend.insert(
        "labels",
        {
            "incident": [label.incident], "job_id": [label.job_id],
            "verdict": [int(label.verdict)], "by": [label.by], "note": [label.note],
            "ts": [ts], "ts_ms": [ms], "ver": [ms],
        },
    )  # fmt: skip
    return label


def incident_labels(backend: ArchiveBackend, jobs: list[str] | None = None) -> list[LabelVerdict]:
    """The latest verdict per incident (of ``jobs``, or every job), by incident."""
    db = backend.database
    where, params = "", {}
    if jobs is not None:
        if not jobs:
            return []
        # one parameter per job: values never become SQL text
        names = [f"j{i}" for i in range(len(jobs))]
        where = "WHERE job_id IN (" + ", ".join(f"{{{n}:String}}" for n in names) + ")"
        params = dict(zip(names, jobs, strict=True))
    _, rows = backend.query(
        f"SELECT incident, argMax(job_id, ts_ms), argMax(verdict, ts_ms), argMax(by, ts_ms), "
        f"argMax(note, ts_ms), max(ts_ms) FROM {db}.labels FINAL {where} "
        "GROUP BY incident ORDER BY incident",
        params,
    )
    return [
        LabelVerdict(str(r[0]), str(r[1]), bool(r[2]), str(r[3]), str(r[4]), int(r[5]))
        for r in rows
    ]
