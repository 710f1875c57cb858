"""``StepExporter``: the training-loop hook, one call per rank per step, never blocking.

``record_step`` appends a tuple to a bounded deque (well under 20 µs); a background
thread turns records into one StepTelemetry per node per step and sends them. When the
queue is full (broker down, sender stuck) the record is dropped and counted — the
training loop never waits for telemetry. A record whose ``ts_end`` or ``ts_start`` lies
more than ``STEPGUARD_MAX_CLOCK_SKEW_S`` beyond this host's clock (a wrong clock, or
milliseconds passed as seconds) is not published either: ``record_step`` returns False,
it counts in ``ExporterStats.future_dated`` and one warning per interval says why; the
worker would only dead-letter it.

Two transports:

- **direct** (small jobs, or one process driving a node's ranks): this process
  batches and publishes to Kafka itself: :meth:`StepExporter.direct`.
- **node aggregator** (one process per rank): records go over a local Unix datagram
  socket to ``stepguard export-node``, the node's single producer:
  :meth:`StepExporter.to_aggregator`.

Example (direct)::

    exporter = StepExporter.direct(settings, job_id="llm-7b", node="node-0001",
                                   ranks_per_node=8)
    for step in ...:
        ...
        exporter.record_step(step, rank, step_time_s=step_time, compute_s=compute,
                             comm_wait_s=comm_wait, data_wait_s=data_wait,
                             local_rank=local_rank, loss=loss)
        if step % 500 == 499:
            with exporter.phase("checkpoint"):   # a long step: not a hang
                save(step)
    exporter.close()   # the job completed; close(reason="failed") after an error

Lifecycle: the exporter announces the job's start when it is created, a long phase
when :meth:`StepExporter.phase` is entered, and the end when :meth:`StepExporter.close`
is called (``reason``: completed, failed or cancelled). The close registered with
``atexit`` (a script that never called ``close``) announces no end: the reason is not
known, and the job's silence is then judged as a hang, then abandoned.
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from pipeline.client.batcher import NAMED_FIELDS, WIRE_FIELDS, RankRecord, StepBatcher
from pipeline.client.sink import KafkaSink
from pipeline.client.waits import InputWait
from pipeline.io.clockskew import FutureGate
from pipeline.io.settings import ClientSettings
from schemas import EndReason, JobEvent, JobEventKind, Phase

__all__ = ["AggregatorTransport", "DirectTransport", "ExporterStats", "StepExporter", "Transport"]

log = logging.getLogger(__name__)

#: Largest datagram sent to the node aggregator.
MAX_DATAGRAM = 60_000
#: The allowed clock skew when no settings are given (``to_aggregator``).
DEFAULT_MAX_CLOCK_SKEW_S: float = ClientSettings.model_fields["max_clock_skew_s"].default


@dataclass(frozen=True, slots=True)
class ExporterStats:
    recorded: int  #: record_step calls accepted into the queue
    #: record_step calls dropped because the queue was full (or left in it at close)
    dropped_queue_full: int
    dropped_send: int  #: records or messages the transport could not deliver
    invalid: int  #: records rejected by validation (e.g. negative times)
    #: messages (direct: step messages and the job's lifecycle events) or datagrams
    #: (aggregator) delivered
    sent: int
    queued: int  #: records still waiting
    #: record_step calls refused: dated beyond the clock + STEPGUARD_MAX_CLOCK_SKEW_S
    future_dated: int = 0

    @property
    def dropped(self) -> int:
        return self.dropped_queue_full + self.dropped_send


class Transport(Protocol):
    """Where a :class:`StepExporter` sends what it records; the sender thread calls it.

    ==================  ============================================================
    method              called
    ==================  ============================================================
    ``push(records)``   with the records taken off the queue (never empty)
    ``event(event)``    with each lifecycle event (start, phase, end)
    ``poll(now)``       on every sender pass (``time.monotonic()``): flush what is due
    ``drain(timeout)``  on :meth:`StepExporter.flush` and at close: send everything
    ``close(timeout)``  once, last
    ``counts()``        ``(sent, dropped, invalid)`` so far, for :class:`ExporterStats`
    ==================  ============================================================

    :class:`DirectTransport` (batch and publish to Kafka from this process) and
    :class:`AggregatorTransport` (datagrams to ``stepguard export-node``) are the two
    shipped; a test or another bus implements these six methods. None of them may block
    the training loop: they run on the sender thread only.
    """

    def push(self, records: list[RankRecord]) -> None: ...
    def event(self, event: JobEvent) -> None: ...
    def poll(self, now: float) -> None: ...
    def drain(self, timeout: float) -> None: ...
    def close(self, timeout: float) -> None: ...
    def counts(self) -> tuple[int, int, int]: ...  # sent, dropped, invalid


class DirectTransport:
    """Batch records into one message per node per step and publish them to Kafka."""

    def __init__(self, sink: KafkaSink, batcher: StepBatcher) -> None:
        self.sink, self.batcher = sink, batcher

    def push(self, records: list[RankRecord]) -> None:
        for r in records:
            for msg in self.batcher.add(r):
                self.sink.send("steps", msg)

    def event(self, event: JobEvent) -> None:
        self.sink.send("lifecycle", event)

    def poll(self, now: float) -> None:
        for msg in self.batcher.expire(now):
            self.sink.send("steps", msg)

    def drain(self, timeout: float) -> None:
        for msg in self.batcher.flush():
            self.sink.send("steps", msg)
        self.sink.flush(timeout)

    def close(self, timeout: float) -> None:
        self.sink.close(timeout)

    def counts(self) -> tuple[int, int, int]:
        return self.sink.stats.sent, self.sink.stats.dropped, self.batcher.invalid


class AggregatorTransport:
    """Datagrams of JSON record lists to the node aggregator's Unix socket."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.sent = self.dropped = self.events_dropped = 0

    def push(self, records: list[RankRecord]) -> None:
        batch: list[list[object]] = []
        size = 0
        for r in records:
            row: list[object] = [*r[:WIRE_FIELDS], r.run]  # not ``arrived``: its clock
            work = {f: getattr(r, f) for f in NAMED_FIELDS if getattr(r, f) is not None}
            if work:  # by name, and only when said: a rank without work sends as before
                row.append(work)
            batch.append(row)
            size += 200
            if size >= MAX_DATAGRAM // 2:
                self._send(batch)
                batch, size = [], 0
        if batch:
            self._send(batch)

    def event(self, event: JobEvent) -> None:
        data = json.dumps({"event": event.model_dump(mode="json")}).encode()
        try:
            self.sock.sendto(data, self.path)
        except OSError:  # aggregator down: counted apart from records
            self.events_dropped += 1

    def _send(self, batch: list[list[object]]) -> None:
        data = json.dumps(batch).encode()
        try:
            self.sock.sendto(data, self.path)
            self.sent += 1
        except OSError:  # aggregator down or its buffer full: never wait
            self.dropped += len(batch)

    def poll(self, now: float) -> None:
        return None

    def drain(self, timeout: float) -> None:
        return None

    def close(self, timeout: float) -> None:
        self.sock.close()

    def counts(self) -> tuple[int, int, int]:
        return self.sent, self.dropped, 0


