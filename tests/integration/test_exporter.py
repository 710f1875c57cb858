"""Exporters against a real broker: direct mode and the node aggregator."""

from __future__ import annotations

import threading

import pytest
from kafka import KafkaConsumer

from pipeline.agents.node import NodeAggregator
from pipeline.client import StepExporter
from pipeline.client.sink import CLIENT_TOPICS
from pipeline.io.kafka import consumer_config, create_topics, make_consumer, registry_of
from schemas import TOPICS, StepTelemetry, decode

pytestmark = pytest.mark.integration


def read_steps(settings, want: int, timeout_polls: int = 60) -> list[StepTelemetry]:
    consumer = make_consumer(settings, [registry_of(settings).name("steps")], None)
    got: list[StepTelemetry] = []
    try:
        for _ in range(timeout_polls):
            for records in consumer.poll(timeout_ms=500).values():
                got += [decode(StepTelemetry, r.value) for r in records]
            if len(got) >= want:
                break
    finally:
        consumer.close()
    return got


def test_node_aggregator_publishes_one_message_per_node_and_step(settings, tmp_path):
    create_topics(settings)
    path = tmp_path / "node.sock"
    agg = NodeAggregator(settings, path, ranks_per_node=4)
    server = threading.Thread(target=agg.serve, daemon=True)
    server.start()
    ranks = [
        StepExporter.to_aggregator(path, job_id="job-a", node="n9", register_atexit=False)
        for _ in range(4)
    ]
    for step in range(10):
        for local, exporter in enumerate(ranks):
            exporter.record_step(
                step,
                36 + local,
                step_time_s=1.0,
                compute_s=0.8,
                comm_wait_s=0.15,
                data_wait_s=0.05,
                local_rank=local,
            )
    for exporter in ranks:
        assert exporter.close().dropped == 0
    got = read_steps(settings, want=10)
    agg.stop()
    server.join(15)
    agg.close()
    assert [m.step for m in got] == list(range(10))
    assert all([s.rank for s in m.samples] == [36, 37, 38, 39] for m in got)
    assert agg.received == 40


def test_direct_exporter_publishes_steps_keyed_by_job(settings):
    create_topics(settings)
    exporter = StepExporter.direct(
        settings, job_id="job-b", node="n1", ranks_per_node=2, register_atexit=False
    )
    for step in range(5):
        for rank in range(2):
            exporter.record_step(
                step,
                rank,
                step_time_s=1.0,
                compute_s=0.8,
                comm_wait_s=0.15,
                data_wait_s=0.05,
                local_rank=rank,
            )
    stats = exporter.close()
    assert (stats.sent, stats.dropped) == (5 + 2, 0)  # 5 steps, the job's start and end
    got = read_steps(settings, want=5)
    assert sorted(m.step for m in got) == list(range(5))


def test_an_exporter_first_on_a_fresh_broker_creates_its_topics_as_the_registry_says(settings):
    """No service has created a topic yet: the exporter's sink creates the ones it
    writes with the registry's partitions, rather than the broker auto-creating them
    on the first send with its own count (1 on Kafka, 4 on Tansu; steps needs 8)."""
    registry = registry_of(settings)
    exporter = StepExporter.direct(
        settings, job_id="job-c", node="n2", ranks_per_node=1, register_atexit=False
    )
    exporter.record_step(0, 0, step_time_s=1.0, compute_s=0.8, comm_wait_s=0.15,
                         data_wait_s=0.05)  # fmt: skip
    assert exporter.close().dropped == 0
    probe = KafkaConsumer(**consumer_config(settings, None))
    try:
        got = {n: probe.partitions_for_topic(registry.name(n)) for n in CLIENT_TOPICS}
    finally:
        probe.close()
    assert got == {n: set(range(TOPICS[n].partitions)) for n in CLIENT_TOPICS}, got
    assert len(read_steps(settings, want=1)) == 1
