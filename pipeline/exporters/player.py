"""``stepguard simulate``: play a scenario to the broker in (scaled) real time."""

from __future__ import annotations

import time
from dataclasses import dataclass

from pipeline.kafka import create_topics, make_producer, publish, registry_of
from pipeline.settings import Settings
from pipeline.simulator import Scenario, simulate

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
) -> PlayStats:
    """Publish the scenario's steps and health; ``speed=None`` means as fast as possible.

    ``stop_after_step`` ends the playback after that step (the job goes silent, as a
    hung job does).
    """
    if speed is not None and speed <= 0:
        raise ValueError("speed must be positive (or None for --max)")
    create_topics(settings)
    registry = registry_of(settings)
    producer = make_producer(settings)
    stats = PlayStats()
    t0 = time.monotonic()
    start_ts = scenario.start_ts
    try:
        if truth:
            for t in scenario.truth():
                publish(producer, registry, "truth", t)
                stats.truth_messages += 1
        for ev in simulate(scenario):
            if speed is not None:
                delay = t0 + (ev.ts - start_ts) / speed - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            if ev.frame is not None:
                for m in ev.frame.to_messages():
                    publish(producer, registry, "steps", m)
                    stats.step_messages += 1
                stats.steps += 1
            for h in ev.health:
                publish(producer, registry, "health", h)
                stats.health_messages += 1
            if stop_after_step is not None and ev.step >= stop_after_step:
                break
        producer.flush(timeout=60)
    finally:
        producer.close(timeout=10)
    stats.wall_s = time.monotonic() - t0
    return stats
