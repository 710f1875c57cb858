"""Jobs named only by health reports and start events: bounded and expiring.

A node agent's report names the job it believes the node runs, and a start event names
a job about to run; neither proves the job exists. Held like real jobs, invented ids
filled ``STEPGUARD_WORKER_MAX_JOBS`` for good (they got no ticks, so they never
expired) and their unacked records pinned the commit of the worker's jobs topic. So a
job stays *pending* until its first step: it does not count against the limit, its
records are acked at once (nothing of it is snapshotted), and it is forgotten after
``ttl_s`` wall seconds or when ``max_jobs`` newer pending jobs push it out.

Examples
--------
>>> wall = [0.0]
>>> pending = PendingJobs(max_jobs=2, ttl_s=60.0, clock=lambda: wall[0])
>>> for job in ("a", "b", "c"):
...     _ = pending.get_or_add(job, lambda j: j.upper())
>>> sorted(pending), pending.evicted  # "a" was pushed out by "c"
(['b', 'c'], 1)
>>> wall[0] = 61.0
>>> pending.get("b"), len(pending), pending.expired
(None, 0, 2)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["PendingJobs"]

S = TypeVar("S")


class PendingJobs(Generic[S]):
    """Per-job states of jobs not yet confirmed by a step, in order of arrival.

    Parameters
    ----------
    max_jobs
        Pending jobs held at once; the oldest is forgotten beyond it.
    ttl_s
        A pending job is forgotten this many wall seconds after it was first named.
    clock
        Wall clock (epoch seconds).
    """

    def __init__(self, max_jobs: int, ttl_s: float, clock: Callable[[], float]) -> None:
        if max_jobs < 1:
            raise ValueError(f"max_jobs must be >= 1, got {max_jobs!r}")
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s!r}")
        self.max_jobs = max_jobs
        self.ttl_s = ttl_s
        self.clock = clock
        self._jobs: OrderedDict[str, tuple[float, S]] = OrderedDict()
        self.expired = 0  #: forgotten after ttl_s
        self.evicted = 0  #: pushed out by newer pending jobs

    def __len__(self) -> int:
        self.expire()
        return len(self._jobs)

    def __contains__(self, job_id: object) -> bool:
        return isinstance(job_id, str) and self.get(job_id) is not None

    def __iter__(self) -> Iterator[str]:
        self.expire()
        return iter(list(self._jobs))

    def expire(self) -> None:
        """Forget the pending jobs named more than ``ttl_s`` ago."""
        horizon = self.clock() - self.ttl_s
        while self._jobs:
            job, (since, _) = next(iter(self._jobs.items()))
            if since > horizon:
                return
            del self._jobs[job]
            self.expired += 1

    def get(self, job_id: str) -> S | None:
        """The pending job's state, if it is still held."""
        self.expire()
        held = self._jobs.get(job_id)
        return None if held is None else held[1]

    def get_or_add(self, job_id: str, make: Callable[[str], S]) -> S:
        """The pending job's state, made with ``make`` if it is not held."""
        held = self.get(job_id)
        if held is not None:
            return held
        state = make(job_id)
        self._jobs[job_id] = (self.clock(), state)
        while len(self._jobs) > self.max_jobs:
            self._jobs.popitem(last=False)
            self.evicted += 1
        return state

    def pop(self, job_id: str) -> S | None:
        """Take the job out (it was confirmed, or it ended)."""
        held = self._jobs.pop(job_id, None)
        return None if held is None else held[1]

    def drop(self, keep: Callable[[S], bool]) -> int:
        """Forget every pending job whose state ``keep`` refuses; how many."""
        gone = [job for job, (_, st) in self._jobs.items() if not keep(st)]
        for job in gone:
            del self._jobs[job]
        return len(gone)
