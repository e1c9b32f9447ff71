"""Clock offset of a server against this prober, by TIME round trips (Cristian's method).

The sample with the smallest round trip bounds the error best: the server read
its clock somewhere inside that round trip, so the offset is known to within
half of it. Never sent to Dynomite client ports (Dynomite closes on TIME).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import redis.asyncio as aioredis

TimeCall = Callable[[], Awaitable[tuple[int, int]]]


@dataclass(frozen=True, kw_only=True)
class ClockOffset:
    endpoint: str
    offset_ns: int  # server clock minus prober clock
    rtt_ns: int  # smallest round trip seen
    samples: int

    @property
    def uncertainty_ns(self) -> int:
        return self.rtt_ns // 2

    def to_dict(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "offset_ms": round(self.offset_ns / 1e6, 4),
            "uncertainty_ms": round(self.uncertainty_ns / 1e6, 4),
            "rtt_ms": round(self.rtt_ns / 1e6, 4),
            "samples": self.samples,
        }


async def estimate_offset(time_call: TimeCall, *, endpoint: str, rounds: int = 7) -> ClockOffset:
    """`time_call` runs TIME on the server and returns (seconds, microseconds)."""
    best: tuple[int, int] | None = None  # (rtt, offset)
    for _ in range(rounds):
        t0 = time.time_ns()
        seconds, micros = await time_call()
        t1 = time.time_ns()
        server_ns = int(seconds) * 1_000_000_000 + int(micros) * 1_000
        rtt = t1 - t0
        offset = server_ns - (t0 + t1) // 2
        if best is None or rtt < best[0]:
            best = (rtt, offset)
    assert best is not None
    return ClockOffset(endpoint=endpoint, offset_ns=best[1], rtt_ns=best[0], samples=rounds)


async def min_rtt_ns(client: aioredis.Redis, *, rounds: int = 7) -> int:
    """Smallest PING round trip on the monotonic clock: bounds one-way delay for push events."""
    best = None
    for _ in range(rounds):
        t0 = time.monotonic_ns()
        await client.ping()
        rtt = time.monotonic_ns() - t0
        best = rtt if best is None else min(best, rtt)
    assert best is not None
    return best
