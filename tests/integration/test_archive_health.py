"""Migration 006 (NodeHealth version 2): the health table gains the silent-slowdown
columns; rows archived before read 0 / NULL, new rows carry the readings, on both
backends."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pipeline.services.archive import migrate, rows_for
from pipeline.services.archive.migrations import (
    applied_migrations,
    available_migrations,
    split_statements,
)
from schemas import GpuHealth, NodeHealth
from tests.conftest import TEST_CLICKHOUSE, _fresh_chdb, _fresh_server, _missing

pytestmark = pytest.mark.integration

#: Columns migration 006 adds to the health table.
HEALTH_V2_COLUMNS = frozenset(
    {
        "nvlink_crc_errors", "nvlink_replay_errors", "nvlink_links_down", "pcie_gen",
        "pcie_gen_max", "pcie_width", "pcie_width_max", "remap_pending", "remap_failed",
    }
)  # fmt: skip


def _report(node: str, ts: datetime, **gpu1) -> NodeHealth:
    gpus = tuple(
        GpuHealth(index=i, temperature_c=60.0, power_w=500.0, sm_clock_mhz=1980.0,
                  utilization_pct=99.0, **(gpu1 if i == 1 else {}))
        for i in range(2)
    )  # fmt: skip
    return NodeHealth(job_id="j", node=node, ts=ts, gpus=gpus)


@pytest.mark.parametrize("kind", ["chdb", "server"])
def test_migration_006_adds_the_health_signals(kind, _chdb_session):
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
            if version <= 5:
                for stmt in split_statements(sql):
                    archive.execute(stmt.replace("{db}", db))
                archive.insert("schema_migrations", {"version": [version], "name": [name],
                                                     "applied_at": [now]})  # fmt: skip
        old = rows_for([(_report("old", now), 0)], [0])["health"]
        assert set(old) >= HEALTH_V2_COLUMNS
        archive.insert("health", {c: v for c, v in old.items() if c not in HEALTH_V2_COLUMNS})
        assert "006_health_signals" in migrate(archive)
        new = _report(
            "new", now, nvlink_crc_errors=16, nvlink_replay_errors=30, nvlink_links_down=1,
            pcie_gen=5, pcie_gen_max=5, pcie_width=8, pcie_width_max=16, remap_pending=True,
        )  # fmt: skip
        for table, cols in rows_for([(new, 0)], [1]).items():
            archive.insert(table, cols)
        cols = ", ".join(sorted(HEALTH_V2_COLUMNS))
        _, rows = archive.query(
            f"SELECT node, gpu, {cols} FROM {db}.health FINAL ORDER BY node, gpu"
        )
        # nvlink_crc_errors, nvlink_links_down, nvlink_replay_errors, pcie_gen, pcie_gen_max,
        # pcie_width, pcie_width_max, remap_failed, remap_pending
        assert rows == [
            ("new", 0, 0, 0, 0, None, None, None, None, 0, 0),
            ("new", 1, 16, 1, 30, 5, 5, 8, 16, 0, 1),
            ("old", 0, 0, 0, 0, None, None, None, None, 0, 0),
            ("old", 1, 0, 0, 0, None, None, None, None, 0, 0),
        ]
    finally:
        archive.execute(f"DROP DATABASE IF EXISTS {db}")
        if kind == "server":
            archive.close()
