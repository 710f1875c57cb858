"""The clock-skew rule (pipeline/io/clockskew.py) and the exporters that apply it, without a
broker: a step or health report dated beyond the wall clock + STEPGUARD_MAX_CLOCK_SKEW_S
is not published, it is counted and one warning per interval says why, and the
training loop goes on."""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime, timedelta

import pytest

from pipeline.agents.dcgm import run_dcgm_exporter
from pipeline.agents.health import run_health_exporter
from pipeline.agents.node import NodeAggregator
from pipeline.client import StepExporter
from pipeline.io.clockskew import FutureGate, future_dated, seconds_ahead
from pipeline.io.settings import load_settings
from schemas import JobEvent, JobEventKind, NodeHealth
from tests.clock import day_start
from tests.factories import telemetry_settings
from tests.unit.pipeline.agents.test_dcgm import exposition
from tests.unit.pipeline.client.test_exporter import FakeNvml

NOW = day_start()


# -- the rule ---------------------------------------------------------------------------
def test_up_to_the_skew_passes_and_beyond_it_the_reason_names_field_and_setting():
    assert future_dated(NOW + timedelta(seconds=300), 300.0, now=NOW) is None
    assert future_dated(NOW - timedelta(days=3), 300.0, now=NOW) is None  # late is fine
    why = future_dated(NOW + timedelta(seconds=301), 300.0, now=NOW, field="issued_at")
    assert why is not None and why.startswith(
        f"issued_at {(NOW + timedelta(seconds=301)).isoformat()}"
    )
    assert "301s ahead of the wall clock" in why and "STEPGUARD_MAX_CLOCK_SKEW_S=300" in why
    assert seconds_ahead(NOW.timestamp() + 2.5, NOW) == 2.5  # floats and datetimes mix


def test_no_limit_checks_nothing_and_odd_times_are_refused_without_raising():
    assert future_dated(1e300, None, now=0.0) is None
    ms = future_dated(time.time() * 1000, 300.0, field="ts_end")  # ms passed as seconds
    assert ms is not None and ms.startswith("ts_end ") and "ahead of the wall clock" in ms
    assert "not a time" in (future_dated(float("nan"), 300.0, now=0.0) or "")
    assert future_dated(float("inf"), 300.0, now=0.0) is not None


def test_the_gate_counts_every_drop_and_warns_once_per_interval(caplog):
    mono = [0.0]
    gate = FutureGate(60.0, "exporter j/n", interval_s=30.0, clock=lambda: 1000.0,
                      monotonic=lambda: mono[0])  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="pipeline.io.clockskew"):
        assert gate.admit(1050.0)
        assert [gate.admit(5000.0, "ts_end") for _ in range(3)] == [False] * 3
        mono[0] = 31.0
        assert not gate.admit(5000.0, "ts_end")
    assert gate.dropped == 4
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2
    assert warnings[0].startswith("exporter j/n: 1 message(s) dated in the future")
    assert warnings[1].startswith("exporter j/n: 3 message(s)")
    assert "STEPGUARD_MAX_CLOCK_SKEW_S=60" in warnings[1] and "ts_end" in warnings[1]
    assert FutureGate(None, "x").admit(1e300)
    with pytest.raises(ValueError, match="max_skew_s"):
        FutureGate(0.0, "x")


# -- StepExporter -----------------------------------------------------------------------
class _Transport:
    """Records what the exporter would send."""

    def __init__(self) -> None:
        self.records: list = []

    def push(self, records) -> None:
        self.records += records

    def event(self, event) -> None:
        pass

    def poll(self, now: float) -> None:
        pass

    def drain(self, timeout: float) -> None:
        pass

    def close(self, timeout: float) -> None:
        pass

    def counts(self) -> tuple[int, int, int]:
        return len(self.records), 0, 0


