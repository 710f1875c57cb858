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
