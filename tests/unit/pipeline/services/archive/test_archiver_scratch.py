"""The decode pool's scratch directories: a killed archiver's are removed by the next
one, a running archiver's are left alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pipeline.services.archive.decode_pool import remove_stale_scratch


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(30)
    return child.pid  # reaped: no process has this pid now (reuse aside)


def test_scratch_of_a_dead_archiver_is_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    dead = tmp_path / f"stepguard-archiver-{_dead_pid()}-abc123"
    live = tmp_path / f"stepguard-archiver-{os.getpid()}-def456"
    other = tmp_path / "stepguard-archiver-notapid-x"
    for d in (dead, live, other):
        d.mkdir()
        (d / "0.in").write_bytes(b"x" * 100)
    assert remove_stale_scratch(tmp_path) == [dead]
    assert not dead.exists() and live.exists() and other.exists()
