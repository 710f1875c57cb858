"""The supervisor's decisions (pure) and the process group driving fake processes."""

from __future__ import annotations

import pytest

from pipeline.tools.supervisor import (
    Backoff,
    ProcessGroup,
    ServiceSpec,
    ServiceState,
    Supervisor,
)


def spec(name: str, **kw: object) -> ServiceSpec:
    return ServiceSpec(name, (name,), **kw)  # type: ignore[arg-type]


def test_backoff_doubles_from_one_second_to_thirty():
    b = Backoff()
    assert [b.delay(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert b.delay(10_000) == 30


@pytest.mark.parametrize(
    "kw", [{"initial_s": 0}, {"factor": 0.5}, {"max_s": 0.5}, {"reset_after_s": 0}]
)
def test_backoff_rejects_nonsense(kw):
    with pytest.raises(ValueError):
        Backoff(**kw)


def test_a_worker_exiting_75_is_restarted_with_growing_backoff():
    sup = Supervisor([spec("worker-1")])
    now = 0.0
    restarts_at = []
    for _ in range(7):
        assert sup.due(now) == ["worker-1"]
        sup.started("worker-1", pid=100, now=now)
        now += 5.0  # crashes after 5 s, well under the reset
        at = sup.exited("worker-1", 75, now)
        assert at is not None
        assert sup.services["worker-1"].state is ServiceState.BACKOFF
        assert sup.due(at - 0.01) == []
        restarts_at.append(at - now)
        now = at
    assert restarts_at == [1, 2, 4, 8, 16, 30, 30]
    assert sup.services["worker-1"].restarts == 6
    assert sup.services["worker-1"].last_exit == 75


def test_sixty_seconds_of_uptime_resets_the_backoff():
    sup = Supervisor([spec("a")])
    sup.started("a", 1, 0.0)
    assert sup.exited("a", 1, 1.0) == 2.0
    sup.started("a", 2, 2.0)
    assert sup.exited("a", 1, 3.0) == 5.0  # second failure in a row: 2 s
    sup.started("a", 3, 5.0)
    assert sup.exited("a", 1, 65.0) == 66.0  # up 60 s: back to 1 s


def test_one_shot_is_done_on_zero_and_retried_on_failure():
    sup = Supervisor([spec("topics", one_shot=True, restart="on-failure")])
    sup.started("topics", 1, 0.0)
    assert sup.exited("topics", 1, 0.5) == 1.5
    sup.started("topics", 2, 1.5)
    assert sup.exited("topics", 0, 2.0) is None
    assert sup.services["topics"].state is ServiceState.DONE
    assert sup.due(100.0) == []


def test_never_restart_marks_failed():
    sup = Supervisor([spec("simulate", one_shot=True, restart="never")])
    sup.started("simulate", 1, 0.0)
    assert sup.exited("simulate", 2, 1.0) is None
    assert sup.services["simulate"].state is ServiceState.FAILED


def test_services_wait_for_what_they_need():
    ready = {"ok": False}
    sup = Supervisor(
        [
            spec("broker", ready=lambda: ready["ok"]),
            spec("topics", one_shot=True, restart="on-failure", after=("broker",)),
            spec("worker", after=("topics",)),
        ]
    )
    assert sup.due(0.0) == ["broker"]
    sup.started("broker", 1, 0.0)
    assert sup.services["broker"].state is ServiceState.STARTING
    assert sup.due(0.0) == []
    sup.ready("broker")
    assert sup.due(0.0) == ["topics"]
    sup.started("topics", 2, 0.0)
    assert sup.due(0.0) == []
    sup.exited("topics", 0, 1.0)
    assert sup.due(1.0) == ["worker"]


def test_a_restarted_broker_gets_its_topics_again():
    sup = Supervisor(
        [
            spec("broker"),
            spec("topics", one_shot=True, restart="on-failure", after=("broker",)),
            spec("play", one_shot=True, restart="never", after=("broker",)),
        ]
    )
    for name in ("broker", "topics", "play"):
        sup.started(name, 1, 0.0)
    sup.exited("topics", 0, 1.0)
    sup.exited("play", 0, 1.0)
    at = sup.exited("broker", -9, 2.0)
    assert at is not None
    sup.started("broker", 5, at)
    assert sup.due(at) == ["topics"]  # the player is not replayed


def test_unknown_dependency_and_duplicates_are_refused():
    with pytest.raises(ValueError, match="unknown"):
        Supervisor([spec("a", after=("b",))])
    with pytest.raises(ValueError, match="duplicate"):
        Supervisor([spec("a"), spec("a")])
    with pytest.raises(ValueError, match="one-shot"):
        spec("t", one_shot=True)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


class FakeProc:
    def __init__(self, name: str, pid: int, log: list[str], clock: FakeClock) -> None:
        self.name, self.pid, self.log, self.clock = name, pid, log, clock
        self.code: int | None = None
        self.ignores_term = False
        self.term_at: float | None = None

    def poll(self) -> int | None:
        if self.code is None and self.term_at is not None and self.clock() >= self.term_at + 0.2:
            self.code = -15
        return self.code

    def terminate(self) -> None:
        self.log.append(f"term {self.name}")
        if not self.ignores_term:
            self.term_at = self.clock()

    def kill(self) -> None:
        self.log.append(f"kill {self.name}")
        self.code = -9


class FakeSpawner:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.log: list[str] = []
        self.procs: dict[str, FakeProc] = {}
        self.next_pid = 100

    def spawn(self, spec: ServiceSpec) -> FakeProc:
        self.next_pid += 1
        self.log.append(f"spawn {spec.name}")
        p = self.procs[spec.name] = FakeProc(spec.name, self.next_pid, self.log, self.clock)
        return p


def stack() -> list[ServiceSpec]:
    return [
        spec("broker", stop_tier=9),
        spec("topics", one_shot=True, restart="on-failure", after=("broker",)),
        spec("worker-1", after=("topics",), stop_tier=1),
        spec("worker-2", after=("topics",), stop_tier=1),
        spec("archiver", after=("topics",), stop_tier=3),
        spec("simulate", one_shot=True, restart="never", after=("worker-1",), stop_tier=0),
    ]


def test_group_restarts_a_killed_worker_after_its_backoff():
    clock = FakeClock()
    spawner = FakeSpawner(clock)
    group = ProcessGroup(Supervisor(stack()), spawner, clock=clock, sleep=clock.sleep)
    group.tick()  # broker
    group.tick()  # topics
    spawner.procs["topics"].code = 0
    group.tick()  # topics done -> workers, archiver
    group.tick()  # simulate
    assert set(group.procs) == {"broker", "worker-1", "worker-2", "archiver", "simulate"}
    old = spawner.procs["worker-1"].pid
    spawner.procs["worker-1"].code = -9
    clock.now = 10.0
    group.tick()
    assert group.supervisor.services["worker-1"].state is ServiceState.BACKOFF
    clock.now = 10.5
    group.tick()
    assert "worker-1" not in group.procs
    clock.now = 11.0
    group.tick()
    status = group.supervisor.services["worker-1"]
    assert status.restarts == 1 and status.pid != old and status.state is ServiceState.RUNNING


def test_clean_stop_sources_first_broker_last_and_kills_the_stubborn():
    clock = FakeClock()
    spawner = FakeSpawner(clock)
    group = ProcessGroup(Supervisor(stack()), spawner, clock=clock, sleep=clock.sleep)
    for _ in range(2):
        group.tick()
    spawner.procs["topics"].code = 0
    for _ in range(2):
        group.tick()
    spawner.procs["archiver"].ignores_term = True
    spawner.log.clear()
    codes = group.stop(grace_s=5.0)
    terms = [line for line in spawner.log if line.startswith(("term", "kill"))]
    assert terms[0] == "term simulate"
    assert set(terms[1:3]) == {"term worker-1", "term worker-2"}
    assert terms[3:] == ["term archiver", "kill archiver", "term broker"]
    assert codes["archiver"] == -9 and codes["broker"] == -15
    assert group.procs == {}
    assert all(
        s.state in (ServiceState.STOPPED, ServiceState.DONE)
        for s in group.supervisor.services.values()
    )
    group.tick()
    assert group.procs == {}  # nothing starts again once stopping


def test_stop_one_stops_a_service_for_good_and_leaves_the_others_running():
    clock = FakeClock()
    spawner = FakeSpawner(clock)
    group = ProcessGroup(Supervisor(stack()), spawner, clock=clock, sleep=clock.sleep)
    for _ in range(2):
        group.tick()
    spawner.procs["topics"].code = 0
    for _ in range(2):
        group.tick()
    spawner.procs["archiver"].ignores_term = True
    spawner.log.clear()
    assert group.stop_one("archiver", grace_s=5.0) == -9
    assert spawner.log == ["term archiver", "kill archiver"]
    clock.now += 60.0
    group.tick()
    assert "archiver" not in group.procs  # not restarted
    assert group.supervisor.services["archiver"].state is ServiceState.STOPPED
    assert {"broker", "worker-1", "worker-2", "simulate"} <= set(group.procs)
    assert group.stop_one("archiver") is None  # not running


def test_docstring_examples():
    import doctest

    import pipeline.tools.supervisor
    import pipeline.tools.up

    for module in (pipeline.tools.supervisor, pipeline.tools.up):
        assert doctest.testmod(module).failed == 0
