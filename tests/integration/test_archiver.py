"""The archiver against a real broker and both ClickHouse backends: rows the table
refuses become dead letters, NaN and NULL stay apart, and an unreachable ClickHouse
loses nothing."""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from pipeline.io.errors import ArchiveError
from pipeline.io.kafka import create_topics, make_producer, publish, registry_of
from pipeline.services.archive import TABLE_OF, ServerBackend
from pipeline.services.archive.archiver import Archiver
from pipeline.services.archive.queries import QUERIES, run_query
from schemas import TOPICS, GpuHealth, NodeHealth
from tests.conftest import TEST_CLICKHOUSE, _missing
from tests.factories import T0, samples, step_telemetry

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _archive_until(archiver: Archiver, archive, sql: str, want: int, max_polls: int = 60):
    """Poll until ``sql`` (a count) reaches ``want``; bounded by polls, not time."""
    got = -1
    for _ in range(max_polls):
        archiver.poll_batch()
        got = archive.query(sql)[1][0][0]
        if got >= want:
            break
    return got


def _publish_steps(settings, nodes: int) -> None:
    """``nodes`` step messages of one job (one partition, in node order), 8 ranks each."""
    registry = registry_of(settings)
    create_topics(settings, ["steps", "deadletter"])
    producer = make_producer(settings)
    for node in range(nodes):
        publish(producer, registry, "steps", step_telemetry(node=f"n{node}", first_rank=8 * node))
    producer.flush()
    producer.close()


def _stored_by_group(settings, archive, group: str, want: int) -> int:
    """The steps rows (FINAL) once a fresh archiver of ``group`` has caught up."""
    again = Archiver(settings, archive, topics=["steps"], group_id=group, max_wait_s=0.3)
    try:
        sql = f"SELECT count() FROM {archive.database}.steps FINAL"
        return _archive_until(again, archive, sql, want)
    finally:
        again.close()


# 1: the steps topic is decoded in a separate process (what `stepguard archiver` does
# on a machine with more than one core); 0: in the archiver's own process.
decode_processes = pytest.mark.parametrize("decode_processes", [0, 1])


@decode_processes
def test_rows_the_table_refuses_become_dead_letters_and_the_rest_is_stored(
    settings, archive, decode_processes
):
    registry = registry_of(settings)
    create_topics(settings)
    producer = make_producer(settings)
    good = [step_telemetry(node=f"n{i}", step=1, first_rank=8 * i) for i in range(3)]
    big_rank = step_telemetry(node="n7", step=1, first_rank=56)
    big_rank = big_rank.model_copy(
        update={"samples": (big_rank.samples[0].model_copy(update={"local_rank": 70_000}),)}
    )
    old = datetime(1960, 1, 1, tzinfo=T0.tzinfo)
    too_old = step_telemetry(node="n8", step=1, first_rank=64).model_copy(
        update={"ts_start": old, "ts_end": old + timedelta(seconds=1)}
    )
    # non-ASCII names take pydantic's path (the fast path leaves them aside): one is
    # stored, the other's rows are refused like big_rank's
    good.append(step_telemetry(node="nœud-9", step=1, first_rank=72))
    big_unicode = step_telemetry(node="nœud-10", step=1, first_rank=80)
    big_unicode = big_unicode.model_copy(
        update={"samples": (big_unicode.samples[0].model_copy(update={"local_rank": 70_000}),)}
    )
    # the schema refuses a GPU index the archive cannot store: a hostile writer's record
    # (built here without validation) is dead-lettered, the rest stored
    gpu = GpuHealth.model_construct(index=70_000, temperature_c=50, power_w=300,
                                    sm_clock_mhz=1400, utilization_pct=90)  # fmt: skip
    health = NodeHealth(node="n0", ts=T0, gpus=(gpu,))
    fine_health = NodeHealth(node="n1", ts=T0, gpus=(gpu.model_copy(update={"index": 1}),))
    for msg in (*good, big_rank, too_old, big_unicode):
        publish(producer, registry, "steps", msg)
    publish(producer, registry, "health", health)
    publish(producer, registry, "health", fine_health)
    producer.flush()
    db = archive.database
    archiver = Archiver(settings, archive, max_batch=1000, max_wait_s=0.3,
                        decode_processes=decode_processes)  # fmt: skip
    try:
        letters = _archive_until(
            # the schema's bounds now refuse these at decode; past them, the archive's
            # column types would (stage 'archive'): either way a dead letter each
            archiver,
            archive,
            f"SELECT count() FROM {db}.dead_letters",
            4,
        )
    finally:
        archiver.close()
        producer.close()
    assert letters == 4
    _, rows = archive.query(f"SELECT count(), uniqExact(node) FROM {db}.steps FINAL")
    assert rows == [(32, 4)]
    _, rows = archive.query(f"SELECT node FROM {db}.health FINAL")
    assert rows == [("n1",)]
    _, rows = archive.query(
        f"SELECT source_topic, error FROM {db}.dead_letters FINAL ORDER BY source_topic, error"
    )
    assert [r[0] for r in rows] == [registry.name("health")] + [registry.name("steps")] * 3
    errors = [r[1] for r in rows[1:]]
    assert sum("local_rank" in e for e in errors) == 2
    assert sum("DateTime" in e for e in errors) == 1


