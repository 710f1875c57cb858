"""Migration 014 (issue 43): the steps table gains the work columns (tokens, flops,
max_seq_len); rows archived before read NULL, new rows carry what the rank said, a rank
that said nothing reads NULL, through both the model path and the fast decoder."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pipeline.services.archive import migrate, rows_for
from pipeline.services.archive.migrations import (
    applied_migrations,
    available_migrations,
    split_statements,
)
from pipeline.services.archive.rows import step_rows
from schemas import RankSample, StepTelemetry, encode
from tests.conftest import TEST_CLICKHOUSE, _fresh_chdb, _fresh_server, _missing

pytestmark = pytest.mark.integration

WORK_COLUMNS = frozenset({"tokens", "flops", "max_seq_len"})


def _step(node: str, step: int, ts: datetime, **work) -> StepTelemetry:
    samples = tuple(
        RankSample(rank=r, local_rank=r, step_time_s=1.0, compute_s=0.8, comm_wait_s=0.1,
                   data_wait_s=0.1, **(work if r == 1 else {}))
        for r in range(2)
    )  # fmt: skip
    return StepTelemetry(job_id="j", node=node, step=step, ts_start=ts, ts_end=ts,
                         samples=samples)  # fmt: skip


@pytest.mark.parametrize("kind", ["chdb", "server"])
def test_migration_014_adds_the_work_columns(kind, _chdb_session):
    if kind == "server":
        if not TEST_CLICKHOUSE:
            _missing("STEPGUARD_TEST_CLICKHOUSE is not set (no ClickHouse server)")
        archive = _fresh_server()
    else:
        archive = _fresh_chdb(_chdb_session)
    db = archive.database
    now = datetime.now(UTC).replace(microsecond=0)
    try:
        assert applied_migrations(archive) == []
        for version, name, sql in available_migrations():
            if version < 14:
                for stmt in split_statements(sql):
                    archive.execute(stmt.replace("{db}", db))
                archive.insert("schema_migrations", {"version": [version], "name": [name],
                                                     "applied_at": [now]})  # fmt: skip
        old = rows_for([(_step("old", 1, now), 0)], [0])["steps"]
        assert set(old) >= WORK_COLUMNS
        archive.insert("steps", {c: v for c, v in old.items() if c not in WORK_COLUMNS})
        assert "014_step_work" in migrate(archive)
        said = {"tokens": 2**40 + 3, "flops": 1.5e15, "max_seq_len": 8192}
        for table, cols in rows_for([(_step("new", 2, now, **said), 0)], [1]).items():
            archive.insert(table, cols)
        fast = step_rows([encode(_step("fast", 3, now, tokens=4096))])
        assert fast.stored == [0]
        archive.insert("steps", {**fast.columns, "ver": [1, 1]})
        _, rows = archive.query(
            f"SELECT node, rank, tokens, flops, max_seq_len FROM {db}.steps FINAL "
            "ORDER BY node, rank"
        )
        assert rows == [
            ("fast", 0, None, None, None),
            ("fast", 1, 4096, None, None),
            ("new", 0, None, None, None),
            ("new", 1, 2**40 + 3, 1.5e15, 8192),
            ("old", 0, None, None, None),
            ("old", 1, None, None, None),
        ]
    finally:
        archive.execute(f"DROP DATABASE IF EXISTS {db}")
        if kind == "server":
            archive.close()
