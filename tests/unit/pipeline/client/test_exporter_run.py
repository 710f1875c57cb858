"""The exporter's ``run`` reaches StepTelemetry.run, in process and through the node
aggregator (issue 14 item 6: a relaunched run never replaces the abandoned run's
archived steps)."""

from __future__ import annotations

import json
import socket

from pipeline.agents.node import NodeAggregator
from pipeline.client import StepBatcher, StepExporter
from pipeline.client.batcher import WIRE_FIELDS
from pipeline.io.settings import load_settings
from tests.unit.pipeline.client.test_exporter import rec


def test_the_batcher_writes_the_records_run_into_the_message():
    batcher = StepBatcher(2)
    assert batcher.add(rec(1, 0, run="job-1/2")) == []
    (msg,) = batcher.add(rec(1, 1, run="job-1/2"))
    assert msg.run == "job-1/2"
    (plain,) = StepBatcher(1).add(rec(2, 0))
    assert plain.run == ""


class _Sink:
    def __init__(self) -> None:
        self.sent: list[tuple[str, object]] = []

    def send(self, topic: str, msg: object) -> None:
        self.sent.append((topic, msg))


def test_the_run_travels_through_the_node_aggregator(tmp_path):
    path = tmp_path / "agg.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(path))
    server.settimeout(10)
    exporter = StepExporter.to_aggregator(
        path, job_id="j", node="n0", register_atexit=False, run="attempt-2", announce_start=False
    )
    exporter.record_step(5, 0, step_time_s=1.0, compute_s=0.8, comm_wait_s=0.15, data_wait_s=0.05)
    exporter.flush()
    exporter.close()
    (row,) = json.loads(server.recv(65536))
    server.close()
    assert len(row) == WIRE_FIELDS + 1 and row[-1] == "attempt-2"

    sink = _Sink()
    agg = NodeAggregator(
        load_settings(),
        tmp_path / "node.sock",
        ranks_per_node=1,
        sink=sink,  # type: ignore[arg-type]
    )
    try:
        agg._handle(json.dumps([row]).encode())
        agg._handle(json.dumps([row[:WIRE_FIELDS]]).encode())  # an exporter from before
        agg._handle(json.dumps([[*row, "extra"]]).encode())
    finally:
        agg.sock.close()
    assert [m.run for _, m in sink.sent] == ["attempt-2", ""]
    assert agg.malformed == 1
