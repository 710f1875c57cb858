"""The archiver's decode processes: step messages decoded into columns off the consumer.

:class:`DecodePool` hands raw values to worker processes that decode them with the bulk
decoder and write the columns into a scratch file in shared memory; the archiver maps
the file back. Each process exits with its parent; scratch left by a killed archiver is
removed at the next start (:func:`remove_stale_scratch`).
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from pipeline.io import statecodec
from pipeline.io.errors import ArchiveError
from pipeline.services.archive.rows import (
    StepRows,
    pack_values,
    step_rows_file,
)

__all__ = ["DecodePool", "default_decode_processes", "remove_stale_scratch"]


def default_decode_processes() -> int:
    """One decode process per core this process may run on but one (the fetch and
    insert threads'), up to 4."""
    try:
        cores = len(os.sched_getaffinity(0))  # a container's cpuset, not the host's
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(0, min(4, cores - 1))


class DecodePool:
    """Processes that decode the steps topic (spawned: the archiver already runs
    threads). A batch goes to a process as a file and its rows come back as one, in a
    private temporary directory (in memory where /dev/shm exists): through the pool's
    pipes, every 64 KiB of a batch waited for the other side, and the decode process
    sat idle for it (BENCHMARKS.md, "Archive ingest")."""

    def __init__(self, processes: int) -> None:
        parent = _scratch_parent()
        remove_stale_scratch(parent)
        self._dir = Path(tempfile.mkdtemp(prefix=f"{_SCRATCH}{os.getpid()}-", dir=parent))
        self._names = itertools.count()
        self._pool = ProcessPoolExecutor(
            processes,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_decode_process_init,
            initargs=(os.getpid(),),
        )
        # start every process now, with the decode modules imported
        for ready in [self.submit([]) for _ in range(processes)]:
            ready()

    def submit(self, values: list[bytes | None]) -> Callable[[], StepRows]:
        """Start decoding ``values``; the returned call waits for their rows."""
        joined, ends = pack_values(values)
        src = self._dir / f"{next(self._names)}.in"
        src.write_bytes(joined)
        try:
            job = self._pool.submit(step_rows_file, str(src), ends, str(src.with_suffix(".out")))
        except BrokenProcessPool as exc:  # one died before: the pool takes no more work
            src.unlink(missing_ok=True)
            raise ArchiveError(f"a decode process died: {exc}") from exc

        def rows() -> StepRows:
            try:
                out = Path(job.result())
            except BrokenProcessPool as exc:
                raise ArchiveError(f"a decode process died: {exc}") from exc
            finally:
                src.unlink(missing_ok=True)
            try:
                # written by our decode process, in our 0700 directory; read as data
                decoded = statecodec.loads(out.read_bytes(), max_bytes=1 << 34)
            except statecodec.StateFormatError as exc:
                raise ArchiveError(f"unreadable decode result: {exc}") from exc
            finally:
                out.unlink(missing_ok=True)
            if not isinstance(decoded, StepRows):
                raise ArchiveError(f"decode process wrote {type(decoded).__name__}")
            return decoded

        return rows

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)
        shutil.rmtree(self._dir, ignore_errors=True)


_SCRATCH = "stepguard-archiver-"


#: /dev/shm is used only with this much free: a batch of 20k messages takes ~48 MB
#: there while it decodes, and Docker gives containers 64 MB unless told otherwise.
_SHM_FREE_BYTES = 1 << 30


def _scratch_parent() -> Path:
    """Shared memory when it is there, writable and roomy; else the temporary directory."""
    shm = Path("/dev/shm")  # noqa: S108 - only as the parent of mkdtemp's private dir
    try:
        if os.access(shm, os.W_OK) and shutil.disk_usage(shm).free >= _SHM_FREE_BYTES:
            return shm
    except OSError:
        pass
    return Path(tempfile.gettempdir())


def remove_stale_scratch(parent: Path) -> list[Path]:
    """Remove the scratch directories of decode pools whose archiver is gone (killed
    before it could clean up: in /dev/shm they would hold memory until a reboot).
    Returns what was removed."""
    removed = []
    for path in parent.glob(f"{_SCRATCH}*-*"):
        pid = path.name[len(_SCRATCH) :].split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _decode_process_init(parent: int) -> None:
    """In a decode process: Ctrl-C reaches the whole process group, but stopping is the
    archiver's to do (it finishes the batches in flight, then shuts the pool down). And
    the process dies with the archiver: a SIGKILLed archiver cannot shut its pool down,
    and the pool's call queue never reads end-of-file (each process holds a copy of
    its write end), so the process would wait for work forever, and keep
    multiprocessing's resource tracker alive with it (the tracker exits when the last
    process holding its pipe does)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(
        target=_exit_with_parent, args=(parent,), name="decode-parent-watch", daemon=True
    ).start()


#: How often a decode process checks that its archiver is still alive (seconds).
_PARENT_POLL_S = 0.25


def _exit_with_parent(parent: int, poll_s: float = _PARENT_POLL_S) -> None:
    """Exit the process at once when ``parent`` is no longer its parent (it died and the
    process was re-parented). Polled, not ``PR_SET_PDEATHSIG``: that signal follows
    the *thread* that started the process, and the pool may start its processes from
    any thread of the archiver."""
    while os.getppid() == parent:
        time.sleep(poll_s)
    os._exit(0)
