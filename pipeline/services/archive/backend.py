"""Archive backends: clickhouse-driver against a server, or embedded chDB."""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
import re
import struct
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import numpy as np

from pipeline.io.errors import ArchiveError, ArchiveRowError
from pipeline.io.redact import redact
from pipeline.io.settings import ArchiveSettings
from pipeline.services.archive.arrow import arrow_array
from pipeline.services.archive.columns import register_numpy_columns
from pipeline.services.archive.limits import QueryLimits, WaitingWriters, with_limits
from pipeline.services.archive.refusals import code_of, is_data_error, refused_value

__all__ = [
    "ArchiveBackend",
    "ArchiveBusyError",
    "ChdbBackend",
    "Columns",
    "ServerBackend",
    "bind_params",
    "chdb_holder",
    "open_backend",
    "read_only_problem",
]

#: Column name -> values, all the same length: either Python lists (the values the
#: driver takes: datetimes, enum names, None for NULL) or, for bulk inserts, numpy
#: arrays (enums as their integer codes, DateTime as UInt32 seconds, strings as object
#: arrays, a nullable column as a masked array whose mask is NULL; NaN stays NaN).
Columns = dict[str, Any]
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_ident(name: str) -> str:
    if not _IDENT.match(name):
        raise ArchiveError(f"invalid identifier {name!r}")
    return name


#: A query parameter, ClickHouse's own spelling: ``{name:Type}``.
_PARAM = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*):\s*([A-Za-z0-9]+)\s*\}")
_INT_BITS = {
    f"{sign}Int{bits}": (sign == "", bits) for sign in ("", "U") for bits in (8, 16, 32, 64)
}


def _typed(name: str, ch_type: str, value: Any) -> str | int | float:
    """``value`` as the Python type of ``ch_type``; a value of another type is refused,
    never converted from text (``"1 OR 1"`` is not a UInt32)."""
    if ch_type == "String":
        if not isinstance(value, str):
            raise ArchiveError(
                f"query parameter {name}: expected a str, got {type(value).__name__}"
            )
        return value
    if ch_type in _INT_BITS:
        signed, bits = _INT_BITS[ch_type]
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise ArchiveError(f"query parameter {name}: expected an int for {ch_type}")
        lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
        if not lo <= int(value) <= hi:
            raise ArchiveError(f"query parameter {name}: {int(value)} is out of {ch_type}")
        return int(value)
    if ch_type in ("Float32", "Float64"):
        if isinstance(value, bool) or not isinstance(value, int | float | np.number):
            raise ArchiveError(f"query parameter {name}: expected a number for {ch_type}")
        return float(value)
    raise ArchiveError(f"query parameter {name}: type {ch_type} is not supported")


def bind_params(sql: str, params: Mapping[str, Any] | None) -> dict[str, str | int | float]:
    """The typed values of the ``{name:Type}`` parameters ``sql`` uses.

    Every placeholder needs a value and every value must have the placeholder's type
    (String, (U)Int8..64, Float32/64); values the SQL does not use are ignored. The
    values travel beside the SQL, never inside its text: chDB binds them server-side,
    the server backend has clickhouse-driver escape them (ClickHouse 18.16 has no
    server-side parameters).
    """
    params = params or {}
    out: dict[str, str | int | float] = {}
    for found in _PARAM.finditer(sql):
        name, ch_type = found[1], found[2]
        if name not in params:
            raise ArchiveError(f"query parameter {name} has no value")
        value = _typed(name, ch_type, params[name])
        if name in out and out[name] != value:  # pragma: no cover - one value per name
            raise ArchiveError(f"query parameter {name} is declared twice")
        out[name] = value
    return out


#: Statements ``stepguard sql`` may run on chDB, which has no read-only connection.
_READ_ONLY_LEADS = frozenset({"SELECT", "SHOW", "DESCRIBE", "DESC", "EXPLAIN", "WITH"})
#: Words that change something; refused anywhere outside string literals and quoted
#: identifiers (``WITH ... INSERT``, ``SELECT ... INTO OUTFILE``).
_WRITE_WORDS = frozenset({
    "INSERT", "ALTER", "DROP", "CREATE", "DELETE", "UPDATE", "TRUNCATE", "RENAME", "ATTACH",
    "DETACH", "OPTIMIZE", "SYSTEM", "GRANT", "REVOKE", "KILL", "SET", "USE", "OUTFILE",
    "BACKUP", "RESTORE", "EXCHANGE", "MOVE", "UNDROP",
})  # fmt: skip


