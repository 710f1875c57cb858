"""The archive's replacing version is the ingest position, and steps are kept per run
(issue 14 item 6), on both backends; migration 005 upgrades an archive of version 4,
and 013 one of version 12 to partitions by the time a row was stored (issue 39)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from pipeline.services.archive import migrate, rows_for
from pipeline.services.archive.backend import ArchiveBackend
from pipeline.services.archive.migrations import (
    applied_migrations,
    available_migrations,
    split_statements,
)
from pipeline.services.archive.queries import QUERIES, run_query
from pipeline.services.archive.rows import ARCHIVED_VERSION, unverified_version
from tests.conftest import TEST_CLICKHOUSE, _fresh_chdb, _fresh_server, _missing
from tests.factories import samples, step_telemetry
from tests.integration.test_archive_health import HEALTH_V2_COLUMNS
from tests.integration.test_archive_work import WORK_COLUMNS

pytestmark = pytest.mark.integration


def _store(archive: ArchiveBackend, messages, offsets, *, before_014: bool = False) -> None:
    for table, cols in rows_for([(m, 0) for m in messages], offsets).items():
        drop = WORK_COLUMNS if before_014 and table == "steps" else ()  # they came with 014
        archive.insert(table, {c: v for c, v in cols.items() if c not in drop})


def test_a_later_record_under_the_same_key_does_not_rewrite_history(archive):
    first = samples()["decisions"]
    later = first.ts + timedelta(days=1)
    forged = first.model_copy(update={"summary": "nothing to see", "ts": later})
    _store(archive, [first], [5])
    _store(archive, [forged], [9])  # same key, newer timestamp, later in the log
    _store(archive, [first], [5])  # a replay of the first record
    _, rows = archive.query(f"SELECT summary, ver FROM {archive.database}.alerts FINAL")
    # unsigned: versioned in the band below every verified row, first one still wins
    assert rows == [(first.summary, unverified_version(5))]


def test_a_relaunched_run_keeps_the_abandoned_runs_steps(archive):
    abandoned = step_telemetry(step=7).model_copy(update={"run": "job-1/0"})
    relaunched = abandoned.model_copy(update={"run": "job-1/1"})
    _store(archive, [abandoned, relaunched, abandoned], [0, 1, 0])
    _, rows = archive.query(
        f"SELECT run, count() FROM {archive.database}.steps FINAL GROUP BY run ORDER BY run"
    )
    assert rows == [("job-1/0", 8), ("job-1/1", 8)]


@contextlib.contextmanager
def _archive_of_version_4(kind: str, shared_chdb, last: int = 4) -> Iterator[ArchiveBackend]:
    """An archive migrated up to ``last`` (4 unless told)."""
    if kind == "server":
        if not TEST_CLICKHOUSE:
            _missing("STEPGUARD_TEST_CLICKHOUSE is not set (no ClickHouse server)")
        backend: ArchiveBackend = _fresh_server()
    else:
        backend = _fresh_chdb(shared_chdb)
    assert applied_migrations(backend) == []  # creates the database and the ledger
    for version, name, sql in available_migrations():
        if version <= last:
            for stmt in split_statements(sql):
                backend.execute(stmt.replace("{db}", backend.database))
            at = datetime.now(UTC)
            backend.insert("schema_migrations", {"version": [version], "name": [name],
                                                 "applied_at": [at]})  # fmt: skip
    try:
        yield backend
    finally:
        backend.execute(f"DROP DATABASE IF EXISTS {backend.database}")
        if kind == "server":
            backend.close()


@pytest.mark.parametrize("kind", ["chdb", "server"])
def test_migration_005_keeps_old_rows_and_lets_nothing_replace_them(kind, _chdb_session):
    sent = samples()
    with _archive_of_version_4(kind, _chdb_session) as archive:
        db = archive.database
        # rows as the archiver wrote them before: no run, ver = the message's ts_ms
        old = rows_for([(m, 1_795_000_000_000) for m in sent.values()])
        old.pop("acks", None)  # the table came with 012
        for table, cols in old.items():
            # run (steps) came with 005, alerts.signed with 008, actions' and
            # approvals' with 010, command results' signed and at_ms with 011
            before = {c: v for c, v in cols.items() if c not in ("run", "signed", "at_ms")}
            if table == "health":  # came with 006
                before = {c: v for c, v in before.items() if c not in HEALTH_V2_COLUMNS}
            if table == "steps":  # the work columns came with 014
                before = {c: v for c, v in before.items() if c not in WORK_COLUMNS}
            before["ver"] = list(cols["ts_ms"])
            archive.insert(table, before)
            archive.insert(table, before)  # a replay, not merged yet
        assert {"005_ingest_version", "008_signed_alerts"} <= set(migrate(archive))
        assert migrate(archive) == []
        for table in old:
            _, rows = archive.query(f"SELECT count(), min(ver), max(ver) FROM {db}.{table}")
            n = 8 if table in ("steps", "health") else 1
            assert rows == [(n, ARCHIVED_VERSION, ARCHIVED_VERSION)], table
        # the first record under a key after the upgrade does not replace the old row
        later = sent["steps"].model_copy(update={"node": "forged"})
        _store(archive, [later], [0])
        _, rows = archive.query(f"SELECT DISTINCT node, run FROM {db}.steps FINAL")
        assert rows == [(sent["steps"].node, "")]
        # ... and a new run is a row of its own
        _store(archive, [later.model_copy(update={"run": "r2"})], [1])
        _, rows = archive.query(f"SELECT count() FROM {db}.steps FINAL")
        assert rows == [(16,)]
        # alerts archived before 008 are not known to be unsigned: the queries keep them
        _, rows = archive.query(f"SELECT signed FROM {db}.alerts")
        assert rows == [(-1,)]
        # results archived before 011: not known to be unsigned, counted at their own time
        _, rows = archive.query(f"SELECT signed, at_ms = ts_ms FROM {db}.command_results")
        assert rows == [(-1, 1)]
        assert run_query(archive, "incidents", job="job-1")[1]
        for name in QUERIES.keys() - {"top_nodes"}:
            run_query(archive, name, job="job-1", limit=5)
        run_query(archive, "top_nodes", limit=5)


@pytest.mark.parametrize("kind", ["chdb", "server"])
def test_migration_013_keeps_every_row_and_partitions_by_when_it_was_stored(kind, _chdb_session):
    now = datetime.now(UTC)
    with _archive_of_version_4(kind, _chdb_session, last=12) as archive:
        db = archive.database
        # an archive of 60 days: every kind of message once a day (the same identity
        # each day but for the steps, one step a day; the first record stored wins)
        days = []
        for d in range(60):
            at = now - timedelta(days=d)
            sent = {name: m.model_copy(update=_dated(m, at)) for name, m in samples().items()}
            sent["steps"] = step_telemetry(step=d + 1).model_copy(update=_dated(sent["steps"], at))
            days.append(sent)
        for d, sent in enumerate(days):  # one day an insert: under any partition limit
            _store(archive, list(sent.values()), [d] * len(sent), before_014=True)
        tables = sorted(rows_for([(m, 0) for m in days[0].values()]))
        summary = (
            f"SELECT count(), sum(ts_ms), sum(ver), uniqExact(toDate(ts)) FROM {db}.{{t}} FINAL"
        )
        before = {t: archive.query(summary.format(t=t))[1] for t in tables}
        assert before["steps"][0][0] == 60 * 8 and before["steps"][0][3] == 60
        assert migrate(archive)[:1] == ["013_receive_partitions"]  # then 014, ...
        after = {t: archive.query(summary.format(t=t))[1] for t in tables}
        assert after == before
        for table in tables:
            _, ddl = archive.query(f"SHOW CREATE TABLE {db}.{table}")
            assert "PARTITION BY toYYYYMMDD(received)" in str(ddl[0][0]), table
            _, parts = archive.query(
                "SELECT uniqExact(partition) FROM system.parts "
                f"WHERE database = '{db}' AND table = '{table}' AND active"
            )
            assert parts[0][0] <= 2, table  # the copy's day (two across midnight)
        for name in QUERIES.keys() - {"top_nodes"}:
            run_query(archive, name, job="job-1", limit=5)


def _dated(message, at: datetime) -> dict:
    """The update that dates ``message`` at ``at`` (each kind names its time)."""
    fields = type(message).model_fields
    return (
        {f: at for f in ("ts", "ts_start", "issued_at", "started_at") if f in fields}
        | ({"ts_end": at + timedelta(seconds=1)} if "ts_end" in fields else {})
        | ({"expires_at": at + timedelta(minutes=5)} if "expires_at" in fields else {})
    )
