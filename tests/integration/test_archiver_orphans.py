"""A SIGKILLed archiver leaves no process behind: its decode processes notice that
their parent is gone and exit, and multiprocessing's resource tracker, whose pipe they
held, exits with them. No broker or ClickHouse is needed: the pool is the archiver's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

_CHILD = """
import json, multiprocessing.resource_tracker as rt, sys
from pipeline.services.archive.archiver import _DecodePool
pool = _DecodePool(2)
kids = [p.pid for p in pool._pool._processes.values()]
print(json.dumps({"decode": kids, "tracker": rt._resource_tracker._pid}), flush=True)
sys.stdin.read()  # until killed
"""


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a reaped-late orphan is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_killed_archivers_decode_processes_and_resource_tracker_exit() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", _CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # the tracker's warning about the semaphores it frees
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    ) as archiver:
        try:
            assert archiver.stdout is not None
            pids = json.loads(archiver.stdout.readline())
        finally:
            os.kill(archiver.pid, signal.SIGKILL)
            archiver.wait(30)
    children = [*pids["decode"], pids["tracker"]]
    assert len(pids["decode"]) == 2 and pids["tracker"] is not None
    deadline = time.monotonic() + 20.0  # a bound for a loaded machine, not a speed check
    while (alive := [p for p in children if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling process existence against a deadline
    assert alive == [], f"still running after their archiver was SIGKILLed: {alive}"
