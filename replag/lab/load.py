"""`replag lab load`: write the same keyspace to every member of the lab's replica group.

Commands are packed once per batch (MSET for strings, a few commands per
collection) and streamed to every member over raw pipelined connections, so a
million 1 KB keys load in seconds. In a replicated lab the replicas are
read-only: the keyspace is written through the primary only and the load
returns once every replica has replicated it. What was loaded is recorded in
DIR/load.json so `lab diverge` can pick existing keys.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from replag.errors import LabError, UsageError
from replag.lab.cluster import lab_topology, read_state
from replag.topology import Endpoint
from replag.wire.resp import RespConnection, pack

LOAD_FILE = "load.json"
BATCH = 1000
IN_FLIGHT = 4
COLLECTION_TYPES = ("hash", "set", "zset", "list", "stream")


@dataclass(frozen=True)
class LoadSpec:
    keys: int
    value_size: int
    types: str = "string"  # or "mixed": every 10th key is a small collection
    prefix: str = "key:"
    seed: int = 0


def key_name(spec: LoadSpec, index: int) -> bytes:
    return f"{spec.prefix}{index:09d}".encode()


def key_type(spec: LoadSpec, index: int) -> str:
    if spec.types == "mixed" and index % 10 == 9:
        return COLLECTION_TYPES[(index // 10) % len(COLLECTION_TYPES)]
    return "string"


def _commands(spec: LoadSpec, start: int, stop: int, block: bytes) -> tuple[bytes, int]:
    """Packed commands for keys [start, stop) and how many replies they produce."""
    strings: list[bytes] = []
    others: list[bytes] = []
    for i in range(start, stop):
        key = key_name(spec, i)
        kind = key_type(spec, i)
        if kind == "string":
            # The index goes first so every value differs, padded to value_size.
            value = (b"%d:" % i + block)[: spec.value_size]
            strings += (key, value)
        elif kind == "hash":
            others.append(
                pack(
                    b"HSET",
                    key,
                    *[
                        b"f%d" % j if k == 0 else b"v%d.%d" % (i, j)
                        for j in range(8)
                        for k in range(2)
                    ],
                )
            )
        elif kind == "set":
            others.append(pack(b"SADD", key, *[b"m%d.%d" % (i, j) for j in range(8)]))
        elif kind == "zset":
            others.append(
                pack(b"ZADD", key, *[x for j in range(8) for x in (b"%d.5" % j, b"m%d" % j)])
            )
        elif kind == "list":
            others.append(pack(b"RPUSH", key, *[b"e%d.%d" % (i, j) for j in range(8)]))
        else:
            others += [
                pack(b"XADD", key, b"%d-1" % (j + 1), b"n", b"%d" % (i + j)) for j in range(4)
            ]
    out = [pack(b"MSET", *strings)] if strings else []
    return b"".join(out + others), len(out) + len(others)


# Called with (keys written so far over all members, keys to write over all members).
LoadProgress = Callable[[int, int], None]


async def _load_member(
    member: Endpoint, spec: LoadSpec, block: bytes, written: Callable[[int], None]
) -> None:
    conn = await RespConnection.open(member, timeout_s=30.0)
    try:
        inflight: list[tuple[asyncio.Future[tuple[list[object], int]], int]] = []
        for start in range(0, spec.keys, BATCH):
            stop = min(spec.keys, start + BATCH)
            payload, count = _commands(spec, start, stop, block)
            inflight.append((conn.send(payload, count), stop - start))
            if len(inflight) >= IN_FLIGHT:
                future, keys = inflight.pop(0)
                replies, _ = await conn.wait(future)
                conn.check(replies)
                written(keys)
        for future, keys in inflight:
            replies, _ = await conn.wait(future)
            conn.check(replies)
            written(keys)
    finally:
        await conn.close()


async def load_members(
    members: tuple[Endpoint, ...], spec: LoadSpec, progress: LoadProgress | None = None
) -> float:
    """Write `spec`'s keyspace to every member; seconds taken."""
    if spec.keys < 0 or spec.value_size < 1:
        raise UsageError("--keys must be >= 0 and --value-size >= 1")
    if spec.types not in ("string", "mixed"):
        raise UsageError(f"--types: expected string or mixed, got {spec.types!r}")
    rng = random.Random(spec.seed)
    block = bytes(rng.getrandbits(8) for _ in range(spec.value_size))
    total = spec.keys * len(members)
    done = 0

    def written(keys: int) -> None:
        nonlocal done
        done += keys
        if progress is not None:
            progress(done, total)

    started = time.perf_counter()
    await asyncio.gather(*(_load_member(m, spec, block, written) for m in members))
    return time.perf_counter() - started


