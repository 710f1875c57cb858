"""A job taken over from its snapshot (the worker that held it died, or a rebalance
moved it): the pipeline's own gap is neither a hang nor silent nodes, and a hang that
began before the takeover is still raised on time (from its last step's event time)."""

from __future__ import annotations

from datetime import timedelta

from pipeline.services.worker.ended import read_mark
from pipeline.services.worker.state import CoreTopics, WorkerDetection
from schemas import (
    AlertKind,
    AlertState,
    EndReason,
    GpuHealth,
    JobEvent,
    JobEventKind,
    NodeHealth,
    encode,
)
from tests.unit.pipeline.services.worker.test_state import T0, Clock, step_msg

TOPICS = CoreTopics("steps", "health", "jobs", lifecycle="lifecycle")
NODES = 8
STEP_S = 1.3  # step_msg: step s ends at T0 + 1.3 (s + 1)
LATENCY = 0.05  # exporter to worker, when nothing is in the way
HEALTH_S = 2.0  # every node reports its health this often (event time)


def ends(step: int) -> float:
    """Event time (seconds after T0) at which ``step`` completes."""
    return STEP_S * (step + 1)


class Job:
    """One job's records as they sit in the steps and jobs topics (offsets), and what a
    worker did with them; a later worker reads the same topics again."""

    def __init__(self) -> None:
        self.steps: list[bytes] = []
        self.jobs: list[tuple[str, bytes]] = []  # (kind, value)
        self.table: dict[str, bytes] = {}

    def publish_step(self, step: int) -> None:
        self.steps += [step_msg(step, n) for n in range(NODES)]

    def publish_health(self, node: int, at: float) -> None:
        h = NodeHealth(
            job_id="j", node=f"n{node}", ts=T0 + timedelta(seconds=at), interval_s=HEALTH_S,
            gpus=(GpuHealth(index=0, temperature_c=60, power_w=500, sm_clock_mhz=1800,
                            utilization_pct=99),),
        )  # fmt: skip
        self.jobs.append(("health", encode(h)))

    def read(self, core: WorkerDetection, steps_from: int = 0, jobs_from: int = 0) -> list:
        """The worker reads both topics from these offsets on (steps first: they are on
        another topic, and nothing orders the two)."""
        alerts = []
        for off in range(steps_from, len(self.steps)):
            out = core.handle_step(0, off, b"j", self.steps[off], token=off, load=self.table.get)
            alerts += self._done(out)
        for off in range(jobs_from, len(self.jobs)):
            kind, value = self.jobs[off]
            out = core.handle_job_record(0, off, b"j", value, kind, off, self.table.get)
            alerts += self._done(out)
        return alerts

    def tick(self, core: WorkerDetection) -> list:
        """The worker's timer: a tick through the jobs topic, read at once."""
        _, value = core.tick_record("j")
        self.jobs.append(("tick", value))
        out = core.handle_job_record(0, len(self.jobs) - 1, b"j", value, "tick", None)
        return self._done(out)

    def _done(self, out) -> list:
        if out.snapshot is not None:
            self.table[out.job_id] = out.snapshot
        elif out.tombstone:
            self.table.pop(out.job_id, None)
        return list(out.alerts)


