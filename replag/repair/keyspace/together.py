"""Concurrent steps of a run that never outlive the step that started them.

`asyncio.gather` leaves its other awaitables running when one fails, and when its
caller is cancelled (Ctrl-C) it returns as soon as the first of them has finished
cancelling, while the others may still be unwinding: a write, an undo or a
connection of a run that has already been recorded as interrupted. `all_of` and
`cancel_all` wait for every one of them, so a stopped run stops whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

_T = TypeVar("_T")


async def all_of(aws: Iterable[Awaitable[_T]]) -> list[_T]:
    """Every awaitable's result, in order. When one fails, or the caller is cancelled,
    the others are cancelled and awaited before the error (or the cancellation)
    propagates. Pass coroutines themselves, never a coroutine wrapped in another
    awaitable's arguments: a wrapper cancelled before it starts never awaits it."""
    tasks: list[asyncio.Future[_T]] = []
    try:
        for aw in aws:
            tasks.append(asyncio.ensure_future(aw))
        return list(await asyncio.gather(*tasks))
    except BaseException:
        await cancel_all(tasks)
        raise


async def cancel_all(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel `tasks` and return once every one has finished. One already being
    cancelled is not cancelled again (that would cut its clean-up short: a connection
    closed, a lease released). A cancellation of the caller meanwhile does not cut the
    wait short either; it is raised once they have finished."""
    tasks = list(tasks)
    for task in tasks:
        if not task.done() and not (isinstance(task, asyncio.Task) and task.cancelling()):
            task.cancel()
    interrupted = False
    while pending := [t for t in tasks if not t.done()]:
        try:
            await asyncio.wait(pending)
        except asyncio.CancelledError:
            interrupted = True
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: the error that matters is the caller's
    if interrupted:
        raise asyncio.CancelledError
