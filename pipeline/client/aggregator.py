"""The node aggregator's core: ranks send records over a Unix socket, one producer per node.

Each rank's :class:`~pipeline.client.exporter.StepExporter` (``to_aggregator``) sends
datagrams of records; :class:`NodeAggregator` groups them per step and publishes one
StepTelemetry per node per step with a single Kafka producer. A record or lifecycle
event dated more than ``STEPGUARD_MAX_CLOCK_SKEW_S`` beyond this host's clock is not
published (counted in ``future_dated``, one warning per interval); a record whose times
are not numbers makes its datagram malformed.

It runs as the node agent ``stepguard export-node`` (:mod:`pipeline.agents.node`) or
inside the training job: the PyTorch integration's local rank 0 serves it in a thread
(:mod:`pipeline.client.pytorch`), which is why it stands on the client floor.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from pipeline.client.batcher import NAMED_FIELDS, WIRE_FIELDS, RankRecord, StepBatcher
from pipeline.client.sink import KafkaSink
from pipeline.io.clockskew import FutureGate
from pipeline.io.settings import ClientSettings
from schemas import JobEvent

__all__ = ["MessageSink", "NodeAggregator"]

log = logging.getLogger(__name__)


class MessageSink(Protocol):
    """Where the aggregator sends: a :class:`~pipeline.client.sink.KafkaSink`, or a rack
    link (:class:`pipeline.agents.rack.RackLink`: steps to the rack aggregator)."""

    def send(self, logical: str, msg: Any) -> Any: ...
    def flush(self, timeout: float) -> Any: ...
    def close(self) -> Any: ...


class NodeAggregator:
    """Receive rank records on ``socket_path`` and publish per-node step messages."""

    def __init__(
        self,
        settings: ClientSettings,
        socket_path: Path,
        *,
        ranks_per_node: int,
        max_wait_s: float = 2.0,
        sink: MessageSink | None = None,
    ) -> None:
        self.socket_path = Path(socket_path)
        self.sink: MessageSink = sink or KafkaSink(settings)
        self.batcher = StepBatcher(
            ranks_per_node, max_wait_s=max_wait_s, columnar=settings.steps_columnar == "all"
        )
        self.received = 0
        self.malformed = 0
        self._future = FutureGate(settings.max_clock_skew_s, "aggregator")
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
        self.sock.bind(str(self.socket_path))
        self.sock.settimeout(0.05)
        self._stop = threading.Event()

    def serve(self) -> None:
        """Receive until :meth:`stop`; then read what is still in the socket and flush
        what is buffered."""
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                data = b""
            if data:
                self._handle(data)
            for msg in self.batcher.expire(time.monotonic()):
                self.sink.send("steps", msg)
        self._drain_socket()  # what the ranks sent before the stop is not lost
        for msg in self.batcher.flush():
            self.sink.send("steps", msg)
        self.sink.flush(10.0)

    def _drain_socket(self) -> None:
        self.sock.setblocking(False)
        while True:
            try:
                data = self.sock.recv(65536)
            except (BlockingIOError, OSError):
                return
            self._handle(data)

    def _handle(self, data: bytes) -> None:
        try:
            rows = json.loads(data)
            if isinstance(rows, dict):  # a lifecycle event of the job
                event = JobEvent.model_validate(rows["event"])
                if self._future.admit(event.ts):
                    self.sink.send("lifecycle", event)
                return
            now = time.monotonic()
            records = [_record(row, now) for row in rows]
            records = [r for r in records if self._admit(r)]
        except (ValueError, TypeError, KeyError) as exc:
            self.malformed += 1
            log.warning("aggregator: malformed datagram: %s", exc)
            return
        for rec in records:
            self.received += 1
            for msg in self.batcher.add(rec):
                self.sink.send("steps", msg)

    def _admit(self, rec: RankRecord) -> bool:
        """False for a record dated too far ahead; TypeError when its times are not
        numbers (the datagram is malformed)."""
        for t in (rec.ts_start, rec.ts_end):
            if isinstance(t, bool) or not isinstance(t, int | float):
                raise TypeError(f"ts_start and ts_end must be numbers, got {t!r}")
        wall = self._future.clock()
        return self._future.admit(rec.ts_end, "ts_end", wall) and self._future.admit(
            rec.ts_start, "ts_start", wall
        )

    @property
    def future_dated(self) -> int:
        """Records and events not published: dated beyond the allowed clock skew."""
        return self._future.dropped

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        self.sink.close()


def _record(row: list[Any], now: float) -> RankRecord:
    """A rank's wire row as a record: its fields up to ``arrived``, then its run (absent
    from older exporters), then an object of its named fields (only those said).
    TypeError or ValueError when the row is not that (the datagram is malformed)."""
    if not isinstance(row, list):
        raise TypeError(f"a record must be a list, got {type(row).__name__}")
    head, tail = row[:WIRE_FIELDS], row[WIRE_FIELDS:]
    work: dict[str, Any] = {}
    if tail and isinstance(tail[-1], dict):
        work = tail.pop()
        unknown = set(work) - set(NAMED_FIELDS)
        if unknown:
            raise ValueError(f"unknown work fields {sorted(unknown)}")
    if len(head) != WIRE_FIELDS or len(tail) > 1:
        raise TypeError(f"a record has {WIRE_FIELDS} fields, its run and its work")
    fields = dict(zip(RankRecord._fields, head, strict=False))
    if tail:
        fields["run"] = tail[0]
    return RankRecord(**fields, arrived=now, **work)
