"""Ranks -> node aggregators -> a rack aggregator (UDP) -> the broker -> the worker's
core: one message per rack per step, every rank filed under its own node, node-level
and rack-level senders in one job, and a lost rack seen as its nodes' silence."""

from __future__ import annotations

import threading
import time

import pytest

from pipeline.agents.node import NodeAggregator
from pipeline.agents.rack import RackAggregator, RackLink
from pipeline.client import StepExporter
from pipeline.client.sink import KafkaSink
from pipeline.io.kafka import create_topics, make_consumer, registry_of
from pipeline.services.worker.state import CoreTopics, WorkerDetection
from tests.integration.test_exporter import read_steps

pytestmark = pytest.mark.integration

RANKS = 2  # per node


def _serve(agg) -> threading.Thread:
    t = threading.Thread(target=agg.serve, daemon=True)
    t.start()
    return t


def _wait(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _record(exporters, node: int, steps: range) -> None:
    now = time.time()  # dated from now: the worker refuses records from the future
    for step in steps:
        for local, exporter in enumerate(exporters):
            exporter.record_step(
                step, node * RANKS + local, step_time_s=1.0, compute_s=0.8,
                comm_wait_s=0.15, data_wait_s=0.05, local_rank=local,
                ts_start=now - 100 + step, ts_end=now - 99 + step,
            )  # fmt: skip


def test_a_rack_sends_one_message_per_step_beside_a_node_of_its_own(settings, tmp_path):
    create_topics(settings)
    rack = RackAggregator(settings, ("127.0.0.1", 0), name="rack-a", nodes_per_rack=2)
    aggs, threads = [], [_serve(rack)]
    for n in range(3):  # nodes 0 and 1 behind the rack, node 2 straight to Kafka
        sink = RackLink(rack.address, KafkaSink(settings)) if n < 2 else None
        agg = NodeAggregator(settings, tmp_path / f"n{n}.sock", ranks_per_node=RANKS, sink=sink)
        aggs.append(agg)
        threads.append(_serve(agg))
    exporters = [
        [StepExporter.to_aggregator(tmp_path / f"n{n}.sock", job_id="job-r", node=f"n{n}",
                                    register_atexit=False) for _ in range(RANKS)]
        for n in range(3)
    ]  # fmt: skip
    for step in range(10):
        # in step order on the topic, as a live job's senders are a step apart: the
        # rack's message first, then node 2's (poll each with a deadline)
        for n in range(3):
            _record(exporters[n], n, range(step, step + 1))
            if n > 0:  # the rack's nodes both sent, then node 2
                sink = rack.sink if n == 1 else aggs[2].sink
                _wait(lambda: sink.stats.sent >= step + 1)
    # the rack's aggregator is lost: node 2 goes on alone for five steps
    rack.stop()
    for agg in aggs[:2]:
        agg.stop()
    for t in threads[:3]:
        t.join(15)
    for step in range(10, 15):
        _record(exporters[2], 2, range(step, step + 1))
        _wait(lambda: aggs[2].sink.stats.sent >= step + 1)
    for e in [x for row in exporters for x in row]:
        e.close()
    got = read_steps(settings, want=25)
    aggs[2].stop()
    threads[3].join(15)
    for agg in [*aggs, rack]:
        agg.close()

    by_sender = {}
    for m in got:
        by_sender.setdefault(m.node, []).append(m)
    assert sorted(by_sender) == ["n2", "rack-a"]
    assert [m.step for m in by_sender["rack-a"]] == list(range(10))
    # the senders' defaults: a rack's message as columns, a node's own as rows
    assert {m.schema_version for m in by_sender["rack-a"]} == {3}
    assert {m.schema_version for m in by_sender["n2"]} == {1}
    assert all(
        sorted((s.node, s.rank) for s in m.samples) == [("n0", 0), ("n0", 1), ("n1", 2), ("n1", 3)]
        for m in by_sender["rack-a"]
    )
    assert rack.malformed == 0 and rack.batcher.late == 0

    # the worker's core reads the mixed job from the topic: six ranks on three nodes,
    # then (the rack lost) node 2's ranks alone: its steps go on being scored
    topic = registry_of(settings).name("steps")
    core = WorkerDetection(CoreTopics(topic, "h", "j"), n_partitions=1, max_clock_skew_s=300.0)
    consumer = make_consumer(settings, [topic], None)
    rank_steps, letters, seen = 0, [], 0
    try:
        for _ in range(20):
            for records in consumer.poll(timeout_ms=500).values():
                for r in records:
                    out = core.handle_step(0, r.offset, r.key, r.value, token=None)
                    letters += out.dead_letters
                    rank_steps += out.rank_steps
                    seen += 1
            if seen >= len(got):
                break
    finally:
        consumer.close()
    assert letters == []
    assert rank_steps >= 10 * 3 * RANKS + 3 * RANKS
