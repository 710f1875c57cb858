"""Threats against the worker from whoever can write one of the topics it reads.

Each test drives the real :class:`~pipeline.services.worker.state.WorkerDetection` (the logic of
``stepguard worker`` without Faust) with what an attacker would publish.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import struct
import zlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from detectors.job_guard import LifecycleLimits
from pipeline.services.worker.seal import Seal
from pipeline.services.worker.state import partition_for
from schemas import (
    AlertKind,
    AlertState,
    CommandKind,
    EndReason,
    Grade,
    JobEvent,
    JobEventKind,
    NodeHealth,
    Phase,
    RecommendedAction,
    Rejected,
    decode,
    encode,
)
from tests.factories import ACTUATOR_KEY, EXECUTOR_KEY, WORKER_KEY, job_controller_key
from tests.security._helpers import (
    JOB_J_KEY,
    STEP_S,
    T0,
    Clock,
    ecc_report,
    feed,
    impostor,
    result,
    step_msg,
    worker,
)
from tests.security._helpers import command as make_command


class _Touch:
    """A pickle that creates a file when it is loaded: stands for any code."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def test_a_pickle_in_the_changelog_is_never_run(tmp_path):
    """Threat: the worker's changelog topic has a fixed name; a pickled 'snapshot'
    written there ran code in every worker that recovered the job."""
    marker = tmp_path / "pwned"
    evil = pickle.dumps(_Touch(marker))
    payloads = [evil, b"x\x9c" + zlib.compress(evil)]
    for i, blob in enumerate(payloads):
        core = worker()
        out = core.handle_step(0, i, b"j", step_msg(0, 0), token=i, load=lambda _j, b=blob: b)
        assert not marker.exists()
        assert core.unreadable_snapshots == 1 and not out.dead_letters  # rebuilt, counted
        assert core.jobs["j"].detection.frames == 0  # a fresh state, not the payload


def test_an_unsigned_or_forged_relaunch_does_not_put_the_hang_clock_in_grace():
    """Threat: unsigned commands kept a job's hang clock in relaunch grace for good."""
    clock = Clock()
    core = worker(clock)
    feed(core, range(30))
    bad = [make_command(CommandKind.RESTART), make_command(CommandKind.RESTART, key=WORKER_KEY),
           make_command(CommandKind.RESTART, key=impostor(ACTUATOR_KEY))]  # fmt: skip
    assert [core.route_command(0, i, b"j", encode(c)) for i, c in enumerate(bad)] == [None] * 3
    assert core.counts()["refused_command"] == 3
    hangs = []
    for i in range(15):  # ~11 step times of silence: a hang, no grace
        clock.now += 1.0
        _, tick = core.tick_record("j")
        hangs += core.handle_job_record(0, 100 + i, b"j", tick, "tick", token=i).alerts
    assert AlertKind.HANG in [a.kind for a in hangs]
    signed = encode(make_command(CommandKind.RESTART, key=ACTUATOR_KEY))
    assert core.route_command(0, 9, b"j", signed) is not None  # the real one is obeyed


def _health_alerts_of(core, node: str, after_step: int) -> list:
    """Report an uncorrectable ECC error on ``node``, then let the steps pass it."""
    at = T0 + timedelta(seconds=STEP_S * after_step + 0.5)
    fwd = core.route_health(0, 500, node.encode(), ecc_report(node, at))
    assert fwd is not None and fwd.partition == partition_for("j", 8)
    out = core.handle_job_record(fwd.partition, 500, b"j", fwd.value, "health", token="h")
    return out.alerts + feed(core, range(after_step + 1, after_step + 4), offset=1000)


