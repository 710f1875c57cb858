"""Kafka with authentication and authorisation: each service works with its own
principal and nothing more (issue 14 item 9, docs/kafka-acls.md).

The broker is ``scripts/kafka.sh start --secure`` (SASL_SSL + SCRAM-SHA-512, ACLs,
see ``conftest.py``). Each service is built from its principal's env file the way it
builds itself in production: the exporter publishes steps, the operator's CLI sends a
control change, the actuator turns a worker-signed alert into signed commands, an
executor and the training-side listener answer them, the archiver stores it all, and
a live ``stepguard worker`` consumes steps in its own group. An exporter's principal
(what a compromised training node holds) is refused on every topic it could use to act.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import (
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    ResourcePatternFilter,
    ResourceType,
)
from kafka.errors import InvalidPartitionsError, KafkaError, TopicAuthorizationFailedError
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.client import StepExporter
from pipeline.client.listener import CommandListener
from pipeline.client.sink import KafkaSink
from pipeline.io.errors import ConfigError
from pipeline.io.kafka import (
    _check_created,
    client_config,
    control_producer,
    create_topics,
    publish,
    read_back,
)
from pipeline.io.settings import load_settings
from pipeline.io.trust import sign
from pipeline.services.actuator.executors import DryRunExecutor, ExecutorRunner
from pipeline.services.actuator.service import Actuator
from pipeline.services.alertmanager.client import PostOutcome
from pipeline.services.alertmanager.episodes import PostableAlert
from pipeline.services.alertmanager.service import AlertmanagerBridge
from pipeline.services.archive.archiver import Archiver
from pipeline.services.worker.app import _credentials, changelog_topic_name, jobs_topic_name
from schemas import (
    ActuatorMode,
    Alert,
    AlertKind,
    AlertState,
    CommandKind,
    CommandStatus,
    Evidence,
    Grade,
    RecommendedAction,
    TopicRegistry,
)
from tests.conftest import fresh_archive
from tests.factories import (
    WORKER_KEY,
    job_controller_settings,
    key_env,
    key_settings,
    step_telemetry,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
JOB = "job-sec"


def _alert(node: str = "node-3") -> Alert:
    now = datetime.now(UTC)
    alert = Alert(
        fingerprint=f"fp-{node}-0001", seq=0, kind=AlertKind.HARDWARE, grade=Grade.CRITICAL,
        state=AlertState.FIRING, job_id=JOB, node=node, step=100, started_at=now, ts=now,
        evidence=Evidence(metric="ecc_uncorrected", value=1, deviation=1),
        recommended_action=RecommendedAction.ISOLATE, summary=f"uncorrectable ECC on {node}",
        node_in_steps=True,
    )  # fmt: skip
    return sign(alert, WORKER_KEY)


def _until(what: str, poll, done, attempts: int = 150):
    """``poll()`` until ``done()`` returns a truthy value (bounded); that value."""
    for _ in range(attempts):
        got = done()
        if got:
            return got
        poll()
    raise AssertionError(f"gave up waiting for {what}")


@pytest.fixture(scope="module")
def topics(secure_kafka):
    """The registry's topics, created by the admin (what `stepguard topics` does)."""
    return create_topics(secure_kafka.settings("admin"))


