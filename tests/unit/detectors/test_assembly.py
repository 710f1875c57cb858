from __future__ import annotations

import pytest

from detectors.assembly import StepAssembler
from tests.factories import step_telemetry


def _msgs(step, nodes=3):
    return [
        step_telemetry(node=f"n{i}", step=step, ranks=2, first_rank=2 * i) for i in range(nodes)
    ]


def test_a_step_is_emitted_once_every_known_node_reported():
    asm = StepAssembler(lag_steps=2)
    out = [f for m in _msgs(0) for f in asm.add(m)]
    out += asm.flush()
    assert [f.step for f in out] == [0]
    out = []
    for m in _msgs(1):
        out.extend(asm.add(m))
    assert [f.step for f in out] == [1]  # complete: all three known nodes reported
    assert out[0].nodes == ("n0", "n1", "n2") and out[0].n_ranks == 6


def test_a_silent_node_does_not_block_the_job_view():
    asm = StepAssembler(lag_steps=2)
    for m in _msgs(0):
        asm.add(m)
    asm.flush()
    emitted = []
    for step in (1, 2):
        for m in _msgs(step)[:2]:  # n2 went silent
            emitted.extend(asm.add(m))
    assert emitted == []  # still waiting for n2 within the lag
    for m in _msgs(3)[:2]:
        emitted.extend(asm.add(m))
    # step 1 is forced out by the lag; the node set is then re-learned, so 2 and 3
    # complete without waiting again for the silent node
    assert [f.step for f in emitted] == [1, 2, 3]
    assert all(f.nodes == ("n0", "n1") for f in emitted)


def test_late_messages_for_emitted_steps_are_counted_not_reemitted():
    asm = StepAssembler(lag_steps=1)
    for m in _msgs(0, nodes=1):
        asm.add(m)
    asm.flush()
    assert asm.add(step_telemetry(node="n0", step=0, ranks=2)) == []
    assert asm.late_messages == 1


def test_lag_must_be_positive():
    with pytest.raises(ValueError, match="lag_steps"):
        StepAssembler(lag_steps=0)


def test_a_restart_from_a_checkpoint_replays_step_numbers():
    from datetime import timedelta

    asm = StepAssembler(lag_steps=1)
    for step in range(4):
        for m in _msgs(step, nodes=1):
            asm.add(m)
    asm.flush()
    later = step_telemetry(node="n0", step=2, ranks=2)
    later = later.model_copy(
        update={"ts_start": later.ts_start + timedelta(hours=1),
                "ts_end": later.ts_end + timedelta(hours=1)}
    )  # fmt: skip
    out = asm.add(later) + asm.flush()
    assert [f.step for f in out] == [2]
    assert asm.restarts == 1 and asm.late_messages == 0


def test_a_late_message_newer_than_its_step_is_not_taken_for_a_relaunch():
    """n2 falls behind: step 1 is forced out without it, step 3 is still pending. Its
    message for step 1 then arrives, ending later than the frames handed out (its own
    clock is later) but before step 3: late, and the pending step 3 is kept."""
    from datetime import timedelta

    asm = StepAssembler(lag_steps=2)
    out = [f for m in _msgs(0) for f in asm.add(m)]
    for m in _msgs(1)[:2] + _msgs(2)[:2] + _msgs(3)[:1]:
        out += asm.add(m)
    assert [f.step for f in out] == [0, 1, 2]  # 3 waits for n1
    late = _msgs(1)[2]
    late = late.model_copy(update={"ts_end": late.ts_end + timedelta(seconds=1.2)})
    assert asm.add(late) == []
    assert (asm.late_messages, asm.restarts) == (1, 0)
    assert [f.step for f in asm.add(_msgs(3)[1])] == [3]


def _fast(step, node, first_rank, every_s=0.05):
    """A node's message of a job whose steps take ``every_s`` seconds."""
    from datetime import timedelta

    m = step_telemetry(node=node, step=step, ranks=2, first_rank=first_rank)
    shift = timedelta(seconds=step * every_s - step)  # the factory's steps are 1 s apart
    return m.model_copy(update={"ts_start": m.ts_start + shift, "ts_end": m.ts_end + shift})


