"""Seed an archive with simulated jobs, as the archiver would have stored them.

For calibration's tests and benchmark (and for trying ``stepguard calibrate`` without
a production archive): a :class:`~pipeline.tools.simulator.Scenario` is simulated, its
steps and health go into the archive through the same row mapping the archiver uses
(:func:`pipeline.services.archive.rows_for`), optionally with the simulator's truth and with the
alerts the detection core raised while the job was "observed" under some settings.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from detectors.config import DetectorConfig
from detectors.job import JobDetection
from pipeline.services.archive.backend import ArchiveBackend
from pipeline.services.archive.rows import rows_for
from pipeline.tools.simulator import Scenario, simulate
from schemas import Alert, Message

__all__ = ["SeededJob", "seed_job"]

_BATCH = 2000


@dataclass(frozen=True, slots=True)
class SeededJob:
    job_id: str
    rank_steps: int
    alerts: list[Alert]  #: what the observing run raised (empty when not observed)

    @property
    def incidents(self) -> dict[str, Alert]:
        """Incident id -> its first FIRING update."""
        out: dict[str, Alert] = {}
        for a in self.alerts:
            if a.state.value == "firing" and a.incident:
                out.setdefault(a.incident, a)
        return out


def _insert(backend: ArchiveBackend, messages: Iterable[tuple[Message, int]]) -> None:
    batch: list[tuple[Message, int]] = []

    def flush() -> None:
        for table, cols in rows_for(batch).items():
            backend.insert(table, cols)
        batch.clear()

    for m in messages:
        batch.append(m)
        if len(batch) >= _BATCH:
            flush()
    if batch:
        flush()


def seed_job(
    backend: ArchiveBackend,
    scenario: Scenario,
    *,
    truth: bool = True,
    observed_with: DetectorConfig | None = None,
) -> SeededJob:
    """Archive ``scenario``'s steps and health; its truth when ``truth``; and, when
    ``observed_with`` is given, the alerts the detection core raised under it."""
    det = JobDetection(scenario.job, observed_with) if observed_with is not None else None
    alerts: list[Alert] = []
    rank_steps = 0

    def records() -> Iterable[tuple[Message, int]]:
        nonlocal rank_steps
        for ev in simulate(scenario):
            ms = int(ev.ts * 1000)
            for h in ev.health:
                yield h, ms
                if det is not None:
                    alerts.extend(det.on_health(h))
            if ev.frame is not None:
                rank_steps += ev.frame.n_ranks
                for m in ev.frame.to_messages():
                    yield m, ms
                if det is not None:
                    alerts.extend(det.on_frame(ev.frame))
            if det is not None:
                alerts.extend(det.tick(ev.ts))
        if det is not None:
            alerts.extend(det.flush())

    _insert(backend, records())
    extra: list[tuple[Any, int]] = []
    if truth:
        t0 = int(scenario.start_ts * 1000)
        extra += [(t, t0) for t in scenario.truth()]
    extra += [(a, int(a.ts.timestamp() * 1000)) for a in alerts]
    _insert(backend, extra)
    return SeededJob(scenario.job, rank_steps, alerts)
