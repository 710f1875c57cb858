"""Exporters without a broker: bounded queue, drops, batching, fake NVML."""

from __future__ import annotations

import json
import socket
import threading
import time
from types import SimpleNamespace

import pytest

from pipeline.agents.health import NvmlReader, NvmlUnavailable, run_health_exporter
from pipeline.client import RankRecord, StepBatcher, StepExporter
from pipeline.io.embedded import free_port
from pipeline.io.settings import load_settings
from schemas import EndReason, JobEvent, NodeHealth, Phase, StepTelemetry
from tests.factories import telemetry_settings


def rec(step: int, rank: int, node: str = "n0", **kw) -> RankRecord:
    base = RankRecord(
        job_id="j", node=node, step=step, rank=rank, local_rank=rank % 8, phase="train",
        dp_group=0, pp_stage=0, tp_group=0, step_time_s=1.0, compute_s=0.8,
        comm_wait_s=0.15, data_wait_s=0.05, loss=2.5, grad_norm=1.0,
        ts_start=100.0 + step, ts_end=101.0 + step, arrived=0.0,
    )  # fmt: skip
    return base._replace(**kw)


def test_batcher_releases_a_node_step_when_all_ranks_are_in():
    b = StepBatcher(ranks_per_node=4)
    out = [m for r in range(4) for m in b.add(rec(7, r))]
    assert len(out) == 1
    msg = out[0]
    assert isinstance(msg, StepTelemetry)
    assert (msg.node, msg.step, [s.rank for s in msg.samples]) == ("n0", 7, [0, 1, 2, 3])


def test_batcher_releases_incomplete_steps_after_lag_or_wait_and_counts_invalid():
    b = StepBatcher(ranks_per_node=None, lag_steps=2, max_wait_s=1.0)
    assert b.add(rec(1, 0)) == [] and b.add(rec(2, 0)) == []
    assert [m.step for m in b.add(rec(3, 0))] == [1]
    assert [m.step for m in b.expire(now=5.0)] == [2, 3]
    assert b.add(rec(4, 1, compute_s=-1.0)) == [] and b.flush() == []
    assert b.invalid == 1


def test_exporter_keeps_the_loop_running_when_the_broker_is_down():
    dead = load_settings({}, kafka_bootstrap=f"127.0.0.1:{free_port()}", **telemetry_settings())
    exporter = StepExporter.direct(
        dead, job_id="j", node="n0", ranks_per_node=8, queue_size=1000, register_atexit=False
    )
    accepted = sum(
        exporter.record_step(
            step,
            rank,
            step_time_s=1.0,
            compute_s=0.8,
            comm_wait_s=0.15,
            data_wait_s=0.05,
            local_rank=rank,
        )
        for step in range(2000)
        for rank in range(8)
    )
    stats = exporter.close(timeout=5)
    assert accepted + stats.dropped_queue_full == 16000
    assert stats.sent == 0
    assert stats.dropped > 0  # counted, not lost silently
    assert stats.queued == 0


def test_exporter_to_a_missing_aggregator_counts_drops(tmp_path):
    exporter = StepExporter.to_aggregator(
        tmp_path / "nobody.sock", job_id="j", node="n0", register_atexit=False
    )
    for rank in range(8):
        assert exporter.record_step(
            0, rank, step_time_s=1.0, compute_s=0.8, comm_wait_s=0.15, data_wait_s=0.05
        )
    stats = exporter.close()
    assert stats.dropped_send == 8 and stats.sent == 0


