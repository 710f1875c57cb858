"""Threat: whoever can write a signed topic invents archived history, the history that
``stepguard calibrate --actions`` graduates kinds on, the outcome labels calibration
learns from and the timeline an analyst reads. The archiver holds public keys only
(SECURITY.md, "Keys") and archives a message with ``signed = 1`` only when a key of its
writer's role verified it: with no keys, nothing counts as signed; command results
are verified too, and the latest result of a command is judged by when the archiver
received it, never by the time its writer put in it. Through the real archiver, on
both backends (the server one where CI provides it)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from pipeline.io.kafka import create_topics, make_producer, publish, registry_of
from pipeline.io.trust import sign
from pipeline.services.archive.archiver import Archiver
from pipeline.services.archive.queries import run_query
from pipeline.tools.calibrate.archive import load_job
from pipeline.tools.calibrate.graduation import GraduationRules, graduation_report
from schemas import CommandStatus, Grade
from tests.factories import ACTUATOR_KEY, EXECUTOR_KEY, OPERATOR_KEY, WORKER_KEY, samples
from tests.security._helpers import impostor

pytestmark = pytest.mark.integration

TOPICS = ["decisions", "commands", "actions", "approvals", "control", "results"]
#: the archiver's row of the key table: every signing role's public keys, no private key
KEY_TABLE = {
    "worker_public_keys": WORKER_KEY.public_text(),
    "actuator_public_keys": ACTUATOR_KEY.public_text(),
    "operator_public_keys": OPERATOR_KEY.public_text(),
    "executor_public_keys": EXECUTOR_KEY.public_text(),
}


def _now_samples(job: str) -> dict:
    """The factory's messages for ``job``, dated now (the archiver dates nothing, but
    the tables partition by day)."""
    now = datetime.now(UTC)
    s = samples()
    out = {}
    for name in ("decisions", "commands", "actions", "approvals", "control", "results"):
        m = s[name]
        update: dict = {"job_id": job} if "job_id" in type(m).model_fields else {}
        for field in ("ts", "issued_at", "started_at"):
            if field in type(m).model_fields:
                update[field] = now
        if name == "commands":
            update["expires_at"] = now + timedelta(minutes=5)
        out[name] = m.model_copy(update=update)
    out["decisions"] = out["decisions"].model_copy(
        update={"grade": Grade.CRITICAL, "incident": "inc-1"}
    )
    return out


def _archive(settings, archive, messages, group: str) -> Archiver:
    """Publish ``(topic, message)`` pairs, then archive until every one is stored."""
    create_topics(settings, [*TOPICS, "deadletter"])
    producer = make_producer(settings)
    registry = registry_of(settings)
    for topic, m in messages:
        publish(producer, registry, topic, m).get(timeout=30)
    producer.close()
    archiver = Archiver(settings, archive, topics=TOPICS, group_id=group, max_wait_s=0.3)
    try:
        for _ in range(60):
            archiver.poll_batch()
            if archiver.stats.messages >= len(messages):
                break
    finally:
        archiver.close()
    assert archiver.stats.messages == len(messages)
    return archiver


def _signed(archive, table: str, job: str) -> list[int]:
    key = "job_id" if table != "approvals" and table != "control_changes" else None
    where = f" WHERE {key} = {{job:String}}" if key else ""
    _, rows = archive.query(
        f"SELECT signed FROM {archive.database}.{table}{where} ORDER BY signed", {"job": job}
    )
    return [int(r[0]) for r in rows]


def test_an_archiver_without_public_keys_archives_nothing_as_signed(settings, archive):
    """Real signatures and forgeries alike: without its writers' public keys the
    archiver cannot tell them apart, so none counts (both used to read signed = 1)."""
    job = f"nokeys-{uuid.uuid4().hex[:8]}"
    s = _now_samples(job)
    keys = {
        "decisions": WORKER_KEY, "commands": ACTUATOR_KEY, "actions": ACTUATOR_KEY,
        "approvals": OPERATOR_KEY, "control": OPERATOR_KEY, "results": EXECUTOR_KEY,
    }  # fmt: skip
    messages = []
    for topic, key in keys.items():
        messages.append((topic, sign(s[topic], key)))
        messages.append((topic, sign(s[topic], impostor(key))))
    _archive(settings, archive, messages, f"g-{uuid.uuid4().hex}")
    for table in ("alerts", "commands", "actions", "command_results", "approvals",
                  "control_changes"):  # fmt: skip
        assert set(_signed(archive, table, job)) == {0}, table
    # ... and no reader takes any of it for real
    assert run_query(archive, "command_outcomes", job=job)[1] == []
    assert run_query(archive, "incident_timeline", job=job)[1] == []


def test_with_the_key_tables_keys_forged_results_do_not_count_and_one_dated_ahead_never_wins(
    settings, archive
):
    """The archiver holds what the key table gives it (public keys only). A forged
    SUCCEEDED (an impostor under the executor's key id) is archived unsigned and
    read by nobody; a FAILED dated ten years ahead by an executor key holder counts
    as received, so the real SUCCEEDED sent after it is the command's last result
    for the timeline, `calibrate --actions` and the outcome labels."""
    settings = settings.model_copy(update=KEY_TABLE)
    job = f"keys-{uuid.uuid4().hex[:8]}"
    s = _now_samples(job)
    alert, command = sign(s["decisions"], WORKER_KEY), sign(s["commands"], ACTUATOR_KEY)
    result = s["results"].model_copy(update={"command_id": command.command_id})
    ahead = sign(result.model_copy(update={"status": CommandStatus.FAILED, "detail": "x",
                                           "ts": result.ts + timedelta(days=3650)}),
                 EXECUTOR_KEY)  # fmt: skip
    forged = sign(result.model_copy(update={"detail": "forged"}), impostor(EXECUTOR_KEY))
    group = f"g-{uuid.uuid4().hex}"
    _archive(settings, archive, [("decisions", alert), ("commands", command),
                                 ("results", ahead), ("results", forged)], group)  # fmt: skip
    # the real success comes after the archiver received the one dated ahead
    real = sign(result.model_copy(update={"ts": datetime.now(UTC) + timedelta(seconds=1)}),
                EXECUTOR_KEY)  # fmt: skip
    _archive(settings, archive, [("results", real)], group)

    _, rows = archive.query(
        f"SELECT detail, signed FROM {archive.database}.command_results FINAL "
        "WHERE job_id = {job:String} ORDER BY detail",
        {"job": job},
    )
    # the forgery, stored first under the real success's key, does not displace it
    assert rows == [("ok", 1), ("x", 1)]
    [(_, command_id, *_, status, detail)] = run_query(archive, "command_outcomes", job=job)[1]
    assert (command_id, status, detail) == (command.command_id, "succeeded", "ok")
    report = graduation_report(archive, GraduationRules(), jobs=[job])
    [row] = [r for r in report.rows if r.commands]
    assert (row.commands, row.succeeded) == (1, 1)
    labels = load_job(archive, job, sources=("outcome",)).labels
    assert [(lab.source, lab.truth) for lab in labels] == [("outcome", True)]
