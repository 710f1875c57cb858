"""Reading the archive from the command line, whoever owns it.

:func:`open_reader` is what ``stepguard sql``, ``query`` and ``report`` open: the
ClickHouse server when a DSN is configured; on chDB, the archiver's query socket
(:mod:`pipeline.services.archive.serve`) when an archiver runs on that directory, else the
directory itself. :class:`ClientBackend` is the read side of
:class:`~pipeline.services.archive.backend.ArchiveBackend` over that socket.
"""

from __future__ import annotations

import json
import math
import socket
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from rich import box
from rich.console import Console
from rich.table import Table

from pipeline.io.errors import ArchiveError
from pipeline.io.settings import ArchiveSettings
from pipeline.services.archive.backend import (
    ArchiveBackend,
    ArchiveBusyError,
    bind_params,
    read_only_problem,
)
from pipeline.services.archive.serve import (
    MAX_REQUEST,
    MAX_RESPONSE,
    query_socket_path,
    recv_frame,
    send_frame,
    socket_address,
)

__all__ = ["ClientBackend", "json_lines", "open_reader", "print_rows", "rows_table"]


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


def open_reader(settings: ArchiveSettings) -> ArchiveBackend:
    """The archive for reading: the server (DSN), the archiver's query socket when an
    archiver owns the chDB directory, or the chDB directory itself.

    When another process holds the directory and no archiver answers, the error
    (:class:`~pipeline.services.archive.backend.ArchiveBusyError`) is one line naming it.
    """
    from pipeline.services import archive  # looked up per call: tests hand in their own

    if settings.clickhouse_dsn is not None:
        return archive.open_backend(settings)
    path = query_socket_path(settings.chdb_path)
    if path.exists():
        try:
            return ClientBackend(path)
        except ArchiveError:
            pass  # left by an archiver that is gone: its directory is free again
    try:
        return archive.open_backend(settings)
    except ArchiveBusyError as exc:
        raise ArchiveBusyError(
            f"{exc}; no archiver answers queries on {path}" if path.exists() else str(exc)
        ) from exc
    except ArchiveError as exc:
        raise ArchiveError(_first_line(str(exc))) from exc


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "cannot open the archive"


def _json_value(value: Any) -> Any:
    """A query value as strict JSON: datetimes in ISO 8601, non-finite floats as the
    strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (a NaN loss is a signal, not a
    NULL), arrays as lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        return _json_value(value.item())
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def json_lines(columns: list[str], rows: list[tuple[Any, ...]]) -> Iterator[str]:
    """One JSON object per row (``{column: value}``), strict JSON (:func:`_json_value`).

    >>> from datetime import UTC, datetime
    >>> list(json_lines(["t", "x"], [(datetime(2026, 1, 1, tzinfo=UTC), float("nan"))]))
    ['{"t": "2026-01-01T00:00:00+00:00", "x": "NaN"}']
    """
    for row in rows:
        yield json.dumps(
            {c: _json_value(v) for c, v in zip(columns, row, strict=True)}, allow_nan=False
        )


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):  # archive times are UTC
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def rows_table(columns: list[str], rows: list[tuple[Any, ...]]) -> Table:
    """A table that fits the console: cells wrap, and a word longer than its column
    (an id, a path) folds onto the next line instead of being cut; times stay whole."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for i, name in enumerate(columns):
        first = next((r[i] for r in rows if r[i] is not None), None)
        table.add_column(name, overflow="fold", no_wrap=isinstance(first, datetime))
    for row in rows:
        table.add_row(*(_cell(v) for v in row))
    return table


#: a table whose rows take more lines than this on average prints one block per row
_MAX_LINES_PER_ROW = 6


def _fits(columns: list[str], width: int) -> bool:
    """Whether a table of ``columns`` can show every column legibly in ``width``: each
    needs a few characters of its name and two of padding."""
    return sum(min(max(len(c), 4), 8) + 2 for c in columns) <= width


def _records(columns: list[str], rows: list[tuple[Any, ...]], out: Console) -> None:
    """Too many columns for the width: each row as ``column  value`` lines."""
    for i, row in enumerate(rows, start=1):
        out.rule(f"row {i}", align="left")
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=False, overflow="fold", style="bold")
        grid.add_column(overflow="fold")
        for name, value in zip(columns, row, strict=True):
            grid.add_row(name, _cell(value))
        out.print(grid)


def print_rows(
    columns: list[str], rows: list[tuple[Any, ...]], out: Console, *, as_json: bool
) -> None:
    """Rows as a table that fits ``out``'s width, or as JSON lines (``--json``)."""
    if as_json:
        for line in json_lines(columns, rows):
            out.file.write(line + "\n")
        out.file.flush()
        return
    if _fits(columns, out.width):
        table = rows_table(columns, rows)
        lines = out.render_lines(table, out.options, pad=False)
        # a row squeezed over many lines reads better as a block of its own
        if not rows or len(lines) <= _MAX_LINES_PER_ROW * (len(rows) + 2):
            out.print(table)
            return
    _records(columns, rows, out)
