"""Retention: drop whole daily partitions older than a cutoff (cheap on ClickHouse).

Since migration 013 a table's daily partitions are by ``received`` (when the archive
stored the row, the server's clock), so retention counts from then: a record dated
a year back by its writer is kept as long as one dated today."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pipeline.services.archive.backend import ArchiveBackend

__all__ = ["ARCHIVE_TABLES", "prune"]

ARCHIVE_TABLES = (
    "steps", "health", "alerts", "commands", "command_results", "approvals",
    "dead_letters", "fault_truth", "control_changes", "actions", "acks",
)  # fmt: skip


def prune(
    backend: ArchiveBackend, older_than: timedelta, now: datetime | None = None,
    dry_run: bool = False,
) -> list[tuple[str, int]]:  # fmt: skip
    """Drop every daily partition entirely older than ``now - older_than``.

    Returns (table, partition) pairs dropped (or that would be, with ``dry_run``).
    """
    cutoff = (now or datetime.now(UTC)) - older_than
    # a day's partition is droppable when the whole day lies before the cutoff
    last_droppable = int((cutoff - timedelta(days=1)).strftime("%Y%m%d"))
    tables = ", ".join(f"'{t}'" for t in ARCHIVE_TABLES)
    _, rows = backend.query(
        "SELECT DISTINCT table, partition FROM system.parts "
        f"WHERE database = '{backend.database}' AND active AND table IN ({tables}) "
        "ORDER BY table, partition"
    )
    dropped = []
    for table, partition in rows:
        part = int(str(partition).strip("'"))
        if part <= last_droppable:
            if not dry_run:
                backend.execute(f"ALTER TABLE {backend.database}.{table} DROP PARTITION {part}")
            dropped.append((str(table), part))
    return dropped
