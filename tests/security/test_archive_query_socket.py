"""The archiver's query socket under a hostile or careless reader (SECURITY.md, the
query-socket row): a slow query is stopped by its time limit while archiving goes on,
and memory and result limits apply while the result is built, on the real chDB."""

from __future__ import annotations

import threading

import pytest

from pipeline.io.errors import ArchiveError
from pipeline.io.kafka import create_topics, make_producer, publish, registry_of
from pipeline.services.archive.archiver import Archiver
from pipeline.services.archive.client import ClientBackend
from pipeline.services.archive.limits import QueryLimits
from pipeline.services.archive.serve import QueryServer, query_socket_path
from tests.conftest import fresh_archive
from tests.factories import step_telemetry
from tests.integration.test_archive_live_query import served  # noqa: F401 (a fixture)

pytestmark = pytest.mark.integration


#: a query that runs for minutes on one core, unless a limit stops it
SLOW = "SELECT count() FROM numbers(20000000000) WHERE sipHash64(number) % 7 = 1"


def test_a_slow_query_is_stopped_by_its_time_limit_and_archiving_goes_on(
    settings, _chdb_session, tmp_path
):
    """One read-only query through the socket used to hold the session (and with it
    every insert) for as long as it ran: now it stops at max_execution_s, and the
    archiver, inserting all along, stores what it fetched."""
    create_topics(settings, ["steps", "deadletter"])
    producer = make_producer(settings)
    for node in range(4):
        publish(producer, registry_of(settings), "steps",
                step_telemetry(node=f"n{node}", first_rank=8 * node)).get(timeout=30)  # fmt: skip
    producer.close()
    path = query_socket_path(tmp_path / "archive")
    limits = QueryLimits(max_execution_s=1)
    with fresh_archive("chdb", _chdb_session) as archive:
        archiver = Archiver(settings, archive, topics=["steps"], max_wait_s=0.3,
                            query_socket=path, query_limits=limits)  # fmt: skip
        answers: list[object] = []

        def slow() -> None:
            try:
                answers.append(ClientBackend(path).query(SLOW))
            except ArchiveError as exc:
                answers.append(exc)

        reader = threading.Thread(target=slow)
        try:
            reader.start()
            for _ in range(100):  # polls, each waiting at most max_wait_s
                archiver.poll_batch()
                if archiver.stats.rows >= 32:
                    break
            archiver.flush()
            reader.join(timeout=120)
        finally:
            archiver.close()
        assert archiver.stats.rows == 32
        _, rows = archive.query(f"SELECT count() FROM {archive.database}.steps FINAL")
        assert rows == [(32,)]
    assert not reader.is_alive()
    [answer] = answers
    assert isinstance(answer, ArchiveError) and "Timeout exceeded" in str(answer)


def test_memory_and_result_limits_apply_while_the_result_is_built(served, tmp_path):  # noqa: F811
    archive, _ = served
    limits = QueryLimits(max_memory_bytes=64 << 20, max_result_rows=1000, max_result_bytes=1 << 20)
    with QueryServer(archive, query_socket_path(tmp_path / "limited"), limits) as server:
        client = ClientBackend(server.path)
        with pytest.raises(ArchiveError, match="memory limit"):
            client.query("SELECT groupArray(number) FROM numbers(100000000)")
        with pytest.raises(ArchiveError, match="Limit for result exceeded"):
            client.query("SELECT number FROM numbers(10000000)")
        with pytest.raises(ArchiveError, match="Limit for result exceeded"):
            client.query("SELECT repeat('x', 1000) FROM numbers(5000)")
        # a limit of its own would lift the archiver's for that query
        with pytest.raises(ArchiveError, match="SETTINGS is not allowed"):
            client.query("SELECT * FROM (SELECT 1 SETTINGS max_execution_time = 0)")
        # what a query cut short had written out never reaches the next one (chDB
        # hands it to the next query's result)
        assert client.query("SELECT 42 AS answer") == (["answer"], [(42,)])
        assert client.query("SELECT 'settings' AS `settings`")[1] == [("settings",)]
