"""The steps batches: acked in offset order, never after their partition is revoked."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from faust.types import TP

from pipeline.services.worker.bulk import AckLine, AckLines, StepBatch, grouped


def record(offset: int, value: bytes = b"{}") -> SimpleNamespace:
    return SimpleNamespace(
        offset=offset, key=b"job", value=value, timestamp=1_000 * offset, timestamp_type=0,
        serialized_value_size=len(value),
    )  # fmt: skip


def test_a_batch_sits_at_its_last_offset_and_keeps_its_records():
    tp = TP("steps", 3)
    records = [record(10), record(11, b"{ }"), record(12)]
    [(got_tp, batch)] = list(grouped({tp: records, TP("steps", 4): []}, generation_id=7))
    assert got_tp == tp and isinstance(batch, StepBatch)
    assert (batch.topic, batch.partition, batch.offset) == ("steps", 3, 12)
    assert batch.records == records and batch.generation_id == 7
    assert batch.serialized_value_size == 7 and batch.timestamp == 12.0


def test_batches_are_acked_in_order_whatever_order_their_records_are_released():
    acked: list[int] = []
    line = AckLine()
    tickets = [line.open(lambda k=k: acked.append(k), records=2) for k in range(3)]
    for k in (2, 2, 1):
        tickets[k].ack()
    assert acked == [] and len(line) == 3  # the first batch still holds both records
    tickets[0].ack()
    assert acked == []
    tickets[0].ack()
    assert acked == [0]  # the second still holds one record; the third waits behind it
    tickets[1].ack()
    assert acked == [0, 1, 2] and len(line) == 0


def test_a_revoked_partition_acks_nothing_more():
    acked: list[str] = []
    lines = AckLines()
    held = lines.line(0).open(lambda: acked.append("p0"), records=1)
    other = lines.line(1).open(lambda: acked.append("p1"), records=1)
    assert lines.held() == 2
    lines.revoke([0])
    held.ack()
    other.ack()
    assert acked == ["p1"] and lines.held() == 0
    fresh = lines.line(0).open(lambda: acked.append("p0 again"), records=1)
    fresh.ack()
    assert acked == ["p1", "p0 again"]


def test_released_too_often_is_logged_not_acked_twice(caplog):
    acked: list[int] = []
    line = AckLine()
    ticket = line.open(lambda: acked.append(1), records=1)
    ticket.ack()
    ticket.ack()
    assert acked == [1]
    assert "released more times" in caplog.text


def test_an_empty_batch_is_refused():
    with pytest.raises(ValueError, match="records"):
        AckLine().open(lambda: None, records=0)


def test_the_consumer_groups_the_steps_topic_and_passes_the_rest(monkeypatch):
    import asyncio

    from faust.transport import consumer as faust_consumer

    from pipeline.services.worker.consumer import LowLatencyConsumer

    steps0, steps1, jobs0 = TP("steps", 0), TP("steps", 1), TP("jobs", 0)
    fetched = [(steps0, record(5)), (jobs0, "health"), (steps1, record(9)), (steps0, record(6))]

    async def getmany(self, timeout):
        for tp, rec in fetched:
            yield tp, rec

    monkeypatch.setattr(faust_consumer.Consumer, "getmany", getmany)
    cls = type("C", (LowLatencyConsumer,), {"bulk_topic": "steps"})
    consumer = cls.__new__(cls)
    consumer.app = SimpleNamespace(consumer_generation_id=4)
    assert consumer._to_message(steps0, fetched[0][1]) is fetched[0][1]  # kept raw

    async def drain():
        return [item async for item in consumer.getmany(1.0)]

    out = asyncio.run(drain())
    assert out[0] == (jobs0, "health")  # the jobs topic a record at a time, first
    batches = {tp: msg for tp, msg in out[1:]}
    assert [r.offset for r in batches[steps0].records] == [5, 6]
    assert batches[steps0].offset == 6 and batches[steps1].offset == 9
    assert {m.generation_id for m in batches.values()} == {4}
