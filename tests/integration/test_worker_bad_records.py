"""Issue 14 item 3, the worker: a bad record on every topic ``stepguard worker`` reads
(steps, health, lifecycle, commands, results) is handled per record, and the good
records after it are handled by the same running process.

Steps, health and lifecycle records that do not decode, are too large or are dated in
the future are dead letters (error, source topic, partition and offset). Commands and
results are the executors' and the actuator's to dead-letter: the worker skips one
that does not decode and counts one that is not signed by its writer's key
(``stepguard_worker_state_events``), and forwards only the good ones to its job topic.
"""

from __future__ import annotations

import contextlib
import json
import time
from datetime import UTC, datetime, timedelta

import pytest

from pipeline.io.kafka import create_topics, make_consumer, make_producer, publish, registry_of
from pipeline.io.trust import sign
from pipeline.services.worker.app import jobs_topic_name
from pipeline.services.worker.seal import SEAL_MAGIC
from pipeline.tools.simulator import simulate
from pipeline.tools.simulator.player import play
from schemas import (
    ActuatorMode,
    Alert,
    AlertKind,
    Command,
    CommandKind,
    CommandResult,
    CommandStatus,
    DeadLetter,
    JobEvent,
    JobEventKind,
    encode,
)
from tests.factories import ACTUATOR_KEY, WORKER_KEY, job_controller_key, signed_headers
from tests.integration.test_worker import Topic, Worker, firing, scenario

pytestmark = pytest.mark.integration


def _command(job: str, cid: str, key=ACTUATOR_KEY) -> Command:
    now = datetime.now(UTC)
    cmd = Command(command_id=cid, kind=CommandKind.RESTART, job_id=job, checkpoint_step=10,
                  reason=("test",), mode=ActuatorMode.AUTO, issued_at=now,
                  expires_at=now + timedelta(minutes=10))  # fmt: skip
    return sign(cmd, key)


def _result(job: str, cid: str, key=None) -> CommandResult:
    key = key or job_controller_key(job)
    res = CommandResult(command_id=cid, job_id=job, executor="job-controller",
                        status=CommandStatus.SUCCEEDED, ts=datetime.now(UTC))  # fmt: skip
    return sign(res, key)


def _with(message, **changes) -> bytes:
    return json.dumps(json.loads(encode(message)) | changes).encode()


def _forwarded(jobs, until: set[tuple[str, str]], timeout_s: float) -> list[tuple[str, str]]:
    """(command | result, command id) of everything the worker forwarded to its job
    topic, read until all of ``until`` showed up (bounded)."""
    seen: list[tuple[str, str]] = []
    deadline = time.monotonic() + timeout_s
    while not until <= set(seen):
        assert time.monotonic() < deadline, f"timed out waiting for {until}: {seen}"
        for records in jobs.poll(timeout_ms=300).values():
            for r in records:
                try:  # the worker's records are sealed: a MAC, then the payload
                    body = json.loads((r.value or b"")[len(SEAL_MAGIC) + 32 :])
                except ValueError:
                    continue
                if isinstance(body, dict) and "command_id" in body:
                    kind = "result" if "executor" in body else "command"
                    seen.append((kind, body["command_id"]))
    return seen