class StepExporter:
    """Non-blocking per-rank step hook with a bounded queue and a sender thread.

    Parameters
    ----------
    transport
        Where records go: a :class:`Transport` (:meth:`direct` and
        :meth:`to_aggregator` build the shipped ones).
    job_id, node
        Written into every record.
    run
        Run or attempt id written into lifecycle events and step telemetry (e.g. the
        scheduler's job id and restart count), so analysts can tell a job's runs
        apart and a relaunched run's steps never replace the abandoned run's in the
        archive.
    announce_start
        Publish the job's START event when the exporter is created.
    queue_size
        Records buffered before ``record_step`` starts dropping.
    poll_s
        Sender sleep when the queue is empty.
    max_clock_skew_s
        A record dated further beyond this host's clock is dropped and counted
        (``direct``: ``STEPGUARD_MAX_CLOCK_SKEW_S``); None: no check.
    """

    def __init__(
        self,
        transport: Transport,
        *,
        job_id: str,
        node: str,
        queue_size: int = 65536,
        poll_s: float = 0.005,
        register_atexit: bool = True,
        run: str = "",
        announce_start: bool = True,
        max_clock_skew_s: float | None = DEFAULT_MAX_CLOCK_SKEW_S,
    ) -> None:
        if not job_id or not node:
            raise ValueError("job_id and node must not be empty")
        if queue_size < 1:
            raise ValueError("queue_size must be >= 1")
        self.job_id = job_id
        self.node = node
        self.queue_size = queue_size
        self.poll_s = poll_s
        self._transport = transport
        self._future = FutureGate(max_clock_skew_s, f"exporter {job_id}/{node}", interval_s=30.0)
        self._queue: collections.deque[RankRecord] = collections.deque()
        self._recorded = 0
        self._dropped_full = 0
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._closed = False
        self.run = run
        self._last_step: int | None = None
        self._events: collections.deque[JobEvent] = collections.deque(maxlen=1024)
        self._input = InputWait()
        #: the wait for input in progress: (since, after step, said yet)
        self._wait: tuple[float, int | None, bool] | None = None
        #: the steps whose wait was said lately (not learned into the pace); written by
        #: the sender only, a set so that the training thread's lookups never iterate it
        self._said: set[int] = set()
        if announce_start:
            self._event(JobEventKind.START)
        self._thread = threading.Thread(target=self._run, name="stepguard-exporter", daemon=True)
        self._thread.start()
        if register_atexit:
            atexit.register(self._close_at_exit)

    @classmethod
    def direct(
        cls,
        settings: ClientSettings,
        *,
        job_id: str,
        node: str,
        ranks_per_node: int | None = None,
        max_wait_s: float = 2.0,
        **kwargs: object,
    ) -> StepExporter:
        """Batch in this process and publish straight to Kafka."""
        transport = DirectTransport(
            KafkaSink(settings),
            StepBatcher(
                ranks_per_node, max_wait_s=max_wait_s, columnar=settings.steps_columnar == "all"
            ),
        )
        kwargs.setdefault("max_clock_skew_s", settings.max_clock_skew_s)
        return cls(transport, job_id=job_id, node=node, **kwargs)  # type: ignore[arg-type]

    @classmethod
    def to_aggregator(
        cls, socket_path: Path | str, *, job_id: str, node: str, **kwargs: object
    ) -> StepExporter:
        """Send records to the node aggregator (``stepguard export-node``)."""
        return cls(AggregatorTransport(Path(socket_path)), job_id=job_id, node=node, **kwargs)  # type: ignore[arg-type]

    def record_step(
        self,
        step: int,
        rank: int,
        *,
        step_time_s: float,
        compute_s: float,
        comm_wait_s: float,
        data_wait_s: float = 0.0,
        local_rank: int = 0,
        ts_start: float | None = None,
        ts_end: float | None = None,
        loss: float | None = None,
        grad_norm: float | None = None,
        phase: str = "train",
        dp_group: int = 0,
        pp_stage: int = 0,
        tp_group: int = 0,
        node: str | None = None,
        tokens: int | None = None,
        flops: float | None = None,
        max_seq_len: int | None = None,
    ) -> bool:
        """Record one rank's step; returns False when the record was dropped.

        The four durations are keyword-only (they share a unit, so a swapped pair would
        pass silently): ``step_time_s`` the rank's wall step time, ``compute_s`` its
        own work, ``comm_wait_s`` the time it sat blocked in collectives (exposed
        communication), ``data_wait_s`` the time it waited for the data loader.
        Times are seconds; ``ts_end`` (epoch seconds) defaults to now and ``ts_start``
        to ``ts_end - step_time_s``. ``node`` overrides the exporter's node (one
        process reporting for several nodes: small jobs, replays). Validation happens
        on the sender thread, except the clock: a ``ts_end`` or ``ts_start`` more than
        the allowed skew beyond this host's clock is dropped here (counted in
        ``future_dated``, one warning per 30 s).

        The work the step did, when the loop knows it (all optional): ``tokens`` the
        tokens this rank processed, ``flops`` its floating-point operations,
        ``max_seq_len`` the longest sequence of its batch. Detection then reads step
        time against work: a rank slow only because it got more tokens is no straggler.
        """
        q = self._queue
        if len(q) >= self.queue_size:
            self._dropped_full += 1
            return False
        now = time.time()
        if ts_end is None:
            end = now
        elif self._future.admit(ts_end, "ts_end", now):
            end = ts_end
        else:
            return False
        if ts_start is not None and not self._future.admit(ts_start, "ts_start", now):
            return False
        q.append(
            RankRecord(
                job_id=self.job_id,
                node=node or self.node,
                step=step,
                rank=rank,
                local_rank=local_rank,
                phase=phase,
                dp_group=dp_group,
                pp_stage=pp_stage,
                tp_group=tp_group,
                step_time_s=step_time_s,
                compute_s=compute_s,
                comm_wait_s=comm_wait_s,
                data_wait_s=data_wait_s,
                loss=loss,
                grad_norm=grad_norm,
                ts_start=end - step_time_s if ts_start is None else ts_start,
                ts_end=end,
                arrived=time.monotonic(),
                run=self.run,
                tokens=tokens,
                flops=flops,
                max_seq_len=max_seq_len,
            )
        )
        self._recorded += 1
        self._last_step = step
        self._input.learn(step_time_s, said=step in self._said)
        return True

    def waiting(self, since: float | None, after_step: int | None = None) -> None:
        """The training loop waits for its next batch since ``since`` (epoch seconds)
        after completing ``after_step``; None: the wait ended. The sender says so in one
        ``wait`` event once the wait lasts as long as a step usually takes
        (:class:`~pipeline.client.waits.InputWait`), so that a stalled input pipeline is
        told from a hung job while it lasts. Call it on the job's leader only: every
        rank waits for the slowest, so one voice is enough, and it costs nothing here."""
        self._wait = None if since is None else (since, after_step, False)

    def _say_wait(self) -> None:
        wait, limit = self._wait, self._input.threshold_s()
        if wait is None or wait[2] or limit is None or time.time() - wait[0] < limit:
            return
        self._wait = (wait[0], wait[1], True)
        if wait[1] is not None:
            self._said = {*sorted(self._said)[-15:], wait[1] + 1}
        at = datetime.fromtimestamp(wait[0], UTC)
        self._event(JobEventKind.WAIT, ts=at, step=wait[1])

    @contextmanager
    def phase(self, name: str, expected_s: float | None = None) -> Iterator[None]:
        """Announce a long phase (``checkpoint``, ``eval``) for the block it wraps:
        the silence until the next step is measured against the phase's expected
        duration (``expected_s``, else what its past runs took), not the step time.

        Publishes one small event when the block is entered; never blocks.
        """
        self._event(JobEventKind.PHASE, phase=Phase(name), expected_s=expected_s)
        yield

    def _event(self, kind: JobEventKind, **fields: Any) -> JobEvent:
        fields.setdefault("ts", datetime.now(UTC))
        fields.setdefault("step", self._last_step)
        event = JobEvent(job_id=self.job_id, kind=kind, run=self.run, source=self.node, **fields)
        self._events.append(event)  # the sender thread publishes it
        return event

    def _run(self) -> None:
        q = self._queue
        last_report = time.monotonic()
        reported = 0
        while True:
            batch: list[RankRecord] = []
            try:
                while True:
                    batch.append(q.popleft())
            except IndexError:
                pass
            try:
                if batch:
                    self._transport.push(batch)
                self._say_wait()
                while self._events:
                    self._transport.event(self._events.popleft())
                self._transport.poll(time.monotonic())
            except Exception:  # the sender must survive anything
                log.exception("exporter: sender failed")
            if not batch and not q:  # records may have come while an event was sent
                if self._stop.is_set():
                    return
                self._idle.set()
                time.sleep(self.poll_s)
            now = time.monotonic()
            if now - last_report > 30.0:
                dropped = self.stats().dropped
                if dropped > reported:
                    log.warning("exporter: %d records/messages dropped so far", dropped)
                    reported = dropped
                last_report = now

    def flush(self, timeout: float = 10.0) -> None:
        """Send everything recorded so far (partial steps included)."""
        deadline = time.monotonic() + timeout
        while self._queue and time.monotonic() < deadline:
            self._idle.clear()
            self._idle.wait(min(0.05, max(0.0, deadline - time.monotonic())))
        self._transport.drain(max(0.0, deadline - time.monotonic()))

    def close(
        self, timeout: float = 5.0, reason: EndReason | str | None = EndReason.COMPLETED
    ) -> ExporterStats:
        """Flush, announce the job's end (``reason``; None: announce nothing), stop the
        sender and report what was dropped (idempotent)."""
        if self._closed:
            return self.stats()
        self._closed = True
        with_drops = None
        try:
            self._stop.set()
            self._thread.join(timeout)
            if self._thread.is_alive():  # sender stuck (broker down): the rest is lost
                lost = len(self._queue)
                self._queue.clear()
                self._dropped_full += lost
            else:
                if reason is not None:
                    self._event(JobEventKind.END, reason=EndReason(reason))
                while self._events:  # the sender has stopped: publish what is left
                    self._transport.event(self._events.popleft())
                self._transport.drain(timeout)
        finally:
            self._transport.close(timeout)
            with_drops = self.stats()
            atexit.unregister(self._close_at_exit)
        if with_drops.dropped:
            log.warning(
                "exporter %s/%s: %d of %d records dropped (queue full %d, send %d)",
                self.job_id,
                self.node,
                with_drops.dropped,
                self._recorded + self._dropped_full,
                with_drops.dropped_queue_full,
                with_drops.dropped_send,
            )
        if with_drops.future_dated:
            log.warning("exporter %s/%s: %d records dated beyond this host's clock + "
                        "STEPGUARD_MAX_CLOCK_SKEW_S were not published", self.job_id,
                        self.node, with_drops.future_dated)  # fmt: skip
        return with_drops

    def _close_at_exit(self) -> None:
        self.close(reason=None)  # how the job ended is not known here

    def stats(self) -> ExporterStats:
        sent, dropped, invalid = self._transport.counts()
        return ExporterStats(
            recorded=self._recorded,
            dropped_queue_full=self._dropped_full,
            dropped_send=dropped,
            invalid=invalid,
            sent=sent,
            queued=len(self._queue),
            future_dated=self._future.dropped,
        )