def test_a_forged_isolate_or_result_cannot_mute_a_nodes_health():
    """Threat: a command or result naming a node put it in ``removed_nodes``, whose
    health was then ignored for good (an uncorrectable ECC error raised nothing)."""
    core = worker()
    feed(core, range(30))
    isolate = make_command(CommandKind.ISOLATE, ("n3",))
    assert core.route_command(0, 1, b"j", encode(isolate)) is None
    assert core.route_result(0, 2, b"j", encode(result())) is None
    alerts = _health_alerts_of(core, "n3", 29)
    critical = [a for a in alerts if a.node == "n3" and a.grade is Grade.CRITICAL]
    assert critical and critical[0].kind is AlertKind.HARDWARE
    # what the control guards: the actuator's signed isolation does take n3 out
    real = worker()
    feed(real, range(30))
    fwd = real.route_command(0, 1, b"j", encode(make_command(CommandKind.ISOLATE, ("n3",),
                                                             key=ACTUATOR_KEY)))  # fmt: skip
    real.handle_job_record(fwd.partition, 1, b"j", fwd.value, "command", token="c")
    assert not [a for a in _health_alerts_of(real, "n3", 29) if a.node == "n3"]


def test_a_forged_job_controller_result_does_not_end_a_relaunchs_episodes():
    """Threat: every training process held the executor private key, so it could sign
    results for any job under any executor name, and the worker acted on any
    executor-signed SUCCEEDED result: a forged one for a real RESTART closed the
    episodes of the nodes it names (and restarted the grace) before anything happened;
    a dry-run executor's "would restart" counted as a relaunch (issue 25 bug 3).

    Control: only the result's own job's controller key counts (issue 22 item 4)."""
    core = worker(result_keys=JOB_J_KEY.verifier() | EXECUTOR_KEY.verifier()
                  | job_controller_key("other-job").verifier())  # fmt: skip
    feed(core, range(30))
    restart = make_command(CommandKind.RESTART, ("n5",), key=ACTUATOR_KEY)
    fwd = core.route_command(0, 1, b"j", encode(restart))
    core.handle_job_record(fwd.partition, 1, b"j", fwd.value, "command", token="c")
    forged = [
        result(),
        result(key=WORKER_KEY),
        result(key=ACTUATOR_KEY),
        result(key=impostor(JOB_J_KEY)),
        result(key=EXECUTOR_KEY),  # the key every training process used to hold
        result(key=job_controller_key("other-job")),
    ]  # another job's controller
    assert [core.route_result(0, i, b"j", encode(r)) for i, r in enumerate(forged)] == [None] * 6
    # written straight to the worker's own job topic: refused there too
    out = core.handle_job_record(fwd.partition, 2, b"j", encode(result()), "result", token="r")
    assert out.alerts == [] and out.release == ["r"]
    out = core.handle_job_record(fwd.partition, 3, b"j", encode(result(key=EXECUTOR_KEY)),
                                 "result", token="r2")  # fmt: skip
    assert out.alerts == [] and out.release == ["r2"]
    assert core.counts()["refused_result"] == 8
    assert core.jobs["j"].detection.relaunches == 0
    # the job's own controller's result is acted on, once
    genuine = encode(result(key=JOB_J_KEY))
    signed = core.route_result(0, 9, b"j", genuine)
    assert signed is not None
    core.handle_job_record(signed.partition, 4, b"j", signed.value, "result", token="ok")
    assert core.jobs["j"].detection.relaunches == 1
    replay = core.route_result(0, 10, b"j", genuine)  # re-published: no second relaunch
    core.handle_job_record(replay.partition, 5, b"j", replay.value, "result", token="again")
    assert core.jobs["j"].detection.relaunches == 1


