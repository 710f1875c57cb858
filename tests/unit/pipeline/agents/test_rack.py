"""Rack-level steps messages: the rack batcher, and the detection core fed a job whose
nodes report partly through racks (StepTelemetry version 2), partly on their own."""

from __future__ import annotations

import pytest

from detectors.frame import StepFrame
from detectors.job import JobDetection
from pipeline.agents.rack import RackBatcher, merge_nodes
from pipeline.io.fastdecode import decode_step
from pipeline.tools.simulator import Scenario, simulate
from schemas import AlertKind, AlertState, RankSample, StepTelemetry, encode
from tests.clock import day_start

T = day_start()  # a clock the test controls, dated from the run


def node_msg(node: int, step: int = 1, ranks: int = 2) -> StepTelemetry:
    samples = tuple(
        RankSample(rank=node * ranks + g, local_rank=g, step_time_s=1, compute_s=0.9,
                   comm_wait_s=0.1, data_wait_s=0)
        for g in range(ranks)
    )  # fmt: skip
    return StepTelemetry(job_id="j", node=f"n{node}", step=step, ts_start=T, ts_end=T,
                         samples=samples)  # fmt: skip


@pytest.mark.parametrize(("columnar", "version"), [(True, 3), (False, 2)])
def test_a_rack_message_attributes_every_rank_to_its_own_node(columnar, version):
    rack = merge_nodes([node_msg(0), node_msg(1)], "rack-0", columnar=columnar)
    assert rack.schema_version == version and rack.node == "rack-0"
    frame = StepFrame.from_messages([rack, node_msg(2)])  # a rack and a node, one step
    assert frame.nodes == ("n0", "n1", "n2")
    assert [frame.node_of_rank(r) for r in (0, 3, 5)] == ["n0", "n1", "n2"]
    view = decode_step(encode(rack))  # the worker's fast path reads it the same way
    assert view is not None
    assert StepFrame.from_messages([view, node_msg(2)]).nodes == frame.nodes


def test_a_sample_naming_its_node_needs_version_2_and_version_2_needs_every_node():
    rack = merge_nodes([node_msg(0), node_msg(1)], "rack-0", columnar=False)
    doc = rack.model_dump()
    with pytest.raises(ValueError, match="version 2"):
        StepTelemetry.model_validate(doc | {"schema_version": 1})
    doc["samples"][0]["node"] = None
    with pytest.raises(ValueError, match="every sample names its node"):
        StepTelemetry.model_validate(doc)


def test_a_columnar_rack_message_carries_its_nodes_as_a_table_and_an_index():
    rack = merge_nodes([node_msg(0), node_msg(1)], "rack-0")
    assert rack.columns is not None and rack.columns.nodes == ("n0", "n1")
    again = StepTelemetry.model_validate_json(encode(rack))
    assert b'"samples"' not in encode(rack) and again.samples == rack.samples
    old = merge_nodes([node_msg(0), node_msg(1)], "rack-0", columnar=False)
    assert [s.model_dump() for s in again.samples] == [s.model_dump() for s in old.samples]


def test_a_rank_sent_by_its_node_and_by_its_rack_counts_once():
    frame = StepFrame.from_messages([merge_nodes([node_msg(0)], "rack-0"), node_msg(0)])
    assert frame.rank.tolist() == [0, 1]


def test_batcher_publishes_complete_racks_at_once_and_partial_ones_after_the_wait():
    b = RackBatcher("rack-0", nodes_per_rack=3, max_wait_s=2.0)
    assert b.add(node_msg(0), 0.0) == [] and b.add(node_msg(1), 0.5) == []
    assert b.expire(1.9) == []
    (out,) = b.expire(2.0)
    assert [s.node for s in out.samples] == ["n0", "n0", "n1", "n1"]
    assert b.add(node_msg(2), 2.1) == [] and b.late == 1  # its step is out: dropped
    assert b.add(node_msg(0, step=2), 3.0) == []
    assert b.add(node_msg(0, step=2), 3.0) == [] and b.duplicates == 1
    assert b.flush()[0].step == 2 and b.flush() == []


