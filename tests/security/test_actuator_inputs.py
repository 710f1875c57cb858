"""Threats against the actuator from whoever can write the decisions or control topic,
run against the real :class:`~pipeline.services.actuator.service.Actuator` on a real broker."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pipeline.io.kafka import control_producer, create_topics, publish, read_back, registry_of
from pipeline.io.trust import sign
from pipeline.services.actuator.service import Actuator
from schemas import (
    ActionState,
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


def test_a_month_old_control_change_is_refused_with_no_newer_one_left(act_settings):
    """Threat (issue 22 item 13): a 30-day-old operator-signed change was applied once
    the newer ones had aged out of the topic. Here none is left: only its age refuses
    it, live and in the next start-up rebuild."""
    s = act_settings.model_copy(update={"actuator_mode": "observe"})
    old = sign(ControlMessage(change_id="chg-month-old", mode=ActuatorMode.AUTO, by="sre",
                              ts=datetime.now(UTC) - timedelta(days=30)), OPERATOR_KEY)  # fmt: skip
    act = Actuator(s)
    try:
        send(s, "control", old)
        consume(act, 1)
        assert act.policy.params.mode is ActuatorMode.OBSERVE and act.stats.refused == 1
    finally:
        act.close()
    again = Actuator(s)
    try:
        assert again.policy.params.mode is ActuatorMode.OBSERVE and again.stats.refused == 1
    finally:
        again.close()


def test_a_health_alert_naming_a_node_outside_the_job_drains_nothing(act_settings):
    """Threat (issue 22 item 3): one health report with a drain XID naming a node that
    never sent a step of the job was graded, and the actuator added the alert's own node
    to the job's nodes before planning, so the executors' target check always passed:
    it signed an ISOLATE. Now the worker-signed alert says the node is not in the job's
    steps, and the actuator only alerts."""
    act = Actuator(act_settings)
    try:
        outsider = alert("job-1", "node-99").model_copy(update={"node_in_steps": False})
        send(act_settings, "decisions", sign(outsider, WORKER_KEY))
        consume(act, 1)
    finally:
        act.close()
    kinds = [(r.message.kind, r.message.targets) for r in read_back(act_settings, "commands")]
    assert kinds == [(CommandKind.NOTIFY, ("node-99",))] and isolated(act_settings) == set()


def test_a_replayed_approval_decides_no_other_hold():
    """Threat (issue 22): an approval was not bound to one hold: replayed once the first
    hold's record had aged out of the actuator's memory, it approved a later hold of the
    same action."""
    from pipeline.policy import Policy, PolicyParams
    from schemas import Approval, ApprovalDecision

    p = Policy(PolicyParams(mode=ActuatorMode.APPROVE, spare_nodes=("spare-0",), hold_ttl_s=60,
                            max_isolation_pct=100))  # fmt: skip
    t0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    fired = alert("job-1", "node-3", t0).model_copy(update={"node_in_steps": True})
    [first] = [r for r in p.on_alert(fired, t0).records if r.action_id]
    approval = sign(Approval(action_id=first.action_id, decision=ApprovalDecision.APPROVE,
                             by="sre", ts=t0, held_at=first.ts), OPERATOR_KEY)  # fmt: skip
    p.on_tick(t0 + timedelta(seconds=61))  # expires undecided
    later = t0 + timedelta(seconds=p.horizon_s + 100)
    again = fired.model_copy(update={"seq": 1, "ts": later})
    assert [r.state for r in p.on_alert(again, later).records] == [ActionState.HELD]
    out = p.on_approval(approval, later)  # the old approval, replayed
    assert out.commands == [] and out.note == "approval of another hold"


def test_a_webhook_receiver_cannot_kill_the_executor_with_a_bad_status_line():
    """Threat (issue 22 item 10): a malformed HTTP status line
    (``http.client.BadStatusLine``) killed ``stepguard executor webhook``, again on every
    restart. Now it is a failed post (a FAILED result), and the executor goes on."""
    import socket
    import threading

    from pipeline.services.actuator.executors import ExecutionError, WebhookExecutor
    from schemas import Command

    server = socket.create_server(("127.0.0.1", 31512))
    server.settimeout(10)

    def serve():
        for _ in range(2):
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 2OO WHATEVER\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    now = datetime.now(UTC)
    cmd = Command(
        command_id="cmd-hook",
        kind=CommandKind.NOTIFY,
        job_id="job-1",
        reason=(),
        mode=ActuatorMode.AUTO,
        issued_at=now,
        expires_at=now + timedelta(minutes=5),
    )
    hook = WebhookExecutor(["http://127.0.0.1:31512/hook"], timeout_s=5, retries=0)
    try:
        for _ in range(2):  # and again: nothing died
            with pytest.raises(ExecutionError, match="BadStatusLine"):
                hook.execute(cmd)
    finally:
        server.close()
        thread.join(timeout=10)