# -- each service, its own principal ---------------------------------------------------
def test_every_service_does_its_job_with_its_own_principal(secure_kafka, topics, _chdb_session):
    k = secure_kafka
    # exporter: a training process's steps (and the job's start and end)
    exporter = StepExporter.direct(
        k.settings("exporter"), job_id=JOB, node="n1", ranks_per_node=2, register_atexit=False
    )
    for step in range(5):
        for rank in range(2):
            exporter.record_step(
                step,
                rank,
                step_time_s=1.0,
                compute_s=0.8,
                comm_wait_s=0.15,
                data_wait_s=0.05,
                local_rank=rank,
            )
    stats = exporter.close()
    assert (stats.sent, stats.dropped) == (5 + 2, 0)

    # operator: `stepguard control --mode auto`, signed with the operator's key; it waits
    # for the actuator's answer (topic acks), so the actuator polls meanwhile
    operator_env = k.env("operator") | key_env(("operator",))
    act_settings = k.settings(
        "actuator", **key_settings(), spare_nodes="spare-0", guard_max_isolation_pct=100.0
    )
    actuator = Actuator(act_settings)
    try:
        done: list = []
        args = ["control", "--mode", "auto", "--reason", "acl test"]
        cli = threading.Thread(
            target=lambda: done.append(CliRunner().invoke(app, args, env=operator_env))
        )
        cli.start()
        _until("the control change", lambda: actuator.poll_once(200),
               lambda: not cli.is_alive())  # fmt: skip
        cli.join(timeout=60)
        result = done[0]
        assert result.exit_code == 0, result.output
        assert actuator.policy.params.mode is ActuatorMode.AUTO
        # the worker's principal writes decisions (its Faust producer is checked below)
        producer = control_producer(k.settings("worker"))
        try:
            publish(producer, TopicRegistry(k.prefix), "decisions", _alert()).get(timeout=30)
        finally:
            producer.close()
        _until("the alert", lambda: actuator.poll_once(200),
               lambda: actuator.stats.consumed >= 2)  # fmt: skip
    finally:
        actuator.close()
    commands = [r.message for r in read_back(act_settings, "commands")]
    assert {c.kind for c in commands} == {
        CommandKind.CHECKPOINT, CommandKind.ISOLATE, CommandKind.RESTART
    }  # fmt: skip

    # the Alertmanager bridge: decisions in its own group (Alertmanager stands aside:
    # tests/integration/test_alertmanager.py runs the real one)
    posted: list[PostableAlert] = []

    class Recorder:
        def post(self, alerts):
            posted.extend(alerts)
            return PostOutcome(sent=len(alerts))

    bridge = AlertmanagerBridge(k.settings("alertmanager", **key_settings()), client=Recorder())
    try:
        _until("the bridge's post", lambda: bridge.poll_once(200), lambda: posted)
    finally:
        bridge.close()
    assert posted[0].labels["job"] == JOB and bridge.stats.dead_letters == 0

    # an executor answers every command; the training-side listener its checkpoint
    runner = ExecutorRunner(k.settings("executor", **key_settings()), DryRunExecutor())
    try:
        _until("the executor's results", lambda: runner.poll_once(200),
               lambda: len(runner.done) >= 3)  # fmt: skip
    finally:
        runner.close()
    saved: list[int] = []
    listener = CommandListener(
        k.settings("listener", **(key_settings() | job_controller_settings(JOB))), JOB,
        on_checkpoint=lambda cmd, step: saved.append(step) or "saved",
    )  # fmt: skip
    with listener:
        applied = listener.poll_step_boundary(7, wait_s=30)
    assert CommandKind.CHECKPOINT in {c.kind for c in applied} and saved == [7]
    results = [r.message for r in read_back(k.settings("executor"), "results")]
    assert sum(r.status is CommandStatus.SUCCEEDED for r in results) >= 4

    # the archiver reads every topic and stores what it read
    with fresh_archive("chdb", _chdb_session) as archive:
        archiver = Archiver(k.settings("archiver"), archive, max_wait_s=0.3)
        try:
            sql = (f"SELECT (SELECT count() FROM {archive.database}.steps FINAL), "
                   f"(SELECT count() FROM {archive.database}.commands FINAL)")  # fmt: skip

            def stored():
                steps, cmds = archive.query(sql)[1][0]
                return (steps, cmds) if steps >= 10 and cmds >= 3 else None

            assert _until("the archive", archiver.poll_batch, stored) == (10, 3)
        finally:
            archiver.close()


# -- and nothing more ------------------------------------------------------------------
#: (principal, logical topic or internal name) pairs each principal must not write:
#: the exporter could otherwise forge commands, control, alerts or the worker's state
REFUSED_WRITES = [
    ("exporter", "commands"), ("exporter", "control"), ("exporter", "decisions"),
    ("exporter", "approvals"), ("exporter", "results"), ("exporter", "actions"),
    ("exporter", "truth"), ("exporter", "changelog"), ("exporter", "jobs"),
    ("worker", "commands"), ("worker", "control"), ("listener", "commands"),
    ("executor", "commands"), ("operator", "commands"), ("archiver", "steps"),
    ("actuator", "steps"), ("actuator", "control"), ("alertmanager", "decisions"),
    ("alertmanager", "commands"),
    # the worker's internal topics: only the worker's principal writes them (issue 22)
    ("simulator", "jobs"), ("simulator", "changelog"), ("actuator", "jobs"),
    ("actuator", "changelog"), ("executor", "jobs"), ("executor", "changelog"),
    ("listener", "jobs"), ("listener", "changelog"), ("operator", "jobs"),
    ("operator", "changelog"), ("archiver", "jobs"), ("archiver", "changelog"),
]  # fmt: skip