def test_a_bad_record_on_every_topic_is_handled_and_the_good_ones_after_it_are_too(
    settings, tmp_path
):
    sc = scenario(
        "bad-records",
        [{"kind": "straggler", "node": 5, "gpu": 1, "onset_step": 30, "magnitude": 0.3}],
    )
    job = sc.job
    create_topics(settings)
    registry = registry_of(settings)
    ahead = datetime.now(UTC) + timedelta(days=1)
    future_end = JobEvent(job_id=job, kind=JobEventKind.END, reason="completed", ts=ahead)
    first = next(e.frame for e in simulate(sc) if e.frame is not None).to_messages()[0]
    future_step = first.model_copy(update={"ts_start": ahead, "ts_end": ahead})
    producer = make_producer(settings)
    # each record as its producer signs it (telemetry proofs): a record refused is
    # refused for its content, not for want of a proof
    sent = lambda logical, value, msg=None: producer.send(  # noqa: E731
        registry.name(logical), key=job.encode(), value=value,
        headers=signed_headers(logical, msg, value) if msg is not None else None,
    ).get(30)  # fmt: skip
    lettered = [  # (what, metadata): each must come back as a dead letter
        ("steps: not json", sent("steps", b"{not json")),
        ("steps: oversized", sent("steps", b"[" + b" " * 40_000 + b"]")),
        ("steps: future", sent("steps", encode(future_step), future_step)),
        ("health: no job", sent("health", b'{"node": 5}')),
        ("lifecycle: not json", sent("lifecycle", b"\xff\xfe")),
    ]
    not_lettered = [  # handled by the worker without a dead letter of their source
        ("lifecycle", encode(future_end)),  # dead-lettered from the worker's job topic
        ("commands", b"{not json"),
        ("commands", _with(_command(job, "cmd-garbage"), signature="é" * 128)),
        ("commands", encode(_command(job, "cmd-forged", key=WORKER_KEY))),
        ("results", b"[]"),
        ("results", _with(_result(job, "cmd-good"), signature="ab" * 32)),
        ("results", encode(_result(job, "cmd-good", key=ACTUATOR_KEY))),
    ]
    for logical, value in not_lettered:  # before the worker starts: it meets them first
        sent(logical, value, future_end if logical == "lifecycle" else None)
    dead = Topic(settings, "deadletter", DeadLetter)
    decisions = Topic(settings, "decisions", Alert)
    w = Worker(settings, tmp_path, "bad", worker_max_message_bytes="32768",
               job_controller_public_keys=job_controller_key(job).public_text())  # fmt: skip
    stack = contextlib.ExitStack()
    try:
        # the good records: a job with a straggler, a signed relaunch and its result
        play(settings, sc, speed=None, truth=False, lifecycle=False)
        decisions.wait(firing(AlertKind.STRAGGLER, "node-0005"), 60, "the straggler", w)
        # the worker made its job topic by now (subscribing earlier could auto-create it)
        jobs = make_consumer(settings, [jobs_topic_name(settings)], None)
        stack.callback(jobs.close)
        publish(producer, registry, "commands", _command(job, "cmd-good")).get(30)
        publish(producer, registry, "results", _result(job, "cmd-good")).get(30)
        good = {("command", "cmd-good"), ("result", "cmd-good")}
        forwarded = _forwarded(jobs, good, 60)
        letters = dead.wait(lambda xs: len(xs) >= len(lettered) + 1, 60, "dead letters", w)
        assert w.proc.poll() is None, w.tail()  # it kept running throughout
        refused = ('stepguard_worker_state_events{event="refused_command"}',
                   'stepguard_worker_state_events{event="refused_result"}')  # fmt: skip
        deadline = time.monotonic() + 30  # the gauges follow the job topic (ticks: 0.5 s)
        while [w.metric(m) for m in refused] != [1, 1] and time.monotonic() < deadline:
            time.sleep(0.1)  # polling the worker's metrics endpoint, bounded
        assert [w.metric(m) for m in refused] == [1, 1], w.tail()
    finally:
        for closing in (stack.close, dead.close, decisions.close, producer.close, w.stop):
            closing()
    # records of one topic are forwarded in order (commands and results each by their
    # own agent): a bad one would have shown up before the good one of its topic
    assert sorted(forwarded) == sorted(good), forwarded
    coords = {(d.source_topic, d.partition, d.offset) for d in letters}
    for what, meta in lettered:
        assert (meta.topic, meta.partition, meta.offset) in coords, (what, letters)
    errors = {(d.source_topic, d.offset): d for d in letters}
    steps = registry.name("steps")
    assert "exceeds the limit of 32768" in errors[(steps, lettered[1][1].offset)].error
    assert errors[(steps, lettered[2][1].offset)].stage == "clock"
    # the future-dated END reached the job topic and was dead-lettered there
    assert any(d.stage == "clock" and d.source_topic == jobs_topic_name(settings)
               for d in letters), letters  # fmt: skip
