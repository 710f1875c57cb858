"""A steps partition's records reach the job agent a fetch at a time.

Faust turns every record it fetches into a message, an event and a trip through its
stream's queue. That costs more per record than the core spends scoring a node's step,
so for node-level telemetry it set the worker's pace (8,476 node messages/s on one core
while a bare consumer reads 236,072/s, BENCHMARKS.md). The worker's consumer therefore
groups each fetch's steps-topic records per partition into one :class:`StepBatch`, a
Faust message like any other (it travels the same queue, acks and commits the same way)
whose ``records`` are the raw records of the fetch. The jobs topic (health, commands,
lifecycle, ticks) still arrives a record at a time.

Acks
----
Faust commits a partition up to the highest acked offset it can reach without a hole,
and counts the offsets between one message and the one before it as a hole already
filled (its gap). A :class:`StepBatch` sits at its last record's offset, so the batch
before it fills everything between them. That is only right when batches are acked in
offset order: acked out of order, a later batch's gap would commit records still held
for an earlier batch's snapshot. Each batch therefore gets a :class:`Ticket` that every
one of its records holds, and an :class:`AckLine` per partition acks a batch's message
only when all its records are released *and* every earlier batch is acked.

>>> acked = []
>>> line = AckLine()
>>> first = line.open(lambda: acked.append("first"), records=2)
>>> second = line.open(lambda: acked.append("second"), records=1)
>>> second.ack(); acked  # done, but the first still holds a record
[]
>>> first.ack(); first.ack(); acked
['first', 'second']
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from faust.types import TP
from faust.types.tuples import ConsumerMessage

__all__ = ["AckLine", "AckLines", "StepBatch", "Ticket"]

log = logging.getLogger(__name__)


class StepBatch(ConsumerMessage):
    """One fetch's records of one steps partition, as one Faust message at the last
    record's offset; ``records`` are aiokafka ``ConsumerRecord`` s in offset order."""

    __slots__ = ("records",)

    def __init__(self, tp: TP, records: list[Any], generation_id: int | None) -> None:
        last = records[-1]
        super().__init__(
            tp.topic, tp.partition, last.offset,
            last.timestamp / 1000.0 if last.timestamp is not None else 0.0,
            last.timestamp_type, None, None, b"", None, 0,
            sum(r.serialized_value_size for r in records), tp,
            generation_id=generation_id,
        )  # fmt: skip
        self.records = records


def grouped(
    batches: dict[TP, list[Any]], generation_id: int | None
) -> Iterable[tuple[TP, StepBatch]]:
    """``(tp, StepBatch)`` for each partition's records of one fetch."""
    for tp, records in batches.items():
        if records:
            yield tp, StepBatch(tp, records, generation_id)


class Ticket:
    """What each record of a batch holds; the batch is done when all have acked."""

    __slots__ = ("_ack", "_line", "pending")

    def __init__(self, line: AckLine, ack: Callable[[], Any], records: int) -> None:
        self._line = line
        self._ack = ack
        self.pending = records

    def ack(self) -> None:
        """One record of the batch released (the core calls this)."""
        self.pending -= 1
        if self.pending == 0:
            self._line.advance()
        elif self.pending < 0:
            log.error("a steps batch was released more times than it has records")


class AckLine:
    """A partition's batches, acked in the order they were opened."""

    def __init__(self) -> None:
        self._open: deque[Ticket] = deque()
        self.closed = False

    def __len__(self) -> int:
        return len(self._open)

    def open(self, ack: Callable[[], Any], records: int) -> Ticket:
        """A ticket for a batch of ``records`` (at least one) whose ``ack`` commits it."""
        if records < 1:
            raise ValueError("records must be at least 1")
        ticket = Ticket(self, ack, records)
        self._open.append(ticket)
        return ticket

    def advance(self) -> None:
        """Ack every finished batch at the head of the line."""
        while self._open and self._open[0].pending <= 0:
            ticket = self._open.popleft()
            if not self.closed:
                ticket._ack()

    def close(self) -> None:
        """The partition was revoked: nothing more of it is acked (its records come
        back to whoever owns it next, from its last commit)."""
        self.closed = True
        self._open.clear()


class AckLines:
    """One :class:`AckLine` per partition of the steps topic this worker reads."""

    def __init__(self) -> None:
        self._lines: dict[int, AckLine] = {}

    def line(self, partition: int) -> AckLine:
        line = self._lines.get(partition)
        if line is None:
            line = self._lines[partition] = AckLine()
        return line

    def revoke(self, partitions: Iterable[int]) -> None:
        for p in partitions:
            line = self._lines.pop(p, None)
            if line is not None:
                line.close()

    def held(self) -> int:
        """Batches opened and not yet acked, over all partitions."""
        return sum(len(line) for line in self._lines.values())
