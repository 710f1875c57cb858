"""Exposed communication wait: a DDP communication hook that times the gradient buckets.

No ``from __future__ import annotations`` in this module: DDP inspects the hook's
annotations at ``register_comm_hook`` and rejects string annotations.

Exposed wait is the part of communication the rank waited for after its own backward
had handed over the last gradient bucket: ``comm done - last handover``. A straggler
hands its last bucket over late and waits little; its healthy peers hand theirs over on
time and wait for it. On CPU (gloo) both moments are host clock readings taken in the
hook (the handover) and in the future's completion callback (run by the backend's
thread when the all-reduce finishes); on CUDA they are events on the current stream,
read after the step without a host synchronisation.

FSDP or hand-written collectives: wrap each blocking collective (or the wait on its
work handle) in :meth:`CommTimer.blocking`, or add what you measured with
:meth:`CommTimer.add`::

    with guard.comm.blocking():
        dist.all_reduce(tensor)       # the whole call is exposed wait

    work = dist.all_reduce(tensor, async_op=True)
    ...                               # overlapped compute
    with guard.comm.blocking():
        work.wait()                   # only the wait is exposed
"""

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

__all__ = ["CommReading", "CommTimer", "timed_hook"]


class CommTimer:
    """Per-step handover and completion times of one rank's gradient communication."""

    def __init__(self, cuda: bool = False) -> None:
        self.cuda = cuda
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Start a new step (called by the guard at every step start)."""
        with self._lock:
            self.buckets = 0
            self.last_handover = 0.0
            self.last_done = 0.0
            self.blocked_s = 0.0
            self._handover_event: Any = None
            self._done_event: Any = None

    # -- the hook's side -------------------------------------------------------------
    def handover(self) -> None:
        """A bucket is handed to the backend now."""
        now = time.perf_counter()
        event = self._record() if self.cuda else None
        with self._lock:
            self.buckets += 1
            self.last_handover = now
            if event is not None:
                self._handover_event = event

    def done(self) -> None:
        """A bucket's collective finished now."""
        now = time.perf_counter()
        event = self._record() if self.cuda else None
        with self._lock:
            self.last_done = max(self.last_done, now)
            if event is not None:
                self._done_event = event

    @staticmethod
    def _record() -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    # -- hand-written collectives ------------------------------------------------------
    @contextlib.contextmanager
    def blocking(self) -> Iterator[None]:
        """The block waits on communication: its wall time is exposed wait."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(time.perf_counter() - t0)

    def add(self, seconds: float) -> None:
        """Add exposed wait measured elsewhere (seconds, >= 0)."""
        if seconds > 0:
            with self._lock:
                self.blocked_s += seconds

    # -- the guard's side --------------------------------------------------------------
    def take(self) -> "CommReading":
        """The step's exposed wait (read later: CUDA events may still be pending); the
        timer starts the next step."""
        with self._lock:
            reading = CommReading(
                self.last_done - self.last_handover if self.buckets else 0.0,
                self._handover_event, self._done_event, self.blocked_s,
            )  # fmt: skip
        self.reset()
        return reading


class CommReading:
    """One step's exposed communication wait; :meth:`seconds` once :meth:`ready`."""

    __slots__ = ("blocked", "done", "handover", "host")

    def __init__(self, host: float, handover: Any, done: Any, blocked: float) -> None:
        self.host, self.handover, self.done, self.blocked = host, handover, done, blocked

    def ready(self) -> bool:
        return self.done is None or bool(self.done.query())

    def seconds(self) -> float:
        hooked = self.host
        if self.handover is not None and self.done is not None:
            self.done.synchronize()
            hooked = self.handover.elapsed_time(self.done) / 1000.0
        return max(0.0, hooked) + self.blocked


def timed_hook(
    timer: CommTimer, hook: Callable[..., Any] | None = None
) -> Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]:
    """A DDP communication hook that times ``hook`` (default: DDP's all-reduce).

    Register it in place of the user's own: ``model.register_comm_hook(state,
    timed_hook(timer, user_hook))``; with no user hook ``state`` is the process
    group (None: the default group), as for ``default_hooks.allreduce_hook``.
    """
    inner = hook or default_hooks.allreduce_hook

    def finished(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        timer.done()
        return fut.value()

    def stepguard_timed_hook(
        state: Any, bucket: dist.GradBucket
    ) -> torch.futures.Future[torch.Tensor]:
        timer.handover()
        return inner(state, bucket).then(finished)

    return stepguard_timed_hook
