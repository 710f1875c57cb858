"""What the actuator, the executors and the archiver count, against a real broker (and
both archive backends): the numbers their metrics endpoints serve, and the one log
line an executor writes per command it answers."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry

from pipeline.io.kafka import control_producer, create_topics, publish, registry_of
from pipeline.io.metrics import ActuatorMetrics, ArchiverMetrics, ExecutorMetrics
from pipeline.io.trust import sign
from pipeline.services.actuator.executors import DryRunExecutor, ExecutorRunner
from pipeline.services.actuator.service import Actuator
from pipeline.services.archive.archiver import Archiver
from schemas import (
    ActuatorMode,
    Alert,
    AlertKind,
    AlertState,
    Command,
    CommandKind,
    Evidence,
    Grade,
    RecommendedAction,
)
from tests.factories import (
    ACTUATOR_KEY,
    WORKER_KEY,
    job_controller_settings,
    key_settings,
    step_telemetry,
    test_key,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def act_settings(settings):
    s = settings.model_copy(
        update=key_settings() | {"actuator_mode": "auto", "spare_nodes": "spare-0",
                                 "guard_max_isolation_pct": 100.0}
    )  # fmt: skip
    create_topics(s)
    return s


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    got = registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


def send(settings, logical, *messages):
    producer = control_producer(settings)
    try:
        reg = registry_of(settings)
        for m in messages:
            publish(producer, reg, logical, m).get(timeout=30)
    finally:
        producer.close()


def command(cid: str, key=ACTUATOR_KEY) -> Command:
    now = datetime.now(UTC)
    cmd = Command(
        command_id=cid, kind=CommandKind.CHECKPOINT, job_id="job-m", targets=(),
        reason=("fp",), mode=ActuatorMode.AUTO, issued_at=now,
        expires_at=now + timedelta(seconds=300),
    )  # fmt: skip
    return sign(cmd, key)


def test_an_executor_logs_and_counts_each_command_it_answers(act_settings, caplog):
    forged = command("cmd-forged", key=test_key("attacker"))
    send(act_settings, "commands", command("cmd-ok"), forged)
    metrics = ExecutorMetrics()
    runner = ExecutorRunner(act_settings, DryRunExecutor(), metrics=metrics)
    reg = metrics.registry
    caplog.set_level(logging.INFO, logger="pipeline.services.actuator.executors")
    try:
        for _ in range(100):  # bounded: until both are answered
            runner.poll_once(timeout_ms=200)
            if value(reg, "stepguard_executor_consumed_total", executor="dry-run") >= 2:
                break
    finally:
        runner.close()
    ok = dict(executor="dry-run", kind="checkpoint", result="succeeded")
    refused = ok | {"result": "refused"}
    assert value(reg, "stepguard_executor_commands_total", **ok) == 1
    assert value(reg, "stepguard_executor_commands_total", **refused) == 1
    assert value(reg, "stepguard_executor_refused_total", executor="dry-run") == 1
    lines = [r.getMessage() for r in caplog.records if "command cmd-" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "cmd-ok checkpoint job=job-m targets=- -> succeeded: dry-run: would" in lines[0]
    assert "cmd-forged checkpoint job=job-m" in lines[1] and "-> refused" in lines[1]


def _alert(fp: str) -> Alert:
    now = datetime.now(UTC)
    return Alert(
        fingerprint=fp, seq=0, kind=AlertKind.HARDWARE, grade=Grade.CRITICAL,
        state=AlertState.FIRING, job_id="job-m", node="node-3", step=100, started_at=now,
        ts=now, evidence=Evidence(metric="ecc_uncorrected", value=1, deviation=1),
        recommended_action=RecommendedAction.ISOLATE, summary="uncorrectable ECC on node-3",
        node_in_steps=True,  # a member of the job: the actuator may isolate it
    )  # fmt: skip


def test_the_actuator_counts_alerts_by_result_and_commands_by_kind(act_settings):
    signed = sign(_alert("fp-metrics-0001"), WORKER_KEY)
    unsigned = _alert("fp-metrics-0002")
    send(act_settings, "decisions", signed, unsigned)
    metrics = ActuatorMetrics()
    act = Actuator(act_settings, metrics=metrics)
    reg = metrics.registry
    try:
        for _ in range(100):
            if act.stats.consumed >= 2:
                break
            act.poll_once(timeout_ms=200)
    finally:
        act.close()
    assert value(reg, "stepguard_actuator_inputs_total", topic="decisions") == 2
    assert value(reg, "stepguard_actuator_alerts_total", grade="critical", result="acted") == 1
    assert value(reg, "stepguard_actuator_alerts_total", grade="critical", result="refused") == 1
    kinds = ("checkpoint", "isolate", "restart")
    counted = {k: value(reg, "stepguard_actuator_commands_total", kind=k) for k in kinds}
    assert sum(counted.values()) == act.stats.commands >= 1, counted
    assert counted["isolate"] == 1
    # auto mode publishes no action record, and the action is still counted (issue 24)
    assert value(reg, "stepguard_actuator_actions_total", mode="auto", state="issued") == 1
    assert value(reg, "stepguard_actuator_held_actions") == 0
    assert value(reg, "stepguard_actuator_oldest_held_seconds") == 0


@pytest.mark.parametrize("decode_processes", [0])
def test_the_archiver_counts_rows_per_table_and_its_lag_reaches_zero(
    settings, archive, decode_processes
):
    create_topics(settings, ["steps", "deadletter"])
    producer = control_producer(settings)
    reg = registry_of(settings)
    for step in range(3):
        publish(producer, reg, "steps", step_telemetry(job="job-m", step=step, ranks=4))
    producer.flush()
    producer.close()
    metrics = ArchiverMetrics()
    archiver = Archiver(settings, archive, topics=["steps"], max_wait_s=0.3, metrics=metrics,
                        decode_processes=decode_processes)  # fmt: skip
    try:
        for _ in range(60):
            archiver.poll_batch()
            if archiver.stats.messages >= 3:
                break
        archiver.poll_batch()  # a poll after the last insert: counters and lag updated
    finally:
        archiver.close()
    r = metrics.registry
    assert value(r, "stepguard_archiver_messages_total") == 3
    assert value(r, "stepguard_archiver_rows_total", table="steps") == 12
    assert value(r, "stepguard_archiver_insert_seconds_count", table="steps") >= 1
    assert value(r, "stepguard_archiver_consumer_lag", topic="steps") == 0


def test_the_job_controller_serves_counts_and_logs_what_it_carries_out(act_settings, caplog):
    import urllib.request

    from pipeline.client.listener import CommandListener
    from pipeline.io.embedded import free_port

    port = free_port()
    s = act_settings.model_copy(
        update={"listener_metrics_port": port} | job_controller_settings("job-m")
    )
    caplog.set_level(logging.INFO, logger="pipeline.client.listener")
    saved: list[int] = []
    listener = CommandListener(s, "job-m", on_checkpoint=lambda c, step: saved.append(step) or "ok")
    with listener:
        send(s, "commands", command("cmd-forged-2", key=test_key("attacker")), command("cmd-ok-2"))
        listener.poll_step_boundary(3, wait_s=30)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            served = resp.read().decode()
    reg = listener.metrics.registry
    ok = dict(executor="job-controller", kind="checkpoint", result="succeeded")
    assert saved == [3]
    assert value(reg, "stepguard_executor_commands_total", **ok) == 1
    assert value(reg, "stepguard_executor_refused_total", executor="job-controller") == 1
    assert 'result="succeeded"} 1.0' in served
    lines = [r.getMessage() for r in caplog.records if "command cmd-" in r.getMessage()]
    assert len(lines) == 2 and "cmd-forged-2" in lines[0] and "-> refused" in lines[0]
    assert "job-controller: command cmd-ok-2 checkpoint job=job-m" in lines[1]
    assert lines[1].endswith("-> succeeded: ok")


def test_the_actuator_reports_held_actions_and_the_age_of_the_oldest(act_settings):
    """Approve mode: the action record is counted as held, and oldest_held_seconds
    follows the actuator's clock (the StepguardActionHeldTooLong alert reads it)."""
    s = act_settings.model_copy(update={"actuator_mode": "approve"})
    t0 = datetime.now(UTC)
    now = [t0]
    alert = _alert("fp-metrics-held").model_copy(update={"ts": t0, "started_at": t0})
    send(s, "decisions", sign(alert, WORKER_KEY))
    metrics = ActuatorMetrics()
    act = Actuator(s, metrics=metrics, clock=lambda: now[0])
    reg = metrics.registry
    try:
        for _ in range(100):
            if act.stats.consumed >= 1:
                break
            act.poll_once(timeout_ms=200)
        now[0] = t0 + timedelta(seconds=120)
        act.poll_once(timeout_ms=100)
    finally:
        act.close()
    assert value(reg, "stepguard_actuator_actions_total", mode="approve", state="held") == 1
    assert value(reg, "stepguard_actuator_held_actions") == 1
    assert value(reg, "stepguard_actuator_oldest_held_seconds") == 120


def _get(url: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_healthz_and_readyz_say_whether_the_actuator_consumes(act_settings):
    """Issue 41 item 6: the metrics port answered only /metrics; a probe could not tell
    a live service that consumes from one that is stuck before its first poll."""
    from pipeline.io.embedded import free_port
    from pipeline.io.metrics import serve_metrics

    port = free_port()
    s = act_settings.model_copy(update={"actuator_metrics_port": port})
    metrics = ActuatorMetrics()
    server = serve_metrics(metrics.registry, s, "actuator_metrics_port", metrics.readiness)
    assert server is not None
    base = f"http://127.0.0.1:{port}"
    act = Actuator(s, metrics=metrics)
    try:
        assert _get(f"{base}/healthz") == (200, "ok\n")
        assert _get(f"{base}/readyz") == (503, "not consuming yet (starting)\n")
        act.poll_once(timeout_ms=200)
        assert _get(f"{base}/readyz") == (200, "ok\n")
        status, body = _get(f"{base}/metrics")
        assert status == 200 and "stepguard_actuator_inputs_total" in body
    finally:
        act.close()
        server.shutdown()
        server.server_close()
