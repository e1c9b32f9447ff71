"""Discovery's one overall deadline: what it finds is contacted at once, never one by one.

Every kind of discovery (INFO replication's replicas, a cluster's shard primaries, the
Sentinels given and the masters one monitors, Dynomite nodes' `/info`) asks the hosts
it has found together, at most `AT_ONCE` in flight, and all those contacts of one
discovery end within `DEADLINE_TIMEOUTS` connect timeouts (`--timeout`, else
settings.connect_timeout) of the first: 100 replicas whose SYNs are dropped cost one
timeout, not 100 in a row (they took 200 s one by one at a 2 s timeout). A host not
answered by then is reported unreachable, with the deadline named, and discovery goes on
with the rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from replag.errors import ReplagError, UnreachableError

DEADLINE_TIMEOUTS = 4  # the whole discovery: this many connect timeouts
AT_ONCE = 64  # requests in flight at once

_Item = TypeVar("_Item")
_Result = TypeVar("_Result")


class Deadline:
    """The end of one discovery: `DEADLINE_TIMEOUTS` × `timeout_s` from when it is made."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.total_s = DEADLINE_TIMEOUTS * timeout_s
        self.at = asyncio.get_running_loop().time() + self.total_s

    def left(self) -> float:
        return max(0.0, self.at - asyncio.get_running_loop().time())

    def missed(self, where: str) -> UnreachableError:
        return UnreachableError(
            f"no answer within discovery's deadline ({DEADLINE_TIMEOUTS} x the timeout, "
            f"{self.total_s:g}s)",
            where=where,
        )

    async def each(
        self,
        items: Sequence[_Item],
        ask: Callable[[_Item], Awaitable[_Result]],
        *,
        where: Callable[[_Item], str],
        errors: tuple[type[ReplagError], ...] = (ReplagError,),
    ) -> list[_Result | ReplagError]:
        """`ask(item)` for every item at once (at most `AT_ONCE` in flight): per item, its
        answer, the error of a kind in `errors` it raised, or, if not answered by the
        deadline, an UnreachableError naming `where(item)` and the deadline. Any other
        error is raised."""
        slots = asyncio.Semaphore(AT_ONCE)

        async def one(item: _Item) -> _Result | ReplagError:
            async with slots:
                try:
                    return await ask(item)
                except errors as exc:
                    return exc

        tasks = [asyncio.ensure_future(one(item)) for item in items]
        if tasks:
            await asyncio.wait(tasks, timeout=self.left())
        for task in tasks:
            task.cancel()  # a no-op on those done
        await asyncio.gather(*tasks, return_exceptions=True)
        out: list[_Result | ReplagError] = []
        for item, task in zip(items, tasks, strict=True):
            if task.cancelled():
                out.append(self.missed(where(item)))
            else:
                out.append(task.result())
        return out


__all__ = ["AT_ONCE", "DEADLINE_TIMEOUTS", "Deadline"]
