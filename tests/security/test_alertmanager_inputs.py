"""Threats against the Alertmanager bridge from whoever can write the decisions topic:
page people (or announce a held action) with an alert no worker signed, or stop one
with a record that crashes the bridge. Run against the real
:class:`~pipeline.services.alertmanager.service.AlertmanagerBridge` on a real broker;
what it would post is recorded instead of sent (the real Alertmanager:
``tests/integration/test_alertmanager.py``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest
from kafka import KafkaProducer

from pipeline.io.kafka import (
    client_config,
    control_producer,
    create_topics,
    publish,
    read_back,
    registry_of,
)
from pipeline.io.trust import SigningKey, sign
from pipeline.services.alertmanager.client import PostOutcome
from pipeline.services.alertmanager.episodes import PostableAlert
from pipeline.services.alertmanager.service import AlertmanagerBridge
from schemas import (
    Alert,
    AlertKind,
    AlertState,
    DeadLetter,
    Evidence,
    Grade,
    RecommendedAction,
    encode,
)
from tests.factories import ACTUATOR_KEY, OPERATOR_KEY, WORKER_KEY, key_settings
from tests.security._helpers import impostor

pytestmark = pytest.mark.integration


class Recorder:
    """Stands in for the Alertmanager client: what would have been posted."""

    def __init__(self) -> None:
        self.posted: list[PostableAlert] = []

    def post(self, alerts: Sequence[PostableAlert]) -> PostOutcome:
        self.posted.extend(alerts)
        return PostOutcome(sent=len(alerts))

    def episodes(self) -> set[str]:
        return {a.labels["episode"] for a in self.posted}


def alert(fp: str, key: SigningKey | None, *, kind=AlertKind.HARDWARE, ts=None) -> Alert:
    now = ts or datetime.now(UTC)
    msg = Alert(
        fingerprint=fp, seq=0, kind=kind, grade=Grade.CRITICAL, state=AlertState.FIRING,
        job_id="job-sec", node="node-1", step=5, started_at=now, ts=now,
        evidence=Evidence(metric="ecc_uncorrected", value=1, deviation=1),
        recommended_action=RecommendedAction.ISOLATE, summary="page someone",
    )  # fmt: skip
    return msg if key is None else sign(msg, key)


def test_only_alerts_a_worker_signed_and_the_actuators_guardrails_reach_alertmanager(settings):
    s = settings.model_copy(update=key_settings())
    create_topics(s)
    registry = registry_of(s)
    later = datetime.now(UTC) + timedelta(days=1)
    bad = {
        "fp-unsigned-01": alert("fp-unsigned-01", None),
        "fp-forged-0001": alert("fp-forged-0001", impostor(WORKER_KEY)),
        "fp-operator-01": alert("fp-operator-01", OPERATOR_KEY),
        # the actuator's key counts for guardrail alerts only (its breakers and holds)
        "fp-actuator-01": alert("fp-actuator-01", ACTUATOR_KEY),
        "held-forged001": alert("held-forged001", impostor(ACTUATOR_KEY), kind=AlertKind.GUARDRAIL),
        "fp-tomorrow-01": alert("fp-tomorrow-01", WORKER_KEY, ts=later),
    }
    good = {
        "fp-worker-0001": alert("fp-worker-0001", WORKER_KEY),
        "held-real00001": alert("held-real00001", ACTUATOR_KEY, kind=AlertKind.GUARDRAIL),
    }
    producer = control_producer(s)
    raw = KafkaProducer(**client_config(s))
    try:
        for msg in [*bad.values(), *good.values()]:
            publish(producer, registry, "decisions", msg).get(timeout=30)
        topic = registry.name("decisions")
        garbled = json.loads(encode(good["fp-worker-0001"])) | {"signature": "é" * 128}
        for value in (b"not json", json.dumps(garbled).encode()):
            raw.send(topic, value).get(timeout=30)
    finally:
        producer.close()
        raw.close()

    recorder = Recorder()
    bridge = AlertmanagerBridge(s, client=recorder)
    try:

        def letters() -> list:
            return [r.message for r in read_back(s, "deadletter")]

        for _ in range(150):  # the two undecodable records are not "consumed" alerts
            read = bridge.stats.consumed >= len(bad) + len(good)
            if read and recorder.posted and len(letters()) >= len(bad) + 2:
                break
            bridge.poll_once(timeout_ms=200)
        else:
            raise AssertionError("the bridge did not read every record")
        # the read-back at start skipped the same records: nothing bad ever sent
        assert recorder.episodes() == set(good)
        held = [a for a in recorder.posted if a.labels["episode"] == "held-real00001"]
        assert held[0].labels["alertname"] == "StepguardActionHeld"
    finally:
        bridge.close()
    dead = letters()
    assert all(isinstance(d, DeadLetter) for d in dead)
    stages = sorted(d.stage for d in dead if isinstance(d, DeadLetter))
    # five signatures refused, one future date, and two records that never decoded
    assert stages.count("signature") == 5 and stages.count("clock") == 1
    assert len(dead) == len(bad) + 2
