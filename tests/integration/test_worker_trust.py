"""Issue 22 against a running ``stepguard worker`` (subprocess, real broker): what only
the worker may write, and records that would make a dead letter too big to send.

Every wait is a bounded poll of a topic or of the worker's metrics endpoint.
"""

from __future__ import annotations

import hashlib
import json
import time

import pytest
from kafka import KafkaConsumer

from pipeline.client.sink import KafkaSink
from pipeline.io.kafka import client_config, make_consumer, make_producer, registry_of
from pipeline.services.worker.app import jobs_topic_name
from pipeline.services.worker.state import KIND_HEADER, partition_for
from pipeline.tools.simulator.player import play
from schemas import AlertKind, AlertState, DeadLetter, decode
from tests.factories import node_settings, step_telemetry
from tests.integration import test_worker
from tests.integration.test_worker import Topic, firing, scenario

# the fixtures of the worker's integration tests: a worker subprocess, its decisions
workers, decisions = test_worker.workers, test_worker.decisions

pytestmark = pytest.mark.integration

#: Apache Kafka's default message.max.bytes (what a topic takes without a config)
BROKER_LIMIT = 1_048_588


def _until(what: str, check, timeout_s: float, worker) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{worker.tail()}"
        time.sleep(0.1)  # polling the worker's metrics endpoint, bounded


def test_a_forged_tick_on_the_jobs_topic_is_refused_and_the_hung_job_stays_watched(
    settings, workers, decisions
):
    """Threat (item 7): one unsigned tick on the worker's internal jobs topic with
    ``wall_s`` ten days ahead made the worker abandon a job that had just hung (the
    embedded broker has no ACLs). The tick is refused, the job stays held."""
    sc = scenario("forged-tick", [], base_compute_s=0.1, collective_s=0.01, steps=100)
    dead = Topic(settings, "deadletter", DeadLetter)
    w = workers()
    try:
        play(settings, sc, speed=None, stop_after_step=60)
        decisions.wait(firing(AlertKind.HANG), 60, "the hang", w)
        _until("the job held", lambda: w.metric("stepguard_worker_jobs") == 1, 30, w)
        jobs = jobs_topic_name(settings)
        probe = KafkaConsumer(**client_config(settings))
        try:  # the jobs topic has the steps topic's partitions
            n = len(probe.partitions_for_topic(registry_of(settings).name("steps")) or ())
        finally:
            probe.close()
        producer = make_producer(settings)
        try:
            body = {"job_id": sc.job, "wall_s": time.time() + 10 * 86400}
            producer.send(jobs, key=sc.job.encode(), value=json.dumps(body).encode(),
                          partition=partition_for(sc.job, n),
                          headers=[(KIND_HEADER, b"tick")]).get(30)  # fmt: skip
        finally:
            producer.close()
        letters = dead.wait(lambda xs: any(d.stage == "auth" for d in xs), 60, "refusal", w)
        assert [d.source_topic for d in letters if d.stage == "auth"] == [jobs]
        unsealed = 'stepguard_worker_state_events{event="unsealed"}'
        _until("the refusal counted", lambda: w.metric(unsealed) == 1, 30, w)
        assert w.metric("stepguard_worker_jobs") == 1, w.tail()  # not abandoned
        abandoned = [a for a in decisions.items if "abandoned" in a.summary]
        assert abandoned == [], decisions.describe()
        assert w.proc.poll() is None
    finally:
        dead.close()


def test_a_record_just_under_the_broker_limit_is_dead_lettered_under_it_and_all_goes_on(
    settings, workers, decisions
):
    """Threat (item 15): a dead letter held the whole raw record, base64: a record just
    under the broker's ``max.message.bytes`` made a dead letter over it, the produce
    failed before the commit, and the consumer crash-looped on that record. Now the
    dead letter is cut (length and hash kept) and the worker handles what follows."""
    raw = b"\xfe" + b"x" * (BROKER_LIMIT - 50_000)  # not JSON, under every limit
    registry = registry_of(settings)
    dead = make_consumer(settings, [registry.name("deadletter")], None)
    w = workers()
    try:
        producer = make_producer(settings)
        try:
            producer.send(registry.name("steps"), key=b"big", value=raw).get(30)
        finally:
            producer.close()
        letters: list[bytes] = []
        deadline = time.monotonic() + 90
        while not letters:
            assert time.monotonic() < deadline, f"no dead letter\n{w.tail()}"
            for records in dead.poll(timeout_ms=300).values():
                letters += [r.value for r in records]
        (value,) = letters
        assert len(value) < BROKER_LIMIT // 4
        letter = decode(DeadLetter, value)
        assert (letter.raw_len, letter.truncated) == (len(raw), True)
        assert letter.raw_sha256 == hashlib.sha256(raw).hexdigest()
        # and the worker went on: a job after it is judged
        sc = scenario("after-big", [], base_compute_s=0.1, collective_s=0.01, steps=100)
        play(settings, sc, speed=None, stop_after_step=60)
        items = decisions.wait(firing(AlertKind.HANG), 60, "the next job's hang", w)
        assert any(a.job_id == sc.job and a.state is AlertState.FIRING for a in items)
        assert w.proc.poll() is None
    finally:
        dead.close()


def test_a_step_naming_a_node_its_writer_holds_no_key_for_is_refused_by_the_worker(
    settings, workers, decisions
):
    """Issue 39 through the real worker and broker: a producer that holds only
    node-0001's key (its own node's) writes a step of the job naming ``login-1``. The
    worker dead-letters it (stage ``auth``, its source offset) and counts it for the
    node it claims; the job's honest, signed telemetry still finds its straggler, and
    ``login-1`` is never named by an alert."""
    sc = scenario("proof", [{"kind": "straggler", "node": 5, "gpu": 2, "onset_step": 40,
                             "magnitude": 0.3}], steps=120)  # fmt: skip
    dead = Topic(settings, "deadletter", DeadLetter)
    w = workers()
    node_only = settings.model_copy(update=node_settings("node-0001"))
    sink = KafkaSink(node_only)
    try:
        forged = step_telemetry(job=sc.job, node="login-1", step=1)
        assert sink.send("steps", forged)
        sink.flush(30)
        assert sink.stats.sent == 1
        play(settings, sc, speed=None)
        steps = registry_of(settings).name("steps")

        def refused(xs: list) -> list:
            return [d for d in xs if d.stage == "auth" and d.source_topic == steps]

        letters = dead.wait(lambda xs: bool(refused(xs)), 60, "refusal", w)
        [letter] = refused(letters)
        assert "login-1" in letter.error and letter.offset >= 0
        counted = f'stepguard_worker_refused_telemetry_total{{node="login-1",topic="{steps}"}}'
        _until("the refusal counted", lambda: w.metric(counted) == 1, 30, w)
        decisions.wait(firing(AlertKind.STRAGGLER, "node-0005"), 60, "the straggler", w)
        assert all(a.node != "login-1" for a in decisions.items), decisions.describe()
    finally:
        sink.close()
        dead.close()
