"""Membership moves only on a node's own records (issue 39, finding 2).

One step record naming a node outside the job and carrying only another node's rank
enrolled that node; a fatal XID in its health then isolated a login node.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from detectors.errors import RefusedRecord
from detectors.frame import NodeStep
from detectors.job import JobDetection
from pipeline.tools.simulator import Scenario, simulate
from schemas import GpuHealth, NodeHealth
from tests.adversary import play

JOB = {"name": "members", "nodes": 8, "gpus_per_node": 2, "tp": 2, "steps": 120, "seed": 5}


def xid79(node: str, msg: NodeStep) -> NodeHealth:
    gpu = GpuHealth(
        index=0, temperature_c=60, power_w=500, sm_clock_mhz=1800, utilization_pct=99,
        xid_codes=(79,),
    )  # fmt: skip
    return NodeHealth(job_id=msg.job_id, node=node, ts=msg.ts_end, gpus=(gpu,))


def impostor(step: int, msgs: Sequence[NodeStep]) -> list[object]:
    out: list[object] = list(msgs)
    if step == 40:  # a copy of node-0002's record under another name
        out.append(msgs[2].model_copy(update={"node": "login-01"}))  # type: ignore[attr-defined]
    if step == 42:
        out += [xid79("login-01", msgs[0])] * 3
    return out


def test_a_node_carrying_only_another_nodes_ranks_is_refused_and_never_isolated():
    out = play(Scenario.model_validate(JOB), impostor)
    assert "login-01" not in out.condemned()
    assert out.refused == 1
    notes = [a for a in out.firing("guardrail") if a.node == "login-01"]
    assert notes and notes[0].evidence.metric == "refused_records"
    assert {n for _, n in out.named()} <= {"login-01"}  # the honest job: nothing else


def first_steps(n: int = 12) -> tuple[JobDetection, list[list[NodeStep]]]:
    sc = Scenario.model_validate(JOB)
    steps = [list(ev.frame.to_messages()) for ev in simulate(sc) if ev.frame is not None]
    return JobDetection(sc.job), steps[:n]


def test_the_impostor_is_no_member_and_the_owner_keeps_its_ranks():
    det, steps = first_steps()
    for msgs in steps[:5]:
        for m in msgs:
            det.on_step(m)
    with pytest.raises(RefusedRecord, match="node-0002"):
        det.on_step(steps[5][2].model_copy(update={"node": "login-01"}))  # type: ignore[attr-defined]
    assert "login-01" not in det.guard.members
    for m in steps[5]:  # the owner's own record still goes in
        det.on_step(m)
    assert det.last_step >= 3


def test_a_rank_far_beyond_the_jobs_is_refused():
    det, steps = first_steps()
    for msgs in steps[:5]:
        for m in msgs:
            det.on_step(m)
    m = steps[5][0]
    far = m.samples[0].model_copy(update={"rank": 900_000})  # type: ignore[attr-defined]
    with pytest.raises(RefusedRecord, match="far beyond"):
        det.on_step(m.model_copy(update={"node": "node-0099", "samples": (far,)}))  # type: ignore[attr-defined]
    assert "node-0099" not in det.guard.members


def test_ranks_move_to_a_replacement_once_their_node_stopped_reporting():
    det, steps = first_steps(12)
    for msgs in steps[:4]:
        for m in msgs:
            det.on_step(m)
    for i, msgs in enumerate(steps[4:12]):  # node-0002 dies; its ranks come back on a spare
        for m in msgs:
            if m.node != "node-0002":
                det.on_step(m)
            elif i >= 3:
                det.on_step(m.model_copy(update={"node": "spare-000"}))  # type: ignore[attr-defined]
    assert "spare-000" in det.guard.members


def test_rank_ownership_and_refusals_survive_a_snapshot():
    from pipeline.io import statecodec

    det, steps = first_steps()
    for msgs in steps[:5]:
        for m in msgs:
            det.on_step(m)
    with pytest.raises(RefusedRecord):
        det.on_step(steps[5][2].model_copy(update={"node": "login-01"}))  # type: ignore[attr-defined]
    back = statecodec.loads(statecodec.dumps(det))
    with pytest.raises(RefusedRecord):  # the restored core still knows who holds what
        back.on_step(steps[6][2].model_copy(update={"node": "login-01"}))  # type: ignore[attr-defined]
    assert "login-01" not in back.guard.members


def test_a_node_the_start_declared_may_bring_high_ranks():
    from schemas import JobEvent, JobEventKind

    det, steps = first_steps()
    start = JobEvent(job_id=det.job_id, kind=JobEventKind.START, ts=steps[0][0].ts_start,
                     nodes=("node-0099",))  # fmt: skip
    det.on_lifecycle(start)
    for msgs in steps[:5]:
        for m in msgs:
            det.on_step(m)
    m = steps[5][0]
    far = m.samples[0].model_copy(update={"rank": 900_000})  # type: ignore[attr-defined]
    det.on_step(m.model_copy(update={"node": "node-0099", "samples": (far,)}))  # type: ignore[attr-defined]
    assert "node-0099" in det.guard.members


def test_a_rack_message_speaks_for_the_nodes_its_samples_name():
    from pipeline.agents.rack import merge_nodes

    det, steps = first_steps()
    for msgs in steps[:5]:
        for m in msgs:
            det.on_step(m)
    # nodes 0-3 now report through their rack: the same ranks, the same nodes
    for m in [merge_nodes(list(steps[5][:4]), "rack-0"), *steps[5][4:]]:
        det.on_step(m)
    # a rack message attributing node-0002's ranks to another node is refused
    stolen = [s.model_copy(update={"node": "login-01"}) for s in steps[6][2].samples]  # type: ignore[attr-defined]
    forged = merge_nodes([steps[6][2].model_copy(update={"samples": tuple(stolen)})], "rack-9")  # type: ignore[attr-defined]
    assert {s.node for s in forged.samples} == {"login-01"}
    with pytest.raises(RefusedRecord, match=r"node login-01 reports rank .* node node-0002 holds"):
        det.on_step(forged)


def test_a_relaunch_frees_the_ranks_of_the_node_it_took_out_before_its_result_arrives():
    """Seen in CI (the simulated job at 8x, issue 41's test): the actuator's RESTART
    took node-0002 out, and the new run's first record from its spare reached the
    worker before the relaunch's result, on another topic: it was refused as carrying
    ranks node-0002 held. The command is the actuator's signed word that node-0002
    left; a node it did not name still may not take another's ranks."""
    from datetime import timedelta

    from schemas import ActuatorMode, Command, CommandKind

    det, steps = first_steps(12)
    for msgs in steps[:6]:
        for m in msgs:
            det.on_step(m)
    at = steps[5][0].ts_end
    cmd = Command(command_id="cmd-1", kind=CommandKind.RESTART, job_id=det.job_id,
                  targets=("node-0002",), checkpoint_step=3, reason=("straggler",),
                  mode=ActuatorMode.AUTO, issued_at=at,
                  expires_at=at + timedelta(minutes=5))  # fmt: skip
    det.on_command(cmd, now=at.timestamp())
    assert det.state == "relaunching"
    later = timedelta(seconds=60)
    run = [[m.model_copy(update={"ts_start": m.ts_start + later, "ts_end": m.ts_end + later})  # type: ignore[attr-defined]
            for m in msgs] for msgs in steps[6:9]]  # fmt: skip
    with pytest.raises(RefusedRecord, match="node-0003"):  # not named by the command
        det.on_step(run[0][3].model_copy(update={"node": "login-01"}))  # type: ignore[attr-defined]
    for msgs in run:  # the new run, node-0002's ranks on its spare
        for m in msgs:
            det.on_step(m.model_copy(update={"node": "spare-000"}) if m.node == "node-0002" else m)  # type: ignore[attr-defined]
    assert "spare-000" in det.guard.members and "login-01" not in det.guard.members
    assert det.state == "running"
