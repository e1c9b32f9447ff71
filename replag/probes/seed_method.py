"""The replication-lag method of the Dynomite benchmark, reproduced for comparison.

Write 1,000 keys in the source region, each value the wall-clock time of its
write; then, on each replica elsewhere, poll 20 random keys until each is
present and average (now − written timestamp); repeat and average. The
figure includes the time spent writing the batch and the poll spacing, which
is why replag's own estimate is reported beside it rather than replaced by it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from typing import TYPE_CHECKING, Any

from replag.config import Config
from replag.errors import UsageError
from replag.probes.keys import ProbeKeys
from replag.wire.connections import async_client, endpoint_errors

if TYPE_CHECKING:
    import redis.asyncio as aioredis

WRITES = 1000
POLLED = 20
POLL_INTERVAL_S = 0.001


async def run_seed_method(
    config: Config,
    *,
    source: str | None = None,
    repeats: int = 5,
    writes: int = WRITES,
    polled: int = POLLED,
    seed: int | None = None,
) -> list[dict[str, Any]]:
    """Per replica outside the source's write endpoint: {"target", "replica", "avg_ms", "keys"}."""
    from redis.exceptions import RedisError  # redis-py only for this method, not a probe's start

    settings = config.settings
    region = config.topology.region(source) if source else config.topology.default_source()
    if region.write is None:
        raise UsageError(f"region {region.name!r} has no write endpoint to probe from")
    rng = random.Random(seed)
    writer = async_client(region.write, timeout_s=settings.connect_timeout, single_connection=True)
    replicas = [(r.name, rep) for r in config.topology.regions for rep in r.replicas]
    readers = {
        rep.name: async_client(rep, timeout_s=settings.connect_timeout) for _, rep in replicas
    }
    durations: dict[str, list[float]] = {rep.name: [] for _, rep in replicas}
    ttl_ms = max(1, int(settings.ttl * 1000))
    try:
        for _ in range(repeats):
            keys = ProbeKeys(
                prefix=settings.prefix,
                run_id="seed" + uuid.uuid4().hex[:8],
                source=region.name,
                slots=region.slots,
            )
            with endpoint_errors(region.write):
                for seq in range(writes):
                    await writer.set(keys.key(seq), str(time.time_ns()), px=ttl_ms)
            chosen = rng.sample(range(writes), min(polled, writes))
            results = await asyncio.gather(
                *(
                    _poll_keys(readers[rep.name], [keys.key(s) for s in chosen], settings.timeout)
                    for _, rep in replicas
                )
            )
            for (_, rep), found in zip(replicas, results, strict=True):
                durations[rep.name] += found
            pipe = writer.pipeline(transaction=False)
            for seq in range(writes):
                pipe.delete(keys.key(seq))
            with contextlib.suppress(RedisError):  # the keys carry a TTL anyway
                await pipe.execute()
    finally:
        await writer.aclose()
        for client in readers.values():
            await client.aclose()
    return [
        {
            "target": region_name,
            "replica": rep.name,
            "keys": len(durations[rep.name]),
            "avg_ms": round(sum(durations[rep.name]) / len(durations[rep.name]), 3)
            if durations[rep.name]
            else None,
        }
        for region_name, rep in replicas
    ]


async def _poll_keys(client: aioredis.Redis, keys: list[bytes], timeout_s: float) -> list[float]:
    """For each key in turn: GET until present; (now − stored timestamp) in ms."""
    from redis.exceptions import RedisError

    out: list[float] = []
    for key in keys:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                value = await client.get(key)
            except (RedisError, OSError):
                return out
            if value is not None:
                out.append((time.time_ns() - int(value)) / 1e6)
                break
            await asyncio.sleep(POLL_INTERVAL_S)
    return out
