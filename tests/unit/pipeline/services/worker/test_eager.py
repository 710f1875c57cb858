"""The eager first wait of the worker's consumer (pipeline/services/worker/eager.py):
a delivery that does not wait costs no task; one that waits races as before."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from mode import Service
from mode.services import WaitResults

from pipeline.services.worker.eager import eager_first, resumed


class Calls:
    def __init__(self) -> None:
        self.args: list[Any] = []

    async def wait_first(self, *coros: Any, timeout: Any = None) -> Any:
        self.args.append(coros)
        return [await c for c in coros if asyncio.iscoroutine(c)]


def _won(coro: Any, value: Any) -> tuple[str, Any]:
    return ("won", value)


def test_a_coroutine_that_never_waits_wins_without_the_race():
    async def deliver() -> int:
        return 7

    async def main() -> Any:
        calls = Calls()
        got = await eager_first(calls.wait_first, _won, deliver(), object())
        return got, calls.args

    got, raced = asyncio.run(main())
    assert got == ("won", 7) and raced == []


def test_a_coroutine_that_waits_races_what_is_left_of_it():
    seen: list[str] = []

    async def deliver(fut: asyncio.Future[int]) -> int:
        seen.append("started")
        value = await fut
        seen.append("resumed")
        return value + 1

    async def main() -> Any:
        fut = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.01, fut.set_result, 41)
        calls = Calls()
        got = await eager_first(calls.wait_first, _won, deliver(fut))
        return got, calls.args

    got, raced = asyncio.run(main())
    # started at once (before the race), finished inside it
    assert got == [42] and len(raced) == 1 and seen == ["started", "resumed"]


def test_bare_yields_and_several_waits_resume_in_order():
    async def deliver() -> list[int]:
        out = []
        for i in range(3):
            await asyncio.sleep(0)
            out.append(i)
            await asyncio.sleep(0.001)
        return out

    async def main() -> Any:
        calls = Calls()
        return await eager_first(calls.wait_first, _won, deliver())

    assert asyncio.run(main()) == [[0, 1, 2]]


def test_an_error_of_what_it_waits_for_reaches_the_coroutine():
    async def deliver(fut: asyncio.Future[int]) -> str:
        try:
            await fut
        except KeyError as exc:
            return f"caught {exc}"
        return "no error"

    async def main() -> Any:
        fut = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.01, fut.set_exception, KeyError("x"))
        return await resumed_after_start(deliver(fut))

    assert asyncio.run(main()) == "caught 'x'"


async def resumed_after_start(coro: Any) -> Any:
    return await resumed(coro, coro.send(None))


def test_an_error_before_it_waits_propagates():
    async def deliver() -> None:
        raise ValueError("bad record")

    async def main() -> Any:
        return await eager_first(Calls().wait_first, _won, deliver())

    with pytest.raises(ValueError, match="bad record"):
        asyncio.run(main())


def test_anything_but_a_coroutine_first_and_any_timeout_go_to_wait_first_unchanged():
    async def main() -> Any:
        calls = Calls()
        event = asyncio.Event()
        await eager_first(calls.wait_first, _won, event)

        async def deliver() -> int:
            return 1

        coro = deliver()
        out = await eager_first(calls.wait_first, _won, coro, timeout=1.0)
        return calls.args, event, coro, out

    args, event, coro, out = asyncio.run(main())
    assert args[0] == (event,) and args[1] == (coro,) and out == [1]


def test_cancelled_while_it_waits_the_coroutine_is_cancelled_where_it_waits():
    seen: list[str] = []

    async def deliver(queue: asyncio.Queue[int]) -> None:
        try:
            await queue.put(2)  # the queue is full: waits
            seen.append("delivered")
        except asyncio.CancelledError:
            seen.append("cancelled at put")
            raise

    async def main() -> Any:
        queue: asyncio.Queue[int] = asyncio.Queue(maxsize=1)
        queue.put_nowait(1)
        coro = deliver(queue)
        task = asyncio.ensure_future(resumed(coro, coro.send(None)))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return queue.qsize()

    assert asyncio.run(main()) == 1 and seen == ["cancelled at put"]


class _Fetcher(Service):
    """A mode service racing deliveries against a suspend event, as Faust's
    fetcher does (``wait_first(deliver(record), suspend_flow.wait())``)."""

    async def wait_first(self, *coros: Any, timeout: Any = None) -> WaitResults:
        return await eager_first(super().wait_first, self._won, *coros, timeout=timeout)

    def _won(self, coro: Any, value: Any) -> WaitResults:
        return WaitResults([coro], [value], False)


def test_in_a_mode_service_a_suspend_still_interrupts_a_delivery_that_waits():
    async def main() -> Any:
        service = _Fetcher()
        queue: asyncio.Queue[int] = asyncio.Queue(maxsize=1)
        suspend = asyncio.Event()

        async def deliver(n: int) -> int:
            await queue.put(n)
            return n

        first = await service.wait_first(deliver(1), suspend.wait())
        asyncio.get_running_loop().call_later(0.01, suspend.set)
        second = await service.wait_first(deliver(2), suspend.wait())
        return first, second, queue.qsize()

    first, second, size = asyncio.run(main())
    assert first.results == [1] and not first.stopped
    # the queue was full: the suspend won, and the second record was not delivered
    assert second.results == [True] and not second.stopped and size == 1