def _topic_name(k, logical: str) -> str:
    worker = k.settings("worker")
    if logical == "changelog":
        return changelog_topic_name(worker)
    if logical == "jobs":
        return jobs_topic_name(worker)
    return TopicRegistry(k.prefix).name(logical)


@pytest.mark.parametrize("principal, logical", REFUSED_WRITES)
def test_a_principal_is_refused_on_topics_it_does_not_write(
    secure_kafka, topics, principal, logical
):
    settings = secure_kafka.settings(principal)
    producer = KafkaProducer(**client_config(settings), max_block_ms=10_000)
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send(_topic_name(secure_kafka, logical), b"{}").get(timeout=30)
    finally:
        producer.close()


@pytest.mark.parametrize("logical", ["commands", "decisions", "approvals", "control"])
def test_the_exporter_cannot_read_what_it_does_not_need(secure_kafka, topics, logical):
    consumer = KafkaConsumer(**client_config(secure_kafka.settings("exporter")))
    try:
        tp = TopicPartition(TopicRegistry(secure_kafka.prefix).name(logical), 0)
        with pytest.raises(TopicAuthorizationFailedError):  # ListOffsets, before any fetch
            consumer.end_offsets([tp])
    finally:
        consumer.close()


def test_the_exporter_cannot_join_another_services_group(secure_kafka, topics):
    exporter = secure_kafka.settings("exporter")
    steps = TopicRegistry(secure_kafka.prefix).name("steps")
    consumer = KafkaConsumer(
        group_id=f"{secure_kafka.group}.worker", enable_auto_commit=False,
        **client_config(exporter),
    )  # fmt: skip
    try:
        consumer.assign([TopicPartition(steps, 0)])
        with pytest.raises(KafkaError, match="uthoriz"):
            consumer.committed(TopicPartition(steps, 0))
    finally:
        consumer.close()


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # kafka-python leaks a failed bootstrap
def test_a_wrong_password_is_refused(secure_kafka, topics):
    wrong = secure_kafka.settings("exporter", kafka_sasl_password="not-the-password")
    sink = KafkaSink(wrong, max_block_ms=1000)
    try:
        assert not sink.send("steps", step_telemetry())
    finally:
        sink.close(1.0)
        gc.collect()  # its leaked sockets warn here, not in a later test
    assert sink.stats.sent == 0 and sink.stats.dropped == 1
    log = (secure_kafka.home / "logs" / "server.log").read_text()
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in log


def test_the_acls_name_no_principal_but_the_services(secure_kafka, topics):
    every = ResourcePatternFilter(ResourceType.ANY, None, ACLResourcePatternType.ANY)
    query = ACLFilter(principal=None, host="*", operation=ACLOperation.ANY,
                      permission_type=ACLPermissionType.ANY, resource_pattern=every)  # fmt: skip
    admin = KafkaAdminClient(**client_config(secure_kafka.settings("admin")))
    try:
        acls, _ = admin.describe_acls(query)
    finally:
        admin.close()
    principals = {acl.principal for acl in acls}
    assert principals == {
        f"User:{p}"
        for p in ("exporter", "simulator", "worker", "actuator", "executor", "listener",
                  "operator", "archiver", "alertmanager")
    }  # fmt: skip
    # nobody but the worker may create topics, and only its own internal ones
    creators = {(a.principal, a.resource_pattern.resource_name) for a in acls
                if a.operation is ACLOperation.CREATE}  # fmt: skip
    worker = secure_kafka.settings("worker")
    assert creators == {
        ("User:worker", jobs_topic_name(worker)),
        ("User:worker", changelog_topic_name(worker).removesuffix("job-states-changelog")),
    }


# -- the Faust worker ------------------------------------------------------------------
def test_the_worker_builds_sasl_ssl_credentials_from_its_settings(tmp_path):
    """No broker needed: what Faust's aiokafka clients will be given."""
    import ssl

    import faust

    not_a_ca = REPO / "tests" / "security" / "conftest.py"
    settings = load_settings(
        {}, kafka_bootstrap="127.0.0.1:1", kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="SCRAM-SHA-512", kafka_sasl_username="worker",
        kafka_sasl_password="pw",
    )  # fmt: skip
    creds = _credentials(settings)
    assert isinstance(creds, faust.SASLCredentials)
    assert (creds.username, creds.password) == ("worker", "pw")
    assert creds.mechanism.value == "SCRAM-SHA-512"
    assert creds.protocol.value == "SASL_SSL"
    assert isinstance(creds.ssl_context, ssl.SSLContext)
    assert creds.ssl_context.verify_mode is ssl.CERT_REQUIRED
    assert creds.ssl_context.check_hostname
    assert "pw" not in repr(creds)
    with pytest.raises(ssl.SSLError):  # the CA file is really loaded
        _credentials(settings.model_copy(update={"kafka_ssl_cafile": not_a_ca}))
    plain = settings.model_copy(
        update={"kafka_security_protocol": "PLAINTEXT", "kafka_sasl_mechanism": None}
    )
    assert _credentials(plain) is None


