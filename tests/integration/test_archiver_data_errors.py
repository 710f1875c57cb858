"""The archiver never stops on data (issue 39, finding 4), on both ClickHouse backends.

An insert that ClickHouse refuses for its rows (a block spread over too many daily
partitions, a value beyond a column's type, a string longer than a FixedString, an Enum
element the column lacks) sends the smallest set of refused messages to the dead-letter
topic, with the error and the source offset, stores the rest and goes on; a later
record of another job is archived. Only a server that is down is retried (that case is
``test_archiver.py::test_unreachable_clickhouse_retries_then_fails_with_nothing_committed``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pipeline.io.errors import ArchiveRowError
from pipeline.io.kafka import create_topics, make_producer, publish, registry_of
from pipeline.services.archive.archiver import Archiver
from pipeline.services.archive.backend import ArchiveBackend
from schemas import JobEvent, JobEventKind

pytestmark = pytest.mark.integration

BURST = 300  # lifecycle events, each dated on another past day


def _event(job: str, ts: datetime, **kw: object) -> JobEvent:
    return JobEvent(job_id=job, kind=kw.pop("kind", JobEventKind.START), ts=ts, **kw)  # type: ignore[arg-type]


def _publish(settings, events: list[JobEvent]) -> list[int]:
    """Publish ``events`` to the lifecycle topic (one key: one partition, in order);
    their offsets."""
    registry = registry_of(settings)
    create_topics(settings)
    producer = make_producer(settings)
    try:
        futures = [publish(producer, registry, "lifecycle", e) for e in events]
        producer.flush()
        return [f.get(timeout=30).offset for f in futures]
    finally:
        producer.close()


def _archive(settings, archive: ArchiveBackend, *wants: tuple[str, int]) -> list[int]:
    """Run a fresh archiver (two insert attempts: a refusal taken for an outage ends it
    at once) until each ``(count_sql, want)`` counts ``want``, bounded by polls; the
    counts."""
    archiver = Archiver(settings, archive, max_batch=5000, max_wait_s=0.3, insert_attempts=2)
    got: list[int] = []
    try:
        for _ in range(40):
            archiver.poll_batch()
            got = [archive.query(sql)[1][0][0] for sql, _ in wants]
            if all(g >= want for g, (_, want) in zip(got, wants, strict=True)):
                break
    finally:
        archiver.close()
    return got


def _letters_sql(settings, archive: ArchiveBackend) -> str:
    topic = registry_of(settings).name("lifecycle")
    return (
        f"SELECT count() FROM {archive.database}.dead_letters FINAL "
        f"WHERE source_topic = '{topic}' AND stage = 'archive'"
    )


def _letters(settings, archive: ArchiveBackend) -> dict[int, str]:
    """Source offset -> error of the lifecycle topic's dead letters (stage 'archive')."""
    topic = registry_of(settings).name("lifecycle")
    _, rows = archive.query(
        f"SELECT offset, error FROM {archive.database}.dead_letters FINAL "
        f"WHERE source_topic = '{topic}' AND stage = 'archive'"
    )
    return {int(offset): str(error) for offset, error in rows}


def _burst_and_family(now: datetime) -> tuple[list[JobEvent], list[JobEvent]]:
    """300 events of job "burst" dated on 300 past days, and the events whose times
    DateTime cannot hold (before 1970, after 2106), in one batch."""
    burst = [
        _event("burst", now - timedelta(days=day), step=day, source=f"s{day}")
        for day in range(1, BURST + 1)
    ]
    bad = [
        _event("burst", datetime(1969, 12, 31, tzinfo=UTC), source="old"),
        _event("burst", datetime(2107, 1, 1, tzinfo=UTC), source="future"),
    ]
    return burst, bad


def test_a_burst_dated_on_300_past_days_is_archived_and_the_archiver_goes_on(settings, archive):
    now = datetime.now(UTC)
    burst, bad = _burst_and_family(now)
    # and 50 more dated on future days, in the same batch
    ahead = [_event("burst", now + timedelta(days=d), source=f"a{d}") for d in range(1, 51)]
    mixed = burst[:150] + bad[:1] + ahead + burst[150:] + bad[1:]
    offsets = _publish(settings, mixed)
    db = archive.database
    stored = (f"SELECT count() FROM {db}.job_events FINAL", BURST + len(ahead))
    assert _archive(settings, archive, stored, (_letters_sql(settings, archive), len(bad))) == [
        BURST + len(ahead),
        len(bad),
    ]
    _, rows = archive.query(
        f"SELECT uniqExact(toDate(ts)), uniqExact(toYYYYMMDD(received)) FROM {db}.job_events"
    )
    days, partitions = rows[0]
    # partitioned by when the archive stored them (one day, two across midnight)
    assert days == BURST + len(ahead) and partitions <= 2
    letters = _letters(settings, archive)
    want = {offsets[mixed.index(e)] for e in bad}
    assert set(letters) == want
    assert all("DateTime" in error for error in letters.values())
    # a later record of another job is archived by the next archiver
    later = _publish(settings, [_event("other", now, source="later")])
    other = f"SELECT count() FROM {db}.job_events FINAL WHERE job_id = 'other'"
    assert _archive(settings, archive, (other, 1)) == [1] and later