def test_exporter_sends_records_to_the_aggregator_socket(tmp_path):
    path = tmp_path / "agg.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(path))
    server.settimeout(10)
    exporter = StepExporter.to_aggregator(
        path, job_id="j", node="n3", register_atexit=False, run="attempt-1"
    )
    for rank in range(8):
        exporter.record_step(
            5,
            rank,
            step_time_s=1.0,
            compute_s=0.8,
            comm_wait_s=0.15,
            data_wait_s=0.05,
            local_rank=rank,
            loss=float("nan"),
        )
    exporter.flush()
    with exporter.phase("checkpoint", expected_s=30.0):
        exporter.flush()
    exporter.close(reason="failed")
    rows, events = [], []
    while len(events) < 3:
        got = json.loads(server.recv(65536))
        if isinstance(got, dict):
            events.append(JobEvent.model_validate(got["event"]))
        else:
            rows += got
    server.close()
    assert [r[:4] for r in rows] == [["j", "n3", 5, r] for r in range(8)]
    assert [(e.kind.value, e.step, e.phase, e.expected_s, e.reason) for e in events] == [
        ("start", None, None, None, None),
        ("phase", 5, Phase.CHECKPOINT, 30.0, None),
        ("end", 5, None, None, EndReason.FAILED),
    ]
    assert {(e.job_id, e.run, e.source) for e in events} == {("j", "attempt-1", "n3")}


