"""The chDB archive is read while the archiver owns it: through the archiver's query
socket (chDB lets one process open a data directory at a time)."""

from __future__ import annotations

import json
import math
import os
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from pipeline.io.errors import ArchiveError
from pipeline.io.kafka import client_config, create_topics, make_producer, publish, registry_of
from pipeline.services.archive.backend import chdb_holder
from pipeline.services.archive.client import ClientBackend
from pipeline.services.archive.serve import QueryServer, query_socket_path, socket_address
from tests.conftest import fresh_archive
from tests.factories import step_telemetry

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
STEPGUARD = str(Path(sys.executable).parent / "stepguard")


@pytest.fixture
def served(_chdb_session, tmp_path):
    """A migrated chDB database served on a socket under a long temporary path."""
    with fresh_archive("chdb", _chdb_session) as archive:
        deep = tmp_path / ("d" * 60) / "archive"
        with QueryServer(archive, query_socket_path(deep)) as server:
            yield archive, server


def test_client_reads_typed_rows_with_parameters(served):
    archive, server = served
    db = archive.database
    client = ClientBackend(server.path)
    assert client.database == db
    now = datetime.now(UTC).replace(microsecond=0)  # whole seconds: a DateTime holds no more
    cols, rows = client.query(
        f"SELECT toDateTime('{now:%Y-%m-%d %H:%M:%S}', 'UTC') AS t, nan AS x, [1, 2] AS a, "
        "NULL AS n, {job:String} AS j, {k:UInt32} + 1 AS k",
        {"job": "x' OR '1'='1", "k": 41},
    )
    assert cols == ["t", "x", "a", "n", "j", "k"]
    ((t, x, a, n, j, k),) = rows
    assert t == now
    assert math.isnan(x) and a == [1, 2] and n is None
    assert j == "x' OR '1'='1" and k == 42
    _, rows = client.query(f"SELECT count() FROM {db}.steps FINAL")
    assert rows == [(0,)]
    assert server.served == 2