async def _replication_offset(conn: RespConnection, field: bytes) -> int:
    info = await conn.checked("INFO", "replication")
    for line in bytes(info).splitlines():
        name, _, value = line.partition(b":")
        if name == field:
            return int(value)
    raise LabError(f"{conn.endpoint.name}: INFO replication has no {field.decode()}")


async def wait_replicated(
    primary: Endpoint, replicas: tuple[Endpoint, ...], *, timeout_s: float = 120.0
) -> None:
    """Until every replica's offset reaches the primary's (now): what was written is there."""
    conns = [await RespConnection.open(ep, timeout_s=10.0) for ep in (primary, *replicas)]
    try:
        target = await _replication_offset(conns[0], b"master_repl_offset")
        deadline = time.monotonic() + timeout_s
        for conn in conns[1:]:
            while await _replication_offset(conn, b"slave_repl_offset") < target:
                if time.monotonic() > deadline:
                    raise LabError(
                        f"{conn.endpoint.name} has not replicated the load after {timeout_s:g} s"
                    )
                await asyncio.sleep(0.05)
    finally:
        for conn in conns:
            await conn.close()


def lab_load(lab_dir: Path, spec: LoadSpec, progress: LoadProgress | None = None) -> dict[str, Any]:
    """Load the lab in `lab_dir`; returns what was done.

    An independent lab: every member of its replica group "lab" is written. A
    replicated lab: only the primary (its replicas refuse writes), then we wait
    until every replica holds the load, so what follows (diverge, check) sees it.
    """
    state = read_state(lab_dir)
    topology = lab_topology(state)
    # The lab writes as the operator on each host would: on the local addresses, not the WAN.
    members = tuple(m.in_region() for m in topology.groups[0].members)
    via: str | None = None
    if state["engine"] == "replicated":
        primary = next(r.write for r in topology.regions if r.write is not None).in_region()
        replicas = tuple(m for m in members if m.name != primary.name)
        seconds = asyncio.run(_load_replicated(primary, replicas, spec, progress))
        via = primary.name
    else:
        seconds = asyncio.run(load_members(members, spec, progress))
    info: dict[str, Any] = {
        **asdict(spec),
        "members": [m.name for m in members],
        "via": via,
        "seconds": round(seconds, 3),
    }
    (lab_dir / LOAD_FILE).write_text(json.dumps(info, indent=2))
    return info


async def _load_replicated(
    primary: Endpoint,
    replicas: tuple[Endpoint, ...],
    spec: LoadSpec,
    progress: LoadProgress | None,
) -> float:
    started = time.perf_counter()
    await load_members((primary,), spec, progress)
    await wait_replicated(primary, replicas)
    return time.perf_counter() - started


def read_load(lab_dir: Path) -> LoadSpec:
    try:
        data = json.loads((lab_dir / LOAD_FILE).read_text())
    except FileNotFoundError:
        raise UsageError(f"nothing loaded in {lab_dir}; run `replag lab load` first") from None
    return LoadSpec(
        keys=data["keys"],
        value_size=data["value_size"],
        types=data["types"],
        prefix=data["prefix"],
        seed=data["seed"],
    )
