"""The rack aggregator: one steps message per rack per step instead of one per node.

A worker handles a few thousand records a second, so a 131,072-rank job in node-level
messages (16,384 a step) is faster than one worker at any step time under ~2 s. A rack
aggregator merges the node messages of its rack into one
:class:`~schemas.StepTelemetry` of version 3 (columns; each sample names its node, the
message's ``node`` names the rack; version 2, samples as objects, with
``STEPGUARD_STEPS_COLUMNAR=off`` for workers older than version 3): at 8 nodes of 8
GPUs a rack, that job sends 2,048 messages a step.

Node aggregators (``stepguard export-node --rack HOST:PORT``) send their per-node
messages to the rack over UDP (:class:`RackLink`; lifecycle events still go straight to
Kafka). :class:`RackAggregator` groups them per (job, run, step) and publishes a group
as soon as ``nodes_per_rack`` nodes reported, or ``max_wait_s`` after its first node
did. A node message arriving for a group already published is dropped and counted
(``late``): the worker would count it late too. Losing a rack aggregator silences one
sender: the worker assembles the job's steps without it (a few steps and seconds later,
:class:`~detectors.assembly.StepAssembler`) and its
nodes' ranks go missing, a signal per rank, never a job hang. Node-level and rack-level
senders mix freely in one job.

Examples
--------
>>> from datetime import UTC, datetime
>>> from schemas import RankSample
>>> t = datetime(2026, 1, 1, tzinfo=UTC)
>>> def node(n):
...     s = RankSample(rank=n, local_rank=0, step_time_s=1, compute_s=1, comm_wait_s=0,
...                    data_wait_s=0)
...     return StepTelemetry(job_id="j", node=f"n{n}", step=4, ts_start=t, ts_end=t,
...                          samples=(s,))
>>> b = RackBatcher("rack-0", nodes_per_rack=2)
>>> b.add(node(0), now=0.0)
[]
>>> [(m.schema_version, m.node, [s.node for s in m.samples]) for m in b.add(node(1), 0.1)]
[(3, 'rack-0', ['n0', 'n1'])]
>>> b.add(node(1), 0.2), b.late  # that step of that rack is out already
([], 1)
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline.client.sink import KafkaSink
from pipeline.io.clockskew import FutureGate
from pipeline.io.settings import Settings
from schemas import Message, Rejected, StepTelemetry, decode, encode

__all__ = ["RackAggregator", "RackBatcher", "RackLink", "merge_nodes", "run_rack_aggregator"]

log = logging.getLogger(__name__)

#: Largest datagram a node sends its rack (a node message of 8 ranks is ~2.5 KB).
MAX_DATAGRAM = 65_507


def merge_nodes(
    messages: Sequence[StepTelemetry], sender: str, *, columnar: bool = True
) -> StepTelemetry:
    """One version-3 message (version 2 unless ``columnar``) from the node messages of
    one step of one job.

    Every sample keeps its node; times span the nodes' (earliest start, latest end).
    """
    if not messages:
        raise ValueError("messages must not be empty")
    first = messages[0]
    if any((m.job_id, m.run, m.step) != (first.job_id, first.run, first.step) for m in messages):
        raise ValueError("messages mix jobs, runs or steps")
    samples = tuple(
        s if s.node is not None else s.model_copy(update={"node": m.node})
        for m in messages
        for s in m.samples
    )
    return StepTelemetry(
        schema_version=3 if columnar else 2, job_id=first.job_id, node=sender,
        step=first.step, run=first.run,
        ts_start=min(m.ts_start for m in messages), ts_end=max(m.ts_end for m in messages),
        samples=samples,
    )  # fmt: skip


@dataclass
class _Group:
    first_seen: float
    nodes: dict[str, StepTelemetry] = field(default_factory=dict)


class RackBatcher:
    """Group node messages per (job, run, step); pure, the caller supplies the time.

    Parameters
    ----------
    name
        The sender name of the rack's messages (not the name of any node).
    nodes_per_rack
        A group is published once this many distinct nodes reported.
    max_wait_s
        ... or this long after its first node did.
    max_pending
        Groups held at once; one more publishes the oldest early.
    max_done
        Published groups remembered, so that a late node is recognised.
    columnar
        Publish StepTelemetry version 3 (columns); False: version 2.
    """

    def __init__(
        self,
        name: str,
        nodes_per_rack: int,
        *,
        max_wait_s: float = 2.0,
        max_pending: int = 1024,
        max_done: int = 4096,
        columnar: bool = True,
    ) -> None:
        if nodes_per_rack < 1:
            raise ValueError(f"nodes_per_rack must be >= 1, got {nodes_per_rack!r}")
        if max_wait_s <= 0:
            raise ValueError(f"max_wait_s must be positive, got {max_wait_s!r}")
        if max_pending < 1 or max_done < 1:
            raise ValueError("max_pending and max_done must be >= 1")
        self.name = name
        self.nodes_per_rack = nodes_per_rack
        self.max_wait_s = max_wait_s
        self.max_pending = max_pending
        self.max_done = max_done
        self.columnar = columnar
        self._pending: OrderedDict[tuple[str, str, int], _Group] = OrderedDict()
        self._done: OrderedDict[tuple[str, str, int], None] = OrderedDict()
        self.late = 0  #: node messages for a group already published (dropped)
        self.duplicates = 0  #: a node's second message for one group (dropped)

    def add(self, msg: StepTelemetry, now: float) -> list[StepTelemetry]:
        """Add one node message; return the rack messages it completed."""
        key = (msg.job_id, msg.run, msg.step)
        if key in self._done:
            self.late += 1
            return []
        group = self._pending.get(key)
        if group is None:
            group = self._pending[key] = _Group(now)
        if msg.node in group.nodes:
            self.duplicates += 1
            return []
        group.nodes[msg.node] = msg
        out = []
        if len(group.nodes) >= self.nodes_per_rack:
            out.append(self._publish(key))
        while len(self._pending) > self.max_pending:
            out.append(self._publish(next(iter(self._pending))))
        return out

    def expire(self, now: float) -> list[StepTelemetry]:
        """The groups whose first node reported ``max_wait_s`` ago or more."""
        due = [k for k, g in self._pending.items() if now - g.first_seen >= self.max_wait_s]
        return [self._publish(k) for k in due]

    def flush(self) -> list[StepTelemetry]:
        """Every group held (at shutdown)."""
        return [self._publish(k) for k in list(self._pending)]

    def _publish(self, key: tuple[str, str, int]) -> StepTelemetry:
        group = self._pending.pop(key)
        self._done[key] = None
        while len(self._done) > self.max_done:
            self._done.popitem(last=False)
        return merge_nodes(list(group.nodes.values()), self.name, columnar=self.columnar)


class RackLink:
    """A node aggregator's sink when it reports to a rack: steps go over UDP to the
    rack aggregator, everything else (lifecycle events) to Kafka through ``fallback``.

    A datagram that cannot be sent is dropped and counted in ``stats.dropped``, as
    :class:`~pipeline.client.sink.KafkaSink` does: training never waits on telemetry.
    """

    def __init__(self, address: tuple[str, int], fallback: KafkaSink) -> None:
        self.address = address
        self.fallback = fallback
        self.stats = fallback.stats
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def send(self, logical: str, msg: Message) -> bool:
        if logical != "steps":
            return self.fallback.send(logical, msg)
        data = encode(msg)
        try:
            if len(data) > MAX_DATAGRAM:
                raise OSError(f"{len(data)} bytes is over one datagram")
            self.sock.sendto(data, self.address)
        except OSError as exc:
            log.debug("rack link: send failed: %s", exc)
            self.stats.dropped += 1
            return False
        self.stats.sent += 1
        return True

    def flush(self, timeout: float | None = None) -> None:
        self.fallback.flush(timeout)

    def close(self, timeout: float = 5.0) -> None:
        self.sock.close()
        self.fallback.close(timeout)


class RackAggregator:
    """Receive node messages on UDP ``listen``; publish one message per rack and step.

    Nothing received is trusted: a datagram that is not a valid node's StepTelemetry
    (version 1, or 3 without sample nodes) is counted in ``malformed`` (one warning
    each), one dated beyond ``STEPGUARD_MAX_CLOCK_SKEW_S`` in ``future_dated``; neither
    is published.
    """

    def __init__(
        self,
        settings: Settings,
        listen: tuple[str, int],
        *,
        name: str,
        nodes_per_rack: int,
        max_wait_s: float = 2.0,
        sink: KafkaSink | None = None,
    ) -> None:
        self.sink = sink or KafkaSink(settings)
        self.batcher = RackBatcher(
            name, nodes_per_rack, max_wait_s=max_wait_s, columnar=settings.steps_columnar != "off"
        )
        self.received = 0
        self.malformed = 0
        self._future = FutureGate(settings.max_clock_skew_s, "rack aggregator")
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
        self.sock.bind(listen)
        self.sock.settimeout(0.05)
        self.address: tuple[str, int] = self.sock.getsockname()[:2]
        self._stop = threading.Event()

    def serve(self) -> None:
        """Receive until :meth:`stop`; then publish what is held."""
        while not self._stop.is_set():
            try:
                data = self.sock.recv(MAX_DATAGRAM)
            except TimeoutError:
                data = b""
            now = time.monotonic()
            if data:
                self._handle(data, now)
            for msg in self.batcher.expire(now):
                self.sink.send("steps", msg)
        for msg in self.batcher.flush():
            self.sink.send("steps", msg)
        self.sink.flush(10.0)

    def _handle(self, data: bytes, now: float) -> None:
        msg = decode(StepTelemetry, data, topic="rack", max_bytes=MAX_DATAGRAM)
        if isinstance(msg, Rejected) or msg.samples[0].node is not None:  # a rack's
            self.malformed += 1
            why = msg.letter.error if isinstance(msg, Rejected) else "not a node's message"
            log.warning("rack aggregator: malformed datagram: %s", why[:300])
            return
        if not self._future.admit(msg.ts_end.timestamp(), "ts_end"):
            return
        self.received += 1
        for out in self.batcher.add(msg, now):
            self.sink.send("steps", out)

    @property
    def future_dated(self) -> int:
        """Node messages not published: dated beyond the allowed clock skew."""
        return self._future.dropped

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self.sock.close()
        self.sink.close()


def run_rack_aggregator(
    settings: Settings, listen: tuple[str, int], *, name: str, nodes_per_rack: int
) -> None:
    """``stepguard export-rack``: serve until SIGTERM/SIGINT."""
    agg = RackAggregator(settings, listen, name=name, nodes_per_rack=nodes_per_rack)
    signal.signal(signal.SIGTERM, lambda *_: agg.stop())
    log.info("rack aggregator %s listening on %s:%d", name, *agg.address)
    try:
        agg.serve()
    except KeyboardInterrupt:
        agg.stop()
    finally:
        with contextlib.suppress(OSError):
            agg.close()
