"""The ClickHouse archive: one small backend interface, two implementations.

``ServerBackend`` talks to a ClickHouse server with clickhouse-driver (production and
CI); ``ChdbBackend`` runs ClickHouse in-process with chDB (the embedded default). The
same migrations (``schemas/sql``) and queries run on both.
"""

from pipeline.services.archive.backend import (
    ArchiveBackend,
    ChdbBackend,
    ServerBackend,
    open_backend,
)
from pipeline.services.archive.migrations import applied_migrations, migrate
from pipeline.services.archive.rows import TABLE_OF, rows_for

__all__ = [
    "TABLE_OF",
    "ArchiveBackend",
    "ChdbBackend",
    "ServerBackend",
    "applied_migrations",
    "migrate",
    "open_backend",
    "rows_for",
]
