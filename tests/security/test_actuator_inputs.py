"""Threats against the actuator from whoever can write the decisions or control topic,
run against the real :class:`~pipeline.actuator.service.Actuator` on a real broker."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pipeline.actuator.service import Actuator
from pipeline.actuator.signing import sign
from pipeline.kafka import control_producer, create_topics, publish, read_back, registry_of
from schemas import (
    ActuatorMode,
    Alert,
    AlertKind,
    AlertState,
    CommandKind,
    ControlMessage,
    Evidence,
    Grade,
    RecommendedAction,
)
from tests.factories import ACTUATOR_KEY, EXECUTOR_KEY, OPERATOR_KEY, WORKER_KEY, key_settings
from tests.security._helpers import impostor

pytestmark = pytest.mark.integration


@pytest.fixture
def act_settings(settings):
    s = settings.model_copy(
        update=key_settings() | {"actuator_mode": "auto", "spare_nodes": "spare-0,spare-1",
                                 "guard_max_isolation_pct": 100.0}
    )  # fmt: skip
    create_topics(s)
    return s


def alert(job: str, node: str, ts: datetime | None = None) -> Alert:
    ts = ts or datetime.now(UTC)
    return Alert(
        fingerprint=f"fp-{job}-{node}", seq=0, kind=AlertKind.HARDWARE, grade=Grade.CRITICAL,
        state=AlertState.FIRING, job_id=job, node=node, step=100, started_at=ts, ts=ts,
        evidence=Evidence(metric="ecc_uncorrected", value=1, deviation=1),
        recommended_action=RecommendedAction.ISOLATE, summary=f"uncorrectable ECC on {node}",
        node_in_steps=True,
    )  # fmt: skip


def send(settings, logical: str, *messages) -> None:
    producer = control_producer(settings)
    try:
        for m in messages:
            publish(producer, registry_of(settings), logical, m).get(timeout=30)
    finally:
        producer.close()


def consume(act: Actuator, n: int) -> None:
    """Poll until the actuator has consumed ``n`` inputs in total (bounded)."""
    for _ in range(150):
        if act.stats.consumed >= n:
            return
        act.poll_once(timeout_ms=200)
    raise AssertionError(f"consumed {act.stats.consumed} < {n}")


def isolated(settings) -> set[str]:
    return {
        t
        for r in read_back(settings, "commands")
        if r.message.kind is CommandKind.ISOLATE
        for t in r.message.targets
    }


def test_unsigned_alerts_and_invented_jobs_cannot_turn_into_isolations(act_settings):
    """Threat: an unsigned alert on the decisions topic became a signed isolation, and
    the breaker being per job, invented job ids isolated without limit."""
    spares = ",".join(f"spare-{i}" for i in range(10))  # spares are not what stops it
    s = act_settings.model_copy(update={"guard_max_isolations_global": 2, "spare_nodes": spares})
    act = Actuator(s)
    try:
        forged = [alert("job-1", "node-1"),  # unsigned
                  sign(alert("job-1", "node-2"), ACTUATOR_KEY),  # not a worker's key
                  sign(alert("job-1", "node-3"), EXECUTOR_KEY),
                  sign(alert("job-1", "node-4"), impostor(WORKER_KEY))]  # fmt: skip
        send(s, "decisions", *forged)
        consume(act, 4)
        assert (act.stats.unsigned_alerts, act.stats.commands) == (4, 0)
        # signed by a worker key but spread over invented jobs: the global budget holds
        send(s, "decisions", *(sign(alert(f"made-up-{i}", f"node-{10 + i}"), WORKER_KEY)
                               for i in range(6)))  # fmt: skip
        consume(act, 10)
    finally:
        act.close()
    assert len(isolated(s)) == 2
    refused = [r.message for r in read_back(s, "actions") if "global" in r.message.detail]
    assert len(refused) == 4 and all("global isolation budget" in r.detail for r in refused)


def test_an_alert_dated_in_the_future_does_not_stop_remediation(act_settings):
    """Threat: one alert dated a day ahead made every later alert 'stale' (one global
    newest time), so nothing was remediated any more."""
    act = Actuator(act_settings)
    try:
        ahead = datetime.now(UTC) + timedelta(days=1)
        send(act_settings, "decisions", sign(alert("job-evil", "node-9", ahead), WORKER_KEY))
        consume(act, 1)
        send(act_settings, "decisions", sign(alert("job-1", "node-3"), WORKER_KEY))
        consume(act, 2)
    finally:
        act.close()
    assert "node-3" in isolated(act_settings)


def test_a_replayed_or_older_control_message_is_not_applied(act_settings):
    """Threat: an old signed control message (``--mode auto``, ``--reset-breaker``)
    re-published was applied again, and again on every start."""
    s = act_settings.model_copy(update={"actuator_mode": "observe"})
    now = datetime.now(UTC)

    def change(cid: str, mode: ActuatorMode, at: datetime) -> ControlMessage:
        return sign(ControlMessage(change_id=cid, mode=mode, reset_breaker=True, by="sre",
                                   ts=at), OPERATOR_KEY)  # fmt: skip

    to_auto = change("chg-auto", ActuatorMode.AUTO, now - timedelta(minutes=5))
    to_observe = change("chg-observe", ActuatorMode.OBSERVE, now)
    act = Actuator(s)
    try:
        send(s, "control", to_auto, to_observe)
        consume(act, 2)
        assert act.policy.params.mode is ActuatorMode.OBSERVE
        older = change("chg-new-id", ActuatorMode.AUTO, now - timedelta(minutes=1))
        send(s, "control", to_auto, older)  # the replay, and an older change under a new id
        consume(act, 4)
        assert act.policy.params.mode is ActuatorMode.OBSERVE and act.stats.refused == 2
    finally:
        act.close()
    again = Actuator(s)  # the start-up rebuild reads the same topic: refused there too
    try:
        assert again.policy.params.mode is ActuatorMode.OBSERVE and again.stats.refused == 2
    finally:
        again.close()