def test_a_malformed_record_on_every_topic_is_dead_lettered_and_the_good_ones_stored(
    settings, archive
):
    """Issue 14 item 3: per record, on every topic the archiver reads. The dead-letter
    topic's own bad record is logged and dropped, never sent back to it (no loop)."""
    registry = registry_of(settings)
    create_topics(settings)
    producer = make_producer(settings)
    bad = b'{"malformed": '
    for logical in TOPICS:
        producer.send(registry.name(logical), key=b"k", value=bad).get(timeout=30)
    for logical, msg in samples().items():
        publish(producer, registry, logical, msg)
    producer.flush()
    producer.close()
    db = archive.database
    archiver = Archiver(settings, archive, max_batch=1000, max_wait_s=0.3)
    try:
        # the sample dead letter, then one decode letter per topic but deadletter
        want = len(TOPICS)
        got = _archive_until(archiver, archive, f"SELECT count() FROM {db}.dead_letters FINAL",
                             want)  # fmt: skip
    finally:
        archiver.close()
    assert got == want
    assert archiver.stats.messages >= 2 * len(TOPICS)
    expected = {t: 1 for t, _ in TABLE_OF.values()}
    expected |= {"steps": 8, "health": 8, "dead_letters": len(TOPICS)}
    for table, n in expected.items():
        assert archive.query(f"SELECT count() FROM {db}.{table} FINAL")[1] == [(n,)], table
    _, rows = archive.query(
        f"SELECT source_topic, raw FROM {db}.dead_letters FINAL WHERE stage = 'decode'"
    )
    ours = sorted(topic for topic, raw in rows if base64.b64decode(raw) == bad)
    assert ours == sorted(registry.name(t) for t in TOPICS if t != "deadletter")


def test_nan_and_null_losses_stay_apart(settings, archive):
    registry = registry_of(settings)
    create_topics(settings, ["steps", "deadletter"])
    producer = make_producer(settings)
    for step, loss in enumerate((math.nan, None, 2.0)):
        msg = step_telemetry(step=step, ranks=2)
        samples = tuple(s.model_copy(update={"loss": loss}) for s in msg.samples)
        publish(producer, registry, "steps", msg.model_copy(update={"samples": samples}))
    producer.flush()
    producer.close()
    db = archive.database
    archiver = Archiver(settings, archive, topics=["steps"], max_wait_s=0.3)
    try:
        _archive_until(archiver, archive, f"SELECT count() FROM {db}.steps", 6)
    finally:
        archiver.close()
    _, rows = archive.query(
        f"SELECT step, isNull(loss), ifNull(isNaN(loss), 0), phase FROM {db}.steps FINAL "
        "ORDER BY step, rank"
    )
    assert rows == [(0, 0, 1, "train")] * 2 + [(1, 1, 0, "train")] * 2 + [(2, 0, 0, "train")] * 2


@decode_processes
def test_unreachable_clickhouse_retries_then_fails_with_nothing_committed(
    settings, archive, caplog, decode_processes
):
    """One message per batch: with a decode process, batches queue behind the failing
    one, and none of them may commit past it."""
    _publish_steps(settings, 4)
    group = f"{settings.consumer_group}.retry"
    nowhere = ServerBackend("clickhouse://default@127.0.0.1:1/nowhere", timeout_s=1)
    failing = Archiver(settings, nowhere, topics=["steps"], group_id=group, max_wait_s=0.3,
                       insert_attempts=2, max_batch=1,
                       decode_processes=decode_processes)  # fmt: skip
    with caplog.at_level(logging.WARNING), pytest.raises(ArchiveError) as failed:
        for _ in range(60):
            failing.poll_batch()
    failing.close()  # the batches queued behind the failure are dropped, not raised again
    assert "ClickHouse at 127.0.0.1:1" in str(failed.value)  # the first failure, not a follow-on
    assert any("retry in" in r.getMessage() for r in caplog.records)
    # the same group starts again from the uncommitted offsets: nothing was lost
    assert _stored_by_group(settings, archive, group, 32) == 32