def _narrow_job_events(archive: ArchiveBackend) -> None:
    """Replace job_events with a table that takes less than the schema allows: its
    partitions by the writer's own time (as before migration 013), an Enum of two
    kinds, a FixedString source and an Int16 step; what ClickHouse refuses there is
    the rows' fault, like any column a future migration narrows."""
    db = archive.database
    archive.execute(f"DROP TABLE {db}.job_events")
    archive.execute(
        f"CREATE TABLE {db}.job_events (event_id String, job_id String, "
        "kind Enum8('start' = 0, 'phase' = 1), step Int16, phase String, "
        "expected_s Float64, reason String, run String, source FixedString(8), "
        "detail String, ts DateTime('UTC'), ts_ms UInt64, ver UInt64, "
        "received DateTime('UTC') DEFAULT now()) "
        "ENGINE = ReplacingMergeTree(ver) PARTITION BY toYYYYMMDD(ts) ORDER BY (job_id, event_id)"
    )


def test_refused_rows_are_the_smallest_set_and_the_good_ones_land(settings, archive):
    _narrow_job_events(archive)
    now = datetime.now(UTC)
    burst, bad_times = _burst_and_family(now)
    bad = [
        *bad_times,
        _event("burst", now, kind=JobEventKind.END, reason="completed", source="end"),
        _event("burst", now, source="longer-than-eight"),
        _event("burst", now, step=40_000, source="big"),
    ]
    mixed = [*burst[:100], bad[0], *burst[100:200], *bad[1:3], *burst[200:], *bad[3:]]
    offsets = _publish(settings, mixed)
    db = archive.database
    stored = (f"SELECT count() FROM {db}.job_events FINAL", BURST)
    # the block spread over 300 days is halved until each half fits (code 252 is the
    # rows' fault, not an outage); every good row lands
    assert _archive(settings, archive, stored, (_letters_sql(settings, archive), len(bad))) == [
        BURST,
        len(bad),
    ]
    letters = _letters(settings, archive)
    assert set(letters) == {offsets[mixed.index(e)] for e in bad}
    by_source = {e.source: letters[offsets[mixed.index(e)]] for e in bad}
    assert "DateTime" in by_source["old"] and "DateTime" in by_source["future"]
    assert "Enum8" in by_source["end"]
    assert "FixedString(8)" in by_source["longer-than-eight"]
    assert "Int16" in by_source["big"]
    later = _publish(settings, [_event("other", now, source="later")])
    other = f"SELECT count() FROM {db}.job_events FINAL WHERE job_id = 'other'"
    assert _archive(settings, archive, (other, 1)) == [1] and later


def test_a_partition_spread_insert_is_refused_as_the_rows_fault(archive):
    """The writer interface itself: ClickHouse's code 252 for a block over too many
    partitions (chDB; later servers) is a row error, never taken for an outage."""
    db = archive.database
    archive.execute(
        f"CREATE TABLE {db}.spread (ts DateTime('UTC'), n UInt8) ENGINE = MergeTree "
        "PARTITION BY toYYYYMMDD(ts) ORDER BY tuple()"
    )
    now = datetime.now(UTC)
    columns = {"ts": [now - timedelta(days=d) for d in range(150)], "n": [1] * 150}
    try:
        archive.insert("spread", columns)
    except ArchiveRowError as exc:  # never an ArchiveError: that would be retried
        assert "252" in str(exc) and "partitions" in str(exc)
    else:  # ClickHouse 18.16 has no max_partitions_per_insert_block
        assert archive.name == "server"
    half = {name: values[:75] for name, values in columns.items()}
    assert archive.insert("spread", half) == 75


@pytest.mark.parametrize(
    ("ch_type", "value", "says"),
    [
        ("UInt16", 70_000, "UInt16"),
        ("Int64", 2**70, "Int64"),
        ("DateTime('UTC')", datetime(1960, 1, 1, tzinfo=UTC), "DateTime"),
        ("DateTime('UTC')", datetime(2200, 1, 1, tzinfo=UTC), "DateTime"),
        ("FixedString(4)", "too long", "FixedString"),
        ("Enum8('a' = 0, 'b' = 1)", "c", "Enum8"),
    ],
)
def test_a_value_beyond_its_column_is_a_row_error_on_both_backends(archive, ch_type, value, says):
    db = archive.database
    archive.execute(f"CREATE TABLE {db}.narrow (v {ch_type}) ENGINE = MergeTree ORDER BY tuple()")
    with pytest.raises(ArchiveRowError, match=says):
        archive.insert("narrow", {"v": [value]})
    _, rows = archive.query(f"SELECT count() FROM {db}.narrow")
    assert rows == [(0,)]
