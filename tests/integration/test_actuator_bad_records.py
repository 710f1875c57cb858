"""Issue 14 item 3, the actuator: a bad record on every topic it reads (decisions,
approvals, control) is a dead letter with its source coordinates, the running actuator
goes on, handles the good records after it on all three topics, and commits past them.

Bad here: bytes that are not JSON, a message of the wrong kind, and a signature that is
not even well-formed (it used to make the verifier raise), and a well-formed, signed
alert dated a day ahead (beyond ``STEPGUARD_MAX_CLOCK_SKEW_S``: stage ``clock``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from kafka import KafkaConsumer, TopicPartition

from pipeline.io.kafka import (
    client_config,
    control_producer,
    create_topics,
    publish,
    read_back,
    registry_of,
)
from pipeline.io.trust import sign
from pipeline.services.actuator.service import Actuator
from schemas import (
    ActionState,
    ActuatorMode,
    Alert,
    AlertKind,
    AlertState,
    Approval,
    ApprovalDecision,
    CommandKind,
    ControlMessage,
    DeadLetter,
    Evidence,
    Grade,
    RecommendedAction,
    encode,
)
from tests.factories import OPERATOR_KEY, WORKER_KEY, key_settings

pytestmark = pytest.mark.integration


def _alert(job: str, node: str, ts: datetime) -> Alert:
    return sign(Alert(
        fingerprint=f"fp-{job}-{node}", seq=0, kind=AlertKind.HARDWARE, grade=Grade.CRITICAL,
        state=AlertState.FIRING, job_id=job, node=node, step=100, started_at=ts, ts=ts,
        evidence=Evidence(metric="ecc_uncorrected", value=1, deviation=1),
        recommended_action=RecommendedAction.ISOLATE, summary=f"uncorrectable ECC on {node}",
        node_in_steps=True,
    ), WORKER_KEY)  # fmt: skip


def _garbled(message, signature: str = "é" * 128) -> bytes:
    return json.dumps(json.loads(encode(message)) | {"signature": signature}).encode()


def _poll_until(act: Actuator, settings, logical: str, done, what: str):
    """Poll the running actuator until ``done(messages of logical)`` (bounded)."""
    for _ in range(150):
        got = [r.message for r in read_back(settings, logical)]
        if done(got):
            return got
        act.poll_once(timeout_ms=200)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_bad_record_on_every_topic_is_dead_lettered_and_the_good_ones_handled(settings):
    s = settings.model_copy(update=key_settings() | {
        "actuator_mode": "auto", "spare_nodes": "spare-0,spare-1",
        "guard_max_isolation_pct": 100.0,
    })  # fmt: skip
    create_topics(s)
    registry = registry_of(s)
    now = datetime.now(UTC)
    to_approve = sign(ControlMessage(change_id="chg-approve", mode=ActuatorMode.APPROVE,
                                     by="sre", ts=now), OPERATOR_KEY)  # fmt: skip
    approval = Approval(
        action_id="act-0123456789abcdef01234567", decision=ApprovalDecision.APPROVE,
        by="sre", ts=now,
    )  # fmt: skip
    approval = sign(approval, OPERATOR_KEY)
    producer = control_producer(s)
    try:
        sent = lambda logical, value: producer.send(  # noqa: E731
            registry.name(logical), key=b"k", value=value
        ).get(30)
        lettered = [
            sent("decisions", b"{not json"),
            sent("decisions", _garbled(_alert("job-1", "node-7", now))),
            sent("decisions", encode(to_approve)),  # a control message on decisions
            sent("approvals", b"\xff\xfe"),
            sent("approvals", _garbled(approval, "ab" * 32)),
            sent("control", b"[]"),
            sent("control", _garbled(to_approve)),
        ]
        # well-formed, signed, dated a day ahead: beyond the allowed clock skew
        ahead = _alert("job-evil", "node-9", now + timedelta(days=1))
        lettered.append(publish(producer, registry, "decisions", ahead).get(30))
        good = [publish(producer, registry, "control", to_approve).get(30)]
    finally:
        producer.close()
    act = Actuator(s)
    try:
        for _ in range(100):  # the good control message after the bad ones is applied
            if act.policy.params.mode is ActuatorMode.APPROVE:
                break
            act.poll_once(timeout_ms=200)
        assert act.policy.params.mode is ActuatorMode.APPROVE
        send = control_producer(s)
        try:
            alert = _alert("job-1", "node-3", now)
            good.append(publish(send, registry, "decisions", alert).get(30))

            def held(records):
                return [r for r in records if r.job_id == "job-1" and r.state is ActionState.HELD]

            (hold,) = held(_poll_until(act, s, "actions", held, "a hold"))
            approved = sign(
                approval.model_copy(update={"action_id": hold.action_id, "held_at": hold.ts}),
                OPERATOR_KEY,
            )
            good.append(publish(send, registry, "approvals", approved).get(30))
        finally:
            send.close()
        commands = _poll_until(act, s, "commands", lambda got: any(
            c.kind is CommandKind.ISOLATE and c.targets == ("node-3",) for c in got),
            "the approved isolation")  # fmt: skip
    finally:
        act.close()
    # approve mode: job-evil's isolation is held, never approved
    assert not [c for c in commands if c.kind is CommandKind.ISOLATE and c.job_id == "job-evil"]
    letters = [r.message for r in read_back(s, "deadletter")]
    assert all(isinstance(d, DeadLetter) for d in letters)
    coords = {(d.source_topic, d.partition, d.offset) for d in letters}
    assert coords == {(m.topic, m.partition, m.offset) for m in lettered}
    garbled = [d for d in letters if d.raw.count(b"\\u00e9") or b'"ab' in d.raw]
    assert len(garbled) == 3 and all("signature" in d.error for d in garbled)
    (future,) = [d for d in letters if d.stage == "clock"]
    assert "STEPGUARD_MAX_CLOCK_SKEW_S=300" in future.error and b"job-evil" in future.raw
    # committed past every record it read: a restarted actuator reads none of them again
    committed = KafkaConsumer(
        **client_config(s), group_id=f"{s.consumer_group}.actuator", enable_auto_commit=False
    )
    try:
        for meta in [*lettered, *good]:
            tp = TopicPartition(meta.topic, meta.partition)
            assert (committed.committed(tp) or 0) > meta.offset, meta
    finally:
        committed.close()
