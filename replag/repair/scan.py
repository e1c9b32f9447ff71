"""Scanning one replica into a `ScanIndex`: per key its hash, entry hash and name.

The hot path is built for ~300k keys/s of 1 KB strings: one connection walks
SCAN while a second one receives, per batch, one MGET and one PTTL per key in
a single pipelined write, several batches in flight; hashing happens in numpy
while the server works on the next batch. Keys MGET cannot read (other types)
get TYPE and chunked reads. A key gone before its PTTL is dropped: deleted or
expired during the scan, it is not divergence.
"""

from __future__ import annotations

import asyncio
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import xxhash

from replag.errors import RepairError, ReplagError
from replag.repair.digest import TYPE_CODES, entry_hashes, expiry_buckets
from replag.repair.tictac import TictacTree
from replag.repair.values import read_values
from replag.resp import RespConnection, pack, pack_multi_and_per_key, pack_per_key
from replag.topology import Endpoint

U64 = npt.NDArray[np.uint64]
_CHUNK_HEADER = struct.Struct("<Q")


@dataclass
class ScanIndex:
    """Keys seen on one replica, in compact arrays (names concatenated in one blob)."""

    key_hashes: U64
    entries: U64
    lengths: npt.NDArray[np.uint32]
    blob: bytes
    _offsets: npt.NDArray[np.int64] | None = field(default=None, repr=False)

    @classmethod
    def empty(cls) -> ScanIndex:
        return cls(np.zeros(0, np.uint64), np.zeros(0, np.uint64), np.zeros(0, np.uint32), b"")

    def __len__(self) -> int:
        return len(self.key_hashes)

    def key(self, index: int) -> bytes:
        if self._offsets is None:
            self._offsets = np.concatenate([[0], np.cumsum(self.lengths, dtype=np.int64)])
        start = int(self._offsets[index])
        return self.blob[start : start + int(self.lengths[index])]

    def to_bytes(self) -> bytes:
        """Checkpoint form: count, then the three arrays, then the key blob."""
        return b"".join(
            [
                _CHUNK_HEADER.pack(len(self)),
                self.key_hashes.astype("<u8").tobytes(),
                self.entries.astype("<u8").tobytes(),
                self.lengths.astype("<u4").tobytes(),
                self.blob,
            ]
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> ScanIndex:
        (n,) = _CHUNK_HEADER.unpack_from(data)
        at = _CHUNK_HEADER.size
        hashes = np.frombuffer(data, "<u8", n, at).astype(np.uint64)
        entries = np.frombuffer(data, "<u8", n, at + 8 * n).astype(np.uint64)
        lengths = np.frombuffer(data, "<u4", n, at + 16 * n).astype(np.uint32)
        return cls(hashes, entries, lengths, data[at + 20 * n :])

    @classmethod
    def concat(cls, parts: list[ScanIndex]) -> ScanIndex:
        if not parts:
            return cls.empty()
        return cls(
            np.concatenate([p.key_hashes for p in parts]),
            np.concatenate([p.entries for p in parts]),
            np.concatenate([p.lengths for p in parts]),
            b"".join(p.blob for p in parts),
        )

    def deduplicated(self) -> ScanIndex:
        """Keep the last sighting of each key: SCAN may return a key twice while the
        server resizes its table, and a duplicate would cancel itself in an XOR tree."""
        if len(self) == 0:
            return self
        reversed_hashes = self.key_hashes[::-1]
        _, first_in_reversed = np.unique(reversed_hashes, return_index=True)
        if len(first_in_reversed) == len(self):
            return self
        keep = np.sort(len(self) - 1 - first_in_reversed)
        keys = [self.key(int(i)) for i in keep]
        return ScanIndex(
            self.key_hashes[keep], self.entries[keep], self.lengths[keep], b"".join(keys)
        )

    def tree(self, depth: int) -> TictacTree:
        tree = TictacTree(depth)
        tree.add(self.key_hashes, self.entries)
        return tree


@dataclass(frozen=True, kw_only=True)
class ScanOptions:
    count: int = 1000
    match: bytes | None = None
    type_filter: str | None = None
    # replag's own probe keys: transient by design (in flight to far replicas, then
    # deleted), so comparing them would report lag as divergence.
    exclude_prefix: bytes | None = None
    ttl_bucket_ms: int = 2000
    timeout_s: float = 5.0
    in_flight_batches: int = 8
    checkpoint_every_s: float = 5.0


@dataclass
class ScanProgress:
    """Where a replica's scan stands; `cursor` is where a resumed scan continues."""

    replica: str
    cursor: bytes = b"0"
    keys: int = 0
    seconds: float = 0.0
    finished: bool = False
    total: int | None = None


Checkpoint = Callable[[ScanProgress, ScanIndex], None]
Progress = Callable[[ScanProgress], None]


class ReplicaScanner:
    """Scans one endpoint from `cursor` to the end of its keyspace."""

    def __init__(
        self,
        endpoint: Endpoint,
        options: ScanOptions,
        *,
        checkpoint: Checkpoint | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.options = options
        self._checkpoint = checkpoint
        self._progress = progress
        # A key that changed type while being read gets a digest no other replica
        # can have, so it always shows up as a candidate and is read again.
        self._changed_digest = int.from_bytes(os.urandom(8), "little")
        self.bytes_received = 0

    async def run(self, state: ScanProgress) -> ScanIndex:
        opts = self.options
        scan_conn = await RespConnection.open(self.endpoint, timeout_s=opts.timeout_s)
        try:
            fetch_conn = await RespConnection.open(self.endpoint, timeout_s=opts.timeout_s)
        except BaseException:
            await scan_conn.close()
            raise
        try:
            return await self._run(state, scan_conn, fetch_conn)
        finally:
            self.bytes_received += scan_conn.bytes_received + fetch_conn.bytes_received
            await scan_conn.close()
            await fetch_conn.close()

    async def _run(
        self, state: ScanProgress, scan_conn: RespConnection, fetch_conn: RespConnection
    ) -> ScanIndex:
        opts = self.options
        (size,) = await scan_conn.request(pack(b"DBSIZE"), 1)
        state.total = size if isinstance(size, int) else None
        queue: asyncio.Queue[
            tuple[bytes, list[bytes], asyncio.Future[tuple[list[object], int]]] | ReplagError | None
        ] = asyncio.Queue(maxsize=opts.in_flight_batches)
        parts: list[ScanIndex] = []
        pending: list[ScanIndex] = []
        started = time.perf_counter() - state.seconds
        last_checkpoint = time.monotonic()
        producer = asyncio.create_task(self._walk(scan_conn, fetch_conn, state.cursor, queue))
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, ReplagError):
                    raise item
                cursor, keys, future = item
                replies, arrived_ns = await fetch_conn.wait(future)
                part = await self._index_batch(fetch_conn, keys, replies, arrived_ns)
                pending.append(part)
                state.cursor, state.keys = cursor, state.keys + len(part)
                state.seconds = time.perf_counter() - started
                if self._progress is not None:
                    self._progress(state)
                if self._checkpoint is not None and (
                    time.monotonic() - last_checkpoint >= opts.checkpoint_every_s
                ):
                    self._flush(state, parts, pending)
                    last_checkpoint = time.monotonic()
            await producer
            state.finished = True
            state.seconds = time.perf_counter() - started
            if self._checkpoint is not None:
                self._flush(state, parts, pending)
            parts.extend(pending)
            return ScanIndex.concat(parts)
        finally:
            if not producer.done():
                producer.cancel()
                await asyncio.gather(producer, return_exceptions=True)

    def _flush(self, state: ScanProgress, parts: list[ScanIndex], pending: list[ScanIndex]) -> None:
        chunk = ScanIndex.concat(pending)
        assert self._checkpoint is not None
        self._checkpoint(state, chunk)
        parts.append(chunk)
        pending.clear()

    async def _walk(
        self,
        scan_conn: RespConnection,
        fetch_conn: RespConnection,
        cursor: bytes,
        queue: asyncio.Queue[
            tuple[bytes, list[bytes], asyncio.Future[tuple[list[object], int]]] | ReplagError | None
        ],
    ) -> None:
        opts = self.options
        extra: list[bytes | int] = [b"COUNT", opts.count]
        if opts.match is not None:
            extra += [b"MATCH", opts.match]
        if opts.type_filter is not None:
            extra += [b"TYPE", opts.type_filter.encode()]
        try:
            while True:
                replies = await scan_conn.request(pack(b"SCAN", cursor, *extra), 1)
                scan_conn.check(replies)
                cursor, keys = replies[0]
                if keys and opts.exclude_prefix:
                    skip = opts.exclude_prefix
                    keys = [k for k in keys if not k.startswith(skip)]
                if keys:
                    future = fetch_conn.send(
                        pack_multi_and_per_key(b"MGET", b"PTTL", keys), 1 + len(keys)
                    )
                    await queue.put((cursor, keys, future))
                if cursor == b"0":
                    break
        except ReplagError as exc:
            # The consumer waits on the queue: hand it the failure, or it waits forever.
            await queue.put(exc)
            return
        except Exception as exc:
            # Anything else (a malformed reply) is a bug to surface, not a silent hang.
            await queue.put(RepairError(f"scan failed: {exc!r}", where=self.endpoint.name))
            return
        await queue.put(None)

    async def index_keys(self, conn: RespConnection, keys: list[bytes]) -> ScanIndex:
        """`keys` as they are now, read the way a scan reads them (keys gone are left out);
        a region agent re-reads the keys a notification named with this."""
        if self.options.exclude_prefix:
            skip = self.options.exclude_prefix
            keys = [k for k in keys if not k.startswith(skip)]
        if not keys:
            return ScanIndex.empty()
        future = conn.send(pack_multi_and_per_key(b"MGET", b"PTTL", keys), 1 + len(keys))
        replies, arrived_ns = await conn.wait(future)
        return await self._index_batch(conn, keys, replies, arrived_ns)

    async def _index_batch(
        self, conn: RespConnection, keys: list[bytes], replies: list[object], arrived_ns: int
    ) -> ScanIndex:
        conn.check(replies[:1])
        values = list(replies[0])  # type: ignore[call-overload]
        n = len(keys)
        ttls = np.array(replies[1:], dtype=np.int64)
        types = np.full(n, TYPE_CODES["string"], dtype=np.uint8)
        keep = ttls != -2
        digests_extra: dict[int, int] = {}
        if None in values:  # rare on string-heavy data: keep the per-key loops out of it
            unread = [i for i, v in enumerate(values) if v is None and ttls[i] != -2]
            if unread:
                digests_extra = await self._read_other_types(conn, keys, unread, types, keep)
            values = [b"" if v is None else v for v in values]
        digests = np.fromiter(map(xxhash.xxh3_64_intdigest, values), dtype=np.uint64, count=n)
        for i, digest in digests_extra.items():
            digests[i] = digest
        key_hashes = np.fromiter(map(xxhash.xxh3_64_intdigest, keys), dtype=np.uint64, count=n)
        now_ms = arrived_ns // 1_000_000
        expiry = np.where(ttls >= 0, ttls + now_ms, -1)
        entries = entry_hashes(
            key_hashes, types, digests, expiry_buckets(expiry, self.options.ttl_bucket_ms)
        )
        if not keep.all():
            idx = np.flatnonzero(keep)
            keys = [keys[i] for i in idx]
            key_hashes, entries = key_hashes[idx], entries[idx]
        lengths = np.fromiter(map(len, keys), dtype=np.uint32, count=len(keys))
        return ScanIndex(key_hashes, entries, lengths, b"".join(keys))

    async def _read_other_types(
        self,
        conn: RespConnection,
        keys: list[bytes],
        unread: list[int],
        types: npt.NDArray[np.uint8],
        keep: npt.NDArray[np.bool_],
    ) -> dict[int, int]:
        names = await conn.request(pack_per_key(b"TYPE", [keys[i] for i in unread]), len(unread))
        typed: list[tuple[bytes, str]] = []
        for i, name in zip(unread, names, strict=True):
            type_name = name.decode() if isinstance(name, bytes) else str(name)
            if type_name == "none":
                keep[i] = False  # deleted between SCAN and MGET
                continue
            types[i] = TYPE_CODES.get(type_name, 0)
            typed.append((keys[i], type_name))
        read = await read_values(conn, typed, chunk=self.options.count)
        digests: dict[int, int] = {}
        for i in unread:
            if not keep[i]:
                continue
            value = read[keys[i]]
            digests[i] = value.digest if value is not None else self._changed_digest
        return digests
