"""Repair racing a writer: no replica may end up older than the last version written to it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import redis.asyncio as aioredis

from replag.repair import repair
from tests.helpers.configs import group_config
from tests.helpers.redis_servers import RedisFactory

KEYS = 200
VERSIONS_PER_KEY = 17  # 200 keys × 17 versions × 3 replicas = 10,200 writes


def version(n: int) -> bytes:
    return b"%012d" % n


async def test_repair_never_clobbers_a_concurrent_write(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    servers = [redis_factory("cw") for _ in range(3)]
    clients = [aioredis.Redis(port=s.port) for s in servers]
    keys = [f"race:{i:03d}".encode() for i in range(KEYS)]
    last: list[dict[bytes, int]] = [{}, {}, {}]
    # Divergent start: n0 and n1 hold version 1; n2 lacks half the keys, holds 0 for the rest.
    for i, key in enumerate(keys):
        for r in (0, 1):
            await clients[r].set(key, version(1))
            last[r][key] = 1
        if i % 2:
            await clients[2].set(key, version(0))
            last[2][key] = 0

    writes = 0

    async def writer() -> None:
        # Walk the keys in the opposite order to the repair, writing bursts of
        # increasing versions to every replica as a proxy would, so some keys are
        # rewritten after the repair compared them and some before.
        nonlocal writes
        n = 1
        for key in reversed(keys):
            for _ in range(VERSIONS_PER_KEY):
                n += 1
                for r, client in enumerate(clients):
                    await client.set(key, version(n))
                    last[r][key] = n
                    writes += 1
                await asyncio.sleep(0)

    config = group_config(tmp_path, servers, repair_settle="5ms")
    writing = asyncio.create_task(writer())
    report = await repair(config, rate=150, max_inflight=4)
    await writing
    result = report.to_dict()
    older = []
    for r, client in enumerate(clients):
        for key in keys:
            held = await client.get(key)
            if key in last[r] and (held is None or int(held) < last[r][key]):
                older.append((r, key, held, last[r][key]))
        await client.aclose()
    print(
        f"\nconcurrent writer: {writes} writes; repair: repaired {result['repaired']}, "
        f"busy {result['busy']}, agreed meanwhile {result['agreed']}, "
        f"conflicts {result['conflicts']}; replicas older than their last write: {len(older)}"
    )
    assert writes >= 10_000
    assert result["divergent"] > 0 and result["repaired"] > 0
    assert older == []