def test_batcher_holds_a_bounded_number_of_steps():
    b = RackBatcher("rack-0", nodes_per_rack=8, max_pending=4, max_done=4)
    out = [m for step in range(10) for m in b.add(node_msg(0, step=step), 0.0)]
    assert [m.step for m in out] == list(range(6))  # the oldest go out early
    assert len(b._pending) == 4 and len(b._done) <= 4


def test_losing_a_rack_is_its_nodes_going_missing_not_a_job_hang():
    sc = Scenario.model_validate({"name": "racks", "nodes": 16, "steps": 120, "seed": 3})
    det = JobDetection(sc.job)
    alerts, frames_after = [], 0
    lost_at = 60
    for ev in simulate(sc):
        if ev.frame is not None:
            msgs = {m.node: m for m in ev.frame.to_messages()}
            names = sorted(msgs)
            racks = [merge_nodes([msgs[n] for n in names[8 * i : 8 * i + 4]], f"rack-{i}")
                     for i in range(2)]  # fmt: skip
            # 2 racks of 4 nodes each, the other 8 nodes on their own (version 1)
            direct = [msgs[n] for i in range(2) for n in names[8 * i + 4 : 8 * i + 8]]
            if ev.frame.step >= lost_at:
                racks = racks[1:]  # rack-0's aggregator is gone
            for m in [*racks, *direct]:
                detected = det.on_step(m)
                alerts += detected.alerts
                if ev.frame.step > lost_at:
                    frames_after += len(detected.frames)
        alerts += det.tick(ev.ts)
    alerts += det.flush()
    firing = [a for a in alerts if a.state is AlertState.FIRING]
    lost = set(sorted({m.node for m in ev.frame.to_messages()})[0:4])
    assert not [a for a in firing if a.kind is AlertKind.HANG]
    assert frames_after >= 120 - lost_at - 3  # the job's steps kept being scored
    missing = {a.node for a in firing if a.kind is AlertKind.MISSING}
    assert missing == lost


@pytest.mark.parametrize(
    ("setting", "node_version", "rack_version"),
    [(None, 1, 3), ("rack", 1, 3), ("all", 3, 3), ("off", 1, 2)],
)
def test_steps_columnar_says_which_senders_send_columns(
    setting, node_version, rack_version, tmp_path
):
    """By default a rack's message goes as columns (its 64 ranks decode 3x faster so)
    and a node's as rows (its 8 decode faster as rows today: BENCHMARKS.md)."""
    from pipeline.agents.node import NodeAggregator
    from pipeline.agents.rack import RackAggregator
    from pipeline.io.settings import load_settings

    env = {} if setting is None else {"STEPGUARD_STEPS_COLUMNAR": setting}
    settings = load_settings(env)
    sink = object()
    node = NodeAggregator(settings, tmp_path / "n.sock", ranks_per_node=2, sink=sink)  # type: ignore[arg-type]
    rack = RackAggregator(settings, ("127.0.0.1", 0), name="rack-0", nodes_per_rack=2,
                          sink=sink)  # type: ignore[arg-type]  # fmt: skip
    try:
        assert node.batcher.schema_version == node_version
        merged = rack.batcher.add(node_msg(0), 0.0) + rack.batcher.add(node_msg(1), 0.0)
        assert [m.schema_version for m in merged] == [rack_version]
    finally:
        node.sock.close()
        rack.sock.close()


def test_a_steps_columnar_value_not_known_fails_naming_the_variable():
    from pipeline.io.settings import load_settings

    with pytest.raises(Exception, match="STEPGUARD_STEPS_COLUMNAR: Input should be"):
        load_settings({"STEPGUARD_STEPS_COLUMNAR": "yes"})
