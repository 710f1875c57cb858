"""``stepguard replay --archive`` through the real chDB (issue 43): the replayed job's
steps (with their work), and its alerts signed with the worker's key, land in the
archive, where ``report`` finds the incident and ``calibrate`` loads the job."""

from __future__ import annotations

from pathlib import Path

import pytest

from detectors.config import DetectorConfig
from pipeline.cli.util import console, err
from pipeline.io.settings import load_settings
from pipeline.io.trust import ephemeral_keys
from pipeline.tools.calibrate.archive import archived_jobs
from pipeline.tools.calibrate.replay import replay_core
from pipeline.tools.replay_run import ReplayOptions, run_replay
from pipeline.tools.report import incidents
from tests.conftest import fresh_archive

pytestmark = pytest.mark.integration

SAMPLE = Path(__file__).resolve().parents[2] / "docs" / "samples" / "replay-straggler.jsonl"


def test_a_replay_written_to_the_archive_is_what_report_and_calibrate_read(_chdb_session):
    settings = load_settings()
    settings = settings.model_copy(update=ephemeral_keys(settings, "replay-test", ["worker"]))
    with fresh_archive("chdb", _chdb_session) as archive:
        opts = ReplayOptions(path=SAMPLE, archive=True, redate=True, json_stdout=True)
        result = run_replay(settings, console, err, opts, backend=archive)
        job = result.job_id
        db = archive.database
        _, rows = archive.query(
            f"SELECT count(), countIf(tokens = 4096), uniqExact(step) FROM {db}.steps FINAL "
            f"WHERE job_id = '{job}'"
        )
        assert rows == [(1600, 1600, 100)]
        found = incidents(archive, job)
        assert {(i.kind, i.node) for i in found} == {("straggler", "node-0002")}
        (loaded,) = archived_jobs(archive, [job])
        assert loaded.rank_steps == 1600 and loaded.last_step == 99
        assert all((f.tokens == 4096).all() and f.flops is None for f in loaded.frames)
        again = replay_core(loaded, DetectorConfig())
        assert {u.node for u in again.updates if u.node} == {"node-0002"}
        # the same file again replaces its rows rather than repeating them
        run_replay(settings, console, err, opts, backend=archive)
        _, rows = archive.query(f"SELECT count() FROM {db}.steps FINAL WHERE job_id = '{job}'")
        assert rows == [(1600,)]
