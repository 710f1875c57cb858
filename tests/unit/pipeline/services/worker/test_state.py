"""WorkerDetection without Faust: dead letters, replay by offset, snapshots, ticks, routing."""

from __future__ import annotations

import json
import pickle
from datetime import UTC, datetime, timedelta
from typing import ClassVar

import pytest

from detectors.engine import DetectorConfig
from pipeline.io.trust import SigningKey, sign
from pipeline.services.worker.state import CoreTopics, JobState, WorkerDetection, partition_for
from schemas import (
    ActuatorMode,
    AlertKind,
    AlertState,
    Command,
    CommandKind,
    CommandResult,
    CommandStatus,
    EndReason,
    GpuHealth,
    Grade,
    JobEvent,
    JobEventKind,
    NodeHealth,
    Phase,
    RankSample,
    RecommendedAction,
    Rejected,
    StepTelemetry,
    decode,
    encode,
)
from tests.clock import day_start
from tests.factories import ACTUATOR_KEY, EXECUTOR_KEY, WORKER_KEY, job_controller_key

T0 = day_start()
TOPICS = CoreTopics("steps", "health", "jobs", lifecycle="lifecycle")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def step_msg(step: int, node: int, slow: float = 1.0, job: str = "j") -> bytes:
    samples = []
    for g in range(8):
        rank = node * 8 + g
        compute = 1.0 * (slow if g == 0 else 1.0) + 0.001 * ((rank * 7 + step) % 5)
        samples.append(
            RankSample(
                rank=rank,
                local_rank=g,
                step_time_s=1.3,
                compute_s=compute,
                comm_wait_s=max(0.0, 1.25 - compute),
                data_wait_s=0.01,
            )
        )
    ts = T0 + timedelta(seconds=1.3 * step)
    return encode(
        StepTelemetry(
            job_id=job,
            node=f"n{node}",
            step=step,
            ts_start=ts,
            ts_end=ts + timedelta(seconds=1.3),
            samples=tuple(samples),
        )
    )


#: a silent job: flagged (it may be in a long step it did not announce), then hung
WARNED_THEN_HUNG = [(AlertKind.HANG, Grade.WARNING), (AlertKind.HANG, Grade.CRITICAL)]


def feed(core: WorkerDetection, steps: range, nodes: int = 8, start_offset: int = 0, table=None):
    out, offset = [], start_offset
    table = table if table is not None else {}
    for s in steps:
        for n in range(nodes):
            o = core.handle_step(0, offset, b"j", step_msg(s, n), token=offset, load=table.get)
            if o.snapshot is not None:
                table[o.job_id] = o.snapshot
            out.append(o)
            offset += 1
    return out


def test_bad_and_oversized_records_are_dead_lettered_and_released():
    core = WorkerDetection(TOPICS, 8, max_message_bytes=2048)
    bad = core.handle_step(3, 17, b"k", b"{nope", token="a")
    big = core.handle_step(3, 18, b"k", step_msg(0, 0) * 3, token="b")
    assert [o.release for o in (bad, big)] == [["a"], ["b"]]
    (letter,) = bad.dead_letters
    assert (letter.source_topic, letter.partition, letter.offset, letter.key) == (
        "steps",
        3,
        17,
        b"k",
    )
    assert "exceeds the limit of 2048" in big.dead_letters[0].error
    assert core.jobs == {}


def test_records_are_held_until_a_snapshot_covers_them():
    core = WorkerDetection(TOPICS, 8, snapshot_steps=5, snapshot_interval_s=1e9, clock=Clock())
    outs = feed(core, range(12))
    snaps = [o for o in outs if o.snapshot is not None]
    assert len(snaps) == 2  # steps complete with a lag of 2: 10 frames -> 2 snapshots
    released = [t for o in outs for t in o.release]
    assert released == list(range(len(released)))  # in order, each once
    assert core.held("j") == len(outs) - len(released) > 0


