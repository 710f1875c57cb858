"""The archiver in a child process, for the test that kills it between an insert and
its commit (``test_archiver.py``). Not a test module.

    python -m tests.integration.archiver_child stall|drain BOOTSTRAP FLAVOR PREFIX GROUP
                                               BACKEND DATABASE MARKER

``BACKEND`` is a ClickHouse server DSN (without the database) or a chDB directory.
``stall``: batches of 2 messages; after the first insert succeeded, write ``MARKER`` and
block inside the insert (the parent SIGKILLs the process there: rows stored, offsets
not committed). ``drain``: archive until a poll finds nothing, then print the steps
table's counts as JSON (chDB lets one process at a time open its directory, so the
parent cannot query it itself).
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

from pipeline.io.settings import load_settings
from pipeline.services.archive import ChdbBackend, ServerBackend, migrate
from pipeline.services.archive.archiver import Archiver


class _StallAfterFirstInsert:
    def __init__(self, inner: Any, marker: Path) -> None:
        self._inner = inner
        self._marker = marker

    def insert(self, table: str, columns: Any) -> int:
        n = self._inner.insert(table, columns)
        self._marker.write_text(f"{table} {n}\n")
        threading.Event().wait()  # until SIGKILL: the commit never comes
        return n

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def main(argv: list[str]) -> int:
    mode, bootstrap, flavor, prefix, group, where, database, marker = argv
    settings = load_settings(
        {}, kafka_bootstrap=bootstrap, broker_flavor=flavor, topic_prefix=prefix
    )
    if where.startswith("clickhouse://"):
        backend: Any = ServerBackend(f"{where}/{database}", timeout_s=20)
    else:
        backend = ChdbBackend(Path(where), database=database)
    migrate(backend)
    if mode == "stall":
        stalling = _StallAfterFirstInsert(backend, Path(marker))
        archiver = Archiver(settings, stalling, topics=["steps"], group_id=group, max_batch=2,
                            max_wait_s=0.3)  # fmt: skip
        while True:
            archiver.poll_batch()
    archiver = Archiver(settings, backend, topics=["steps"], group_id=group, max_wait_s=0.5)
    try:
        for _ in range(120):  # until a poll finds nothing, once something was stored
            if archiver.poll_batch() == 0 and archiver.stats.messages:
                break
    finally:
        archiver.close()
    db = backend.database
    _, final = backend.query(f"SELECT count(), uniqExact(node, rank, step) FROM {db}.steps FINAL")
    _, raw = backend.query(f"SELECT count() FROM {db}.steps")
    print(json.dumps({"final": final[0][0], "distinct": final[0][1], "raw": raw[0][0]}))
    backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
