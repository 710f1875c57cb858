"""A node's health silence is judged only as far as its own path has delivered.

Health reports reach their job through the routers of the health topic's partitions
(one *path* each). One router that falls behind (a slow consumer, or a worker that died
and whose partitions wait for a rebalance) delayed every report of its partition, and
the job named the nodes keyed there ``MISSING``, CRITICAL, recommending isolation,
while their reports sat unread. Each forwarded report now names its path and each
worker's timer writes its paths' watermarks: a node whose path lags is not silent,
however long it lags, and a node silent on a path that delivers (a lone node on its
partition included) is named as before.
"""

from __future__ import annotations

from datetime import timedelta

from pipeline.services.worker.seal import Seal, health_path
from pipeline.services.worker.state import CoreTopics, WorkerDetection
from schemas import AlertKind, AlertState, GpuHealth, NodeHealth, encode
from tests.unit.pipeline.services.worker.test_state import T0, Clock, step_msg

TOPICS = CoreTopics("steps", "health", "jobs", lifecycle="lifecycle")
NODES = 8
STEP_S = 1.3  # step_msg: step s ends at T0 + 1.3 (s + 1)
HEALTH_S = 2.0
#: the health topic's partition of each node: six share path 0, n6 is on path 1, n7
#: alone on path 2
PATH = {n: 0 for n in range(6)} | {6: 1, 7: 2}


def health(node: int, at: float) -> bytes:
    return encode(
        NodeHealth(
            job_id="j",
            node=f"n{node}",
            ts=T0 + timedelta(seconds=at),
            interval_s=HEALTH_S,
            gpus=(
                GpuHealth(
                    index=0, temperature_c=60, power_w=500, sm_clock_mhz=1800, utilization_pct=99
                ),
            ),
        )
    )


def missing(alerts: list) -> list[str]:
    return sorted(
        {
            a.node
            for a in alerts
            if a.kind is AlertKind.MISSING
            and a.evidence.metric == "intervals_silent"
            and a.state is AlertState.FIRING
        }
    )


class Live:
    """A job's steps and health read as they come, the timer ticking after each step
    and (``marks``) writing the watermarks of the three health paths: a path is read
    to its end unless its router lags, then it says the newest report it forwarded."""

    def __init__(self, marks: bool = True) -> None:
        self.clock = Clock()
        self.core = WorkerDetection(TOPICS, 8, clock=self.clock)
        self.marks = marks
        self.table: dict[str, bytes] = {}
        self.offset = 0
        self.alerts: list = []
        self.forwarded: dict[int, float] = {}  # per path, the newest report forwarded
        self.lagging: set[int] = set()

    def _next(self) -> int:
        self.offset += 1
        return self.offset

    def forward(self, node: int, at: float) -> None:
        fwd = self.core.route_health(PATH[node], self._next(), f"n{node}".encode(),
                                     health(node, at))  # fmt: skip
        assert health_path(fwd.kind) == PATH[node]
        out = self.core.handle_job_record(0, self._next(), b"j", fwd.value, fwd.kind,
                                          token=None, load=self.table.get)  # fmt: skip
        self.forwarded[PATH[node]] = max(at, self.forwarded.get(PATH[node], at))
        self.alerts += out.alerts

    def step(self, step: int) -> None:
        for n in range(NODES):
            out = self.core.handle_step(0, self._next(), b"j", step_msg(step, n), token=None,
                                        load=self.table.get)  # fmt: skip
            if out.snapshot is not None:
                self.table[out.job_id] = out.snapshot
            self.alerts += out.alerts
        self.clock.now = 1000.0 + STEP_S * (step + 1) + 0.05
        self.timer()

    def timer(self) -> None:
        core = self.core
        if self.marks:
            base = T0.timestamp()
            paths = [(p, base + self.forwarded[p] if p in self.lagging else None)
                     for p in (0, 1, 2) if p in self.forwarded]  # fmt: skip
            value = core.watermarks_record(paths)
            out = core.handle_job_record(0, self._next(), b"paths", value, "paths", token=None)
            assert not out.dead_letters, out.dead_letters
        tick = core.tick_record("j")
        if tick is not None:
            self.alerts += core.handle_job_record(
                0, self._next(), b"j", tick[1], "tick", None
            ).alerts


def play(live: Live, steps: range, dead: set[int], lag_path: int | None, held: list) -> None:
    """Health every 2 s from every node not ``dead``; reports of ``lag_path`` are held
    back in ``held`` (its router is behind) instead of forwarded."""
    for step in steps:
        first = int(STEP_S * step // HEALTH_S) + 1
        for k in range(first, int(STEP_S * (step + 1) // HEALTH_S) + 1):
            for n in range(NODES):
                if n in dead:
                    continue
                if PATH[n] == lag_path:
                    held.append((n, k * HEALTH_S))
                else:
                    live.forward(n, k * HEALTH_S)
        live.step(step)


def run(marks: bool) -> tuple[Live, list]:
    """40 steps in health, then n5 (path 0) and n7 (alone on path 2) die and path 1's
    router falls 20 steps behind; then it catches up."""
    live, held = Live(marks), []
    play(live, range(40), set(), None, held)
    live.lagging = {1}
    play(live, range(40, 60), {5, 7}, 1, held)
    return live, held


def test_a_lagging_path_is_not_its_nodes_silence_but_dead_nodes_on_delivered_paths_are():
    live, held = run(marks=True)
    assert missing(live.alerts) == ["n5", "n7"]  # n7: the only node of its partition
    # path 1's router catches up: its backlog, then its watermark; n6 was never missing
    live.lagging = set()
    for n, at in held:
        live.forward(n, at)
    play(live, range(60, 70), {5, 7}, None, held)
    assert "n6" not in missing(live.alerts)


def test_without_watermarks_the_lagging_path_reads_as_silence():
    """The control: the same feed judged as before this change (a router that writes
    no watermarks) names the lagging path's node too."""
    live, _ = run(marks=False)
    assert missing(live.alerts) == ["n5", "n6", "n7"]


def test_watermarks_are_sealed_and_bounded():
    core = WorkerDetection(TOPICS, 8, clock=Clock())
    forged = Seal(b"x" * 32).seal("paths", b'{"wall_s": 1.0, "paths": [[0, null]]}')
    out = core.handle_job_record(0, 1, b"paths", forged, "paths", token="f")
    assert out.dead_letters and out.release == ["f"]
    value = core.watermarks_record([(70000, None)])  # sealed, but no such partition
    out = core.handle_job_record(0, 2, b"paths", value, "paths", token="b")
    assert "65535" in out.dead_letters[0].error
