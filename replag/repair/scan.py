"""Scanning one replica into a `ScanIndex`: per key its hash, entry hash and name.

The hot path is built for ~300k keys/s of 1 KB strings: one connection walks
SCAN while a second one receives, per batch, one MGET and the batch's TTLs in
a single pipelined write, several batches in flight; hashing happens in numpy
while the server works on the next batch. Keys MGET cannot read (other types)
get TYPE and chunked reads. A key gone before its TTL was read is dropped:
deleted or expired during the scan, it is not divergence.

TTLs cost the server as much as a third of the values' read, so they are
fetched the cheapest way the replica allows (`TtlSource`): not at all where
INFO says the database holds no key with an expiry; else one script call
per batch that returns only the keys whose PTTL is not -1 (no expiry), which
spares the server a command and this side a reply per key; else, where
scripts are refused (ACLs, Redis Cluster's one-slot rule), one PTTL per key.

A Redis Cluster node (`Endpoint.cluster`, read with READONLY) refuses an MGET
across slots (CROSSSLOT). Where SCAN walks the node slot by slot (Redis 7.2+
and Valkey keep a table per slot) and slots hold many keys, a batch spans one
or two slots (five of its keys, spread over it, say so): it is read with one
MGET per slot it holds. Elsewhere (Redis 7.0 and older hash every key into one table, so a batch
holds about one key per slot; or sparse slots) with a GET per key, pipelined.
Measured (benchmarks/cluster_scan.py): on dense slots an MGET per slot cost the
server 17% less CPU per key than a GET per key, in the same time; on sparse
ones (Redis 7.0) it took twice the time and 20% more CPU. A key that answers
MOVED or ASK (its slot moved, or is migrating, since SCAN named it) is left
out of the index, as keys gone are: the check names such slots (`slots`).
"""

from __future__ import annotations

import asyncio
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from replag.errors import RepairError, ReplagError
from replag.repair.digest import TYPE_CODES, entry_hashes, expiry_buckets
from replag.repair.native import hash_each, string_index
from replag.repair.slots import is_moved, key_slot, slot_groups
from replag.repair.tictac import TictacTree, leaf_of
from replag.repair.together import cancel_all
from replag.repair.values import read_values
from replag.resp import (
    RespConnection,
    check_replies,
    error_text,
    pack,
    pack_multi_and_per_key,
    pack_over_keys,
    pack_per_key,
)
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


# Per batch: the 1-based position and PTTL of every key that has an expiry (or is
# gone: -2), as a flat list. A key without one costs the server no reply.
TTL_SCRIPT = b"""local out = {}
for i, key in ipairs(KEYS) do
  local ttl = redis.call('PTTL', key)
  if ttl ~= -1 then
    out[#out + 1] = i
    out[#out + 1] = ttl
  end
end
return out"""
TtlSource = Literal["none", "script", "pttl"]
# Asked of a replica before its scan: whether it holds expiring keys, whether it is
# a Redis Cluster node.
TTL_PROBE = pack(b"INFO", b"keyspace") + pack(b"INFO", b"cluster")
LOAD_TTL_SCRIPT = pack(b"SCRIPT", b"LOAD", TTL_SCRIPT)


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
    # Batches fetched ahead of the one being indexed: more only grows the server's
    # output buffers, which costs it CPU (measured: 4.5 µs/key at 1, 6.3 at 8).
    in_flight_batches: int = 1
    checkpoint_every_s: float = 30.0
    # "auto": none where INFO shows no expiring key, else "script", else "pttl".
    ttls: TtlSource | Literal["auto"] = "auto"
    # Keys per second read from the replica (None: as fast as it answers).
    rate: float | None = None
    # Added to the scan process's nice value (a forked scan only).
    nice: int = 0
    # Only keys in these leaves are read (a keys-only pass over the rest).
    leaves: LeafFilter | None = None


