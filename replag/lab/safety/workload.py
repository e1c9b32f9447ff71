"""Hostile writers: versioned SET/DEL/EXPIRE and hash/set/zset updates on every replica.

Each operation gets a fresh version and goes to every replica in a random
order, one after the other with a short random pause between them, as a proxy
fanning a write out to its racks does; the spread between the first and last
replica applying it is recorded. Each key is owned by one writer task, so the
operations on a key are applied in version order on every replica; with the
replies recorded (DEL and PEXPIREAT say whether the key was there), the history
says exactly what every replica was told, in order.

Run as a process of its own (`python -m replag.lab.safety.workload SPEC.json`)
so the writers and the repair under test do not share an event loop: it prints
`ready` and its connections' addresses, drops writes until it reads `calm`, writes
until its stdin closes, then writes the history and exits.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from replag.lab.safety.model import Keyspace, expire_command, write_command
from replag.topology import Endpoint
from replag.wire.resp import RespConnection, error_text, pack

WRITE, DELETE, EXPIRE = "w", "d", "e"


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    ports: tuple[int, ...]
    keys: int
    keyspace_seed: int
    hot: tuple[int, ...]  # key indexes that get `hot_share` of the operations
    seed: int
    base_ms: int
    history: str
    writers: int = 8
    hot_share: float = 0.6
    delete_share: float = 0.3
    expire_share: float = 0.15
    max_pause_ms: float = 1.0
    # Until the harness says "calm", this share of writes (never a DEL) skips one
    # replica: a dropped write, the divergence repair exists for. `protected`
    # replicas never miss one (a source:REPLICA policy trusts its source).
    drop_share: float = 0.15
    protected: tuple[int, ...] = ()
    # Key indexes never written: divergence injected there stays for the repair to find,
    # however late it starts.
    untouched: tuple[int, ...] = ()
    timeout_s: float = 10.0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkloadSpec:
        data = json.loads(text)
        for name in ("ports", "hot", "protected", "untouched"):
            data[name] = tuple(data[name])
        return cls(**data)


@dataclass(frozen=True)
class Op:
    """One operation as every replica applied it: `applied` is [(replica, reply)] in order."""

    key: int
    version: int
    kind: str  # WRITE, DELETE or EXPIRE
    slot: int
    applied: tuple[tuple[int, int | str], ...]
    spread_ms: float
    calm: bool = True  # started after the harness said "calm" (while repair runs)
    # Wall clock (epoch ns, as MONITOR stamps commands): before the first send, after
    # the last reply. Every replica applied it in between.
    started_ns: int = 0
    ended_ns: int = 0

    def to_json(self) -> str:
        return json.dumps(
            [
                self.key,
                self.version,
                self.kind,
                self.slot,
                self.applied,
                self.spread_ms,
                self.calm,
                self.started_ns,
                self.ended_ns,
            ]
        )

    @classmethod
    def from_json(cls, line: str) -> Op:
        key, version, kind, slot, applied, spread, calm, started, ended = json.loads(line)
        applied = tuple((r, x) for r, x in applied)
        return cls(key, version, kind, slot, applied, spread, calm, started, ended)


def _reply(value: Any) -> int | str:
    text = error_text(value)
    if text is not None:
        return f"error: {text}"
    return value if isinstance(value, int) else 1


class _Writer:
    """One task: its own connection to each replica, its own share of the keys."""

    def __init__(self, spec: WorkloadSpec, index: int, versions: itertools.count[int]) -> None:
        self.spec, self.versions = spec, versions
        self.rng = random.Random(spec.seed * 1000 + index)
        self.keyspace = Keyspace(spec.keys, spec.keyspace_seed)
        left = set(spec.untouched)
        self.mine = [k for k in range(spec.keys) if k % spec.writers == index and k not in left]
        self.hot = [k for k in spec.hot if k % spec.writers == index and k not in left]
        self.conns: list[RespConnection] = []
        self.addresses: list[str] = []  # as the servers name these connections (CLIENT INFO)
        self.ops: list[Op] = []

    async def open(self) -> None:
        for port in self.spec.ports:
            endpoint = Endpoint(name=f"127.0.0.1:{port}", host="127.0.0.1", port=port)
            conn = await RespConnection.open(endpoint, timeout_s=self.spec.timeout_s)
            self.conns.append(conn)
            (info,) = await conn.request(pack(b"CLIENT", b"INFO"), 1)
            fields = dict(f.split("=", 1) for f in info.decode().split() if "=" in f)
            self.addresses.append(fields["addr"])

    async def run(self, stop: asyncio.Event, calm: asyncio.Event) -> None:
        while not stop.is_set() and self.mine:
            await self.one(dropping=not calm.is_set())

    async def one(self, *, dropping: bool) -> None:
        spec, rng = self.spec, self.rng
        pool = self.hot if self.hot and rng.random() < spec.hot_share else self.mine
        index = rng.choice(pool)
        key = self.keyspace.name(index)
        version = next(self.versions)
        roll = rng.random()
        slot = rng.randrange(8)
        if roll < spec.delete_share:
            kind, command = DELETE, pack(b"DEL", key)
        elif roll < spec.delete_share + spec.expire_share:
            kind, command = EXPIRE, expire_command(key, version, spec.base_ms)
        else:
            kind = WRITE
            command, _ = write_command(key, self.keyspace.type(index), version, slot)
        order = list(range(len(self.conns)))
        rng.shuffle(order)
        if dropping and kind != DELETE and rng.random() < spec.drop_share:
            droppable = [r for r in order if r not in spec.protected]
            if droppable:
                order.remove(rng.choice(droppable))
        applied: list[tuple[int, int | str]] = []
        started_ns = time.time_ns()
        first = time.monotonic()  # the spread is bounded by first send to last reply
        for n, replica in enumerate(order):
            if n and spec.max_pause_ms and rng.random() < 0.5:
                await asyncio.sleep(rng.uniform(0, spec.max_pause_ms) / 1000)
            (reply,) = await self.conns[replica].request(command, 1)
            applied.append((replica, _reply(reply)))
        spread = (time.monotonic() - first) * 1000
        ended_ns = time.time_ns()
        self.ops.append(
            Op(
                index,
                version,
                kind,
                slot,
                tuple(applied),
                round(spread, 3),
                not dropping,
                started_ns,
                ended_ns,
            )
        )

    async def close(self) -> None:
        for conn in self.conns:
            await conn.close()


async def run_workload(
    spec: WorkloadSpec,
    *,
    stop: asyncio.Event,
    calm: asyncio.Event,
    ready: asyncio.Event,
    addresses: list[str] | None = None,
) -> list[Op]:
    """Write until `stop` is set, dropping writes until `calm` is; every operation has
    finished on its replicas when this returns. The writers' connections' addresses (as
    the servers see them) go to `addresses` before `ready` is set."""
    versions = itertools.count(2)
    writers = [_Writer(spec, i, versions) for i in range(spec.writers)]
    try:
        for writer in writers:
            await writer.open()
            if addresses is not None:
                addresses += writer.addresses
        ready.set()
        await asyncio.gather(*(w.run(stop, calm) for w in writers))
    finally:
        for writer in writers:
            await writer.close()
    return sorted((op for w in writers for op in w.ops), key=lambda op: op.version)


def read_history(path: Path) -> list[Op]:
    with path.open(encoding="utf-8") as fh:
        return [Op.from_json(line) for line in fh if line.strip()]


async def _serve(spec: WorkloadSpec) -> list[Op]:
    """Announce `ready` and the writers' addresses, drop writes until stdin says `calm`,
    stop at its EOF."""
    stop, calm, ready = asyncio.Event(), asyncio.Event(), asyncio.Event()
    addresses: list[str] = []
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    async def listen() -> None:
        await ready.wait()
        print("ready", *addresses, flush=True)
        while line := await reader.readline():
            if line.strip() == b"calm":
                calm.set()
        stop.set()  # EOF: the harness is done repairing

    listener = asyncio.create_task(listen())
    try:
        return await run_workload(spec, stop=stop, calm=calm, ready=ready, addresses=addresses)
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)


def main(spec_path: str) -> None:
    spec = WorkloadSpec.from_json(Path(spec_path).read_text(encoding="utf-8"))
    ops = asyncio.run(_serve(spec))
    Path(spec.history).write_text("".join(op.to_json() + "\n" for op in ops), encoding="utf-8")
    print(f"done {len(ops)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