def test_the_step_exporter_drops_a_future_dated_record_and_the_loop_goes_on(caplog):
    sent = _Transport()
    exporter = StepExporter(sent, job_id="j", node="n0", register_atexit=False,
                            announce_start=False, max_clock_skew_s=300.0)  # fmt: skip
    now = time.time()
    with caplog.at_level(logging.WARNING):
        assert not exporter.record_step(
            1,
            0,
            step_time_s=1.0,
            compute_s=0.8,
            comm_wait_s=0.1,
            data_wait_s=0.1,
            ts_end=now * 1000,
        )  # ms
        assert not exporter.record_step(
            1,
            1,
            step_time_s=1.0,
            compute_s=0.8,
            comm_wait_s=0.1,
            data_wait_s=0.1,
            ts_start=now + 3600,
        )
        assert exporter.record_step(
            1, 2, step_time_s=1.0, compute_s=0.8, comm_wait_s=0.1, data_wait_s=0.1, ts_end=now + 5
        )  # within skew
        assert exporter.record_step(
            2, 0, step_time_s=1.0, compute_s=0.8, comm_wait_s=0.1, data_wait_s=0.1
        )  # the default: now
    stats = exporter.close()
    assert [(r.step, r.rank) for r in sent.records] == [(1, 2), (2, 0)]
    assert (stats.future_dated, stats.recorded, stats.dropped) == (2, 2, 0)
    lines = [r.getMessage() for r in caplog.records]
    assert any("ts_end" in m and "STEPGUARD_MAX_CLOCK_SKEW_S=300" in m for m in lines)
    assert any("2 records dated beyond this host's clock" in m for m in lines)


def test_direct_exporters_take_the_skew_from_settings():
    s = load_settings({"STEPGUARD_MAX_CLOCK_SKEW_S": "5"}, kafka_bootstrap="127.0.0.1:1",
                      **telemetry_settings())  # fmt: skip
    exporter = StepExporter.direct(s, job_id="j", node="n0", register_atexit=False,
                                   announce_start=False)  # fmt: skip
    try:
        assert not exporter.record_step(
            0,
            0,
            step_time_s=1.0,
            compute_s=0.8,
            comm_wait_s=0.1,
            data_wait_s=0.1,
            ts_end=time.time() + 60,
        )
    finally:
        stats = exporter.close(timeout=1, reason=None)
    assert stats.future_dated == 1


# -- node aggregator --------------------------------------------------------------------
class _Sink:
    def __init__(self) -> None:
        self.sent: list = []

    def send(self, logical: str, msg) -> bool:
        self.sent.append((logical, msg))
        return True

    def flush(self, timeout: float | None = None) -> None:
        pass

    def close(self, timeout: float = 5.0) -> None:
        pass


def _row(step: int, rank: int, ts_end: object) -> list:
    return ["j", "n0", step, rank, rank, "train", 0, 0, 0, 1.0, 0.8, 0.1, 0.1, None, None,
            1.0, ts_end, "run-1"]  # fmt: skip


def test_the_node_aggregator_publishes_no_record_or_event_from_the_future(tmp_path):
    sink = _Sink()
    agg = NodeAggregator(load_settings({}), tmp_path / "agg.sock", ranks_per_node=1,
                         sink=sink)  # type: ignore[arg-type]  # fmt: skip
    try:
        now = time.time()
        agg._handle(json.dumps([_row(1, 0, now + 86_400), _row(2, 0, now)]).encode())
        ahead = JobEvent(
            job_id="j", kind=JobEventKind.START, ts=datetime.now(UTC) + timedelta(days=1)
        )
        agg._handle(json.dumps({"event": ahead.model_dump(mode="json")}).encode())
        agg._handle(json.dumps([_row(3, 0, "tomorrow")]).encode())  # not a number
    finally:
        agg.close()
    assert [(logical, m.step) for logical, m in sink.sent] == [("steps", 2)]
    assert (agg.future_dated, agg.malformed) == (2, 1)


# -- health exporters -------------------------------------------------------------------
def _an_hour_behind() -> float:
    return time.time() - 3600  # the report (dated now) is an hour ahead of this clock


def test_export_health_does_not_publish_a_report_dated_beyond_its_clock(capsys):
    settings = load_settings({})
    code = run_health_exporter(settings, node="n1", once=True, dry_run=True, nvml=FakeNvml(),
                               clock=_an_hour_behind)  # fmt: skip
    out = capsys.readouterr()
    assert code == 0 and out.out == ""
    assert "1 reports dated in the future not published" in out.err
    run_health_exporter(settings, node="n1", once=True, dry_run=True, nvml=FakeNvml())
    assert NodeHealth.model_validate_json(capsys.readouterr().out).node == "n1"


def test_export_health_from_dcgm_does_not_publish_a_report_dated_beyond_its_clock(capsys):
    code = run_dcgm_exporter(load_settings({}), "http://127.0.0.1:1/metrics", node="x",
                             once=True, dry_run=True, fetch=lambda url, t: exposition(),
                             clock=_an_hour_behind)  # fmt: skip
    out = capsys.readouterr()
    assert code == 0 and out.out == ""
    assert "1 reports dated in the future not published" in out.err
