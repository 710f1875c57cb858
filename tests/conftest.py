"""Real-service fixtures: a Kafka-compatible broker and ClickHouse.

- ``STEPGUARD_TEST_KAFKA=host:port`` points at a running Apache Kafka (CI starts one
  with ``scripts/kafka.sh``); otherwise the embedded Tansu broker is started here.
- ``STEPGUARD_TEST_CLICKHOUSE=clickhouse://...`` points at a ClickHouse server (CI
  starts Debian's 18.16 with ``scripts/clickhouse.sh``); without it the server-backend
  tests skip locally. chDB always runs in-process.
- Under ``CI=true`` a missing or unreachable service fails the run; it never skips.

Every test gets its own topic prefix and database, so tests never share state.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.io.embedded import TansuBroker, probe_kafka
from pipeline.io.settings import Settings, load_settings
from pipeline.services.archive import ChdbBackend, ServerBackend, migrate
from pipeline.services.archive.backend import ArchiveBackend
from tests.factories import telemetry_settings

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
TEST_KAFKA = os.environ.get("STEPGUARD_TEST_KAFKA", "")
TEST_CLICKHOUSE = os.environ.get("STEPGUARD_TEST_CLICKHOUSE", "")


def _missing(what: str) -> None:
    if IN_CI:
        pytest.fail(f"CI=true but {what}; .ci/run must start it", pytrace=False)
    pytest.skip(what)


@pytest.fixture(scope="session")
def broker_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """Settings pointing at a live broker (real Kafka if given, else embedded Tansu)."""
    # telemetry is authenticated, as in a deployment: every producer and worker built
    # from these settings holds the tests' cluster secret (tests.factories)
    auth = telemetry_settings()
    if TEST_KAFKA:
        host, _, port = TEST_KAFKA.rpartition(":")
        if not probe_kafka(host, int(port), timeout=5.0):
            pytest.fail(f"STEPGUARD_TEST_KAFKA={TEST_KAFKA} does not answer", pytrace=False)
        yield load_settings({}, kafka_bootstrap=TEST_KAFKA, broker_flavor="kafka", **auth)
        return
    if IN_CI:
        pytest.fail("CI=true but STEPGUARD_TEST_KAFKA is not set", pytrace=False)
    with TansuBroker(log_dir=tmp_path_factory.mktemp("tansu")) as broker:
        yield load_settings({}, kafka_bootstrap=broker.bootstrap, broker_flavor="tansu", **auth)


@pytest.fixture
def settings(broker_settings: Settings) -> Settings:
    """Per-test settings: a fresh topic prefix and consumer group."""
    return fresh_settings(broker_settings)


@pytest.fixture(scope="session")
def chdb_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # chDB allows one data path per process: every test shares it, with its own database.
    return tmp_path_factory.mktemp("chdb")


@pytest.fixture(scope="session")
def _chdb_session(chdb_root: Path) -> Iterator[ChdbBackend]:
    backend = ChdbBackend(chdb_root, database="default")
    yield backend
    backend.close()


def _fresh_chdb(shared: ChdbBackend) -> ChdbBackend:
    return shared.with_database(f"t_{uuid.uuid4().hex[:12]}")


def _fresh_server() -> ServerBackend:
    db = f"t_{uuid.uuid4().hex[:12]}"
    base = TEST_CLICKHOUSE.rsplit("/", 1)[0] if TEST_CLICKHOUSE.count("/") > 2 else TEST_CLICKHOUSE
    return ServerBackend(f"{base}/{db}", timeout_s=20)


@contextlib.contextmanager
def fresh_archive(kind: str, shared_chdb: ChdbBackend) -> Iterator[ArchiveBackend]:
    """A migrated, empty archive database on the ``kind`` backend, dropped afterwards."""
    if kind == "server":
        if not TEST_CLICKHOUSE:
            _missing("STEPGUARD_TEST_CLICKHOUSE is not set (no ClickHouse server)")
        backend: ArchiveBackend = _fresh_server()
    else:
        backend = _fresh_chdb(shared_chdb)
    migrate(backend)
    try:
        yield backend
    finally:
        backend.execute(f"DROP DATABASE IF EXISTS {backend.database}")
        if kind == "server":
            backend.close()


@pytest.fixture(params=["chdb", "server"])
def archive(request: pytest.FixtureRequest, _chdb_session: ChdbBackend) -> Iterator[ArchiveBackend]:
    """A migrated, empty archive database on each backend."""
    with fresh_archive(request.param, _chdb_session) as backend:
        yield backend


def fresh_settings(base: Settings) -> Settings:
    tag = uuid.uuid4().hex[:10]
    return base.model_copy(update={"topic_prefix": f"t{tag}.", "consumer_group": f"g{tag}"})
