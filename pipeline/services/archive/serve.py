"""Read-only queries on a chDB archive while the archiver owns it.

chDB lets one process open a data directory at a time (a second one, even read-only,
fails), and it has no network endpoint. So the archiver, which owns the directory
while it runs, answers read-only queries on a Unix domain socket beside it
(:func:`query_socket_path`), and ``stepguard sql``/``query``/``report`` go through it
(:class:`pipeline.services.archive.client.ClientBackend`): one owner of the data, readers
welcome.

Protocol: one request per connection, each way a 4-byte big-endian length and that
many bytes of JSON.

- request: ``{"op": "query", "sql": str, "params": {name: str | int | float}}`` or
  ``{"op": "info"}``, at most :data:`MAX_REQUEST` bytes;
- response: ``{"columns": [...], "rows": [[...], ...]}`` (a DateTime as
  ``{"__dt__": ISO}``, NaN and infinities as JSON's non-standard literals, which
  Python's ``json`` reads), ``{"database": ..., "backend": ...}`` for ``info``, or
  ``{"error": "one line"}``; at most :data:`MAX_RESPONSE` bytes (a larger result is an
  error that says to add a LIMIT).

Only read-only statements run (:func:`~pipeline.services.archive.backend.read_only_problem`,
whatever the request says), on the archiver's own chDB session between its inserts
(the backend's lock), each under ClickHouse's time, memory and result limits
(:class:`~pipeline.services.archive.limits.QueryLimits`: checked while it runs and while its
result is built) and after the inserts waiting for the session, so an insert waits
for one query at most. The socket lives in a private directory (0700) and is itself
0600, and a connection from another user id is closed unanswered (``SO_PEERCRED``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import stat
import struct
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

from pipeline.io.errors import ArchiveError
from pipeline.services.archive.backend import ChdbBackend
from pipeline.services.archive.limits import QueryLimits

__all__ = [
    "MAX_REQUEST",
    "MAX_RESPONSE",
    "QueryServer",
    "decode_value",
    "encode_value",
    "query_socket_path",
    "recv_frame",
    "send_frame",
    "socket_address",
]

log = logging.getLogger(__name__)

#: Largest request accepted (SQL and parameters).
MAX_REQUEST = 1 << 20
#: Largest response sent or read: beyond it, ask for fewer rows.
MAX_RESPONSE = 64 << 20
#: A connection that sends nothing for this long is closed (one slow reader must
#: not keep the others waiting).
IO_TIMEOUT_S = 10.0
_LEN = struct.Struct(">I")
#: sun_path holds 108 bytes on Linux; longer paths are reached through /proc.
_SUN_PATH_MAX = 100
_DT = "__dt__"


def query_socket_path(chdb_path: Path) -> Path:
    """Where the archiver of the chDB archive at ``chdb_path`` answers queries: a
    private directory beside the data directory (never inside it: that is chDB's)."""
    path = Path(chdb_path).absolute()
    return path.with_name(path.name + ".query") / "socket"


@contextlib.contextmanager
def socket_address(path: Path) -> Any:
    """``path`` as a name ``bind``/``connect`` take: itself when short enough, else
    through ``/proc/self/fd`` of its directory (a pytest temporary directory easily
    passes the 108 bytes a Unix socket name may have)."""
    if len(os.fsencode(str(path))) <= _SUN_PATH_MAX:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


def send_frame(sock: socket.socket, payload: Any) -> None:
    data = json.dumps(payload, default=encode_value, separators=(",", ":")).encode()
    sock.sendall(_LEN.pack(len(data)) + data)


def recv_frame(sock: socket.socket, limit: int) -> Any:
    """One frame's JSON; a length beyond ``limit`` is refused before anything is read
    into memory."""
    (size,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if size > limit:
        raise ArchiveError(f"query socket: a frame of {size} bytes is over the limit of {limit}")
    try:
        return json.loads(_recv_exact(sock, size), object_hook=decode_value)
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError too
        raise ArchiveError(f"query socket: unreadable frame: {exc}") from None


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    parts, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ArchiveError("query socket: the connection closed mid-frame")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def encode_value(value: Any) -> Any:
    """JSON for what a query returns beyond JSON's own types (``json`` ``default``)."""
    if isinstance(value, datetime):
        return {_DT: value.isoformat()}
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return str(value)  # Decimal, UUID, ...: as text


def decode_value(obj: dict[str, Any]) -> Any:
    """The inverse of :func:`encode_value` (``json`` ``object_hook``)."""
    if len(obj) == 1 and _DT in obj and isinstance(obj[_DT], str):
        return datetime.fromisoformat(obj[_DT])
    return obj


class QueryServer:
    """Answers read-only queries on ``backend`` at ``path`` from a daemon thread,
    one connection at a time (queries run one at a time on chDB anyway), each under
    ``limits``. ``start()`` listens, ``close()`` stops and removes the socket; a
    context manager does both."""

    def __init__(self, backend: ChdbBackend, path: Path, limits: QueryLimits | None = None) -> None:
        self.backend = backend
        self.path = Path(path)
        self.limits = limits or QueryLimits()
        self.served = 0
        self.refused = 0
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def start(self) -> QueryServer:
        directory = self.path.parent
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = directory.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            raise ArchiveError(f"query socket: {directory} is not a directory of this user")
        os.chmod(directory, 0o700)  # an existing one too: only we may reach the socket
        # a socket left by an archiver that died: the chDB lock says none runs now
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with socket_address(self.path) as address:
                sock.bind(address)
            os.chmod(self.path, 0o600)
            sock.listen(8)
        except OSError as exc:
            sock.close()
            raise ArchiveError(f"query socket: cannot listen on {self.path}: {exc}") from exc
        sock.settimeout(0.5)  # accept wakes up to see a close
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name="archive-query", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=IO_TIMEOUT_S + 5)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def __enter__(self) -> QueryServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _serve(self) -> None:
        assert self._sock is not None
        while not self._stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if not self._stopping.is_set():
                    log.error("query socket %s: accept failed: %s", self.path, exc)
                return
            with conn:
                try:
                    self._answer(conn)
                except (OSError, ArchiveError) as exc:
                    log.warning("query socket: a connection failed: %s", exc)

    def _answer(self, conn: socket.socket) -> None:
        if not _same_user(conn):
            self.refused += 1
            log.warning("query socket: refused a connection from another user")
            return
        conn.settimeout(IO_TIMEOUT_S)
        try:
            request = recv_frame(conn, MAX_REQUEST)
        except ArchiveError as exc:
            self.refused += 1
            send_frame(conn, {"error": str(exc)})
            return
        response = self.handle(request)
        data = json.dumps(response, default=encode_value, separators=(",", ":")).encode()
        if len(data) > MAX_RESPONSE:
            rows = len(response.get("rows", ()))
            response = {
                "error": f"the result ({rows} rows, {len(data)} bytes) is over the query "
                f"socket's limit of {MAX_RESPONSE} bytes: add a LIMIT"
            }
            data = json.dumps(response).encode()
        conn.sendall(_LEN.pack(len(data)) + data)

    def handle(self, request: Any) -> dict[str, Any]:
        """The response to one decoded request (never raises for a bad request)."""
        if not isinstance(request, dict):
            self.refused += 1
            return {"error": "a request is a JSON object"}
        op = request.get("op", "query")
        if op == "info":
            return {"database": self.backend.database, "backend": self.backend.name}
        if op != "query":
            self.refused += 1
            return {"error": f"unknown op {str(op)[:40]!r}"}
        sql, params = request.get("sql"), request.get("params") or {}
        if not isinstance(sql, str) or not isinstance(params, dict):
            self.refused += 1
            return {"error": "a query needs sql (a string) and params (an object)"}
        try:
            # read-only whatever the request says: the archive is the archiver's
            columns, rows = self.backend.query(sql, params, readonly=True, limits=self.limits)
        except ArchiveError as exc:
            self.refused += 1
            return {"error": _one_line(str(exc))}
        self.served += 1
        return {"columns": columns, "rows": [list(r) for r in rows]}


def _one_line(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else "query failed"
    return first[:2000]


def _same_user(conn: socket.socket) -> bool:
    """Whether the peer runs as our user id (Linux ``SO_PEERCRED``; elsewhere the
    socket's 0600 mode is the only check)."""
    peercred = getattr(socket, "SO_PEERCRED", None)
    if peercred is None:  # pragma: no cover - not Linux
        return True
    creds = conn.getsockopt(socket.SOL_SOCKET, peercred, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid == os.getuid()
