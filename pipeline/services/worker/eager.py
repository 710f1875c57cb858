"""Start a coroutine at once, and race the rest of it only if it waits.

Faust's fetcher hands every record to its topic's stream through
``Service.wait_first(deliver(record), suspend_flow)``: four tasks and an
``asyncio.wait`` per record, so that a rebalance can interrupt a delivery blocked on a
full stream buffer. Most deliveries never wait (the buffer has room), and those tasks
were most of what a Faust agent spent per record before its own code ran.

:func:`eager_first` keeps that race and drops its cost when nothing waits: the first
coroutine runs at once up to its first suspension, as an eager task does (Python 3.12's
``asyncio.eager_task_factory``); finished there, it wins without a task; suspended, what
is left of it (:func:`resumed`) races the other waits exactly as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

__all__ = ["eager_first", "resumed"]


async def resumed(coro: Coroutine[Any, Any, Any], yielded: Any) -> Any:
    """The rest of ``coro``, already run up to a suspension at which it yielded
    ``yielded`` (a future it waits for, or None for a bare yield). Cancelled while
    waiting, the future ``coro`` waits for is cancelled too, so ``coro`` sees the
    cancellation where it waits, as it would in a task of its own."""
    while True:
        try:
            if yielded is None:
                await asyncio.sleep(0)
            else:
                # what a task does with a future its coroutine yields: the flag
                # says "a coroutine waits on me" and is cleared by whoever waits
                yielded._asyncio_future_blocking = False
                await yielded
        except BaseException as exc:
            if yielded is None or not yielded.done():
                # our own cancellation (or interruption) before its future was done:
                # thrown into the coroutine where it waits
                try:
                    yielded = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
                continue
            # the future ended with an error: the coroutine reads it as it resumes
        try:
            yielded = coro.send(None)
        except StopIteration as stop:
            return stop.value


WaitFirst = Callable[..., Awaitable[Any]]


async def eager_first(
    wait_first: WaitFirst,
    done: Callable[[Any, Any], Any],
    *coros: Any,
    timeout: float | None = None,
) -> Any:
    """``wait_first(*coros, timeout=timeout)`` with its first argument, when a
    coroutine, run at once: if it returns before it would wait, ``done(coro, value)``
    is the answer and the other coroutines are closed unstarted (after one turn of the
    loop, as the race would have given the others: a caller in a loop never starves
    them); if it raises, the error propagates as ``wait_first`` would propagate it."""
    first = coros[0] if coros else None
    if timeout is not None or not asyncio.iscoroutine(first):
        return await wait_first(*coros, timeout=timeout)
    try:
        yielded = first.send(None)
    except StopIteration as stop:
        for other in coros[1:]:  # never started: closed, as the race would cancel them
            if asyncio.iscoroutine(other):
                other.close()
        await asyncio.sleep(0)
        return done(first, stop.value)
    return await wait_first(resumed(first, yielded), *coros[1:], timeout=timeout)
