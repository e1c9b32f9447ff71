"""An asyncio event loop in a thread of its own, for work that must not share the API's loop.

The service runs its probe schedule on one and its checks and repairs on another,
so an API request (on uvicorn's loop) never waits behind a probe round or a
check, and a burst of requests or a long check never delays the probe's
observations. Coroutines are handed over with `submit` (any thread) or awaited
from another loop with `run`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class BackgroundLoop:
    def __init__(self, name: str) -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> BackgroundLoop:
        self._thread.start()
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule `coro` on this loop; its future can be awaited anywhere (`wrap_future`)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on this loop and wait for it from the caller's loop."""
        return await asyncio.wrap_future(self.submit(coro))

    async def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on this loop and return its result, without waiting for whatever the loop
        runs next (a task `fn` started may keep the loop busy for long)."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller, who decides
                future.set_exception(exc)

        self.loop.call_soon_threadsafe(run)
        return await asyncio.wrap_future(future)

    async def stop(self) -> None:
        """Cancel what still runs on the loop, wait for it, then end the thread."""
        if not self._thread.is_alive():
            return
        await self.run(_cancel_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.to_thread(self._thread.join)
        self.loop.close()


async def _cancel_all() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel `task` and wait until it has ended, its own CancelledError swallowed, but
    never one aimed at the caller. (`with suppress(CancelledError): await task` swallows
    both: a caller cancelled while it waits then runs on, and one that loops waits for
    ever; that is how a probe run hung on a learning observer that kept polling.)"""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