def test_replay_after_restart_skips_what_the_snapshot_reflects_and_repeats_alerts():
    clock = Clock()
    table: dict[str, bytes] = {}
    core = WorkerDetection(TOPICS, 8, snapshot_steps=3, snapshot_interval_s=1e9, clock=clock)
    first = feed(core, range(60), table=table)
    # crash: a new process, state from the table, records replayed from offset 0
    again = WorkerDetection(TOPICS, 8, snapshot_steps=3, snapshot_interval_s=1e9, clock=clock)
    replay = feed(again, range(60), table=dict(table))
    alerts_once = {(a.fingerprint, a.seq) for o in first for a in o.alerts}
    alerts_replayed = {(a.fingerprint, a.seq) for o in replay for a in o.alerts}
    assert alerts_replayed <= alerts_once
    skipped = sum(1 for o in replay if o.steps == 0 and o.release and not o.alerts)
    assert skipped > 0
    st = again.jobs["j"]
    assert st.offsets[("steps", 0)] == 60 * 8 - 1
    assert st.detection.last_step == core.jobs["j"].detection.last_step


def test_straggler_alerts_and_state_pickles():
    core = WorkerDetection(TOPICS, 8)
    table: dict[str, bytes] = {}
    outs = feed(core, range(30), table=table)
    outs += [
        core.handle_step(
            0,
            10_000 + i,
            b"j",
            step_msg(30 + i // 8, i % 8, slow=1.3 if i % 8 == 5 else 1.0),
            token=None,
        )
        for i in range(8 * 20)
    ]
    kinds = {(a.kind, a.node) for o in outs for a in o.alerts}
    assert (AlertKind.STRAGGLER, "n5") in kinds
    st = JobState.from_bytes(core.jobs["j"].to_bytes())
    assert st.detection.last_step == core.jobs["j"].detection.last_step


def test_tick_uses_last_event_time_plus_wall_time_and_fires_a_hang():
    clock = Clock()
    core = WorkerDetection(TOPICS, 8, clock=clock)
    feed(core, range(30))
    record = core.tick_record("j")
    assert record is not None
    partition, value = record
    assert partition == 0
    assert core.handle_job_record(0, 1, b"j", value, "tick", token="t1").alerts == []
    alerts = tick_every_second(core, clock, 60, offset=2)  # a minute without steps
    assert [(a.kind, a.grade) for a in alerts] == WARNED_THEN_HUNG
    assert core.held("j") > 0 or core.jobs["j"].steps_since_snapshot == 0


def tick_every_second(core: WorkerDetection, clock: Clock, seconds: int, offset: int) -> list:
    """What the worker's timer does: a tick through the broker every second."""
    alerts = []
    for i in range(seconds):
        clock.now += 1.0
        _, value = core.tick_record("j")
        alerts += core.handle_job_record(0, offset + i, b"j", value, "tick", token=i).alerts
    return alerts


def test_a_broker_outage_is_not_a_hang_but_a_hang_after_it_still_is():
    """No record at all (not even the worker's own ticks) means the worker was cut off
    from the broker: the blind time does not count on the job's hang clock."""
    clock = Clock()
    core = WorkerDetection(TOPICS, 8, clock=clock, blind_after_s=5.0)
    feed(core, range(30))
    _, stale = core.tick_record("j")  # sent as the broker went away, delivered after
    clock.now += 60.0
    assert core.handle_job_record(0, 1, b"j", stale, "tick", token="t").alerts == []
    assert tick_every_second(core, clock, 2, offset=2) == []
    assert core.blind_periods == 1
    # the job really is silent: the hang fires once the clock runs again
    alerts = tick_every_second(core, clock, 60, offset=10)
    assert [(a.kind, a.grade) for a in alerts] == WARNED_THEN_HUNG


def test_health_is_routed_to_the_partition_of_its_job():
    core = WorkerDetection(TOPICS, 8)
    h = NodeHealth(
        job_id="job-42",
        node="n1",
        ts=T0,
        gpus=(
            GpuHealth(
                index=0, temperature_c=60, power_w=500, sm_clock_mhz=1800, utilization_pct=99
            ),
        ),
    )
    fwd = core.route_health(2, 5, b"n1", encode(h))
    assert (fwd.job_id, fwd.partition) == ("job-42", partition_for("job-42", 8))
    assert core.route_health(2, 6, b"n1", encode(h.model_copy(update={"job_id": None}))) is None
    assert core.unrouted_health == 1
    out = core.handle_job_record(fwd.partition, 0, b"job-42", fwd.value, "health", token="h")
    assert out.job_id == "job-42" and not out.dead_letters


def test_partition_for_matches_kafka_python_default_partitioner():
    from kafka.partitioner.default import murmur2

    for key in ("a", "job-1", "llm-70b/run-3"):
        assert partition_for(key, 8) == (murmur2(key.encode()) & 0x7FFFFFFF) % 8


def test_revoked_partitions_drop_jobs_and_held_records():
    core = WorkerDetection(TOPICS, 8, snapshot_steps=1000, snapshot_interval_s=1e9)
    feed(core, range(5))
    assert core.held("j") > 0
    assert core.drop_partitions({0}) == 1
    assert core.jobs == {} and core.held("j") == 0


@pytest.mark.parametrize("kw", [{"n_partitions": 0}, {"snapshot_steps": 0}, {"blind_after_s": 0}])
def test_bad_arguments_are_named(kw):
    args = {"n_partitions": 8} | kw
    with pytest.raises(ValueError, match=next(iter(kw))):
        WorkerDetection(TOPICS, args.pop("n_partitions"), **args)


def test_a_long_checkpoint_step_is_not_a_hang_for_the_worker():
    """A checkpoint save that takes many step times ends with a completed step: the
    worker scores the step before it looks at the hang clock."""
    from pipeline.tools.simulator import Scenario, SimulatedJob

    sc = Scenario(name="ckpt", nodes=4, steps=80, warmup_steps=5, checkpoint_every=40,
                  checkpoint_s=8.0)  # fmt: skip
    core = WorkerDetection(TOPICS, 8)
    alerts, offset = [], 0
    for ev in SimulatedJob(sc).events():
        if ev.frame is None:
            continue
        for msg in ev.frame.to_messages():
            out = core.handle_step(0, offset, b"ckpt", encode(msg), token=offset)
            alerts += out.alerts
            offset += 1
    assert offset == 80 * 4
    assert [a for a in alerts if a.kind is AlertKind.HANG] == []


class _Payload:
    """What an attacker who can write the changelog would put there."""

    ran: ClassVar[list[str]] = []

    def __reduce__(self):
        return (_Payload.ran.append, ("code ran",))


def test_snapshots_are_data_and_a_pickle_in_the_changelog_is_never_executed(tmp_path):
    core = WorkerDetection(TOPICS, 8)
    feed(core, range(12))
    st = core.jobs["j"]
    blob = st.to_bytes()
    assert JobState.from_bytes(blob).detection.last_step == st.detection.last_step
    assert len(blob) < len(pickle.dumps(st, protocol=pickle.HIGHEST_PROTOCOL))
    hostile = {
        "pickle": pickle.dumps(_Payload()),
        "truncated": blob[: len(blob) // 2],
        "other job": blob,  # job j's snapshot stored under another job's key
    }
    for name, value in hostile.items():
        fresh = WorkerDetection(TOPICS, 8)
        job = "other" if name == "other job" else "j"
        out = fresh.handle_step(
            0, 0, job.encode(), step_msg(0, 0, job=job), token="t", load=lambda _, v=value: v
        )
        assert not out.dead_letters, name
        assert fresh.unreadable_snapshots == 1, name
        assert fresh.jobs[job].detection.last_step == -1, name  # rebuilt from records
    assert _Payload.ran == []


def test_a_snapshot_over_the_limit_is_not_written_and_its_records_stay_held():
    core = WorkerDetection(TOPICS, 8, snapshot_steps=3, max_snapshot_bytes=1000)
    outs = feed(core, range(12))
    assert all(o.snapshot is None for o in outs)
    assert not [t for o in outs for t in o.release]
    assert core.held("j") == 12 * 8 and core.oversized_snapshots > 0


def relaunch_command(
    kind: CommandKind,
    targets: tuple[str, ...] = (),
    key: SigningKey | None = ACTUATOR_KEY,
    expires_at: datetime = T0 + timedelta(days=3650),
) -> bytes:
    cmd = Command(
        command_id="cmd-0001", kind=kind, job_id="j", targets=targets, reason=("fp",),
        mode=ActuatorMode.AUTO, issued_at=T0, expires_at=expires_at,
    )  # fmt: skip
    return encode(cmd if key is None else sign(cmd, key))


#: what the worker holds: the actuator's public keys
COMMAND_KEYS = ACTUATOR_KEY.verifier()


def test_a_relaunch_command_makes_the_job_relaunching_never_hung():
    """The job goes quiet while it restarts from a checkpoint: that silence is the
    relaunch the actuator asked for, shown as ``relaunching``, not a hang however long
    (issue 44: a 45-79 s relaunch was a CRITICAL hang recommending a second RESTART);
    past ``relaunch_max_s`` it is ``relaunch_stuck``: a WARNING to investigate."""
    clock = Clock()
    core = WorkerDetection(
        TOPICS, 8, clock=clock, command_keys=COMMAND_KEYS,
        detector_config=DetectorConfig(relaunch_max_s=120.0),
    )  # fmt: skip
    feed(core, range(30))
    assert core.job_states()["running"] == 1
    assert core.route_command(0, 0, b"j", relaunch_command(CommandKind.CHECKPOINT)) is None
    fwd = core.route_command(0, 1, b"j", relaunch_command(CommandKind.RESTART, ("n3",)))
    assert fwd is not None and fwd.partition == partition_for("j", 8)
    out = core.handle_job_record(fwd.partition, 1, b"j", fwd.value, "command", token="c")
    assert out.alerts == []
    # 100 s of silence (~80 median step times): a CRITICAL hang without the command
    assert tick_every_second(core, clock, 100, offset=2) == []
    assert core.job_states() == {"running": 0, "relaunching": 1, "relaunch_stuck": 0, "ending": 0}
    alerts = tick_every_second(core, clock, 200, offset=200)
    assert [(a.kind, a.grade, a.recommended_action) for a in alerts] == [
        (AlertKind.HANG, Grade.WARNING, RecommendedAction.INVESTIGATE)
    ]
    assert "relaunch_stuck" in alerts[0].summary
    assert core.job_states()["relaunch_stuck"] == 1


def test_without_the_command_the_same_silence_is_a_hang():
    clock = Clock()
    core = WorkerDetection(TOPICS, 8, clock=clock)
    feed(core, range(30))
    assert AlertKind.HANG in [a.kind for a in tick_every_second(core, clock, 10, offset=2)]


def test_an_unsigned_forged_malformed_or_expired_relaunch_is_not_obeyed():
    """Only the actuator's signed, unexpired commands put a job's hang clock in grace;
    anything else is counted and skipped, and a garbage signature raises nothing."""
    clock = Clock()
    core = WorkerDetection(TOPICS, 8, clock=clock, command_keys=COMMAND_KEYS)
    feed(core, range(30))
    restart = CommandKind.RESTART
    signed = json.loads(relaunch_command(restart))
    bad = [
        relaunch_command(restart, key=None),  # unsigned
        relaunch_command(restart, key=WORKER_KEY),  # a key that signs no command
        relaunch_command(restart, key=SigningKey("act-1", WORKER_KEY.private)),  # forged
        relaunch_command(restart, expires_at=datetime.fromtimestamp(999, UTC)),  # expired
        json.dumps(signed | {"signature": "é" * 128}).encode(),  # malformed: undecodable
        json.dumps(signed | {"targets": ["n0"]}).encode(),  # tampered
    ]
    assert [core.route_command(0, i, b"j", v) for i, v in enumerate(bad)] == [None] * 6
    assert core.counts()["refused_command"] == 5  # the malformed one does not decode
    assert AlertKind.HANG in [a.kind for a in tick_every_second(core, clock, 10, offset=2)]
    unkeyed = WorkerDetection(TOPICS, 8, clock=clock)  # no actuator keys: nothing obeyed
    assert unkeyed.route_command(0, 0, b"j", relaunch_command(restart)) is None


def job_event(kind: JobEventKind, seconds: float, **kw) -> bytes:
    return encode(JobEvent(job_id="j", kind=kind, ts=T0 + timedelta(seconds=seconds), **kw))


def test_a_job_that_ended_raises_no_hang_and_its_state_is_dropped():
    clock = Clock()
    core = WorkerDetection(TOPICS, 8, clock=clock)
    feed(core, range(30))
    alerts = tick_every_second(core, clock, 60, offset=1)
    assert [(a.kind, a.grade) for a in alerts] == WARNED_THEN_HUNG  # silent without an end: a hang
    end = job_event(JobEventKind.END, 1.3 * 31, reason=EndReason.COMPLETED)
    fwd = core.route_lifecycle(1, 7, b"j", end)
    assert (fwd.job_id, fwd.partition) == ("j", partition_for("j", 8))
    out = core.handle_job_record(0, 100, b"j", fwd.value, "lifecycle", token="end")
    assert out.alerts == [] and not out.tombstone  # pending until no step contradicts it
    confirm = core.jobs["j"].detection.guard.limits.end_confirm_s
    alerts = tick_every_second(core, clock, int(confirm) - 1, offset=200)
    assert alerts == [] and "j" in core.jobs  # held: no hang while it is pending
    clock.now += 1.0
    _, value = core.tick_record("j")
    out = core.handle_job_record(0, 300, b"j", value, "tick", token="confirmed")
    assert [(a.kind, a.state) for a in out.alerts] == [(AlertKind.HANG, AlertState.RESOLVED)]
    assert "job ended: completed" in out.alerts[0].summary
    assert out.tombstone and "confirmed" in out.release and core.held("j") == 0
    assert "j" not in core.jobs and core.tick_record("j") is None
    # a late message of the ended run is ignored; a newer one is a new run, from scratch
    late = core.handle_step(0, 5000, b"j", step_msg(29, 3), token="late")
    assert (late.release, late.alerts, core.after_end) == (["late"], [], 1)
    assert "j" not in core.jobs
    core.handle_step(0, 5001, b"j", step_msg(40, 3), token="new")
    assert core.jobs["j"].detection.last_step == -1


def test_an_end_for_a_job_this_worker_never_held_still_tombstones_it():
    core = WorkerDetection(TOPICS, 8)
    end = job_event(JobEventKind.END, 5.0, reason=EndReason.CANCELLED)
    out = core.handle_job_record(0, 1, b"j", end, "lifecycle", token="e")
    assert out.tombstone and out.release == ["e"] and core.ended == {"j": T0.timestamp() + 5}


def test_an_announced_checkpoint_is_not_a_hang():
    clock = Clock()
    core = WorkerDetection(TOPICS, 8, clock=clock)
    feed(core, range(30))
    last = core.jobs["j"].last_event_ts
    phase = job_event(JobEventKind.PHASE, last - T0.timestamp(), phase=Phase.CHECKPOINT,
                      expected_s=30.0)  # fmt: skip
    assert core.handle_job_record(0, 1, b"j", phase, "lifecycle", token="p").alerts == []
    assert tick_every_second(core, clock, 30, offset=2) == []  # 23 step times of silence
    assert [a.kind for a in tick_every_second(core, clock, 40, offset=40)] == [AlertKind.HANG]


def test_a_job_silent_past_its_idle_ttl_is_abandoned_with_one_info_alert():
    clock = Clock()
    core = WorkerDetection(TOPICS, 8, clock=clock, job_idle_ttl_s=120.0)
    feed(core, range(30))
    alerts = tick_every_second(core, clock, 119, offset=1)
    clock.now += 1.0
    _, value = core.tick_record("j")
    out = core.handle_job_record(0, 500, b"j", value, "tick", token="last")
    alerts += out.alerts
    assert out.tombstone and "last" in out.release and core.held("j") == 0
    assert [(a.kind, a.grade, a.state) for a in alerts] == [
        (AlertKind.HANG, Grade.WARNING, AlertState.FIRING),
        (AlertKind.HANG, Grade.CRITICAL, AlertState.FIRING),
        (AlertKind.HANG, Grade.CRITICAL, AlertState.RESOLVED),
        (AlertKind.MISSING, Grade.INFO, AlertState.RESOLVED),
    ]
    assert "job abandoned" in alerts[-1].summary
    assert "j" not in core.jobs and core.tick_record("j") is None


def test_jobs_beyond_the_cap_are_dead_lettered_not_taken_on():
    core = WorkerDetection(TOPICS, 8, max_jobs=2)
    for job in ("a", "b"):
        assert not core.handle_step(0, 0, b"x", step_msg(0, 0, job=job), token=job).dead_letters
    out = core.handle_step(0, 1, b"x", step_msg(0, 0, job="c"), token="c")
    (letter,) = out.dead_letters
    assert (letter.stage, out.release, sorted(core.jobs)) == ("limit", ["c"], ["a", "b"])
    assert "STEPGUARD_WORKER_MAX_JOBS=2" in letter.error and core.refused == 1


def test_hostile_rank_ids_and_too_many_ranks_are_dead_lettered():
    core = WorkerDetection(TOPICS, 8, max_ranks_per_job=16)
    hostile = json.loads(step_msg(0, 0))
    hostile["samples"][0]["rank"] = 500_000_000
    out = core.handle_step(0, 0, b"j", json.dumps(hostile).encode(), token="h")
    assert out.dead_letters and "rank" in out.dead_letters[0].error and core.jobs == {}
    for node in range(2):
        assert not core.handle_step(0, 1 + node, b"j", step_msg(0, node), token=node).dead_letters
    out = core.handle_step(0, 3, b"j", step_msg(0, 2), token="third")
    (letter,) = out.dead_letters
    assert letter.stage == "limit" and "STEPGUARD_MAX_RANKS_PER_JOB=16" in letter.error
    assert core.handle_step(0, 4, b"j", step_msg(1, 1), token="known").dead_letters == []


def test_malformed_lifecycle_events_are_dead_lettered():
    core = WorkerDetection(TOPICS, 8)
    bad = core.route_lifecycle(
        0, 3, b"j", b'{"job_id": "j", "kind": "end", "ts": "2026-01-01T00:00:00Z"}'
    )
    assert isinstance(bad, Rejected) and "reason" in bad.letter.error


def test_a_relaunch_carried_out_resolves_the_episodes_of_the_node_it_left_out():
    core = WorkerDetection(
        TOPICS, 8, command_keys=COMMAND_KEYS, result_keys=job_controller_key("j").verifier()
    )
    feed(core, range(30))
    outs = [
        core.handle_step(
            0,
            10_000 + i,
            b"j",
            step_msg(30 + i // 8, i % 8, slow=1.3 if i % 8 == 5 else 1.0),
            token=None,
        )
        for i in range(8 * 20)
    ]
    assert (AlertKind.STRAGGLER, "n5") in {(a.kind, a.node) for o in outs for a in o.alerts}
    cmd = core.route_command(0, 1, b"j", relaunch_command(CommandKind.RESTART, ("n5",)))
    core.handle_job_record(cmd.partition, 1, b"j", cmd.value, "command", token="c")
    failed = CommandResult(command_id="cmd-0001", job_id="j", executor="job",
                           status=CommandStatus.FAILED, ts=T0)  # fmt: skip
    assert core.route_result(0, 0, b"j", encode(failed)) is None
    succeeded = failed.model_copy(update={"status": CommandStatus.SUCCEEDED})
    assert core.route_result(0, 1, b"j", encode(succeeded)) is None  # unsigned: ignored
    assert core.refused_results == 1
    assert core.route_result(0, 1, b"j", encode(sign(succeeded, EXECUTOR_KEY))) is None
    assert core.refused_results == 2  # an executor's (a dry run's) result is no relaunch
    done = encode(sign(succeeded, job_controller_key("j")))  # the job's own controller
    fwd = core.route_result(0, 1, b"j", done)
    out = core.handle_job_record(fwd.partition, 2, b"j", fwd.value, "result", token="r")
    assert {(a.node, a.state) for a in out.alerts} == {("n5", AlertState.RESOLVED)}
    assert "n5 left the job" in out.alerts[0].summary


def test_a_snapshot_of_another_detector_layout_is_refused_not_crashed_on():
    core = WorkerDetection(TOPICS, 8)
    feed(core, range(12))
    st = core.jobs["j"]
    st.layout = 1  # written by a worker whose detectors kept other fields
    old = st.to_bytes()
    fresh = WorkerDetection(TOPICS, 8)
    out = fresh.handle_step(0, 0, b"j", step_msg(0, 0), token="t", load=lambda _: old)
    assert not out.dead_letters and fresh.unreadable_snapshots == 1


def test_records_dated_in_the_future_are_dead_lettered_not_learned():
    core = WorkerDetection(TOPICS, 8, max_clock_skew_s=300.0)
    ahead = json.loads(step_msg(0, 0))
    when = datetime.now(UTC) + timedelta(hours=2)
    ahead["ts_start"] = ahead["ts_end"] = when.isoformat()
    out = core.handle_step(0, 0, b"j", json.dumps(ahead).encode(), token="f")
    (letter,) = out.dead_letters
    assert letter.stage == "clock" and "STEPGUARD_MAX_CLOCK_SKEW_S=300" in letter.error
    assert core.jobs == {} and core.counts()["future_dated"] == 1
    end = job_event(JobEventKind.END, (when - T0).total_seconds(), reason=EndReason.FAILED)
    assert core.handle_job_record(0, 1, b"j", end, "lifecycle", token="e").dead_letters
    assert core.ended == {}  # a future end cannot end the job
    assert not core.handle_step(0, 2, b"j", step_msg(0, 0), token="ok").dead_letters


@pytest.mark.parametrize(("budget", "expected"), [(1.0, 59), (0.05, 4)])
def test_snapshots_are_spaced_out_by_what_the_last_one_cost(monkeypatch, budget, expected):
    clock = Clock()
    encode_state = JobState.to_bytes

    def costly(self: JobState) -> bytes:  # each snapshot takes 1 s of the clock
        clock.now += 1.0
        return encode_state(self)

    monkeypatch.setattr(JobState, "to_bytes", costly)
    core = WorkerDetection(
        TOPICS, 8, snapshot_steps=1, snapshot_interval_s=1e9, snapshot_budget=budget,
        clock=clock,
    )  # fmt: skip
    snaps = 0
    for step in range(60):  # 1.3 s steps, every one due by its count
        clock.now += 1.3
        outs = feed(core, range(step, step + 1), start_offset=8 * step)
        snaps += sum(o.snapshot is not None for o in outs)
    assert core.jobs["j"].snapshot_cost_s == pytest.approx(1.0)
    # 100 %: a snapshot waits its 1 s cost, less than a step (59 of 60 steps complete:
    # the last waits for its successor); 5 %: 20 s, a snapshot every 16 steps
    assert snaps == expected


def test_a_snapshot_budget_outside_0_1_is_refused():
    with pytest.raises(ValueError, match="snapshot_budget"):
        WorkerDetection(TOPICS, 8, snapshot_budget=0)


def _seconds_to_hang(event_rate: float) -> int:
    clock = Clock()
    core = WorkerDetection(TOPICS, 8, clock=clock, event_rate=event_rate)
    feed(core, range(30))
    for i in range(120):
        clock.now += 1.0
        _, value = core.tick_record("j")
        alerts = core.handle_job_record(0, 2 + i, b"j", value, "tick", token=i).alerts
        if any(a.kind is AlertKind.HANG for a in alerts):
            return i + 1
    raise AssertionError("no hang in 120 s")


def test_a_job_replayed_at_4x_has_its_silence_measured_at_4x():
    # 1.3 s steps: the hang comes after the same silence in event time, which a job
    # played at 4x real time reaches in a quarter of the wall time
    at_1x, at_4x = _seconds_to_hang(1.0), _seconds_to_hang(4.0)
    assert at_4x == pytest.approx(at_1x / 4, abs=1)
    with pytest.raises(ValueError, match="event_rate"):
        WorkerDetection(TOPICS, 8, event_rate=0)


class Counted:
    """A token that counts its releases (a batch's ticket)."""

    def __init__(self) -> None:
        self.released = 0

    def ack(self) -> None:
        self.released += 1


def test_a_batch_of_steps_does_what_the_records_one_by_one_do():
    """Two jobs interleaved (one with a straggler), a record that is not JSON and one
    dated past the clock-skew limit: ``handle_steps`` in fetches of 37 records raises
    the same alerts and dead letters, scores the same steps, and releases each record's
    token exactly once in all (held ones once a snapshot covers them)."""
    records = []
    for step in range(40):
        for node in range(8):
            for job in ("a", "b"):
                records.append((job.encode(), step_msg(step, node, 2.5 if job == "b" and
                                                       node == 3 else 1.0, job=job)))  # fmt: skip
    records.insert(101, (b"a", b"{not json"))
    ahead = datetime.now(UTC) + timedelta(days=2)  # its time of day is early morning
    future = step_msg(5, 0, job="a").replace(
        T0.strftime('"%Y-%m-%d').encode(), ahead.strftime('"%Y-%m-%d').encode())  # fmt: skip
    assert future != step_msg(5, 0, job="a")  # the record really is dated ahead
    records.insert(202, (b"a", future))

    def what(outs):
        alerts = [(a.job_id, a.kind, a.node, a.grade, a.state) for o in outs for a in o.alerts]
        letters = sorted((d.offset, d.stage) for o in outs for d in o.dead_letters)
        return alerts, letters, sum(o.rank_steps for o in outs), sum(o.steps for o in outs)

    one = WorkerDetection(TOPICS, 8, clock=Clock(), max_clock_skew_s=300.0)
    singles = [one.handle_step(0, off, k, v, token=off) for off, (k, v) in enumerate(records)]
    many = WorkerDetection(TOPICS, 8, clock=Clock(), max_clock_skew_s=300.0)
    batches, tickets = [], []
    for lo in range(0, len(records), 37):
        ticket = Counted()
        chunk = [(off, *records[off]) for off in range(lo, min(lo + 37, len(records)))]
        outs = many.handle_steps(0, chunk, ticket)
        for o in outs:
            for t in o.release:
                t.ack()
        batches += outs
        tickets.append((ticket, len(chunk)))
    alerts, letters, rank_steps, steps = what(batches)
    assert (alerts, letters, rank_steps, steps) == what(singles)
    assert {a[2] for a in alerts if a[0] == "b"} == {"n3"} and [s for _, s in letters] == [
        "decode", "clock"]  # fmt: skip
    assert {j: st.detection.last_step for j, st in many.jobs.items()} == {"a": 39, "b": 39}
    held = sum(many.held(j) for j in many.jobs)
    assert sum(t.released for t, _ in tickets) + held == len(records)
    assert all(t.released <= n for t, n in tickets)


def test_a_batch_moves_a_jobs_clock_as_its_records_one_by_one_do():
    """A fetch works out a job's clock bound once per frame (its frames bound the clock:
    issue 39): after every fetch, the job's event time is what the same records one by
    one left, a record dated 100 s ahead of its step included."""
    records = [step_msg(s, n) for s in range(30) for n in range(8)]
    ahead = decode(StepTelemetry, records[21 * 8])
    assert not isinstance(ahead, Rejected)
    later = {"ts_start": ahead.ts_start + timedelta(seconds=100),
             "ts_end": ahead.ts_end + timedelta(seconds=100)}  # fmt: skip
    records[21 * 8] = encode(ahead.model_copy(update=later))
    one = WorkerDetection(TOPICS, 8, clock=Clock(), max_clock_skew_s=None)
    clocks = []
    for off, value in enumerate(records):
        one.handle_step(0, off, b"j", value, token=off)
        clocks.append(one.jobs["j"].last_event_ts)
    many = WorkerDetection(TOPICS, 8, clock=Clock(), max_clock_skew_s=None)
    for lo in range(0, len(records), 13):
        chunk = [(off, b"j", records[off]) for off in range(lo, min(lo + 13, len(records)))]
        many.handle_steps(0, chunk, token=None)
        assert many.jobs["j"].last_event_ts == clocks[chunk[-1][0]]
    assert max(clocks) < ahead.ts_end.timestamp() + 100  # the record ahead was bounded