def test_a_replayed_result_does_not_keep_a_hung_job_relaunching():
    """Threat (issue 22 item 4): re-publishing one genuine SUCCEEDED result (no key
    needed) restarted the relaunch grace each time: a hung job stayed "relaunching"."""
    clock = Clock()
    core = worker(clock)
    feed(core, range(30))
    restart = make_command(CommandKind.RESTART, key=ACTUATOR_KEY)
    fwd = core.route_command(0, 1, b"j", encode(restart))
    core.handle_job_record(fwd.partition, 1, b"j", fwd.value, "command", token="c")
    genuine = encode(result(key=JOB_J_KEY))
    first = core.route_result(0, 2, b"j", genuine)
    core.handle_job_record(first.partition, 2, b"j", first.value, "result", token="r")
    # the relaunched run (its steps dated after the old run's) makes progress, then hangs
    feed(core, range(0, 30), offset=5000, t0=T0 + timedelta(seconds=STEP_S * 40))
    hangs = []
    for i in range(40):  # the silence, with the genuine result replayed all along
        clock.now += 2.0
        again = core.route_result(0, 100 + i, b"j", genuine)
        core.handle_job_record(again.partition, 100 + i, b"j", again.value, "result", token=i)
        _, tick = core.tick_record("j")
        hangs += core.handle_job_record(0, 200 + i, b"j", tick, "tick", token=i).alerts
    assert AlertKind.HANG in [a.kind for a in hangs]
    assert core.jobs["j"].detection.relaunches == 1


def test_oversized_and_future_dated_records_are_dead_letters_not_state():
    """Threats: one huge record allocates before it is checked; one record dated in
    the future moves a job's event time, and with it every hang clock."""
    core = worker(max_message_bytes=4096, max_clock_skew_s=300.0)
    huge = core.handle_step(0, 0, b"j", b"{" + b" " * 10_000 + b"}", token="big")
    (letter,) = huge.dead_letters
    assert "exceeds the limit of 4096" in letter.error and huge.release == ["big"]
    ahead = datetime.now(UTC) + timedelta(days=1)
    late = core.route_health(0, 1, b"n1", ecc_report("n1", ahead))
    out = core.handle_job_record(late.partition, 1, b"j", late.value, "health", token="f")
    assert [d.stage for d in out.dead_letters] == ["clock"]
    assert "j" not in core.jobs or core.jobs["j"].detection.now is None
    assert not [a for a in out.alerts if a.state is AlertState.FIRING]


# -- issue 22: one writer, one job --------------------------------------------------
def _ticks(core, clock, seconds: int, offset: int) -> list:
    alerts = []
    for i in range(seconds):
        clock.now += 1.0
        rec = core.tick_record("j")
        if rec is not None:
            alerts += core.handle_job_record(rec[0], offset + i, b"j", rec[1], "tick", i).alerts
    return alerts


def _lifecycle(kind: JobEventKind, at: datetime, **kw) -> bytes:
    return encode(JobEvent(job_id="j", kind=kind, ts=at, **kw))


def test_an_unsigned_end_the_jobs_steps_contradict_is_refused_and_the_job_stays_watched():
    """Threat (issue 22 item 1): one unsigned lifecycle end, dated a few minutes ahead,
    resolved a running job's episodes, dropped its state and made the worker ignore
    every record dated before it: the job then hung and nothing was reported."""
    clock = Clock()
    core = worker(clock, seal=Seal(b"w" * 32))
    feed(core, range(30))
    ahead = T0 + timedelta(seconds=STEP_S * 31 + 200)
    end = core.route_lifecycle(0, 1, b"j", _lifecycle(JobEventKind.END, ahead,
                                                      reason=EndReason.COMPLETED))  # fmt: skip
    out = core.handle_job_record(end.partition, 1, b"j", end.value, "lifecycle", token="e")
    assert not out.tombstone and "j" in core.jobs and core.ended == {}
    alerts = out.alerts + feed(core, range(30, 34), offset=1000)  # the job goes on
    anomalies = [a for a in alerts if a.kind is AlertKind.LIFECYCLE]
    assert anomalies and all(a.grade is Grade.WARNING for a in anomalies)
    assert core.after_end == 0  # none of its steps was taken for the ended run's
    hangs = _ticks(core, clock, 20, offset=200)  # and then it hangs: raised, then acted on
    firing = [(a.kind, a.grade) for a in hangs if a.state is AlertState.FIRING]
    assert firing == [(AlertKind.HANG, Grade.WARNING), (AlertKind.HANG, Grade.CRITICAL)]


