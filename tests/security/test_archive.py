"""Threats against the archive: SQL from outside (``stepguard report --job/--incident``)
or read back from it (node names an exporter chose), and rewriting history (the
replacing version was the writer's own timestamp; a relaunched run's steps replaced
the abandoned run's). On both backends (the server one where CI provides it)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from pipeline.io.trust import sign
from pipeline.services.archive import rows_for
from pipeline.tools.report import incidents, render_report
from tests.factories import WORKER_KEY, samples, step_telemetry

pytestmark = pytest.mark.integration

HOSTILE_JOB = "j' OR '1'='1' --\\"
HOSTILE_NODE = "n'); DROP TABLE alerts; --\t\\'"


def _store(archive, messages, offsets=None) -> None:
    for table, cols in rows_for([(m, 0) for m in messages], offsets).items():
        archive.insert(table, cols)


def _tables(archive) -> set[str]:
    _, rows = archive.query(f"SHOW TABLES FROM {archive.database}")
    return {r[0] for r in rows}


def _two_jobs(archive) -> None:
    base = samples()["decisions"]  # job-1's incident: nobody else's report shows it
    theirs = base.model_copy(update={"job_id": HOSTILE_JOB, "node": HOSTILE_NODE,
                                     "fingerprint": "e" * 24, "step": 30})  # fmt: skip
    steps = [
        step_telemetry(job=job, node=node, step=s)
        for job, node in (("job-1", "node-3"), (HOSTILE_JOB, HOSTILE_NODE))
        for s in range(20, 40)
    ]
    _store(archive, [sign(base, WORKER_KEY), sign(theirs, WORKER_KEY), *steps])


def test_report_job_and_incident_are_values_never_sql(archive):
    """Threat: ``stepguard report --job "x' OR 1=1 --"`` read (or changed) every job."""
    _two_jobs(archive)
    before = _tables(archive)
    assert incidents(archive, "x' OR '1'='1' --") == []
    assert incidents(archive, "job-1' --") == []
    assert incidents(archive, "job-1", incident="' OR 1=1 --") == []
    (mine,) = incidents(archive, "job-1")
    assert mine.node == "node-3"
    assert _tables(archive) == before


def test_node_names_read_back_from_the_archive_never_become_sql(archive, tmp_path):
    """Threat (second order): the report put node names it read from the archive into
    the SQL of its next queries, so an exporter choosing a node name wrote SQL."""
    _two_jobs(archive)
    before = _tables(archive)
    result = render_report(archive, HOSTILE_JOB, tmp_path / "report.html")
    (inc,) = incidents(archive, HOSTILE_JOB)
    assert inc.node == HOSTILE_NODE  # bound exactly, quotes and backslashes included
    assert len(result.panels) == 1 and result.html_path.exists()
    assert _tables(archive) == before
    _, rows = archive.query(f"SELECT count() FROM {archive.database}.alerts FINAL")
    assert rows == [(2,)]


def test_a_later_record_cannot_rewrite_history(archive):
    """Threat: the replacing version was the message's own timestamp, so a record
    dated later under the same key replaced what was archived; steps after a relaunch
    replaced the abandoned run's rows (key job, step, rank)."""
    first = samples()["decisions"]
    forged = first.model_copy(update={"summary": "nothing happened",
                                      "ts": first.ts + timedelta(days=365)})  # fmt: skip
    _store(archive, [first], [10])
    _store(archive, [forged], [11])
    _, rows = archive.query(f"SELECT summary FROM {archive.database}.alerts FINAL")
    assert rows == [(first.summary,)]
    abandoned = step_telemetry(step=7).model_copy(update={"run": "run-0"})
    relaunched = abandoned.model_copy(update={"run": "run-1", "ts_end": abandoned.ts_end})
    _store(archive, [abandoned, relaunched], [20, 21])
    _, rows = archive.query(
        f"SELECT run, count() FROM {archive.database}.steps FINAL GROUP BY run ORDER BY run"
    )
    assert rows == [("run-0", 8), ("run-1", 8)]