def play_live(job: Job, core: WorkerDetection, clock: Clock, wall0: float, steps: range) -> list:
    """Steps published and read as they complete (health from every node every 2 s);
    the worker ticks every second between them."""
    alerts = []
    for step in steps:
        for t in range(int(ends(step - 1) // HEALTH_S) + 1, int(ends(step) // HEALTH_S) + 1):
            for n in range(NODES):
                job.publish_health(n, t * HEALTH_S)
        job.publish_step(step)
        clock.now = wall0 + ends(step) + LATENCY
        alerts += job.read(core, len(job.steps) - NODES, len(job.jobs) - _new_health(job))
        if core.tick_record("j") is not None:
            alerts += job.tick(core)
    return alerts


def _new_health(job: Job) -> int:
    n = 0
    for kind, _ in reversed(job.jobs):
        if kind != "health":
            break
        n += 1
    return n


def hangs(alerts: list) -> list:
    return [a for a in alerts if a.kind is AlertKind.HANG and a.state is AlertState.FIRING]


def first_hang(job: Job, core: WorkerDetection, clock: Clock, until: float) -> float | None:
    """Tick every second until a hang is raised: the wall time it was, or None."""
    while clock.now < until:
        clock.now += 1.0
        if hangs(job.tick(core)):
            return clock.now
    return None


def test_a_hang_that_began_before_the_takeover_is_raised_on_time_after_it() -> None:
    clock, wall0 = Clock(), 1000.0
    alone, control = WorkerDetection(TOPICS, 8, clock=clock), Job()
    assert hangs(play_live(control, alone, clock, wall0, range(40))) == []
    last_arrival = clock.now  # the job hangs after step 39: no step from here on
    on_time = first_hang(control, alone, clock, last_arrival + 60)  # nobody died
    assert on_time is not None

    clock.now = 1000.0
    old, job = WorkerDetection(TOPICS, 8, clock=clock), Job()
    play_live(job, old, clock, wall0, range(40))
    for _ in range(2):  # the old worker's ticks, then it is SIGKILLed at +2.9 s
        clock.now += 1.0
        assert hangs(job.tick(old)) == []
    clock.now = last_arrival + 2.9 + 0.5  # another worker takes the job over
    new = WorkerDetection(TOPICS, 8, clock=clock)
    assert hangs(job.read(new)) == []  # it replays what the snapshot does not reflect
    raised = first_hang(job, new, clock, last_arrival + 60)
    assert raised is not None, "the hang was never raised after the takeover"
    # judged from the last step's arrival, as if nobody died (within a tick), not a
    # new timeout from the takeover
    assert raised <= on_time + 1.0


def missing_health(alerts: list) -> list:
    return [a for a in alerts if a.kind is AlertKind.MISSING and a.evidence.metric
            == "intervals_silent" and a.state is AlertState.FIRING]  # fmt: skip


def test_a_healthy_job_read_late_after_a_takeover_is_not_hung() -> None:
    clock, wall0 = Clock(), 1000.0
    job = Job()
    play_live(job, WorkerDetection(TOPICS, 8, clock=clock), clock, wall0, range(40))
    # the worker dies; the job goes on for 12 s; another worker takes over and reads
    # the backlog (its ticks wait for the steps partition, as the worker's timer does)
    for step in range(40, 49):
        job.publish_step(step)
    clock.now = wall0 + ends(48) + 0.5
    new = WorkerDetection(TOPICS, 8, clock=clock)
    alerts = job.read(new)
    alerts += play_live(job, new, clock, wall0, range(49, 60))
    assert hangs(alerts) == []
    assert new.jobs["j"].detection.last_step == 59


def test_health_re_keyed_late_through_a_takeover_is_not_a_silent_node() -> None:
    """The job's worker died, and so did the worker that re-keys the health of nodes 6
    and 7 (it owned their partition of the health topic). The new owner restores the
    job's snapshot and reads the steps of the gap at once, the health of nodes 0-5 (re-
    keyed by a survivor) too; nodes 6 and 7's reports come only once their partition
    has a new owner too, seconds later. Nobody was silent but the pipeline."""
    clock, wall0 = Clock(), 1000.0
    job = Job()
    alerts = play_live(job, WorkerDetection(TOPICS, 8, clock=clock), clock, wall0, range(40))
    gap = range(40, 49)
    delayed = [(n, t * HEALTH_S) for t in range(int(ends(39) // HEALTH_S) + 1,
                                                 int(ends(48) // HEALTH_S) + 1)
               for n in range(NODES)]  # fmt: skip
    for step in gap:
        job.publish_step(step)
    for n, at in delayed:
        if n < 6:
            job.publish_health(n, at)
    clock.now = wall0 + ends(48) + 0.5
    new = WorkerDetection(TOPICS, 8, clock=clock)
    alerts += job.read(new)
    alerts += play_live(job, new, clock, wall0, range(49, 52))
    late = len(job.jobs)
    for n, at in delayed:
        if n >= 6:
            job.publish_health(n, at)
    alerts += job.read(new, steps_from=len(job.steps), jobs_from=late)
    alerts += play_live(job, new, clock, wall0, range(52, 70))
    assert missing_health(alerts) == []
    assert hangs(alerts) == []


def test_a_node_that_stays_silent_after_a_takeover_is_still_missing() -> None:
    """The same takeover, but node 7's health never comes back: it is named once its
    silence after the catch-up exceeds its intervals."""
    clock, wall0 = Clock(), 1000.0
    job = Job()
    play_live(job, WorkerDetection(TOPICS, 8, clock=clock), clock, wall0, range(40))
    for step in range(40, 49):
        job.publish_step(step)
    clock.now = wall0 + ends(48) + 0.5
    new = WorkerDetection(TOPICS, 8, clock=clock)
    alerts = job.read(new)
    real = job.publish_health
    job.publish_health = lambda node, at: None if node == 7 else real(node, at)  # type: ignore[method-assign]
    for n in range(7):
        for t in range(int(ends(39) // HEALTH_S) + 1, int(ends(48) // HEALTH_S) + 1):
            real(n, t * HEALTH_S)
    alerts += job.read(new, steps_from=len(job.steps), jobs_from=0)
    alerts += play_live(job, new, clock, wall0, range(49, 70))
    assert {a.node for a in missing_health(alerts)} == {"n7"}


def test_a_job_taken_over_is_not_ticked_before_a_record_is_read() -> None:
    """Its clock runs on from its last step, so a tick before the driver can know
    whether the steps of the gap are unread would call a healthy job hung: none is made
    until a record was read after the takeover (a fetch came back: the worker's timer
    then sees which partitions have unread steps), or the catch-up time passed."""
    clock, wall0 = Clock(), 1000.0
    job = Job()
    play_live(job, WorkerDetection(TOPICS, 8, clock=clock), clock, wall0, range(40))
    clock.now += 12.0
    new = WorkerDetection(TOPICS, 8, clock=clock, blind_after_s=5.0)
    assert new.adopt("j", job.table["j"], owned={0})
    assert new.tick_record("j") is None
    clock.now += 0.1
    other = step_msg(0, 0, job="another-job")  # any record: here another job's step
    new.handle_step(3, 0, b"another-job", other, token=None)
    assert new.tick_record("j") is not None
    later = WorkerDetection(TOPICS, 8, clock=clock, blind_after_s=5.0)
    assert later.adopt("j", job.table["j"], owned={0})
    clock.now += 5.0
    assert later.tick_record("j") is not None  # nothing came: judged after all


def test_health_held_up_by_a_broker_outage_is_not_a_silent_node() -> None:
    """The outage grace covers silent nodes as it covers the hang clock: after 20 s
    without any record, the steps of the outage and most nodes' health come back at
    once, nodes 6 and 7's health seconds later (their producer reconnected later)."""
    clock, wall0 = Clock(), 1000.0
    job = Job()
    core = WorkerDetection(TOPICS, 8, clock=clock, blind_after_s=5.0)
    alerts = play_live(job, core, clock, wall0, range(40))
    steps_from, jobs_from = len(job.steps), len(job.jobs)
    outage = [(n, t * HEALTH_S) for t in range(int(ends(39) // HEALTH_S) + 1,
                                               int(ends(55) // HEALTH_S) + 1)
              for n in range(NODES)]  # fmt: skip
    for step in range(40, 56):
        job.publish_step(step)
    for n, at in outage:
        if n < 6:
            job.publish_health(n, at)
    clock.now = wall0 + ends(55) + 0.5  # the broker is back
    alerts += job.read(core, steps_from, jobs_from)
    assert core.blind_periods == 1
    alerts += play_live(job, core, clock, wall0, range(56, 59))
    late = len(job.jobs)
    for n, at in outage:
        if n >= 6:
            job.publish_health(n, at)
    alerts += job.read(core, steps_from=len(job.steps), jobs_from=late)
    alerts += play_live(job, core, clock, wall0, range(59, 75))
    assert missing_health(alerts) == []
    assert hangs(alerts) == []


def test_a_tick_sent_before_a_rebalance_and_read_after_it_judges_nothing() -> None:
    """Seen in the chaos soak: the worker held the job and sent a tick; a rebalance
    dropped the job and restored it from its snapshot, five steps older than what the
    worker had read; the tick was read after the restore, before those steps were read
    again, and called the job hung (2.6 s since its newest step, by the snapshot)."""
    clock, wall0 = Clock(), 1000.0
    job = Job()
    core = WorkerDetection(TOPICS, 8, clock=clock)
    play_live(job, core, clock, wall0, range(40))
    table = dict(job.table)  # the snapshot the rebalance will restore
    alerts = play_live(job, core, clock, wall0, range(40, 45))
    clock.now += 0.5
    tick = core.tick_record("j")  # sent while the worker held the job ...
    assert tick is not None
    job.table = table
    clock.now += 1.0  # ... the rebalance: the job is restored from the older snapshot
    new = WorkerDetection(TOPICS, 8, clock=clock)
    assert new.adopt("j", job.table["j"], owned={0})
    job.jobs.append(("tick", tick[1]))  # read now, before the steps are read again
    out = new.handle_job_record(0, len(job.jobs) - 1, b"j", tick[1], "tick", None, job.table.get)
    alerts += list(out.alerts)
    alerts += job.read(new)  # the steps since the snapshot, read again
    alerts += play_live(job, new, clock, wall0, range(45, 60))
    assert hangs(alerts) == []


def test_a_job_ended_just_before_its_worker_died_is_not_made_anew_by_its_replayed_steps():
    """Seen in the chaos soak: the worker confirmed the job's end, dropped it, and was
    SIGKILLed 3 s later. Its successor read the steps partition again from its
    committed offset, which other jobs' held records had kept ten steps behind the end,
    while the end, on the jobs topic, was committed: the replayed steps made the job
    anew, and its silence became two hang episodes and a restart for a finished job.
    The job's table entry is now the mark of its end, and the successor reads it."""
    clock, wall0 = Clock(), 1000.0
    job = Job()
    old = WorkerDetection(TOPICS, 8, clock=clock, job_idle_ttl_s=600.0)
    play_live(job, old, clock, wall0, range(40))
    end = JobEvent(job_id="j", kind=JobEventKind.END, reason=EndReason.COMPLETED,
                   ts=T0 + timedelta(seconds=ends(39) + 0.1))  # fmt: skip
    job.jobs.append(("lifecycle", encode(end)))
    job.read(old, steps_from=len(job.steps), jobs_from=len(job.jobs) - 1)
    while "j" in old.jobs:  # the end is confirmed once no step contradicts it
        clock.now += 1.0
        assert hangs(job.tick(old)) == []
    mark = read_mark("j", job.table["j"], None)
    assert mark is not None and mark.end_ts >= end.ts.timestamp() and mark.partition == 0
    clock.now += 3.0  # SIGKILLed; the successor replays steps 30-39 and nothing of jobs
    new = WorkerDetection(TOPICS, 8, clock=clock, job_idle_ttl_s=600.0)
    assert not new.adopt("j", job.table["j"], owned={0})  # the tick loop finds the mark
    alerts = job.read(new, steps_from=30 * NODES, jobs_from=len(job.jobs))
    assert "j" not in new.jobs and new.after_end == 10 * NODES
    fresh = WorkerDetection(TOPICS, 8, clock=clock)  # a record read before any tick
    job.read(fresh, steps_from=30 * NODES, jobs_from=len(job.jobs))
    assert "j" not in fresh.jobs and fresh.after_end == 10 * NODES
    stored = lambda: list(job.table.items())  # noqa: E731 - what the tick loop reads
    for _ in range(120):
        clock.now += 1.0
        assert new.tick_record("j") is None and new.expiry_ticks(stored(), {0}) == []
    assert hangs(alerts) == []
    # the mark goes once the job idle time has passed, deleted by a record of its own
    clock.now = mark.wall_s + 600.0
    assert new.expiry_ticks(stored(), owned={1}) == []  # not our partition
    [(job_id, partition, value)] = new.expiry_ticks(stored(), owned={0})
    tick = new.handle_job_record(partition, 998, b"j", value, "tick", "t", job.table.get)
    assert not tick.tombstone  # only an expire record deletes a mark
    out = new.handle_job_record(partition, 999, b"j", value, "expire", "e", job.table.get)
    job._done(out)
    assert (job_id, out.release) == ("j", ["e"]) and "j" not in job.table
    # and a new run under the same id starts from scratch
    job.publish_step(41)
    job.read(new, steps_from=len(job.steps) - NODES, jobs_from=len(job.jobs))
    assert new.jobs["j"].detection.last_step == -1  # fresh: none of the old run's steps


def test_end_marks_beyond_max_ended_go_oldest_first_and_a_snapshot_never_goes():
    clock = Clock()
    core = WorkerDetection(TOPICS, 8, clock=clock, max_ended=2)
    table: dict[str, bytes] = {}
    for k in range(4):  # four jobs end, a second apart
        clock.now += 1.0
        end = JobEvent(job_id=f"j{k}", kind=JobEventKind.END, reason=EndReason.COMPLETED,
                       ts=T0 + timedelta(seconds=k))  # fmt: skip
        out = core.handle_job_record(0, k, b"x", encode(end), "lifecycle", k, table.get)
        table[out.job_id] = out.snapshot
    job = Job()  # and a live job holds a snapshot
    play_live(job, core, clock, 1000.0, range(12))
    table["j"] = job.table["j"]
    due = core.expiry_ticks(list(table.items()), owned={0})
    assert [j for j, _, _ in due] == ["j0", "j1"]
    out = core.handle_job_record(0, 50, b"j", due[0][2], "expire", "e", table.get)
    assert out.tombstone and out.job_id == "j0"
    del table["j0"]
    clock.now += 1.0  # j0 runs again and ends again: a newer mark
    again = JobEvent(job_id="j0", kind=JobEventKind.END, reason=EndReason.COMPLETED,
                     ts=T0 + timedelta(seconds=30))  # fmt: skip
    out = core.handle_job_record(0, 60, b"x", encode(again), "lifecycle", "a", table.get)
    table["j0"] = out.snapshot
    replayed = core.handle_job_record(0, 50, b"j", due[0][2], "expire", "r", table.get)
    assert not replayed.tombstone  # an old order never deletes a later end's mark
    forged = core.ticks.value("j", clock.now, "expire")  # an expire naming the live job
    out = core.handle_job_record(0, 51, b"j", forged, "expire", "f", table.get)
    assert not out.tombstone and out.release == ["f"]
