"""`cancel_and_wait`: a task's cancellation is awaited without swallowing the caller's."""

from __future__ import annotations

import asyncio

import pytest

from replag.background import cancel_and_wait


async def _slow_to_end() -> None:
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        await asyncio.sleep(0.05)  # ends a little after it is told to (closes a socket)
        raise


async def test_a_caller_cancelled_while_it_waits_is_cancelled_too() -> None:
    # Like a probe's learning observer: a loop that stops another task. Were the caller's
    # cancellation swallowed, it would loop for ever and whoever awaits it would hang.
    inner = asyncio.create_task(_slow_to_end())
    waiting = asyncio.Event()

    async def loop_that_stops_it() -> None:
        while True:
            waiting.set()
            await cancel_and_wait(inner)
            await asyncio.sleep(0.01)

    outer = asyncio.create_task(loop_that_stops_it())
    await waiting.wait()
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(outer, timeout=10)  # (the timeout only guards a hang)
    assert inner.cancelled()


async def test_the_task_s_own_cancellation_is_swallowed() -> None:
    inner = asyncio.create_task(_slow_to_end())
    await asyncio.sleep(0)
    await cancel_and_wait(inner)
    assert inner.cancelled()
    await cancel_and_wait(inner)  # again, once it has ended: nothing to do