def test_bad_exporter_arguments_are_named():
    with pytest.raises(ValueError, match="queue_size"):
        StepExporter(None, job_id="j", node="n", queue_size=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ranks_per_node"):
        StepBatcher(ranks_per_node=0)


class FakeNvml:
    """Just enough of pynvml: two GPUs, one throttled, one XID pending."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_NVLINK_MAX_LINKS = 2
    nvmlEventTypeXidCriticalError = 8

    class NVMLError(Exception):
        pass

    def __init__(self, fail_init: bool = False) -> None:
        self.fail_init = fail_init
        self.events = [SimpleNamespace(device="gpu1", eventData=79)]
        self.shut = False

    def nvmlInit(self):
        if self.fail_init:
            raise self.NVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return f"gpu{i}"

    def nvmlEventSetCreate(self):
        return "set"

    def nvmlDeviceRegisterEvents(self, h, mask, es):
        assert mask == 8

    def nvmlEventSetWait_v2(self, es, timeout_ms):
        if not self.events:
            raise self.NVMLError("Timeout")
        return self.events.pop()

    def nvmlEventSetFree(self, es):
        pass

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 71 if h == "gpu1" else 55

    def nvmlDeviceGetPowerUsage(self, h):
        return 650_000

    def nvmlDeviceGetClockInfo(self, h, clock):
        return 1980

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=97, memory=40)

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        return {("gpu1", 0): 12, ("gpu1", 1): 1}.get((h, kind), 0)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0x40 | 0x4 if h == "gpu1" else 0

    def nvmlDeviceGetNvLinkErrorCounter(self, h, link, counter):
        if link == 1:
            raise self.NVMLError("Not Supported")
        return 2


def test_nvml_reader_builds_node_health_from_a_fake_nvml():
    nv = FakeNvml()
    with NvmlReader(nv) as reader:
        report = reader.read("node-7", job_id="j", interval_s=5.0)
    assert isinstance(report, NodeHealth) and nv.shut
    g0, g1 = report.gpus
    assert (g0.temperature_c, g1.temperature_c, g1.power_w, g1.sm_clock_mhz) == (55, 71, 650, 1980)
    assert (g1.ecc_corrected, g1.ecc_uncorrected, g1.xid_codes) == (12, 1, (79,))
    assert g1.throttle_reasons == ("sw_power_cap", "hw_thermal_slowdown")
    assert (g0.nvlink_errors, g0.utilization_pct) == (6, 97)


def test_export_health_without_a_driver_exits_with_a_clear_message(capsys):
    with pytest.raises(NvmlUnavailable, match="no NVIDIA driver"):
        NvmlReader(FakeNvml(fail_init=True))
    code = run_health_exporter(load_settings({}), once=True, nvml=FakeNvml(fail_init=True))
    assert code == 3
    assert "NVML is not available" in capsys.readouterr().err


def test_export_health_dry_run_prints_json(capsys):
    code = run_health_exporter(
        load_settings({}), node="n1", once=True, dry_run=True, nvml=FakeNvml()
    )
    assert code == 0
    report = NodeHealth.model_validate_json(capsys.readouterr().out)
    assert report.node == "n1" and len(report.gpus) == 2


class _Events:
    """A transport that keeps the events it is handed."""

    def __init__(self) -> None:
        self.events: list[JobEvent] = []
        self.said = threading.Event()

    def push(self, records) -> None: ...
    def poll(self, now) -> None: ...
    def drain(self, timeout) -> None: ...
    def close(self, timeout) -> None: ...
    def counts(self):
        return 0, 0, 0

    def event(self, event: JobEvent) -> None:
        self.events.append(event)
        if event.kind.value == "wait":
            self.said.set()


def _paced(transport: _Events, step_s: float) -> StepExporter:
    exporter = StepExporter(
        transport, job_id="j", node="n0", register_atexit=False, announce_start=False
    )
    for step in range(8):
        exporter.record_step(step, 0, step_time_s=step_s, compute_s=step_s, comm_wait_s=0.0)
    return exporter


def test_a_wait_for_input_that_lasts_a_step_is_said_once_dated_at_its_start():
    transport = _Events()
    exporter = _paced(transport, step_s=0.2)
    since = time.time() - 1.0  # waiting for a second already: five step times
    exporter.waiting(since, after_step=7)
    assert transport.said.wait(10), "the wait was never said"
    exporter.waiting(None)
    exporter.close(timeout=5)
    waits = [e for e in transport.events if e.kind.value == "wait"]
    assert [(e.step, e.source) for e in waits] == [(7, "n0")]
    assert abs(waits[0].ts.timestamp() - since) < 1e-3
    # the waited step is not the rank's pace: the next wait is judged on 0.2 s steps
    exporter2 = _paced(_Events(), step_s=0.2)
    exporter2._said = {8}
    for _ in range(40):
        exporter2.record_step(8, 0, step_time_s=5.0, compute_s=0.2, comm_wait_s=0.0)
    assert exporter2._input.threshold_s() == pytest.approx(0.2)
    exporter2.close(timeout=5)


def test_a_wait_shorter_than_a_step_is_not_said():
    transport = _Events()
    exporter = _paced(transport, step_s=30.0)
    exporter.waiting(time.time(), after_step=7)
    exporter.waiting(None)  # the batch came
    exporter.flush()
    exporter.close(timeout=5)
    assert [e.kind.value for e in transport.events] == ["end"]


def test_work_travels_by_name_from_the_exporter_through_the_aggregator_wire(tmp_path):
    """A rank's tokens, flops and longest sequence reach its StepTelemetry sample; a rank
    that said none sends the row it always sent (an older aggregator still reads it)."""
    from pipeline.client.aggregator import _record

    path = tmp_path / "agg.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(path))
    server.settimeout(10)
    exporter = StepExporter.to_aggregator(path, job_id="j", node="n0", register_atexit=False)
    for rank in range(2):
        work = {"tokens": 4096 * (rank + 1), "flops": 1e15, "max_seq_len": 2048} if rank else {}
        exporter.record_step(
            5, rank, step_time_s=1.0, compute_s=0.8, comm_wait_s=0.1, local_rank=rank, **work
        )
    exporter.flush()
    rows = json.loads(server.recv(65536))
    while isinstance(rows, dict):  # the job's start event
        rows = json.loads(server.recv(65536))
    exporter.close()
    server.close()
    assert not any(isinstance(x, dict) for x in rows[0])  # nothing said: the old row
    assert rows[1][-1] == {"tokens": 8192, "flops": 1e15, "max_seq_len": 2048}
    batcher = StepBatcher(ranks_per_node=2)
    (msg,) = [m for row in rows for m in batcher.add(_record(row, 0.0))]
    assert [(s.tokens, s.flops, s.max_seq_len) for s in msg.samples] == [
        (None, None, None),
        (8192, 1e15, 2048),
    ]
    with pytest.raises(ValueError, match="unknown work fields"):
        _record([*rows[1][:-1], {"tokens": 1, "evil": 2}], 0.0)
    with pytest.raises(TypeError):
        _record("not a row", 0.0)
