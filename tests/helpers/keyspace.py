"""Data tests write into real servers: many plain keys, every type in two insertion orders."""

from __future__ import annotations

import time
from typing import Any

import redis

# When the field TTLs `write_every_type` sets expire (absolute, the same for every server
# a test fills: replicas holding one logical value agree on it).
FIELDS_EXPIRE_AT_MS = (int(time.time()) + 7200) * 1000


def fill(client: redis.Redis, count: int, *, prefix: str = "k:", size: int = 64) -> None:
    pipe = client.pipeline(transaction=False)
    for i in range(count):
        pipe.set(f"{prefix}{i:07d}", b"%07d" % i + b"x" * size)
    pipe.execute()


def write_every_type(client: redis.Redis, *, reverse: bool = False) -> None:
    """The same logical values, inserted in the opposite order when `reverse`."""
    order: Any = reversed if reverse else (lambda x: x)
    fields = [(f"f{i}".encode(), f"v{i}".encode()) for i in range(50)]
    for f, v in order(fields):
        client.hset(b"t:hash", f, v)
    # Where the server has them (Redis 7.4+, Valkey 9+), some fields carry TTLs: part of
    # the hash, compared and copied with it.
    expiring = [f for f, _ in fields[:5]]
    try:
        client.execute_command(
            "HPEXPIREAT", b"t:hash", FIELDS_EXPIRE_AT_MS, "FIELDS", len(expiring), *expiring
        )
    except redis.ResponseError as exc:
        if "unknown command" not in str(exc).lower():
            raise
    for m in order(list(range(40))):
        client.sadd(b"t:set", m)  # integers: intset encoding on one server
    for m in order(list(range(30))):
        client.zadd(b"t:zset", {f"m{m}": m / 3})
    client.rpush(b"t:list", *[f"e{i}" for i in range(20)])
    for i in range(5):
        client.xadd(b"t:stream", {b"n": str(i).encode(), b"\xff": b"\x00"}, id=f"{i + 1}-0")
    client.set(b"t:string", b"\xfe\xff not utf-8 \x00")
    client.set(b"\xff\xfe\x00bin-key", b"value")
