"""Reassemble per-node StepTelemetry messages into one StepFrame per job step.

Exporters publish one message per node per step; detectors want the whole step. A
step is complete when every node seen recently has reported it. A silent node must not
block the job's view (its absence is itself the signal the detectors look for), so an
incomplete step is forced out once the job has gone on without it: a message
``lag_steps`` steps later has arrived *and* the job's event time has passed the step's
by ``lag_s`` seconds; or, whatever the clocks say, ``max_lag_steps`` steps later.

Both conditions, because nodes publish independently and their messages reach the
topic with their own delivery delays: a producer's batch, a busy host. Counted in steps
alone, a node whose messages ran a few hundred milliseconds behind in a job of 50 ms
steps was forced out of most frames, judged missing, and its late messages dropped
(measured: a real 4-rank DDP job under load lost 2 of 80 node messages, and a healthy
node was alerted missing). Event time measures that delay on the job's own clock, so
replaying the same records assembles the same frames.

A message for a step already handed out is *late* (counted, dropped: a late node is
a signal, not a new step) unless it is newer in event time than everything the job
has sent: then step numbers went back, and the job was relaunched from a checkpoint.
A straggler's late message always predates the later steps that forced its step out,
so lateness alone never reads as a relaunch.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from detectors.frame import NodeStep, StepFrame

__all__ = ["StepAssembler"]


@dataclass
class _JobBuffer:
    pending: dict[int, dict[str, NodeStep]] = field(default_factory=lambda: defaultdict(dict))
    known_nodes: set[str] = field(default_factory=set)
    #: per pending step, how many of ``known_nodes`` have reported it (O(1) completeness)
    known_hits: dict[int, int] = field(default_factory=dict)
    emitted_through: int = -1
    emitted_ts: float = float("-inf")
    max_seen: int = -1
    #: newest event time of any message of the job
    newest_ts: float = float("-inf")
    #: per pending step, the earliest event time any node reported for it
    first_ts: dict[int, float] = field(default_factory=dict)


class StepAssembler:
    """Buffer messages per job and step; hand out complete steps in step order.

    Parameters
    ----------
    lag_steps
        An incomplete step is forced out once a message for ``step + lag_steps`` has
        arrived ...
    lag_s
        ... and the job's newest event time is ``lag_s`` seconds past the step's
        earliest (the delivery delay a node's messages may have).
    max_lag_steps
        ... or, whatever the event times, once a message for ``step + max_lag_steps``
        has arrived (bounds what is buffered: a node whose clock runs ahead).
    """

    def __init__(self, lag_steps: int = 2, lag_s: float = 2.0, max_lag_steps: int = 64) -> None:
        if lag_steps < 1:
            raise ValueError("lag_steps must be >= 1")
        if not 0.0 <= lag_s <= 3600.0:
            raise ValueError(f"lag_s must be in [0, 3600] seconds, got {lag_s!r}")
        if max_lag_steps < lag_steps:
            raise ValueError(f"max_lag_steps must be >= lag_steps, got {max_lag_steps!r}")
        self.lag_steps = lag_steps
        self.lag_s = lag_s
        self.max_lag_steps = max_lag_steps
        self._jobs: dict[str, _JobBuffer] = defaultdict(_JobBuffer)
        self.late_messages = 0
        self.restarts = 0

    def add(self, msg: NodeStep) -> list[StepFrame]:
        """Add one message; return the frames it completed (possibly none)."""
        buf = self._jobs[msg.job_id]
        ts = msg.ts_end.timestamp()
        if msg.step <= buf.emitted_through:
            if ts <= max(buf.emitted_ts, buf.newest_ts):
                self.late_messages += 1  # that step is already out; a late node is a signal
                return []
            # a step number seen before but newer than anything the job sent: the job
            # restarted from a checkpoint; what is still buffered is the abandoned run's
            self.restarts += 1
            buf.pending.clear()
            buf.known_hits.clear()
            buf.first_ts.clear()
            buf.emitted_through = msg.step - 1
            buf.max_seen = msg.step - 1
        nodes = buf.pending[msg.step]
        if msg.node not in nodes and msg.node in buf.known_nodes:
            buf.known_hits[msg.step] = buf.known_hits.get(msg.step, 0) + 1
        nodes[msg.node] = msg
        first = buf.first_ts.get(msg.step)
        if first is None or ts < first:
            buf.first_ts[msg.step] = ts
        buf.max_seen = max(buf.max_seen, msg.step)
        buf.newest_ts = max(buf.newest_ts, ts)
        return self._drain(buf)

    def reporting(self, job_id: str) -> frozenset[str]:
        """The nodes of ``job_id``'s latest assembled step (empty before the first)."""
        buf = self._jobs.get(job_id)
        return frozenset(buf.known_nodes) if buf is not None else frozenset()

    def progress(self, job_id: str) -> float | None:
        """Event time of the newest buffered step of ``job_id`` that at least half of
        the nodes of its latest assembled step reported (its earliest node's time):
        the job is stepping even while one node's record of that step is missing.
        None when no such step is buffered."""
        buf = self._jobs.get(job_id)
        if buf is None or not buf.known_nodes:
            return None
        need = (len(buf.known_nodes) + 1) // 2
        best: float | None = None
        for step, hits in buf.known_hits.items():
            if hits >= need:
                ts = buf.first_ts[step]
                best = ts if best is None else max(best, ts)
        return best

    def expire(self, now: float) -> list[StepFrame]:
        """The clock at event time ``now`` with no message: hand out the steps of a job
        whose nodes are not known yet that the clock is ``lag_s`` past (a job shorter
        than ``lag_s`` must not keep its steps buffered: none is complete before a
        forced step names the nodes).

        Once a job's nodes are known, only its own records force a step out. A clock
        is an estimate (the worker's runs on the wall clock from the newest record it
        read), and it runs ahead of records still to be read: a worker that took a job
        over with a backlog to read forced its snapshot's part-filled steps out without
        the nodes whose messages were still unread, judged those nodes missing, kept
        the few it saw as the job's nodes, dropped the rest as late, and the actuator
        isolated three healthy nodes (chaos soak, a worker killed). A step a hang left
        part-filled stays buffered too: the job's silence is the hang's signal, not its
        nodes'."""
        out: list[StepFrame] = []
        for buf in self._jobs.values():
            if not buf.known_nodes:
                out.extend(self._drain(buf, before=now - self.lag_s))
        return out

    def flush(self) -> list[StepFrame]:
        """Emit every buffered step (end of input)."""
        out: list[StepFrame] = []
        for buf in self._jobs.values():
            out.extend(self._drain(buf, flush=True))
        return out

    def _forced(self, buf: _JobBuffer, step: int) -> bool:
        """Whether the job has gone on far enough without ``step`` to hand it out."""
        ahead = buf.max_seen - step
        if ahead >= self.max_lag_steps:
            return True
        return ahead >= self.lag_steps and buf.newest_ts - buf.first_ts[step] >= self.lag_s

    def _drain(
        self, buf: _JobBuffer, flush: bool = False, before: float = float("-inf")
    ) -> list[StepFrame]:
        out = []
        while buf.pending:
            step = min(buf.pending)
            nodes = buf.pending[step]
            known = buf.known_nodes
            complete = bool(known) and buf.known_hits.get(step, 0) >= len(known)
            forced = not complete and (
                flush or buf.first_ts[step] <= before or self._forced(buf, step)
            )
            if not (complete or forced):
                break
            del buf.pending[step]
            buf.known_hits.pop(step, None)
            buf.first_ts.pop(step, None)
            if forced or not known.issuperset(nodes):
                # the set of nodes changed (one fell silent, or one joined): recount
                buf.known_nodes = set(nodes) if forced else known | set(nodes)
                buf.known_hits = {
                    s: sum(1 for n in pending if n in buf.known_nodes)
                    for s, pending in buf.pending.items()
                }
            buf.emitted_through = step
            frame = StepFrame.from_messages(list(nodes.values()))
            buf.emitted_ts = max(buf.emitted_ts, frame.ts)
            out.append(frame)
        return out
