"""Node health on its own clock: when reports are taken and when they arrive.

Real node agents report on their own clocks (an NVML loop every 10 s, a dcgm-exporter
scrape), not at the job's step ends, and their reports reach the detector through a
path of its own (the health topic, keyed by node) that can lag or stall and then
deliver its backlog in a burst. A scenario opts in with ``health_interval_s``:

- every node reports every ``health_interval_s`` at its own phase (drawn once per
  node), with a little jitter, during long steps and stalls too;
- each report is delivered ``health_delay_s`` later on average (exponential);
- a ``health_delay`` fault (a trap: the nodes are fine) blocks the path: from
  ``onset_step`` for ``duration_steps`` (variant ``window``, the default), or while
  the job is stalled from ``onset_step`` on (variant ``stall``: a path that flushes
  with the job's progress, so a hang holds the health back too). When the block
  ends, the backlog drains one node after another (a consumer catching up reads
  one node-keyed partition after the other), ``magnitude`` nodes per second (0: all
  at once).

Without ``health_interval_s`` the simulator keeps its step-aligned reports (every
``health_interval_steps`` nominal steps, stamped at the event that made them due).

Examples
--------
>>> from pipeline.tools.simulator.scenario import Scenario
>>> sc = Scenario.model_validate({"name": "hp", "nodes": 4, "steps": 10,
...     "health_interval_s": 10.0, "faults": [{"kind": "health_delay",
...     "onset_step": 2, "duration_steps": 3, "magnitude": 2.0}]})
>>> path = HealthPath(sc)
>>> path.blocked(step=3, stalled=False), path.blocked(step=6, stalled=False)
(True, False)
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from pipeline.tools.simulator.scenario import FaultSpec, Scenario
from schemas.telemetry import NodeHealth
from schemas.truth import FaultKind

__all__ = ["HealthClock", "HealthPath"]

F64 = npt.NDArray[np.float64]
IP = npt.NDArray[np.intp]
B = npt.NDArray[np.bool_]


class HealthClock:
    """When each node slot's next report is due (its own phase and jitter).

    Examples
    --------
    >>> c = HealthClock(3, 10.0, start=0.0, seed=1)
    >>> rounds = list(c.due(25.0))
    >>> [len(slots) for slots, _ in rounds], all(t <= 25.0 for _, ts in rounds for t in ts)
    ([3, 3, 2], True)
    """

    def __init__(self, nodes: int, interval_s: float, *, start: float, seed: int) -> None:
        self.interval_s = interval_s
        self._rng = np.random.default_rng([seed, 0x4E41])
        self._next = start + self._rng.uniform(0.0, interval_s, nodes)

    def due(self, now: float, alive: B | None = None) -> Iterator[tuple[IP, F64]]:
        """Rounds of ``(slots, times)`` of the reports due by ``now``, oldest first
        (a long step or stall spans several rounds); dead slots skip theirs."""
        while True:
            mask = self._next <= now
            if not mask.any():
                return
            slots = np.flatnonzero(mask)
            times = self._next[slots].copy()
            jitter = 1.0 + 0.02 * self._rng.standard_normal(slots.size)
            self._next[slots] += self.interval_s * np.clip(jitter, 0.9, 1.1)
            if alive is not None:
                keep = alive[slots]
                slots, times = slots[keep], times[keep]
            if slots.size:
                yield slots, times


@dataclass(order=True, slots=True)
class _Pending:
    at: float
    seq: int
    report: NodeHealth = field(compare=False)


class HealthPath:
    """Delivery of health reports: delayed, blocked by ``health_delay`` faults,
    drained node by node afterwards."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.mean_delay_s = scenario.health_delay_s
        self._rng = np.random.default_rng([scenario.seed, 0x50A7])
        self._faults: list[FaultSpec] = [
            f for f in scenario.faults if f.kind == FaultKind.HEALTH_DELAY
        ]
        self._in_flight: list[_Pending] = []
        self._backlog: dict[str, list[NodeHealth]] = defaultdict(list)
        self._draining: deque[tuple[float, str]] = deque()
        self._seq = 0
        self._was_blocked = False

    def blocked(self, *, step: int, stalled: bool) -> bool:
        """Is the path blocked at the job's ``step`` (the next one to run)?"""
        for f in self._faults:
            if step < f.onset_step:
                continue
            if (f.variant or "window") == "stall":
                if stalled:
                    return True
            elif f.active(step):
                return True
        return False

    def send(self, reports: list[NodeHealth]) -> None:
        """Reports just taken; each arrives after its own delivery delay."""
        for r in reports:
            delay = float(self._rng.exponential(self.mean_delay_s)) if self.mean_delay_s else 0.0
            self._seq += 1
            self._in_flight.append(_Pending(r.ts.timestamp() + delay, self._seq, r))

    def deliver(self, now: float, *, step: int, stalled: bool) -> list[NodeHealth]:
        """What reaches the detector by event time ``now``, in arrival order."""
        blocked = self.blocked(step=step, stalled=stalled)
        self._in_flight.sort()
        arrived: list[NodeHealth] = []
        while self._in_flight and self._in_flight[0].at <= now:
            p = self._in_flight.pop(0)
            if blocked or p.report.node in self._backlog:
                self._backlog[p.report.node].append(p.report)  # behind its node's backlog
            else:
                arrived.append(p.report)
        if self._was_blocked and not blocked and self._backlog:
            self._drain_from(now)
        self._was_blocked = blocked
        while self._draining and self._draining[0][0] <= now:
            _, node = self._draining.popleft()
            arrived += self._backlog.pop(node, [])
        return arrived

    def _drain_from(self, now: float) -> None:
        rate = max(f.magnitude for f in self._faults) if self._faults else 0.0
        nodes = sorted(self._backlog)
        order = self._rng.permutation(len(nodes))
        for i, j in enumerate(order.tolist()):
            at = now + (i / rate if rate > 0 else 0.0)
            self._draining.append((at, nodes[j]))
