"""Reassemble per-node StepTelemetry messages into one StepFrame per job step.

Exporters publish one message per node per step; detectors want the whole step. A
step is complete when every node seen recently has reported it, or when a message
``lag_steps`` steps later arrives (a silent node must not block the job's view: its
absence is itself the signal the hang detector looks for).

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


class StepAssembler:
    """Buffer messages per job and step; hand out complete steps in step order.

    Parameters
    ----------
    lag_steps
        A step is forced out once a message for ``step + lag_steps`` has arrived.
    """

    def __init__(self, lag_steps: int = 2) -> None:
        if lag_steps < 1:
            raise ValueError("lag_steps must be >= 1")
        self.lag_steps = lag_steps
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
            buf.emitted_through = msg.step - 1
            buf.max_seen = msg.step - 1
        nodes = buf.pending[msg.step]
        if msg.node not in nodes and msg.node in buf.known_nodes:
            buf.known_hits[msg.step] = buf.known_hits.get(msg.step, 0) + 1
        nodes[msg.node] = msg
        buf.max_seen = max(buf.max_seen, msg.step)
        buf.newest_ts = max(buf.newest_ts, ts)
        return self._drain(buf, force_below=buf.max_seen - self.lag_steps + 1)

    def flush(self) -> list[StepFrame]:
        """Emit every buffered step (end of input)."""
        out: list[StepFrame] = []
        for buf in self._jobs.values():
            out.extend(self._drain(buf, force_below=buf.max_seen + 1))
        return out

    def _drain(self, buf: _JobBuffer, force_below: int) -> list[StepFrame]:
        out = []
        while buf.pending:
            step = min(buf.pending)
            nodes = buf.pending[step]
            known = buf.known_nodes
            complete = bool(known) and buf.known_hits.get(step, 0) >= len(known)
            if not (complete or step < force_below):
                break
            del buf.pending[step]
            buf.known_hits.pop(step, None)
            if step < force_below or not known.issuperset(nodes):
                # the set of nodes changed (one fell silent, or one joined): recount
                buf.known_nodes = set(nodes) if step < force_below else known | set(nodes)
                buf.known_hits = {
                    s: sum(1 for n in pending if n in buf.known_nodes)
                    for s, pending in buf.pending.items()
                }
            buf.emitted_through = step
            frame = StepFrame.from_messages(list(nodes.values()))
            buf.emitted_ts = max(buf.emitted_ts, frame.ts)
            out.append(frame)
        return out