@dataclass(frozen=True)
class LeafFilter:
    """Leaves of a depth-`depth` tree (int64, sorted, as bytes: options stay hashable)."""

    depth: int
    leaves: bytes

    @classmethod
    def of(cls, leaves: npt.NDArray[np.int64], depth: int) -> LeafFilter:
        return cls(depth, np.sort(leaves).astype(np.int64).tobytes())

    def keep(self, keys: list[bytes]) -> list[bytes]:
        hashes = hash_each(keys)
        wanted = np.frombuffer(self.leaves, dtype=np.int64)
        picked = np.flatnonzero(np.isin(leaf_of(hashes, self.depth), wanted, assume_unique=False))
        return [keys[i] for i in picked]


@dataclass
class ScanProgress:
    """Where a replica's scan stands; `cursor` is where a resumed scan continues."""

    replica: str
    cursor: bytes = b"0"
    keys: int = 0
    seconds: float = 0.0
    finished: bool = False
    total: int | None = None


Checkpoint = Callable[[ScanProgress], None]
Progress = Callable[[ScanProgress], None]
Sink = Callable[[ScanIndex], None]


class ReplicaScanner:
    """Scans one endpoint from `cursor` to the end of its keyspace.

    Each batch's index goes to `sink` when one is given (the scanner then keeps
    nothing), else into the parts `run_parts` returns. `checkpoint(state)` is
    called every `checkpoint_every_s` and at the end, once every batch up to
    `state.cursor` has been indexed; `progress(state)` after every batch.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        options: ScanOptions,
        *,
        sink: Sink | None = None,
        checkpoint: Checkpoint | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.options = options
        self._sink = sink
        self._checkpoint = checkpoint
        self._progress = progress
        # A key that changed type while being read gets a digest no other replica
        # can have, so it always shows up as a candidate and is read again.
        self._changed_digest = int.from_bytes(os.urandom(8), "little")
        self.bytes_received = 0
        # How TTLs are read: chosen per replica when a scan starts (see the module).
        self.ttl_source: TtlSource = "pttl"
        self._script_sha = b""
        # A Redis Cluster node: batches are read with a GET per key (`fetch_request`).
        self.cluster = endpoint.cluster

    async def run(self, state: ScanProgress) -> ScanIndex:
        return ScanIndex.concat(await self.run_parts(state))

    async def run_parts(self, state: ScanProgress) -> list[ScanIndex]:
        """The scan as the parts it was indexed in (no copy into one index: half the peak
        memory of `run` for whoever can use the parts as they are)."""
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
    ) -> list[ScanIndex]:
        opts = self.options
        (size,) = await scan_conn.request(pack(b"DBSIZE"), 1)
        state.total = size if isinstance(size, int) else None
        self.ttl_source = await self._ttl_source(fetch_conn)
        queue: asyncio.Queue[
            tuple[bytes, list[bytes], asyncio.Future[tuple[list[object], int]]] | ReplagError | None
        ] = asyncio.Queue(maxsize=opts.in_flight_batches)
        parts: list[ScanIndex] = []
        keep = parts.append if self._sink is None else self._sink
        started = time.perf_counter() - state.seconds
        last_checkpoint = time.monotonic()
        read = state.keys
        producer = asyncio.create_task(self._walk(scan_conn, fetch_conn, state.cursor, queue))
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, ReplagError):
                    raise item
                cursor, keys, future = item
                read += len(keys)
                replies, arrived_ns = await fetch_conn.wait(future)
                part = await self._index_batch(fetch_conn, keys, replies, arrived_ns)
                keep(part)
                state.cursor, state.keys = cursor, state.keys + len(part)
                state.seconds = time.perf_counter() - started
                if opts.rate:
                    # Throttled: the next batch is not read before its keys are due.
                    await asyncio.sleep(max(0.0, read / opts.rate - state.seconds))
                if self._progress is not None:
                    self._progress(state)
                if self._checkpoint is not None and (
                    time.monotonic() - last_checkpoint >= opts.checkpoint_every_s
                ):
                    self._checkpoint(state)
                    last_checkpoint = time.monotonic()
            await producer
            state.finished = True
            state.seconds = time.perf_counter() - started
            if self._checkpoint is not None:
                self._checkpoint(state)
            return parts
        finally:
            if not producer.done():
                await cancel_all([producer])

    async def _walk(
        self,
        scan_conn: RespConnection,
        fetch_conn: RespConnection,
        cursor: bytes,
        queue: asyncio.Queue[
            tuple[bytes, list[bytes], asyncio.Future[tuple[list[object], int]]] | ReplagError | None
        ],
    ) -> None:
        extra = scan_arguments(self.options)
        try:
            while True:
                replies = await scan_conn.request(pack(b"SCAN", cursor, *extra), 1)
                scan_conn.check(replies)
                cursor, keys = replies[0]
                keys = batch_keys(keys, self.options)
                if keys:
                    future = self._fetch(fetch_conn, keys, self.ttl_source)
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
        keys = without_prefix(keys, self.options.exclude_prefix)
        if not keys:
            return ScanIndex.empty()
        # Not "none": that a replica held no expiring key when a scan began says
        # nothing about the keys a notification names later.
        source: TtlSource = "pttl" if self.ttl_source == "none" else self.ttl_source
        replies, arrived_ns = await conn.wait(self._fetch(conn, keys, source))
        return await self._index_batch(conn, keys, replies, arrived_ns, source)

    async def _ttl_source(self, conn: RespConnection) -> TtlSource:
        source = self.options.ttls
        if source == "auto":
            keyspace, cluster = await conn.request(TTL_PROBE, 2)
            source = ttl_source_from_info(keyspace, cluster, self.endpoint.db) or "script"
        if source != "script":
            return source
        if self.cluster:
            return "pttl"  # a script's keys must share one slot there
        loaded = await conn.request(LOAD_TTL_SCRIPT, 1)
        return self.script_loaded(loaded[0])

    def script_loaded(self, reply: Any) -> TtlSource:
        """The TTL source once SCRIPT LOAD answered `reply`."""
        if error_text(reply) is not None:
            return "pttl"  # scripting refused (ACL, disabled): the per-key way
        self._script_sha = bytes(reply)
        return "script"

    def fetch_request(self, keys: list[bytes], source: TtlSource) -> tuple[bytes, int]:
        """One pipelined write (and how many replies it gets): MGET of the batch and its
        TTLs as `source` says; on a Cluster node an MGET per slot or a GET per key
        (`batch_replies` gives their replies the one MGET's shape)."""
        if self.cluster:
            groups = _slot_groups(keys)
            if groups is None:
                reads, count = pack_per_key(b"GET", keys), len(keys)
            else:
                reads = b"".join(pack_over_keys([keys[i] for i in g], (b"MGET",)) for g in groups)
                count = len(groups)
            if source == "none":
                return reads, count
            return reads + pack_per_key(b"PTTL", keys), count + len(keys)
        if source == "pttl":
            return pack_multi_and_per_key(b"MGET", b"PTTL", keys), 1 + len(keys)
        if source == "none":
            return pack_over_keys(keys, (b"MGET",)), 1
        heads = ((b"MGET",), (b"EVALSHA", self._script_sha, len(keys)))
        return pack_over_keys(keys, *heads), 2

    def batch_replies(
        self, keys: list[bytes], replies: list[Any], source: TtlSource
    ) -> tuple[list[bytes], list[Any]]:
        """A batch's keys and replies as one MGET and its TTLs give them: on a Cluster node
        the GETs as one list (nil for a key of another type: WRONGTYPE), and the keys
        that answered MOVED or ASK (served elsewhere now) left out, as keys gone are."""
        if not self.cluster:
            return keys, replies
        n = len(keys)
        groups = _slot_groups(keys)
        values: list[Any] = list(replies[:n]) if groups is None else [None] * n
        ttls = replies[n:] if groups is None else replies[len(groups) :]
        kept = [True] * n
        for group, reply in zip(groups or [], replies, strict=False):
            if is_moved(reply):
                for i in group:
                    kept[i] = False
            elif error_text(reply) is not None:
                return keys, [reply]  # any other error: the caller's check raises it
            else:
                for i, value in zip(group, reply, strict=True):
                    values[i] = value
        for i, value in enumerate(values):
            text = error_text(value)
            if text is None:
                continue
            if text.startswith("WRONGTYPE"):
                values[i] = None  # another type: read as MGET's nil is
            elif is_moved(value):
                kept[i] = False
            else:
                return keys, [value]  # any other error: the caller's check raises it
        if source != "none":
            for i, ttl in enumerate(ttls):
                if not isinstance(ttl, int):  # MOVED between the GET and the PTTL
                    kept[i] = False
        if all(kept):
            return keys, [values, *ttls]
        picked = [i for i, keep in enumerate(kept) if keep]
        out_ttls = [ttls[i] for i in picked] if source != "none" else []
        return [keys[i] for i in picked], [[values[i] for i in picked], *out_ttls]

    def _fetch(
        self, conn: RespConnection, keys: list[bytes], source: TtlSource
    ) -> asyncio.Future[tuple[list[object], int]]:
        return conn.send(*self.fetch_request(keys, source))

    async def _index_batch(
        self,
        conn: RespConnection,
        keys: list[bytes],
        replies: list[object],
        arrived_ns: int,
        source: TtlSource | None = None,
    ) -> ScanIndex:
        source = self.ttl_source if source is None else source
        keys, replies = self.batch_replies(keys, replies, source)
        conn.check(replies[:1])
        ttls = batch_ttls(replies, len(keys), source, self.endpoint)
        values: list[bytes | None] = replies[0]  # type: ignore[assignment]
        return await self.index_values(conn, keys, values, ttls, arrived_ns // 1_000_000)

    async def index_values(
        self,
        conn: RespConnection,
        keys: list[bytes],
        values: list[bytes | None],
        ttls: npt.NDArray[np.int64],
        now_ms: int | npt.NDArray[np.int64],
    ) -> ScanIndex:
        """A batch's index from its MGET reply and TTLs (read at `now_ms`: one moment, or
        one per key); keys MGET could not read (other types) are read on `conn`."""
        bucket_ms = self.options.ttl_bucket_ms
        if None not in values:  # the common case: strings only, no per-key loop here
            return index_batch(keys, values, ttls, now_ms, bucket_ms)  # type: ignore[arg-type]
        n = len(keys)
        types = np.full(n, TYPE_CODES["string"], dtype=np.uint8)
        keep = ttls != -2
        digests: dict[int, int] = {}
        unread = [i for i, v in enumerate(values) if v is None and ttls[i] != -2]
        if unread:
            digests = await self._read_other_types(conn, keys, unread, types, keep)
        read = [b"" if v is None else v for v in values]
        return index_batch(keys, read, ttls, now_ms, bucket_ms, types, keep, digests)

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
            if type_name == "none" or is_moved(name):
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


def _slot_groups(keys: list[bytes]) -> list[list[int]] | None:
    """A Cluster batch's keys by slot where SCAN walked dense slots in order (five keys
    spread over the batch lie in at most two slots); None elsewhere: then a GET per key
    costs less."""
    if not keys:
        return None
    n = len(keys)
    sampled = {key_slot(keys[i]) for i in (0, n // 4, n // 2, 3 * n // 4, n - 1)}
    return slot_groups(keys) if len(sampled) <= 2 else None


def scan_arguments(options: ScanOptions) -> list[bytes | int]:
    """What follows the cursor in every SCAN of a scan with `options`."""
    extra: list[bytes | int] = [b"COUNT", options.count]
    if options.match is not None:
        extra += [b"MATCH", options.match]
    if options.type_filter is not None:
        extra += [b"TYPE", options.type_filter.encode()]
    return extra


def without_prefix(keys: list[bytes], prefix: bytes | None) -> list[bytes]:
    """`keys` but those starting with `prefix` (replag's probe keys)."""
    if not prefix or not keys:
        return keys
    # One search in C for the common batch that holds none of them (a hit inside a
    # key costs only the exact filter below).
    if not keys[0].startswith(prefix) and b"\n" + prefix not in b"\n".join(keys):
        return keys
    return [k for k in keys if not k.startswith(prefix)]


def batch_keys(keys: list[bytes], options: ScanOptions) -> list[bytes]:
    """The keys of a SCAN reply that the scan reads."""
    keys = without_prefix(keys, options.exclude_prefix)
    if keys and options.leaves is not None:
        keys = options.leaves.keep(keys)
    return keys


def batch_ttls(
    replies: list[object], n: int, source: TtlSource, endpoint: Endpoint
) -> npt.NDArray[np.int64]:
    """PTTL per key (-1: no expiry, -2: gone) from a batch's replies after its MGET."""
    if source == "pttl":
        return np.array(replies[1:], dtype=np.int64)
    ttls = np.full(n, -1, dtype=np.int64)
    if source == "script":
        check_replies(replies[1:2], endpoint)  # NOSCRIPT after a SCRIPT FLUSH: fail, resumable
        flat = np.array(replies[1], dtype=np.int64)
        ttls[flat[0::2] - 1] = flat[1::2]
    return ttls


def ttl_source_from_info(keyspace: object, cluster: object, db: int) -> TtlSource | None:
    """How TTLs are read, from the replies to `TTL_PROBE`: None if by script, should
    the replica accept one (SCRIPT LOAD says)."""
    if _expiring_keys(keyspace, db) == 0:
        return "none"
    if isinstance(cluster, bytes) and b"cluster_enabled:1" in cluster:
        return "pttl"  # a script's keys must share one slot there
    return None


def index_batch(
    keys: list[bytes],
    values: list[bytes],
    ttls: npt.NDArray[np.int64],
    now_ms: int | npt.NDArray[np.int64],
    bucket_ms: int,
    types: npt.NDArray[np.uint8] | None = None,
    keep: npt.NDArray[np.bool_] | None = None,
    digests_of: dict[int, int] | None = None,
) -> ScanIndex:
    """The index of a batch: per key its hash, its entry hash (type, value digest and
    expiry bucket, TTLs read at `now_ms`, one moment or one per key) and its name.
    `types` default to strings; `keep` (default: keys whose TTL is not -2, gone) picks
    the keys indexed;
    `digests_of` replaces the digest of `values[i]` for keys of other types."""
    n = len(keys)
    if types is None and keep is None and int(ttls.max(initial=-1)) == -1:
        # Strings, none with an expiry or gone: the common batch, one loop in C.
        return ScanIndex(*string_index(keys, values))
    digests = hash_each(values)
    if digests_of:
        digests = digests.copy()
        for i, digest in digests_of.items():
            digests[i] = digest
    key_hashes = hash_each(keys)
    if types is None:
        types = np.full(n, TYPE_CODES["string"], dtype=np.uint8)
    expiry = np.where(ttls >= 0, ttls + now_ms, -1)
    entries = entry_hashes(key_hashes, types, digests, expiry_buckets(expiry, bucket_ms))
    if keep is None:
        keep = ttls != -2
    if not keep.all():
        idx = np.flatnonzero(keep)
        keys = [keys[i] for i in idx]
        key_hashes, entries = key_hashes[idx], entries[idx]
    lengths = np.fromiter(map(len, keys), dtype=np.uint32, count=len(keys))
    return ScanIndex(key_hashes, entries, lengths, b"".join(keys))


def _expiring_keys(info: object, db: int) -> int | None:
    """`expires=` of `db` in INFO keyspace (0 when the db has no keys), None if unreadable."""
    if not isinstance(info, bytes):
        return None
    prefix = b"db%d:" % db
    for line in info.splitlines():
        if line.startswith(prefix):
            for field in line[len(prefix) :].split(b","):
                name, _, value = field.partition(b"=")
                if name == b"expires" and value.isdigit():
                    return int(value)
            return None
    return 0