def test_only_reads_go_through_and_the_socket_is_private(served):
    archive, server = served
    client = ClientBackend(server.path)
    db = archive.database
    with pytest.raises(ArchiveError, match="refused: only SELECT"):
        client.query(f"DROP TABLE {db}.steps")
    # a client that skips the check: the server refuses it all the same
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with socket_address(server.path) as address:
        raw.connect(address)
    body = f'{{"op":"query","sql":"DROP TABLE {db}.steps","params":{{}}}}'.encode()
    raw.sendall(struct.pack(">I", len(body)) + body)
    size = struct.unpack(">I", raw.recv(4))[0]
    answer = raw.recv(size).decode()
    raw.close()
    assert "error" in answer and "refused" in answer
    _, rows = archive.query(f"EXISTS TABLE {db}.steps")
    assert rows == [(1,)]
    with pytest.raises(ArchiveError, match="only read-only"):
        client.execute(f"TRUNCATE TABLE {db}.steps")
    assert stat.S_IMODE(os.stat(server.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(server.path.parent).st_mode) == 0o700


def test_an_oversized_or_broken_request_is_refused_and_the_server_goes_on(served):
    _, server = served
    for frame in (struct.pack(">I", 1 << 30), struct.pack(">I", 5) + b"{nope"):
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with socket_address(server.path) as address:
            raw.connect(address)
        raw.sendall(frame)
        size = struct.unpack(">I", raw.recv(4))[0]
        assert b"error" in raw.recv(size)
        raw.close()
    assert ClientBackend(server.path).query("SELECT 1")[1] == [(1,)]
    assert server.refused == 2


def _env(settings, chdb: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("STEPGUARD_")}
    return base | {
        "STEPGUARD_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "STEPGUARD_BROKER_FLAVOR": settings.broker_flavor,
        "STEPGUARD_TOPIC_PREFIX": settings.topic_prefix,
        "STEPGUARD_CONSUMER_GROUP": settings.consumer_group,
        "STEPGUARD_CHDB_PATH": str(chdb),
        "STEPGUARD_ARCHIVER_METRICS_PORT": "0",
        "COLUMNS": "80",
    }


def _cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STEPGUARD, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip


def _wait_committed(settings, group: str, metas, timeout_s: float = 90.0) -> None:
    """Until ``group`` committed past every record of ``metas``: the archiver commits
    a batch only after its rows are stored."""
    probe = KafkaConsumer(**client_config(settings), group_id=group, enable_auto_commit=False)
    pending = {TopicPartition(m.topic, m.partition): m.offset for m in metas}
    deadline = time.monotonic() + timeout_s
    try:
        while pending and time.monotonic() < deadline:
            pending = {tp: o for tp, o in pending.items() if (probe.committed(tp) or 0) <= o}
            if pending:
                threading.Event().wait(0.1)  # between two reads of the committed offsets
    finally:
        probe.close()
    assert not pending, f"the archiver did not commit {pending} in {timeout_s} s"


def test_sql_and_query_read_the_archive_while_the_archiver_runs(settings, tmp_path):
    chdb = tmp_path / "archive"
    env = _env(settings, chdb)
    create_topics(settings)
    archiver = subprocess.Popen(
        [STEPGUARD, "archiver", "--decode-processes", "0", "--max-wait-s", "0.2",
         "--progress-s", "0"],
        cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # the archiver says "archiving ..." once it consumes and serves queries
        seen = []
        for line in archiver.stderr:  # type: ignore[union-attr]
            seen.append(line)
            if line.startswith("archiving"):
                break
        assert archiver.poll() is None, "".join(seen)
        # keep reading what it says, so that a full pipe never blocks it
        drain = threading.Thread(target=lambda: seen.extend(archiver.stderr), daemon=True)
        drain.start()
        producer = make_producer(settings)
        registry = registry_of(settings)
        sent = [
            publish(producer, registry, "steps", step_telemetry(node=f"n{n}", first_rank=8 * n))
            for n in range(3)
        ]
        metas = [f.get(timeout=30) for f in sent]
        producer.close()
        _wait_committed(settings, f"{settings.consumer_group}.archiver", metas)
        client = ClientBackend(query_socket_path(chdb))
        count = f"SELECT count() FROM {client.database}.steps FINAL"
        assert client.query(count)[1] == [(24,)]
        # the command line, as a person runs it while the archiver holds the directory
        out = _cli(env, "sql", f"SELECT node, count() AS ranks FROM {client.database}.steps "
                   "FINAL GROUP BY node ORDER BY node")  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert "n0" in out.stdout and "n2" in out.stdout and "3 rows" in out.stderr
        out = _cli(env, "sql", "--json", f"SELECT node, count() AS ranks, max(ts) AS last "
                   f"FROM {client.database}.steps FINAL GROUP BY node ORDER BY node")  # fmt: skip
        assert out.returncode == 0, out.stderr
        lines = [json.loads(line) for line in out.stdout.splitlines()]
        assert [(r["node"], r["ranks"]) for r in lines] == [("n0", 8), ("n1", 8), ("n2", 8)]
        assert lines[0]["last"].endswith("+00:00")
        out = _cli(env, "report", "--job", "job-1", "--out", str(tmp_path / "r.html"))
        assert out.returncode == 0, out.stderr
        assert "job job-1: 0 incident(s)" in out.stdout
        out = _cli(env, "query", "rank_slowdown", "--job", "job-1", "--limit", "5")
        assert out.returncode == 0, out.stderr
        assert max(len(line) for line in out.stdout.splitlines()) <= 80
        # what needs the directory itself says who holds it, in one line
        assert chdb_holder(chdb) == archiver.pid
        out = _cli(env, "archive", "migrate")
        assert out.returncode == 4  # no archive (docs/cli.md)
        said = " ".join(out.stderr.split())
        assert said.startswith("error: the chDB archive at ")
        assert f"is open in process {archiver.pid}," in said
        assert "Traceback" not in said and "DB::Exception" not in said
        out = _cli(env, "sql", f"DROP TABLE {client.database}.steps")
        assert out.returncode == 4 and "refused" in out.stderr
        assert client.query(count)[1] == [(24,)]
    finally:
        archiver.terminate()
        archiver.wait(timeout=60)
        archiver.stderr.close()  # type: ignore[union-attr]
    assert archiver.returncode == 0, "".join(seen)
    assert not query_socket_path(chdb).exists() and chdb_holder(chdb) is None
    # with the archiver gone the directory is the command line's to open
    out = _cli(env, "sql", "SELECT count() FROM stepguard.steps FINAL")
    assert out.returncode == 0, out.stderr
    assert "24" in out.stdout