def test_a_phase_of_a_day_at_step_ten_to_the_fifteen_cannot_hide_a_hang():
    """Threat (item 2): one phase with ``expected_s`` of 7 days and ``step`` 10**15 made
    the hang allowance about ten days."""
    assert isinstance(decode(JobEvent, _lifecycle(JobEventKind.PHASE, T0, phase=Phase.EVAL,
                                                  expected_s=1.0)
                             .replace(b'"expected_s":1.0', b'"expected_s":604800.0')),
                      Rejected)  # fmt: skip
    clock = Clock()
    core = worker(clock, limits=LifecycleLimits(max_phase_s=30.0))  # STEPGUARD_MAX_PHASE_S
    feed(core, range(30))
    now = T0 + timedelta(seconds=STEP_S * 31)
    for i, (step, expected) in enumerate([(10**15, 86400.0), (29, 86400.0)]):
        event = _lifecycle(JobEventKind.PHASE, now, phase=Phase.CHECKPOINT, step=step,
                           expected_s=expected)  # fmt: skip
        core.handle_job_record(0, 10 + i, b"j", event, "lifecycle", token=i)
    # refused (far ahead) and cut to STEPGUARD_MAX_PHASE_S: both reported ...
    hangs = _ticks(core, clock, 200, offset=100)
    # ... and the hang is raised within the maximum phase, not ten days later
    assert AlertKind.HANG in [a.kind for a in hangs if a.state is AlertState.FIRING]


def test_health_naming_a_node_outside_the_job_is_never_graded_for_isolation():
    """Threat (item 3): a NodeHealth with a fatal error naming a node that never sent a
    step of the job was graded CRITICAL (isolate) for it: any node agent could have any
    node drained. Only members are graded; an outside node is at most an INFO."""
    core = worker()
    feed(core, range(30))
    outside = [a for a in _health_alerts_of(core, "n99", 29) if a.node == "n99"]
    assert outside and all(a.grade is Grade.INFO for a in outside)
    assert all(a.recommended_action is RecommendedAction.NONE for a in outside)
    core = worker()
    feed(core, range(30))
    member = [a for a in _health_alerts_of(core, "n3", 29) if a.node == "n3"]
    assert member and member[0].grade is Grade.CRITICAL  # a member is still judged


def test_one_rank_record_beyond_int32_never_drops_the_step_for_every_node():
    """Threat (item 5): a pp_stage of 2**31 passed the schema and overflowed the frame's
    int32 column: the whole step was dropped for every node, and a healthy job got a
    false hang. Now that one record is a dead letter and the step is still judged."""
    core = worker()
    feed(core, range(30))
    bad = json.loads(step_msg(30, 3))
    bad["samples"][0]["pp_stage"] = 2**31
    out = core.handle_step(0, 500, b"j", json.dumps(bad).encode(), token="bad")
    assert [d.stage for d in out.dead_letters] == ["decode"] and out.release == ["bad"]
    frames = core.jobs["j"].detection.frames
    for n in (0, 1, 2, 4, 5, 6, 7):
        core.handle_step(0, 501 + n, b"j", step_msg(30, n), token=n)
    feed(core, range(31, 34), offset=600)
    assert core.jobs["j"].detection.frames == frames + 4  # step 30 was judged too
    assert core.jobs["j"].detection.last_step == 33


