"""Reading the archive from the command line, whoever owns it.

:func:`open_reader` is what ``stepguard sql``, ``query`` and ``report`` open: the
ClickHouse server when a DSN is configured; on chDB, the archiver's query socket
(:mod:`pipeline.archive.serve`) when an archiver runs on that directory, else the
directory itself. :class:`ClientBackend` is the read side of
:class:`~pipeline.archive.backend.ArchiveBackend` over that socket.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.archive.backend import ChdbBackend, ServerBackend, bind_params, read_only_problem
from pipeline.archive.serve import (
    MAX_REQUEST,
    MAX_RESPONSE,
    query_socket_path,
    recv_frame,
    send_frame,
    socket_address,
)
from pipeline.errors import ArchiveError
from pipeline.settings import Settings

__all__ = ["ClientBackend", "open_reader"]


class ClientBackend:
    """Read-only queries through a running archiver's query socket.

    ``query`` takes what :meth:`ChdbBackend.query` takes and returns the same rows
    (aware datetimes, NaN); every statement runs read-only, so ``execute`` and
    ``insert`` are errors. The database is the archiver's.
    """

    name = "chdb (through the archiver)"

    def __init__(self, path: Path, timeout_s: float = 60.0) -> None:
        self.path = Path(path)
        self.timeout_s = timeout_s
        info = self._request({"op": "info"})
        database = info.get("database")
        if not isinstance(database, str):
            raise ArchiveError(f"query socket {self.path}: no database in its answer")
        self.database = database

    def _request(self, request: dict[str, Any]) -> dict[str, Any]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout_s)
        try:
            with socket_address(self.path) as address:
                sock.connect(address)
            send_frame(sock, request)
            response = recv_frame(sock, MAX_RESPONSE)
        except OSError as exc:
            raise ArchiveError(f"query socket {self.path}: {exc}") from exc
        finally:
            sock.close()
        if not isinstance(response, dict):
            raise ArchiveError(f"query socket {self.path}: unreadable answer")
        if "error" in response:
            raise ArchiveError(f"archiver: {response['error']}")
        return response

    def query(
        self, sql: str, params: Mapping[str, Any] | None = None, *, readonly: bool = True
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Rows of ``sql``, run read-only by the archiver (``readonly`` is always on)."""
        if problem := read_only_problem(sql):
            raise ArchiveError(f"refused: {problem}")
        values = {
            k: v.item() if isinstance(v, np.generic) else v for k, v in (params or {}).items()
        }
        bind_params(sql, values)  # a bad value is refused here, naming it
        request = {"op": "query", "sql": sql, "params": values}
        if len(sql) > MAX_REQUEST // 2:
            raise ArchiveError(f"query too long ({len(sql)} characters)")
        response = self._request(request)
        columns, rows = response.get("columns"), response.get("rows")
        if not isinstance(columns, list) or not isinstance(rows, list):
            raise ArchiveError(f"query socket {self.path}: unreadable answer")
        return [str(c) for c in columns], [tuple(r) for r in rows]

    def execute(self, sql: str) -> None:
        raise ArchiveError(
            f"the chDB archive is open in the archiver; only read-only queries go through "
            f"{self.path} (stop the archiver to change the archive)"
        )

    def insert(self, table: str, columns: Any) -> int:
        self.execute(f"INSERT INTO {table}")
        return 0  # pragma: no cover - execute raises

    def close(self) -> None:
        """Nothing to close: each query is one connection."""


def open_reader(settings: Settings) -> ServerBackend | ChdbBackend | ClientBackend:
    """The archive for reading: the server (DSN), the archiver's query socket when an
    archiver owns the chDB directory, or the chDB directory itself.

    When the directory is locked and no archiver answers, the error is one line that
    says so (chDB allows one process per directory).
    """
    if settings.clickhouse_dsn is not None:
        return ServerBackend(settings.clickhouse_dsn.get_secret_value())
    path = query_socket_path(settings.chdb_path)
    if path.exists():
        try:
            return ClientBackend(path)
        except ArchiveError:
            pass  # left by an archiver that is gone: its directory is free again
    try:
        return ChdbBackend(settings.chdb_path)
    except ArchiveError as exc:
        raise ArchiveError(
            f"cannot open the chDB archive at {settings.chdb_path}: another process has it "
            f"open (chDB allows one at a time) and no archiver answers on {path}; stop that "
            "process, or run `stepguard archiver`, which serves queries while it runs"
            if path.exists() or _locked_message(str(exc))
            else str(exc).splitlines()[0]
        ) from exc


def _locked_message(text: str) -> bool:
    return any(s in text for s in ("Cannot lock file", "Another server instance", "EmbeddedServer"))
