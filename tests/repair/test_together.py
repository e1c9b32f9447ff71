"""`repair.together`: a stopped step stops whole (what Ctrl-C relies on)."""

from __future__ import annotations

import asyncio

import pytest

from replag.repair.keyspace.together import all_of, cancel_all


class _SlowToStop:
    """A step that waits forever and, cancelled, needs a few more turns of the loop to
    clean up (as a write closing its connection does)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.stopped = False

    async def run(self) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        finally:
            for _ in range(3):
                await asyncio.sleep(0)
            self.stopped = True


async def _quick_to_stop() -> None:
    await asyncio.Event().wait()


def _others() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]


async def test_a_cancelled_caller_returns_once_every_step_has_stopped() -> None:
    # asyncio.gather returns as soon as the quickest one has stopped: the slow ones would
    # still be running after the run was recorded as interrupted.
    slow = [_SlowToStop(), _SlowToStop()]
    task = asyncio.create_task(all_of([_quick_to_stop(), *(s.run() for s in slow)]))
    for s in slow:
        await s.started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [s.stopped for s in slow] == [True, True]
    assert _others() == []


async def test_one_failing_stops_the_others_before_its_error_is_raised() -> None:
    slow = _SlowToStop()

    async def fails() -> None:
        await slow.started.wait()
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        await all_of([slow.run(), fails()])
    assert slow.stopped
    assert _others() == []


async def test_results_come_in_order() -> None:
    async def value(n: int) -> int:
        await asyncio.sleep(0.01 * (3 - n))
        return n

    assert await all_of(value(n) for n in range(3)) == [0, 1, 2]


async def test_a_second_cancellation_does_not_cut_the_wait_short() -> None:
    slow = [_SlowToStop(), _SlowToStop()]
    children = [asyncio.ensure_future(s.run()) for s in slow]
    for s in slow:
        await s.started.wait()
    waiting = asyncio.create_task(cancel_all(children))
    await asyncio.sleep(0)
    waiting.cancel()  # a second Ctrl-C, or a lost lease, while the first unwinds
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert [s.stopped for s in slow] == [True, True]
    assert _others() == []