def test_a_node_whose_messages_arrive_a_few_fast_steps_behind_stays_in_every_frame():
    """Steps of 50 ms; n1's messages reach the topic five steps (250 ms) behind n0's,
    as a producer's batch or a busy host delays them. Counted in steps alone, n1 fell
    out of the frames and was judged missing; within lag_s it is waited for."""
    asm = StepAssembler(lag_steps=2, lag_s=1.0)
    out = []
    for step in range(40):
        out += asm.add(_fast(step, "n0", 0))
        if step >= 5:
            out += asm.add(_fast(step - 5, "n1", 2))
    for step in range(35, 40):
        out += asm.add(_fast(step, "n1", 2))
    assert [f.step for f in out] == list(range(40))
    assert all(f.nodes == ("n0", "n1") for f in out)
    assert asm.late_messages == 0


def test_a_silent_node_in_a_fast_job_is_given_up_after_lag_s_of_event_time():
    asm = StepAssembler(lag_steps=2, lag_s=1.0)
    for step in range(3):
        asm.add(_fast(step, "n0", 0))
        asm.add(_fast(step, "n1", 2))
    asm.flush()  # both nodes known
    out = []
    for step in range(3, 60):  # n1 falls silent after step 2
        out += asm.add(_fast(step, "n0", 0))
        if out:
            break
    # step 3 waits until the job is 1 s (20 steps of 50 ms) past it, then goes out
    assert out[0].step == 3 and out[0].nodes == ("n0",)
    assert step == 23


def test_max_lag_steps_bounds_the_wait_whatever_the_clocks_say():
    # n0's clock stands still (every message the same event time): only the step
    # count can force a step out, max_lag_steps after it
    asm = StepAssembler(lag_steps=2, lag_s=60.0, max_lag_steps=8)
    m = step_telemetry(node="n0", step=0, ranks=2)
    asm.add(m)
    asm.add(step_telemetry(node="n1", step=0, ranks=2, first_rank=2))
    asm.flush()  # both nodes known
    out = []
    for step in range(1, 20):
        out += asm.add(m.model_copy(update={"step": step}))
        if out:
            break
    assert out[0].step == 1 and step == 9


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"lag_s": -1.0}, "lag_s"), ({"lag_steps": 4, "max_lag_steps": 3}, "max_lag_steps")],
)
def test_bad_lags_fail_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        StepAssembler(**kwargs)


def test_a_job_shorter_than_lag_s_is_let_out_by_the_clock():
    """Ten steps of 50 ms (less than lag_s of event time): no node is known yet, so no
    step is complete and none forced; the clock lag_s past them lets them out."""
    from detectors.job import JobDetection

    job = JobDetection("job-1")
    frames = []
    for step in range(10):
        for node, first in (("n0", 0), ("n1", 2)):
            frames += job.on_step(_fast(step, node, first)).frames
    assert frames == []
    last = _fast(9, "n0", 0).ts_end.timestamp()
    assert job.tick_detected(last + 0.5).frames == []  # within lag_s: still waited for
    out = job.tick_detected(last + 2.5).frames
    assert [f.step for f in out] == list(range(10))
    assert all(f.nodes == ("n0", "n1") for f in out)


def test_once_nodes_are_known_the_clock_forces_no_step_out():
    """A worker's clock runs ahead of records still unread (a takeover's backlog): a
    part-filled step must wait for the job's own records, not be forced by the clock
    without the nodes whose messages are still to come."""
    from detectors.job import JobDetection

    job = JobDetection("job-1")
    for step in range(4):  # both nodes known from a forced step on
        for node, first in (("n0", 0), ("n1", 2)):
            job.on_step(_fast(step, node, first))
    job.tick_detected(_fast(3, "n0", 0).ts_end.timestamp() + 5.0)
    assert job.assembler._jobs["job-1"].known_nodes == {"n0", "n1"}
    job.on_step(_fast(4, "n0", 0))  # n1's message for step 4 is still unread
    late = _fast(4, "n0", 0).ts_end.timestamp() + 60.0
    assert job.tick_detected(late).frames == []
    out = job.on_step(_fast(4, "n1", 2)).frames
    assert [f.step for f in out] == [4] and out[0].nodes == ("n0", "n1")
