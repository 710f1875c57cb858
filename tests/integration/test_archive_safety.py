"""Values from outside never become SQL text, and ``stepguard sql`` only reads, on both
archive backends (issue 14 item 7)."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

import pipeline.services.archive
from pipeline.cli.app import app
from pipeline.io.errors import ArchiveError
from pipeline.io.trust import sign
from pipeline.services.archive import rows_for
from pipeline.services.archive.queries import run_query
from pipeline.tools.report import render_report
from tests.factories import WORKER_KEY, samples, step_telemetry

pytestmark = pytest.mark.integration

HOSTILE_JOB = "j' OR '1'='1' --\\"
HOSTILE_NODE = "n'); DROP TABLE alerts; --\t\\'"


def _archive_hostile_job(archive) -> None:
    base = samples()["decisions"]
    alerts = [  # signed by a worker: the named queries ignore unsigned alerts
        (sign(base, WORKER_KEY), 0),  # job-1, an ordinary job
        (sign(base.model_copy(update={
            "job_id": HOSTILE_JOB, "node": HOSTILE_NODE, "fingerprint": "e" * 24,
            "incident": "../../escaped", "step": 30,
        }), WORKER_KEY), 0),
    ]  # fmt: skip
    steps = [
        (step_telemetry(job=HOSTILE_JOB, node=HOSTILE_NODE, step=s, first_rank=0), 0)
        for s in range(20, 40)
    ]
    for table, cols in rows_for(alerts + steps).items():
        archive.insert(table, cols)


def test_job_and_node_are_parameters_never_sql(archive):
    _archive_hostile_job(archive)
    cols, rows = run_query(archive, "incidents", job="x' OR 1=1 --")
    assert rows == []
    cols, rows = run_query(archive, "incidents", job=HOSTILE_JOB)
    (row,) = rows
    assert row[cols.index("culprit")] == HOSTILE_NODE  # bound exactly, backslashes included
    _, slow = run_query(archive, "rank_slowdown", job=HOSTILE_JOB, limit=3)
    assert len(slow) == 3
    with pytest.raises(ArchiveError, match="expected an int"):
        run_query(archive, "rank_slowdown", job=HOSTILE_JOB, limit="1; DROP TABLE x")


def test_report_binds_names_read_back_from_the_archive(archive, tmp_path):
    _archive_hostile_job(archive)
    out = tmp_path / "r" / "report.html"
    result = render_report(archive, HOSTILE_JOB, out)
    assert list(result.panels) == ["../../escaped"]  # a key, never a path: images are inline
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == ["report.html"]
    _, rows = archive.query(f"SELECT count() FROM {archive.database}.alerts FINAL")
    assert rows == [(2,)]


class _Borrowed:
    """The test's archive handed to the CLI, which must not close the shared session."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    "statement",
    [
        "DROP TABLE {db}.alerts",
        "INSERT INTO {db}.alerts SELECT * FROM {db}.alerts",
        "ALTER TABLE {db}.alerts DELETE WHERE 1",
        "TRUNCATE TABLE {db}.alerts",
        "SELECT 1; DROP TABLE {db}.alerts",
        "CREATE TABLE {db}.evil (x UInt8) ENGINE = Memory",
    ],
)
def test_sql_command_refuses_every_write(archive, monkeypatch, statement):
    for table, cols in rows_for([(samples()["decisions"], 0)]).items():
        archive.insert(table, cols)
    db = archive.database
    _, tables = archive.query(f"SHOW TABLES FROM {db}")
    monkeypatch.setattr(
        pipeline.services.archive, "open_backend", lambda _settings: _Borrowed(archive)
    )
    runner = CliRunner()
    refused = runner.invoke(app, ["sql", statement.format(db=db)])
    assert isinstance(refused.exception, ArchiveError), refused.output
    # and the server refuses it too, without the command's help
    with pytest.raises(ArchiveError):
        archive.query(statement.format(db=db), readonly=True)
    assert archive.query(f"SHOW TABLES FROM {db}")[1] == tables
    assert archive.query(f"SELECT count() FROM {db}.alerts FINAL")[1] == [(1,)]
    read = runner.invoke(app, ["sql", f"SELECT count() FROM {db}.alerts FINAL"])
    assert read.exit_code == 0, read.output
    assert "1 rows" in read.output