class _FailsOnce:
    """The archive, except that its first insert fails (ClickHouse gone for a moment)."""

    def __init__(self, inner):
        self._inner = inner
        self.failed = False

    def insert(self, table, columns):
        if not self.failed:
            self.failed = True
            raise ArchiveError("ClickHouse restarting")
        return self._inner.insert(table, columns)

    def __getattr__(self, name):
        return getattr(self._inner, name)


@decode_processes
def test_batches_queued_behind_a_failed_one_do_not_commit_past_it(
    settings, archive, decode_processes
):
    """With decode processes, later batches are already queued when one fails; storing
    and committing them would move the group's offset past the failed batch."""
    _publish_steps(settings, 4)
    group = f"{settings.consumer_group}.queued"
    flaky = _FailsOnce(archive)
    first = Archiver(settings, flaky, topics=["steps"], group_id=group, max_wait_s=0.3,
                     insert_attempts=1, max_batch=1,
                     decode_processes=decode_processes)  # fmt: skip
    with pytest.raises(ArchiveError, match="ClickHouse restarting"):
        for _ in range(60):
            first.poll_batch()
    first.close()
    assert flaky.failed
    assert _stored_by_group(settings, archive, group, 32) == 32


class _Gated:
    """The archive, except that the first insert waits until ``opened`` is set."""

    def __init__(self, inner):
        self._inner = inner
        self.opened = threading.Event()
        self.waited = False

    def insert(self, table, columns):
        if not self.waited:
            self.waited = True
            assert self.opened.wait(60), "the test never opened the gate"
        return self._inner.insert(table, columns)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_a_batch_stored_after_a_rebalance_commits_only_the_partitions_still_owned(
    settings, archive, caplog
):
    """Archiver A fetched a batch from every partition; archiver B joins the group and
    takes half of them while A is still inserting. A must not commit B's partitions
    (B reads them from its own position), and nothing is lost or counted twice."""
    registry = registry_of(settings)
    create_topics(settings, ["steps", "deadletter"])
    producer = make_producer(settings)
    for job in range(16):  # keyed by job: spread over the 8 partitions
        publish(producer, registry, "steps", step_telemetry(job=f"job-{job}", node="n0"))
    producer.flush()
    producer.close()
    group = f"{settings.consumer_group}.rebalance"
    gated = _Gated(archive)
    a = Archiver(settings, gated, topics=["steps"], group_id=group, max_wait_s=0.3)
    b = None
    db = archive.database
    try:
        assert a.poll_batch() == 16  # the whole topic, now blocked in A's insert
        b = Archiver(settings, archive, topics=["steps"], group_id=group, max_wait_s=0.3)
        # B joined when it stored its partitions' rows (A's are held at the gate)
        assert _archive_until(b, archive, f"SELECT count() FROM {db}.steps", 1) > 0
        with caplog.at_level(logging.WARNING):
            gated.opened.set()
            a.flush()
        assert any("reassigned" in r.getMessage() for r in caplog.records)
        # both stored B's partitions; FINAL reads them once
        _, rows = archive.query(f"SELECT count(), uniqExact(job_id) FROM {db}.steps FINAL")
        assert rows == [(16 * 8, 16)]
    finally:
        a.close()
        if b is not None:
            b.close()