def test_health_naming_invented_jobs_never_fills_the_worker_nor_pins_its_commit():
    """Threat (item 6): health reports naming invented job ids never expired and filled
    STEPGUARD_WORKER_MAX_JOBS (every real new job refused); their unacked records
    pinned the internal topic's commit."""
    clock = Clock()
    core = worker(clock, max_jobs=2, max_pending_jobs=16, pending_ttl_s=60.0)
    for i in range(100):
        report = encode(NodeHealth(job_id=f"invented-{i}", node="n1", ts=T0))
        out = core.handle_job_record(0, i, f"invented-{i}".encode(), report, "health", token=i)
        assert out.release == [i] and not out.dead_letters  # acked at once
    assert core.jobs == {} and len(core.pending) == 16  # bounded
    real = core.handle_step(0, 1000, b"j", step_msg(0, 0), token="real")
    assert not real.dead_letters and "j" in core.jobs  # a real job is taken on
    clock.now += 61.0
    assert len(core.pending) == 0  # and they expire


def test_the_workers_internal_topics_accept_only_what_the_worker_sealed():
    """Threat (item 7): one unsigned tick on the worker's jobs topic with ``wall_s`` far
    ahead made the worker abandon a job that had just hung; its changelog took any
    snapshot that decoded."""
    clock = Clock()
    seal = Seal(b"w" * 32)
    core = worker(clock, seal=seal)
    feed(core, range(30))
    forged = json.dumps({"job_id": "j", "wall_s": clock.now + 10 * 86400}).encode()
    out = core.handle_job_record(0, 50, b"j", forged, "tick", token="forged")
    assert [d.stage for d in out.dead_letters] == ["auth"] and out.release == ["forged"]
    sealed_far = seal.seal("tick", forged)  # even sealed, a tick is not beyond the clock
    out = core.handle_job_record(0, 51, b"j", sealed_far, "tick", token="far")
    assert out.dead_letters and "beyond this worker's clock" in out.dead_letters[0].error
    assert "j" in core.jobs and core.counts()["unsealed"] == 1  # not abandoned
    # a forwarded record is sealed as its kind: replayed as another kind it is refused
    fwd = core.route_health(0, 60, b"n1", ecc_report("n1", T0 + timedelta(seconds=40)))
    assert core.handle_job_record(0, 61, b"j", fwd.value, "lifecycle", "x").dead_letters
    # a snapshot no worker of the group sealed is not read: the job starts afresh
    blob = core.jobs["j"].to_bytes()
    other = worker(clock, seal=Seal(b"w" * 32))
    other.handle_step(0, 0, b"j", step_msg(30, 0), token=1, load=lambda _j: blob)
    assert other.unreadable_snapshots == 1 and other.jobs["j"].detection.frames == 0
    third = worker(clock, seal=Seal(b"w" * 32))
    sealed = seal.seal("snapshot", blob, job="j")
    third.handle_step(0, 0, b"j", step_msg(30, 0), token=1, load=lambda _j: sealed)
    assert third.unreadable_snapshots == 0 and third.jobs["j"].detection.frames > 0


def test_a_changelog_value_of_any_shape_leaves_the_job_monitored_afresh():
    """Threat (item 8): a deeply nested msgpack value in the changelog made
    ``statecodec.loads`` raise RecursionError; the job was never monitored again."""
    body = b"\x91" * 200_000 + b"\xc0"
    deep = struct.pack("<4sBBQ", b"SGST", 1, 1, len(body)) + zlib.compress(body)
    core = worker()
    out = core.handle_step(0, 0, b"j", step_msg(0, 0), token="s", load=lambda _j: deep)
    assert core.unreadable_snapshots == 1 and not out.dead_letters and "j" in core.jobs


def test_a_record_just_under_the_broker_limit_makes_a_dead_letter_under_it():
    """Threat (item 15): a dead letter base64-encoded the whole raw record: one just
    under the broker's ``max.message.bytes`` made a dead letter over it, the produce
    failed before the commit and the consumer crash-looped on that record."""
    broker_limit = 1_048_588  # Apache Kafka's default message.max.bytes
    raw = b"\xff" * (broker_limit - 2048)
    out = worker().handle_step(0, 7, b"j", raw, token="big")
    (letter,) = out.dead_letters
    assert len(encode(letter)) < broker_limit // 4
    assert (letter.raw_len, letter.truncated) == (len(raw), True)
    assert letter.raw_sha256 == hashlib.sha256(raw).hexdigest() and raw.startswith(letter.raw)


