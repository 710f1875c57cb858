"""``stepguard simulate``: play a scenario to the broker in (scaled) real time."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.io.kafka import create_topics, make_producer, publish, registry_of
from pipeline.io.settings import Settings
from pipeline.io.telemetry_auth import telemetry_prover
from pipeline.tools.simulator import Scenario, SimulatedJob
from pipeline.tools.simulator.announce import InputWaits, job_event, phase_announcement
from schemas import EndReason, JobEvent, JobEventKind

__all__ = ["PlayStats", "play"]


@dataclass
class PlayStats:
    steps: int = 0
    step_messages: int = 0
    health_messages: int = 0
    truth_messages: int = 0
    wall_s: float = 0.0


def play(
    settings: Settings,
    scenario: Scenario,
    *,
    speed: float | None = 1.0,
    truth: bool = True,
    stop_after_step: int | None = None,
    lifecycle: bool = True,
    announce_phases: bool | None = None,
    job: SimulatedJob | None = None,
    on_event: Callable[[SimulatedJob], None] | None = None,
    lead_s: float | None = None,
) -> PlayStats:
    """Publish the scenario's steps and health; ``speed=None`` means as fast as possible.

    With ``lifecycle`` the job's START comes first and its END (completed) last, as
    training code's exporter publishes them; with ``announce_phases`` every checkpoint
    and eval step is announced when it starts (``StepExporter.phase``); None: as the
    scenario says (``Scenario.announce_phases``).
    ``stop_after_step`` ends the playback after that step without an end (the job goes
    silent, as a hung job does).

    ``lead_s``: the most an event may be dated ahead of the wall clock; the player holds
    it back until then (``None``: no bound; see :mod:`.timing`).

    Closed loop: pass the ``job`` to play and ``on_event``, called after each event is
    published, applies the commands that arrived meanwhile (isolate, restart, ...) to
    it, so the next events show their effect.
    """
    if speed is not None and speed <= 0:
        raise ValueError("speed must be positive (or None for --max)")
    if announce_phases is None:
        announce_phases = scenario.announce_phases
    create_topics(settings)
    registry = registry_of(settings)
    producer = make_producer(settings)
    # it plays every node of the job: the cluster secret (or the nodes' keys), and its
    # job controller's key for the job-level events (pipeline.io.telemetry_auth)
    prover = telemetry_prover(settings, "the simulator")
    stats = PlayStats()
    t0 = time.monotonic()
    start_ts = scenario.start_ts
    try:
        if truth:
            for t in scenario.truth():
                publish(producer, registry, "truth", t)
                stats.truth_messages += 1
        if lifecycle:
            start = job_event(scenario, JobEventKind.START, start_ts)
            publish(producer, registry, "lifecycle", start, prover)
        last_ts, last_step, stopped = start_ts, 0, False
        sim = job if job is not None else SimulatedJob(scenario)
        waits = InputWaits(scenario)
        for ev in sim.events():
            said: list[tuple[float, JobEvent]] = []
            if announce_phases and ev.frame is not None:
                ann = phase_announcement(scenario, ev.frame, last_step)
                if ann is not None:
                    said.append((ev.frame.ts_start, ann))
                wait = waits.during(ev.frame, last_step)
                if wait is not None:
                    said.append(wait)
            for at, event in said:  # while the step runs, as the client says them
                _wait(t0, at - start_ts, speed)
                _not_ahead(at, lead_s)
                publish(producer, registry, "lifecycle", event, prover)
                producer.flush()
            _wait(t0, ev.ts - start_ts, speed)
            _not_ahead(ev.ts, lead_s)
            if ev.frame is not None:
                for m in ev.frame.to_messages():
                    publish(producer, registry, "steps", m, prover)
                    stats.step_messages += 1
                stats.steps += 1
            for h in ev.health:
                publish(producer, registry, "health", h, prover)
                stats.health_messages += 1
            last_ts, last_step = ev.ts, max(ev.step, 0)
            if on_event is not None:
                on_event(sim)
            if stop_after_step is not None and ev.step >= stop_after_step:
                stopped = True
                break
        if lifecycle and not stopped:
            end = job_event(
                scenario, JobEventKind.END, last_ts, last_step, reason=EndReason.COMPLETED
            )
            publish(producer, registry, "lifecycle", end, prover)
        producer.flush(timeout=60)
    finally:
        producer.close(timeout=10)
    stats.wall_s = time.monotonic() - t0
    return stats


def _wait(t0: float, offset_s: float, speed: float | None) -> None:
    if speed is not None:
        delay = t0 + offset_s / speed - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def _not_ahead(ts: float, lead_s: float | None) -> None:
    """Hold an event dated ``ts`` until it is at most ``lead_s`` ahead of the wall clock
    (the services refuse records dated beyond their clock + the allowed skew)."""
    if lead_s is not None:
        delay = ts - lead_s - time.time()
        if delay > 0:
            time.sleep(delay)
