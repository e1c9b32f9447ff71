"""Wait for a condition instead of sleeping a guessed time: the machine is shared and slow."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

DEFAULT_TIMEOUT_S = 30.0


async def until(
    check: Callable[[], bool | Awaitable[bool]],
    what: str = "condition",
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    every_s: float = 0.02,
) -> None:
    """Return as soon as `check()` (sync or async) is true; fail naming `what` after
    `timeout_s`. The timeout only bounds a hang: nothing asserts how fast it happened."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened within {timeout_s:g}s: {what}")
        await asyncio.sleep(every_s)


def wait_until(
    check: Callable[[], bool],
    what: str = "condition",
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    every_s: float = 0.02,
) -> None:
    """`until` for code that is not running in an event loop."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened within {timeout_s:g}s: {what}")
        time.sleep(every_s)