def test_phases_announced_over_and_over_cannot_hide_a_hang():
    """Threat: a phase announced with no length, again every 100 s while no step
    completes, moved the phase's start each time: the job's lifecycle writer kept a
    hung job silent for ever. From the third announcement in a row the start stays."""
    clock = Clock()
    core = worker(clock)
    feed(core, range(30))
    start = T0 + timedelta(seconds=STEP_S * 31)
    hangs: list = []
    for i in range(12):  # 1,200 s of silence, announced again every 100 s
        event = _lifecycle(JobEventKind.PHASE, start + timedelta(seconds=100 * i),
                           phase=Phase.CHECKPOINT, step=29)  # fmt: skip
        core.handle_job_record(0, 10 + i, b"j", event, "lifecycle", token=i)
        hangs += _ticks(core, clock, 100, offset=1000 + 100 * i)
    firing = [a for a in hangs if a.kind is AlertKind.HANG and a.state is AlertState.FIRING]
    assert firing, "no hang in 1,200 s of announced silence"
    assert Grade.CRITICAL in [a.grade for a in firing]


def test_waits_for_input_said_over_and_over_cannot_hide_a_hang():
    """Threat: a job's lifecycle writer says ``wait`` (its leader waits for input)
    every 5 s, for this step and every step ahead it may name, while no step
    completes. Each step gets one allowance from its earliest wait: the hang is
    flagged within 1.5 x 10 median steps of the first, and climbs to CRITICAL."""
    clock = Clock()
    core = worker(clock)
    feed(core, range(30))
    start = T0 + timedelta(seconds=STEP_S * 31)
    hangs: list = []
    for i in range(40):  # 200 s of silence, a wait said again every 5 s
        for after in range(29, 29 + 20):
            event = _lifecycle(JobEventKind.WAIT, start + timedelta(seconds=5 * i), step=after)
            core.handle_job_record(0, 10 + i, b"j", event, "lifecycle", token=(i, after))
        hangs += _ticks(core, clock, 5, offset=1000 + 5 * i)
    firing = [a for a in hangs if a.kind is AlertKind.HANG and a.state is AlertState.FIRING]
    assert firing, "no hang in 200 s of silence said to wait for input"
    first = min(a.ts for a in firing)
    assert first - start <= timedelta(seconds=1.5 * 10 * STEP_S + 2)
    assert Grade.CRITICAL in [a.grade for a in firing]


@pytest.mark.parametrize(("max_phase_s", "hung"), [(30.0, True), (3600.0, False)])
def test_the_operators_max_phase_also_bounds_a_phase_that_says_no_length(max_phase_s, hung):
    """A phase announced without a length is allowed 1.5 x 120 s (phase_floor_s) before
    the hang warns; where the operator cut every phase to STEPGUARD_MAX_PHASE_S=30, a
    phase that says nothing gets no more than one that says 30 s."""
    clock = Clock()
    core = worker(clock, limits=LifecycleLimits(max_phase_s=max_phase_s))
    feed(core, range(30))
    now = T0 + timedelta(seconds=STEP_S * 31)
    event = _lifecycle(JobEventKind.PHASE, now, phase=Phase.CHECKPOINT, step=29)
    core.handle_job_record(0, 10, b"j", event, "lifecycle", token=0)
    hangs = _ticks(core, clock, 100, offset=100)
    fired = [a for a in hangs if a.kind is AlertKind.HANG and a.state is AlertState.FIRING]
    assert bool(fired) is hung, [(a.grade.value, a.summary) for a in fired]
