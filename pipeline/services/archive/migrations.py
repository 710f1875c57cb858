"""Numbered SQL migrations from ``schemas/sql``, applied once and recorded."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from importlib import resources

from pipeline.services.archive.backend import ArchiveBackend

__all__ = ["applied_migrations", "available_migrations", "migrate", "split_statements"]

_NAME = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")


def available_migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) for every ``NNN_name.sql`` shipped with ``schemas``."""
    out = []
    for entry in resources.files("schemas").joinpath("sql").iterdir():
        m = _NAME.match(entry.name)
        if m:
            out.append((int(m.group(1)), m.group(2), entry.read_text()))
    return sorted(out)


def split_statements(sql: str) -> list[str]:
    lines = [ln for ln in sql.splitlines() if not ln.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def _ensure_ledger(backend: ArchiveBackend) -> None:
    db = backend.database
    backend.execute(f"CREATE DATABASE IF NOT EXISTS {db}")
    backend.execute(
        f"CREATE TABLE IF NOT EXISTS {db}.schema_migrations "
        "(version UInt32, name String, applied_at DateTime('UTC')) "
        "ENGINE = MergeTree ORDER BY version"
    )


def applied_migrations(backend: ArchiveBackend) -> list[int]:
    _ensure_ledger(backend)
    _, rows = backend.query(
        f"SELECT DISTINCT version FROM {backend.database}.schema_migrations ORDER BY version"
    )
    return [int(r[0]) for r in rows]


def migrate(backend: ArchiveBackend) -> list[str]:
    """Apply every migration not yet recorded; returns the names applied."""
    done = set(applied_migrations(backend))
    applied = []
    for version, name, sql in available_migrations():
        if version in done:
            continue
        for stmt in split_statements(sql):
            backend.execute(stmt.replace("{db}", backend.database))
        backend.insert(
            "schema_migrations",
            {"version": [version], "name": [name], "applied_at": [datetime.now(UTC)]},
        )
        applied.append(f"{version:03d}_{name}")
    return applied