def test_create_topics_leaves_topics_it_may_not_create_to_the_admin():
    """CreateTopics answers per topic: created, exists, not authorised pass; others raise."""
    ok = {"topics": [
        {"name": "a", "error_code": 0}, {"name": "b", "error_code": 36},
        {"name": "c", "error_code": 29, "error_message": "Authorization failed."},
    ]}  # fmt: skip
    _check_created(ok)
    with pytest.raises(InvalidPartitionsError, match="cannot create topic d"):
        _check_created({"topics": [{"name": "d", "error_code": 37, "error_message": "bad"}]})


def test_a_missing_tls_file_is_a_configuration_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"STEPGUARD_KAFKA_SSL_CAFILE: .*no such file"):
        load_settings({"STEPGUARD_KAFKA_SSL_CAFILE": str(tmp_path / "ca.pem")})


def _committed(k, group: str, topic: str) -> int:
    """Records of ``topic`` the group has committed (the sum of its offsets)."""
    admin = KafkaAdminClient(**client_config(k.settings("admin")))
    try:
        offsets = admin.list_group_offsets({group: None}).get(group, {})
    except KafkaError:  # the group does not exist yet
        return 0
    finally:
        admin.close()
    return sum(o.offset for tp, o in offsets.items() if tp.topic == topic and o.offset > 0)


def test_a_live_worker_consumes_steps_with_its_principal(secure_kafka, topics, tmp_path):
    k = secure_kafka
    env = {key: v for key, v in os.environ.items() if not key.startswith("STEPGUARD_")}
    env |= k.env("worker") | key_env(("worker", "actuator")) | {
        "STEPGUARD_WORKER_DATA_DIR": str(tmp_path / "worker"),
        "STEPGUARD_WORKER_METRICS_PORT": "0",
        "STEPGUARD_WORKER_SESSION_TIMEOUT_S": "6",
        "STEPGUARD_WORKER_SNAPSHOT_STEPS": "2",  # held records are acked at a snapshot
        # this tree's worker, not whichever one is installed (it runs from tmp_path):
        # an older worker dead-letters what this tree's exporter sends
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
    }  # fmt: skip
    env.pop("STEPGUARD_ACTUATOR_PRIVATE_KEY")  # the worker only verifies commands
    exporter = StepExporter.direct(
        k.settings("exporter"), job_id=JOB + "-w", node="n1", ranks_per_node=2,
        register_atexit=False,
    )  # fmt: skip
    for step in range(20):
        for rank in range(2):
            exporter.record_step(
                step,
                rank,
                step_time_s=1.0,
                compute_s=0.8,
                comm_wait_s=0.15,
                data_wait_s=0.05,
                local_rank=rank,
            )
    assert exporter.close().dropped == 0
    steps = TopicRegistry(k.prefix).name("steps")
    worker = subprocess.Popen(
        [sys.executable, "-c", "from pipeline.cli.app import main; main()", "worker"],
        env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        committed = 0
        while time.monotonic() < deadline and worker.poll() is None:
            committed = _committed(k, f"{k.group}.worker", steps)
            if committed >= 20:
                break
            time.sleep(0.5)  # polling the group's committed offsets, not a sync stand-in
        assert worker.poll() is None, worker.stderr.read().decode()[-3000:]
        assert committed >= 20
        # the worker created its own internal topics under its principal
        admin = KafkaAdminClient(**client_config(k.settings("admin")))
        try:
            names = set(admin.list_topics())
        finally:
            admin.close()
        worker_settings = k.settings("worker")
        changelog = changelog_topic_name(worker_settings)
        assert {jobs_topic_name(worker_settings), changelog} <= names
        # ... and its Faust producer wrote the job's snapshots to the changelog
        probe = KafkaConsumer(**client_config(k.settings("admin")))
        try:
            parts = [TopicPartition(changelog, p) for p in probe.partitions_for_topic(changelog)]
            written = 0
            for _ in range(60):
                written = sum(probe.end_offsets(parts).values())
                if written:
                    break
                time.sleep(0.5)  # polling the changelog's end offsets
        finally:
            probe.close()
        assert written > 0
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        worker.stderr.close()