def _code_only(sql: str) -> str | None:
    """``sql`` with string literals and quoted identifiers blanked out; ``None`` when
    one is not closed or the text holds a comment or a heredoc (``$$...$$``), whose
    ends a checker could read differently from ClickHouse's own lexer."""
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c in "'\"`":
            j = i + 1
            while j < n and sql[j] != c:
                j += 2 if sql[j] == "\\" else 1
            if j >= n:
                return None
            out.append(" ")
            i = j + 1
        elif c in "#$" or sql.startswith(("--", "/*"), i):
            return None
        else:
            out.append(c)
            i += 1
    return "".join(out)


def read_only_problem(sql: str) -> str | None:
    """Why ``sql`` is not one read-only statement, or ``None`` if it is.

    Conservative: one statement (no ``;`` outside literals but one at the end), no
    comment, led by SELECT, SHOW, DESCRIBE, EXPLAIN or WITH, and no word that writes
    anywhere outside literals. It refuses some harmless queries (a column named
    ``update`` needs backticks) and never lets a write through.

    >>> read_only_problem("SELECT 'DROP; it' FROM t") is None
    True
    >>> read_only_problem("SELECT 1; DROP TABLE t")
    'only one statement may run'
    """
    code = _code_only(sql)
    if code is None:
        return "comments, heredocs and unterminated literals are not allowed"
    code = code.strip()
    if code.endswith(";"):
        code = code[:-1]
    if ";" in code:
        return "only one statement may run"
    words = [w.upper() for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", code)]
    if not words or words[0] not in _READ_ONLY_LEADS or not code[:1].isalpha():
        return "only SELECT, SHOW, DESCRIBE, EXPLAIN or WITH statements may run"
    if words[:2] == ["SHOW", "CREATE"]:  # SHOW CREATE TABLE reads a definition
        words = words[2:]
    writes = sorted(set(words) & _WRITE_WORDS)
    if writes:
        return f"{', '.join(writes)} is not allowed in a read-only query"
    return None


class ArchiveBackend(Protocol):
    """What the archiver, migrations, reports and ``stepguard sql`` need."""

    database: str
    name: str

    def execute(self, sql: str) -> None: ...

    def query(
        self, sql: str, params: Mapping[str, Any] | None = None, *, readonly: bool = False
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Rows of ``sql``. ``params`` bind its ``{name:Type}`` placeholders (values never
        become SQL text); ``readonly`` refuses anything that could change the archive."""
        ...

    def insert(self, table: str, columns: Columns) -> int: ...

    def close(self) -> None: ...


def _column_types(
    backend: ArchiveBackend, cache: dict[tuple[str, str], dict[str, str]], table: str
) -> dict[str, str]:
    """Column name -> ClickHouse type of ``table`` in ``backend``'s database, read with
    ``DESCRIBE TABLE`` once and kept in ``cache`` (each backend clears its cache when a
    statement may change a table's columns). ``table`` must be a plain identifier
    (:class:`ArchiveError` otherwise): it is written into the SQL."""
    key = (backend.database, table)
    if key not in cache:
        _, rows = backend.query(f"DESCRIBE TABLE {backend.database}.{_check_ident(table)}")
        cache[key] = {str(r[0]): str(r[1]) for r in rows}
    return cache[key]


class ServerBackend:
    """ClickHouse server over the native protocol (clickhouse-driver).

    Inserts always use ``INSERT INTO t (cols) VALUES`` with data passed separately:
    inline VALUES hang clickhouse-driver against 18.16 (docs/backends.md).
    """

    name = "server"

    def __init__(self, dsn: str, timeout_s: float = 30.0) -> None:
        from clickhouse_driver import Client

        parts = urlsplit(dsn)
        try:
            port = parts.port or 9000
        except ValueError:  # the message would quote the text after the colon
            raise ArchiveError("invalid ClickHouse DSN: the port is not a number") from None
        self.database = _check_ident((parts.path or "/default").strip("/") or "default")
        self._host = f"{parts.hostname}:{port}"
        # never in an error message: the DSN and its password (the driver's messages
        # quote what the server says, which could echo them)
        self._secrets = [dsn, parts.password or ""]

        def connect(use_numpy: bool) -> Any:
            return Client(
                host=parts.hostname or "127.0.0.1",
                port=port,
                user=parts.username or "default",
                password=parts.password or "",
                database="default",
                secure=parts.scheme == "clickhouses",
                connect_timeout=min(timeout_s, 10.0),
                send_receive_timeout=timeout_s,
                settings={"use_numpy": use_numpy},
            )

        self._client = connect(use_numpy=False)
        # the archiver inserts from its own thread while others may query
        self._lock = threading.RLock()
        self._types: dict[tuple[str, str], dict[str, str]] = {}
        # numpy arrays go through a second connection with the driver's numpy columns
        self._numpy_client = connect(use_numpy=True)

    def _run(self, sql: str, data: Any = None, client: Any = None, **kw: Any) -> Any:
        from clickhouse_driver.errors import Error as DriverError
        from clickhouse_driver.errors import NetworkError, SocketTimeoutError

        client = client or self._client
        try:
            with self._lock:  # a connection runs one query at a time
                if data is None:
                    return client.execute(sql, **kw)
                return client.execute(sql, data, **kw)
        except (NetworkError, SocketTimeoutError, OSError, EOFError) as exc:
            raise ArchiveError(self._message(exc)) from exc  # down: retried
        except DriverError as exc:
            # the server's refusal (ServerException) or the driver's own conversion of
            # a value (TypeMismatchError, TooLargeStringSize, an unknown Enum element):
            # the rows' fault or not, by ClickHouse's code (pipeline.services.archive.refusals)
            data = is_data_error(exc.code, str(exc))
            raise (ArchiveRowError if data else ArchiveError)(self._message(exc)) from exc
        except (ValueError, TypeError, OverflowError, struct.error) as exc:
            # a value the driver cannot convert to the column's type
            raise ArchiveRowError(self._message(repr(exc))) from exc

    def _message(self, exc: object) -> str:
        return redact(f"ClickHouse at {self._host}: {exc}", self._secrets)

    def execute(self, sql: str) -> None:
        self._types.clear()  # a statement may change a table's columns (a migration)
        self._run(sql)

    def query(
        self, sql: str, params: Mapping[str, Any] | None = None, *, readonly: bool = False
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """``params`` are typed Python values that clickhouse-driver escapes into the
        text it sends (18.16 has no server-side parameters); ``readonly`` runs with the
        server's ``readonly=1``, which refuses every write and settings change."""
        values = bind_params(sql, params)
        kw: dict[str, Any] = {"with_column_types": True}
        if readonly:
            kw["settings"] = {"readonly": 1}
        if values:
            # clickhouse-driver's own placeholders are %(name)s, its text goes through
            # Python's % formatting
            driver_sql = _PARAM.sub(lambda m: f"%({m[1]})s", sql.replace("%", "%%"))
            rows, types = self._run(driver_sql, values, **kw)
        else:
            rows, types = self._run(sql, **kw)
        return [name for name, _ in types], [tuple(r) for r in rows]

    def insert(self, table: str, columns: Columns) -> int:
        names = list(columns)
        if not names:
            return 0
        n = len(columns[names[0]])
        if n == 0:
            return 0
        sql = f"INSERT INTO {self.database}.{_check_ident(table)} ({', '.join(names)}) VALUES"
        types = _column_types(self, self._types, table)
        if problem := refused_value(table, columns, types):
            raise ArchiveRowError(self._message(problem))
        if not any(isinstance(columns[c], np.ndarray) for c in names):
            self._run(sql, [columns[c] for c in names], columnar=True)
            return n
        register_numpy_columns()
        _register_numpy_enums(types.values())
        data = _for_numpy_driver([columns[c] for c in names])
        self._run(sql, data, client=self._numpy_client, columnar=True)
        return n

    def close(self) -> None:
        self._client.disconnect()
        self._numpy_client.disconnect()


def _for_numpy_driver(columns: list[Any]) -> list[Any]:
    """Columns as clickhouse-driver's numpy columns take them, with the writers of
    :mod:`~pipeline.services.archive.columns`: numpy arrays (masked ones with their mask
    as NULL, a NaN stays a NaN: ``test_nan_and_null_losses_stay_apart``) as they are, a
    list as an object array."""
    return [v if isinstance(v, np.ndarray) else np.asarray(v, dtype=object) for v in columns]


_NUMPY_ENUMS: set[str] = set()


def _register_numpy_enums(types: Any) -> None:
    """Teach clickhouse-driver's numpy inserts our Enum8 columns.

    clickhouse-driver 0.2 has no numpy Enum column and falls back to its generic one,
    which converts item by item (0.6 us a row: the largest cost of a steps insert)
    and logs a warning per insert. An Enum8 is an Int8 on the wire, so we register an
    Int8 numpy column under the exact Enum8 type name; values are the enum's codes.
    """
    for ch_type in types:
        if not ch_type.startswith("Enum8(") or ch_type in _NUMPY_ENUMS:
            continue
        try:
            from clickhouse_driver.columns.numpy import service
        except ImportError:  # pragma: no cover - the driver's generic column still works
            return
        int8 = service.column_by_type["Int8"]  # columns.register_numpy_columns's, once run
        service.column_by_type[ch_type] = type("NumpyEnum8Column", (int8,), {"ch_type": ch_type})
        _NUMPY_ENUMS.add(ch_type)


class ArchiveBusyError(ArchiveError):
    """Another process has the chDB data directory open (one at a time)."""


def chdb_holder(path: Path) -> int | None:
    """The id of the process that holds chDB's lock on the data directory ``path`` (0
    when its status file does not say), or ``None`` when nobody holds it.

    ClickHouse keeps an exclusive ``flock`` on ``<path>/status`` while it runs and
    writes its ``PID:`` there.
    """
    status = Path(path) / "status"
    try:
        fd = os.open(status, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            found = re.search(rb"PID: (\d+)", os.read(fd, 4096))
            return int(found[1]) if found else 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class ChdbBackend:
    """ClickHouse in-process (chDB). One process owns a data directory at a time."""

    name = "chdb"

    def __init__(self, path: Path, database: str = "stepguard") -> None:
        try:
            from chdb import session
        except ImportError as exc:  # pragma: no cover - chdb is a dependency
            raise ArchiveError("chdb is not installed") from exc
        self.database = _check_ident(database)
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._check_free()  # before chDB prints its own complaint
        try:
            self._session = session.Session(str(self.path))
        except Exception as exc:  # chdb raises plain exceptions
            self._check_free()
            raise ArchiveError(f"cannot open chDB at {self.path}: {exc}") from exc
        self._types: dict[tuple[str, str], dict[str, str]] = {}
        self._lock = threading.RLock()  # one query at a time, from any thread
        # statements (the archiver's inserts) waiting for the lock: a limited query
        # (the query socket's) lets them go first, so each waits for one query at most;
        # shared, like the lock, by the clones of with_database
        self._writers = WaitingWriters()
        # NaN loss is a signal: keep it distinct from NULL in query results.
        self.execute("SET output_format_json_quote_denormals = 1")

    def _check_free(self) -> None:
        holder = chdb_holder(self.path)
        if holder is not None and holder != os.getpid():  # our own: chDB's to judge
            raise ArchiveBusyError(
                f"the chDB archive at {self.path} is open in process {holder or '(unknown)'}, "
                "and chDB lets one process at a time open it: stop that process (while it "
                "is `stepguard archiver`, `stepguard sql`, `query` and `report` read "
                "through it)"
            )

    def with_database(self, database: str) -> ChdbBackend:
        """The same session (one chDB path per process) working in another database."""
        clone = copy.copy(self)
        clone.database = _check_ident(database)
        return clone

    def execute(self, sql: str) -> None:
        self._types.clear()  # a statement may change a table's columns (a migration)
        self._writers.arrive()
        try:
            with self._lock:
                self._run(sql)
        except Exception as exc:
            data = is_data_error(code_of(str(exc)), str(exc))
            raise (ArchiveRowError if data else ArchiveError)(f"chDB: {exc}") from exc
        finally:
            self._writers.leave()

    def _run(self, sql: str, fmt: str = "CSV", params: dict[str, str] | None = None) -> Any:
        """One statement on the session (the lock held). chDB hands what a failed query
        had already written out to the *next* query's result: a query cut short by a
        limit would put its rows before another's, so after a failure one throwaway
        query takes them."""
        try:
            return self._session.query(sql, fmt, params=params)
        except Exception:
            with contextlib.suppress(Exception):
                self._session.query("SELECT 1", "CSV")
            raise

    def query(
        self,
        sql: str,
        params: Mapping[str, Any] | None = None,
        *,
        readonly: bool = False,
        limits: QueryLimits | None = None,
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Rows typed like clickhouse-driver's: aware UTC datetimes, enum names, NaN.

        ``params`` are bound by chDB itself (``{name:Type}``, query parameters);
        ``readonly`` refuses anything but one SELECT/SHOW/DESCRIBE/EXPLAIN/WITH
        statement (:func:`read_only_problem`): chDB's session has no read-only mode.
        ``limits`` (read-only too) run it under ClickHouse's time, memory and result
        limits, after the inserts waiting for the session (:mod:`.limits`).
        """
        if (readonly or limits) and (problem := read_only_problem(sql)):
            raise ArchiveError(f"chDB: refused: {problem}")
        values = bind_params(sql, params)
        text = sql.rstrip().rstrip(";")
        if limits is not None:
            text = with_limits(text, limits)
            self._writers.wait_none(limits.wait_s)  # the waiting inserts first, for a while
        try:
            with self._lock:
                res = self._run(
                    text,
                    "JSONCompactEachRowWithNamesAndTypes",
                    params={k: _chdb_param(v) for k, v in values.items()} or None,
                )
        except Exception as exc:
            raise ArchiveError(f"chDB: {exc}") from exc
        lines = [ln for ln in str(res).splitlines() if ln.strip()]
        if len(lines) < 2:
            return [], []
        names, types = json.loads(lines[0]), json.loads(lines[1])
        convert = [_converter(t) for t in types]
        rows = []
        for line in lines[2:]:
            values = json.loads(line)
            rows.append(tuple(f(v) for f, v in zip(convert, values, strict=True)))
        return names, rows

    def insert(self, table: str, columns: Columns) -> int:
        """Insert through Arrow (``INSERT ... SELECT FROM Python(table)``), typed from the
        table's own column types so that empty arrays and all-NULL columns convert."""
        import pyarrow as pa

        names = list(columns)
        if not names:
            return 0
        n = len(columns[names[0]])
        if n == 0:
            return 0
        types = _column_types(self, self._types, table)
        if problem := refused_value(table, columns, types):
            # Arrow would store a DateTime past 2106 as 2106 and cut a FixedString
            raise ArchiveRowError(f"chDB: {problem}")
        try:
            arrow_rows = pa.table(  # noqa: F841 - read by chDB through Python(arrow_rows)
                {c: arrow_array(columns[c], types[c]) for c in names}
            )
        except KeyError as exc:
            raise ArchiveError(f"chDB: {table} has no column {exc}") from exc
        except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
            raise ArchiveRowError(f"chDB: cannot build rows for {table}: {exc}") from exc
        sql = (
            f"INSERT INTO {self.database}.{_check_ident(table)} ({', '.join(names)}) "
            f"SELECT {', '.join(names)} FROM Python(arrow_rows)"
        )
        self.execute(sql)
        return n

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing twice is harmless
            self._session.close()


def _chdb_param(value: str | int | float) -> str:
    """A parameter value as ClickHouse parses it: strings in the escaped (TSV) form,
    where a backslash starts an escape sequence."""
    if not isinstance(value, str):
        return repr(value)
    for raw, escaped in (
        ("\\", "\\\\"),
        ("\t", "\\t"),
        ("\n", "\\n"),
        ("\r", "\\r"),
        ("\0", "\\0"),
    ):
        value = value.replace(raw, escaped)
    return value


def _converter(ch_type: str) -> Callable[[Any], Any]:
    base = (
        ch_type.removeprefix("Nullable(").rstrip(")")
        if ch_type.startswith("Nullable(")
        else ch_type
    )
    if base.startswith("DateTime"):
        return lambda v: None if v is None else datetime.fromisoformat(v).replace(tzinfo=UTC)
    if base.startswith("Float"):
        return lambda v: float(v) if isinstance(v, str) else v
    return lambda v: v


def open_backend(settings: ArchiveSettings) -> ServerBackend | ChdbBackend:
    """The backend the settings choose: a server DSN if given, else chDB at chdb_path."""
    if settings.clickhouse_dsn is not None:
        return ServerBackend(settings.clickhouse_dsn.get_secret_value())
    return ChdbBackend(settings.chdb_path)
