"""Steps sent as columns (StepTelemetry version 3) archive the rows their version-1 or
version-2 equivalents archive, on chDB and on the ClickHouse server, through the
archiver (its column path: ``pipeline.services.archive.columns`` on the server, Arrow
on chDB), and a replay of the same records leaves the same rows."""

from __future__ import annotations

import math

import pytest

from pipeline.io.kafka import create_topics, make_producer, publish, registry_of
from pipeline.services.archive.archiver import Archiver
from tests.conftest import fresh_archive, fresh_settings
from tests.unit.pipeline.services.archive.test_columnar_rows import _as_v3, _message

pytestmark = pytest.mark.integration


def _publish(settings, messages) -> None:
    registry = registry_of(settings)
    create_topics(settings, ["steps", "deadletter"])
    producer = make_producer(settings)
    for m in messages:
        publish(producer, registry, "steps", m)
    producer.flush()
    producer.close()


def _archive(settings, archive, group: str, want: int) -> int:
    """Archive the topic from the start with a fresh ``group``: the rows it stored."""
    archiver = Archiver(settings, archive, topics=["steps"], group_id=group, max_wait_s=0.3)
    try:
        for _ in range(60):  # bounded by polls, not time
            archiver.poll_batch()
            if archiver.stats.fetched >= want and archiver.poll_batch() == 0:
                break
    finally:
        archiver.close()
    assert archiver.stats.dead_letters == 0
    return archiver.stats.rows


def _rows(archive) -> list[tuple]:
    """Every steps row (FINAL) but ``received`` (when the archive stored it), NaN
    spelled out so that rows compare."""
    db = archive.database
    _, described = archive.query(f"DESCRIBE TABLE {db}.steps")
    names = [r[0] for r in described if r[0] != "received"]
    _, rows = archive.query(
        f"SELECT {', '.join(names)} FROM {db}.steps FINAL ORDER BY run, job_id, step, rank"
    )
    return [tuple(map(_nan, r)) for r in rows]


def _nan(v):
    return "NaN" if isinstance(v, float) and math.isnan(v) else v


def _as_sent(messages) -> list[tuple]:
    """What the archive must hold of each sample (NULL where it said nothing; the
    node that sent it: the steps table keeps the sender, a rack's for version 2)."""
    return sorted(
        (m.step, s.rank, m.node, s.phase.value, _nan(s.loss), s.grad_norm, s.tokens,
         s.flops, s.max_seq_len)
        for m in messages
        for s in m.samples
    )  # fmt: skip


def test_v3_steps_archive_the_rows_of_the_same_v1_and_v2_steps(settings, archive, _chdb_session):
    old = [_message(1, s) for s in range(4)] + [_message(2, s) for s in range(4, 8)]
    new = [_as_v3(m) for m in old]
    as_columns = fresh_settings(settings)
    _publish(settings, old)
    _publish(as_columns, new)
    _archive(settings, archive, f"{settings.consumer_group}.old", len(old))
    with fresh_archive(archive.name, _chdb_session) as columns_archive:
        _archive(as_columns, columns_archive, f"{as_columns.consumer_group}.new", len(new))
        want = _rows(archive)
        assert len(want) == 8 * len(old)
        _, stored = columns_archive.query(
            "SELECT step, rank, node, phase, loss, grad_norm, tokens, flops, max_seq_len "
            f"FROM {columns_archive.database}.steps FINAL ORDER BY step, rank"
        )
        assert [tuple(map(_nan, r)) for r in stored] == _as_sent(old)
        assert _rows(columns_archive) == want
        # a replay of the same records (another group from the start) changes nothing
        again = _archive(as_columns, columns_archive, f"{as_columns.consumer_group}.re", len(new))
        assert again == len(want)  # stored again ...
        assert _rows(columns_archive) == want  # ... and collapsed by FINAL