def _child(mode: str, settings, group: str, where: str, database: str, marker: Path):
    args = [sys.executable, "-m", "tests.integration.archiver_child", mode,
            settings.kafka_bootstrap, settings.broker_flavor, settings.topic_prefix, group,
            where, database, str(marker)]  # fmt: skip
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.mark.parametrize("kind", ["chdb", "server"])
def test_killed_between_insert_and_commit_leaves_no_duplicate_and_no_gap(settings, kind, tmp_path):
    """SIGKILL an archiver process after its first batch is stored and before that
    batch's offsets are committed; the next archiver of the group stores the batch
    again, and FINAL reads every row exactly once."""
    if kind == "server":
        if not TEST_CLICKHOUSE:
            _missing("STEPGUARD_TEST_CLICKHOUSE is not set (no ClickHouse server)")
        where = (
            TEST_CLICKHOUSE.rsplit("/", 1)[0] if TEST_CLICKHOUSE.count("/") > 2 else TEST_CLICKHOUSE
        )
    else:
        where = str(tmp_path / "chdb")  # the child owns it; this process has its own
    database = f"t_{uuid.uuid4().hex[:12]}"
    _publish_steps(settings, 6)
    group = f"{settings.consumer_group}.killed"
    marker = tmp_path / "inserted"
    stalled = _child("stall", settings, group, where, database, marker)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and stalled.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # polling for the child's marker file, bounded
        assert marker.exists(), stalled.communicate(timeout=10)[0].decode(errors="replace")
        assert marker.read_text().split() == ["steps", "16"]  # 2 messages of 8 ranks
    finally:
        stalled.kill()
        stalled.communicate(timeout=10)
    drain = _child("drain", settings, group, where, database, marker)
    out, _ = drain.communicate(timeout=120)
    assert drain.returncode == 0, out.decode(errors="replace")
    counts = json.loads(out.decode().strip().splitlines()[-1])
    try:
        assert counts["final"] == counts["distinct"] == 6 * 8
        # the first batch was stored twice (before the kill and after it): FINAL hides it
        assert counts["raw"] >= counts["final"]
    finally:
        if kind == "server":
            server = ServerBackend(f"{where}/{database}")
            server.execute(f"DROP DATABASE IF EXISTS {database}")
            server.close()


def test_replaying_every_topic_gives_identical_query_results(settings, archive):
    """A second consumer group reads every topic from the start into the same archive
    (a replay): every table's FINAL count and every analyst query answer the same."""
    registry = registry_of(settings)
    create_topics(settings)
    producer = make_producer(settings)
    for logical, msg in samples().items():
        publish(producer, registry, logical, msg)
    for step in range(6, 12):  # a job with a slow rank, for the per-rank queries
        for node in range(2):
            m = step_telemetry(node=f"node-{node}", step=step, first_rank=8 * node)
            if node == 1:
                slow = m.samples[3].model_copy(update={"compute_s": 0.6})
                m = m.model_copy(update={"samples": (*m.samples[:3], slow, *m.samples[4:])})
            publish(producer, registry, "steps", m)
    producer.flush()
    producer.close()
    db = archive.database

    def answers() -> dict[str, object]:
        out: dict[str, object] = {
            table: archive.query(f"SELECT count() FROM {db}.{table} FINAL")[1]
            for table in sorted({t for t, _ in TABLE_OF.values()})
        }
        for name in QUERIES:
            out[name] = run_query(archive, name, job="job-1")
        return out

    def archive_all(group: str) -> None:
        archiver = Archiver(settings, archive, group_id=group, max_batch=7, max_wait_s=0.3)
        try:
            for _ in range(120):
                if archiver.poll_batch() == 0 and archiver.stats.messages >= len(samples()) + 12:
                    break
        finally:
            archiver.close()
        assert archiver.stats.messages == len(samples()) + 12

    archive_all(f"{settings.consumer_group}.first")
    first = answers()
    archive_all(f"{settings.consumer_group}.replay")
    assert answers() == first
    assert first["steps"] == [(8 + 12 * 8,)]  # the sample's 8 ranks, then 12 x 8
    slowest = first["rank_slowdown"][1][0]
    assert slowest[1:3] == ("node-1", 11)  # node-1's rank 8 + 3


def test_run_reports_progress_until_stopped(settings, archive):
    _publish_steps(settings, 3)
    seen: list[tuple[int, int]] = []
    archiver = Archiver(settings, archive, topics=["steps"], max_batch=1, max_wait_s=0.3)
    try:
        stats = archiver.run(
            lambda: len(seen) >= 60 or (bool(seen) and seen[-1][0] == 3),
            lambda s: seen.append((s.messages, s.rows)),
            every_s=0,
        )
    finally:
        archiver.close()
    assert seen[-1] == (3, 24) and (stats.messages, stats.rows) == (3, 24)
    assert [m for m, _ in seen] == sorted(m for m, _ in seen)  # progress only grows


def test_a_killed_decode_process_fails_the_batch_and_loses_nothing(settings, archive):
    """The OOM killer takes a decode process: the archiver stops with an error naming
    it and commits nothing past the batch; the next archiver stores everything."""
    _publish_steps(settings, 4)
    group = f"{settings.consumer_group}.oom"
    doomed = Archiver(settings, archive, topics=["steps"], group_id=group, max_wait_s=0.3,
                      decode_processes=1)  # fmt: skip
    for pid in doomed._decoders._pool._processes:  # the pool's own processes
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(ArchiveError, match="decode process"):
        for _ in range(60):
            doomed.poll_batch()
    doomed.close()
    assert _stored_by_group(settings, archive, group, 32) == 32
