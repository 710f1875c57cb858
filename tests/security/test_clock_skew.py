"""Threat: a writer dates a message in the future. Only the worker refused that; the
actuator applied a control change dated a day ahead (and then every real change was
"not newer" and refused, live and after each restart), executors and the job
controller carried out a command issued tomorrow, and exporters published whatever
time the training code passed (milliseconds as seconds included).

Control: every entry point applies one rule (``pipeline/io/clockskew.py``): dated beyond
its wall clock + ``STEPGUARD_MAX_CLOCK_SKEW_S`` is a dead letter (actuator, worker), a
REFUSED result (executors, listener) or not published (exporters). Run on a real broker.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from kafka import KafkaConsumer, TopicPartition

from pipeline.agents.health import run_health_exporter
from pipeline.client import StepExporter
from pipeline.client.listener import CommandListener
from pipeline.io.kafka import (
    client_config,
    control_producer,
    create_topics,
    publish,
    read_back,
    registry_of,
)
from pipeline.io.trust import sign
from pipeline.services.actuator.executors import DryRunExecutor, ExecutorRunner
from pipeline.services.actuator.service import Actuator
from schemas import (
    ActionState,
    ActuatorMode,
    Alert,
    AlertKind,
    AlertState,
    Approval,
    ApprovalDecision,
    Command,
    CommandKind,
    CommandStatus,
    ControlMessage,
    Evidence,
    Grade,
    RecommendedAction,
)
from tests.factories import ACTUATOR_KEY, OPERATOR_KEY, WORKER_KEY, key_settings
from tests.unit.pipeline.client.test_exporter import FakeNvml

pytestmark = pytest.mark.integration

DAY = timedelta(days=1)


@pytest.fixture
def s(settings):
    s = settings.model_copy(update=key_settings() | {"actuator_mode": "observe"})
    create_topics(s)
    return s


def _send(settings, logical: str, *messages) -> list:
    producer = control_producer(settings)
    try:
        return [publish(producer, registry_of(settings), logical, m).get(30) for m in messages]
    finally:
        producer.close()


def _alert(job: str, node: str, ts: datetime) -> Alert:
    return sign(Alert(
        fingerprint=f"fp-{job}-{node}", seq=0, kind=AlertKind.HARDWARE, grade=Grade.CRITICAL,
        state=AlertState.FIRING, job_id=job, node=node, step=100, started_at=ts, ts=ts,
        evidence=Evidence(metric="ecc_uncorrected", value=1, deviation=1),
        recommended_action=RecommendedAction.ISOLATE, summary=f"uncorrectable ECC on {node}",
        node_in_steps=True,
    ), WORKER_KEY)  # fmt: skip


def _change(cid: str, mode: ActuatorMode, ts: datetime) -> ControlMessage:
    return sign(ControlMessage(change_id=cid, mode=mode, by="sre", ts=ts), OPERATOR_KEY)


def _consume(act: Actuator, n: int) -> None:
    for _ in range(150):
        if act.stats.consumed >= n:
            return
        act.poll_once(timeout_ms=200)
    raise AssertionError(f"consumed {act.stats.consumed} < {n}")


def test_the_actuator_dead_letters_decisions_approvals_and_control_dated_in_the_future(s):
    now = datetime.now(UTC)
    approval = Approval(action_id="act-0123456789abcdef01234567",
                        decision=ApprovalDecision.APPROVE, by="sre", ts=now + DAY)  # fmt: skip
    act = Actuator(s)
    try:
        ahead = [
            *_send(s, "control", _change("chg-tomorrow", ActuatorMode.AUTO, now + DAY)),
            *_send(s, "approvals", sign(approval, OPERATOR_KEY)),
            *_send(s, "decisions", _alert("job-evil", "node-9", now + DAY)),
        ]
        _consume(act, 3)
        # the real change after it is newer than every change applied, so it applies
        good = _send(s, "control", _change("chg-now", ActuatorMode.APPROVE, now))
        _consume(act, 4)
        assert act.policy.params.mode is ActuatorMode.APPROVE
        good += _send(s, "decisions", _alert("job-1", "node-3", datetime.now(UTC)))
        _consume(act, 5)
        assert act.stats.future_dated == 3
    finally:
        act.close()
    actions = [r.message for r in read_back(s, "actions")]
    assert [(a.job_id, a.state) for a in actions] == [("job-1", ActionState.HELD)]
    letters = [r.message for r in read_back(s, "deadletter")]
    assert {(d.source_topic, d.partition, d.offset) for d in letters} == {
        (m.topic, m.partition, m.offset) for m in ahead
    }
    assert {d.stage for d in letters} == {"clock"}
    assert all("STEPGUARD_MAX_CLOCK_SKEW_S=300" in d.error for d in letters)
    committed = KafkaConsumer(
        **client_config(s), group_id=f"{s.consumer_group}.actuator", enable_auto_commit=False
    )
    try:
        for meta in [*ahead, *good]:
            tp = TopicPartition(meta.topic, meta.partition)
            assert (committed.committed(tp) or 0) > meta.offset, meta
    finally:
        committed.close()
    again = Actuator(s)  # the rebuild reads the control topic back: refused there too
    try:
        assert again.policy.params.mode is ActuatorMode.APPROVE
        assert again.stats.future_dated == 1
    finally:
        again.close()


def _command(cid: str, issued: datetime) -> Command:
    return sign(Command(command_id=cid, kind=CommandKind.CHECKPOINT, job_id="job-1",
                        reason=("fp",), mode=ActuatorMode.AUTO, issued_at=issued,
                        expires_at=issued + timedelta(minutes=5)), ACTUATOR_KEY)  # fmt: skip


def test_executors_and_the_listener_refuse_a_command_issued_in_the_future(s):
    now = datetime.now(UTC)
    _send(s, "commands", _command("cmd-tomorrow", now + DAY), _command("cmd-now", now))
    runner = ExecutorRunner(s, DryRunExecutor())
    saved: list[int] = []
    try:
        with CommandListener(
            s, "job-1", on_checkpoint=lambda c, step: saved.append(step) or "saved"
        ) as listener:
            applied = listener.poll_step_boundary(7, wait_s=30)
        for _ in range(50):
            runner.poll_once(timeout_ms=200)
            if "cmd-now" in runner.done:
                break
    finally:
        runner.close()
    assert [c.command_id for c in applied] == ["cmd-now"] and saved == [7]
    # the refused one is not remembered as done
    assert "cmd-now" in runner.done and "cmd-tomorrow" not in runner.done
    results = {(r.message.executor, r.message.command_id, r.message.status): r.message.detail
               for r in read_back(s, "results")}  # fmt: skip
    for executor in ("dry-run", "job-controller"):
        why = results[(executor, "cmd-tomorrow", CommandStatus.REFUSED)]
        assert why.startswith("issued_at ") and "STEPGUARD_MAX_CLOCK_SKEW_S=300" in why
        assert (executor, "cmd-tomorrow", CommandStatus.SUCCEEDED) not in results
    assert results[("dry-run", "cmd-now", CommandStatus.SUCCEEDED)].startswith("dry-run")
    assert results[("job-controller", "cmd-now", CommandStatus.SUCCEEDED)] == "saved"


def test_exporters_never_publish_a_step_or_health_report_dated_in_the_future(s):
    exporter = StepExporter.direct(s, job_id="job-1", node="n0", ranks_per_node=1,
                                   register_atexit=False)  # fmt: skip
    tomorrow = time.time() + DAY.total_seconds()
    assert not exporter.record_step(
        1, 0, step_time_s=1.0, compute_s=0.8, comm_wait_s=0.1, data_wait_s=0.1, ts_end=tomorrow
    )
    assert exporter.record_step(
        2, 0, step_time_s=1.0, compute_s=0.8, comm_wait_s=0.1, data_wait_s=0.1
    )  # training goes on
    stats = exporter.close(timeout=10)
    assert stats.future_dated == 1
    assert [r.message.step for r in read_back(s, "steps")] == [2]
    behind = lambda: time.time() - DAY.total_seconds()  # noqa: E731 - a clock a day slow
    assert run_health_exporter(s, node="n0", once=True, nvml=FakeNvml(), clock=behind) == 0
    assert run_health_exporter(s, node="n0", once=True, nvml=FakeNvml()) == 0
    assert len(list(read_back(s, "health"))) == 1
