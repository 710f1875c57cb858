"""Threats against the worker from whoever can write one of the topics it reads.

Each test drives the real :class:`~pipeline.services.worker.state.WorkerCore` (the logic of
``stepguard worker`` without Faust) with what an attacker would publish.
"""

from __future__ import annotations

import pickle
import zlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pipeline.services.worker.state import partition_for
from schemas import AlertKind, AlertState, CommandKind, Grade, encode
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
    feed(core, range(0, 30), offset=5000)  # the relaunched run makes progress, then hangs
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
