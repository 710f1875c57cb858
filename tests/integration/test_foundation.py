"""Every message type through a real broker and into ClickHouse on both backends."""

from __future__ import annotations

import pytest

from pipeline.io.kafka import (
    consume_decoded,
    create_topics,
    make_consumer,
    make_producer,
    publish,
    registry_of,
)
from pipeline.services.archive import migrate, rows_for
from pipeline.services.archive.archiver import Archiver
from pipeline.services.archive.migrations import applied_migrations, available_migrations
from schemas import TOPICS, DeadLetter, StepTelemetry, encode
from tests.factories import samples, step_telemetry

pytestmark = pytest.mark.integration


def _drain(consumer, registry, producer, want: int, max_polls: int = 200):
    """Poll until ``want`` decoded messages arrived (bounded by poll count, not time)."""
    got = []
    for _ in range(max_polls):
        got.extend(consume_decoded(consumer, registry, producer, timeout_ms=200))
        if len(got) >= want:
            break
    return got


def test_every_message_type_round_trips_through_the_broker(settings):
    registry = registry_of(settings)
    topics = create_topics(settings)
    producer = make_producer(settings)
    sent = samples()
    futures = [publish(producer, registry, logical, msg) for logical, msg in sent.items()]
    for fut in futures:
        fut.get(timeout=30)  # acknowledged by the broker
    consumer = make_consumer(settings, topics.values(), settings.consumer_group)
    try:
        got = _drain(consumer, registry, producer, want=len(sent))
    finally:
        consumer.close()
        producer.close()
    by_topic = {registry.logical_of(d.topic): d for d in got}
    assert set(by_topic) == set(TOPICS)
    for logical, msg in sent.items():
        received = by_topic[logical].message
        assert encode(received) == encode(msg)
        assert by_topic[logical].partition in range(TOPICS[logical].partitions)


def test_malformed_message_goes_to_dead_letter_and_good_ones_keep_flowing(settings):
    registry = registry_of(settings)
    create_topics(settings)
    producer = make_producer(settings)
    steps = registry.name("steps")
    good = [step_telemetry(step=i) for i in range(3)]
    publish(producer, registry, "steps", good[0]).get(timeout=30)
    bad_meta = producer.send(steps, key=b"job-1", value=b'{"job_id": 12, "truncated').get(
        timeout=30
    )
    for msg in good[1:]:
        publish(producer, registry, "steps", msg).get(timeout=30)

    consumer = make_consumer(settings, [steps], settings.consumer_group)
    dead_consumer = make_consumer(settings, [registry.name("deadletter")], None)
    try:
        got = _drain(consumer, registry, producer, want=3)
        consumer.commit()
        dead = _drain(dead_consumer, registry, producer, want=1)
    finally:
        consumer.close()
        dead_consumer.close()
        producer.close()
    assert sorted(d.message.step for d in got) == [0, 1, 2]
    assert len(dead) == 1
    letter = dead[0].message
    assert isinstance(letter, DeadLetter)
    assert (letter.source_topic, letter.partition, letter.offset) == (
        steps,
        bad_meta.partition,
        bad_meta.offset,
    )
    assert letter.raw == b'{"job_id": 12, "truncated'
    assert letter.key == b"job-1"
    assert "StepTelemetry" in letter.error


def test_migrations_apply_once_and_are_recorded(archive):
    shipped = [version for version, _, _ in available_migrations()]
    assert shipped[:5] == [1, 2, 3, 4, 5] and 8 in shipped
    assert applied_migrations(archive) == shipped
    assert migrate(archive) == []
    _, rows = archive.query(f"SELECT count() FROM {archive.database}.schema_migrations")
    assert rows == [(len(shipped),)]


def test_every_message_type_lands_in_the_archive_without_duplicates(archive):
    sent = samples()
    batch = [(msg, 1_795_000_000_000) for msg in sent.values()]
    for table, columns in rows_for(batch + batch).items():  # a replay: everything twice
        archive.insert(table, columns)
    db = archive.database
    expected = {
        "steps": 8, "health": 8, "alerts": 1, "commands": 1, "command_results": 1,
        "approvals": 1, "dead_letters": 1, "fault_truth": 1, "control_changes": 1,
        "actions": 1,
    }  # fmt: skip
    for table, n in expected.items():
        _, rows = archive.query(f"SELECT count() FROM {db}.{table} FINAL")
        assert rows == [(n,)], table
    _, rows = archive.query(f"SELECT node, rank, grade, state, deviation FROM {db}.alerts FINAL")
    assert rows == [("node-3", 27, "warning", "firing", 9.3)]
    _, rows = archive.query(f"SELECT targets, replacements, signed FROM {db}.commands FINAL")
    assert rows == [(["node-3"], ["spare-0"], 0)]
    _, rows = archive.query(f"SELECT count() FROM {db}.steps FINAL WHERE isNull(loss)")
    assert rows == [(0,)]


def test_broker_to_archive_end_to_end(settings, archive):
    """Exporter -> broker -> archiver -> ClickHouse, committed only after insert."""
    registry = registry_of(settings)
    create_topics(settings)
    producer = make_producer(settings)
    for step in range(5):
        for node in range(3):
            publish(
                producer,
                registry,
                "steps",
                step_telemetry(node=f"n{node}", step=step, first_rank=8 * node),
            )
    producer.send(registry.name("health"), key=b"n0", value=b"garbage").get(timeout=30)
    producer.flush()
    archiver = Archiver(settings, archive, max_batch=100, max_wait_s=0.5)
    try:
        for _ in range(60):
            archiver.poll_batch()
            _, rows = archive.query(f"SELECT count() FROM {archive.database}.steps FINAL")
            if rows[0][0] >= 5 * 3 * 8:
                break
        # the dead letter itself is archived too (it was produced to the deadletter topic)
        for _ in range(60):
            _, dl = archive.query(f"SELECT count() FROM {archive.database}.dead_letters")
            if dl[0][0] >= 1:
                break
            archiver.poll_batch()
    finally:
        archiver.close()
        producer.close()
    assert rows == [(120,)]
    _, rows = archive.query(
        f"SELECT source_topic, error != '' FROM {archive.database}.dead_letters FINAL"
    )
    assert rows == [(registry.name("health"), 1)]
    _, rows = archive.query(
        f"SELECT uniqExact(node), max(step) FROM {archive.database}.steps FINAL"
    )
    assert rows == [(3, 4)]


def test_step_telemetry_decodes_from_the_wire_as_the_model(settings):
    # the producer sends exactly the model's JSON: a non-Python consumer sees the same
    payload = encode(step_telemetry())
    assert isinstance(StepTelemetry.model_validate_json(payload), StepTelemetry)
