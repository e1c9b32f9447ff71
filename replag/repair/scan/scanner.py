"""Scanning one replica into a `ScanIndex` (`scan_index`): per key its hash, entry hash and name.

The hot path is built for ~300k keys/s of 1 KB strings: one connection walks
SCAN while a second one receives, per batch, one MGET and the batch's TTLs in
a single pipelined write, several batches in flight; hashing happens in numpy
while the server works on the next batch. Keys MGET cannot read (other types)
get TYPE and chunked reads. A key gone before its TTL was read is dropped:
deleted or expired during the scan, it is not divergence. TTLs are read the
cheapest way the replica allows (`scan_ttls`); a Redis Cluster node's batches
are read within its slots (`scan_cluster`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from replag.errors import RepairError, ReplagError, UnreachableError
from replag.repair.keyspace.digest import TYPE_CODES
from replag.repair.keyspace.field_ttls import (
    entry_digest,
    keys_with_volatile_fields,
    server_has_field_ttls,
)
from replag.repair.keyspace.native import hash_each
from replag.repair.keyspace.observe import observe_keys
from replag.repair.keyspace.slots import is_moved
from replag.repair.keyspace.together import cancel_all
from replag.repair.keyspace.values import read_values
from replag.repair.scan.cluster import cluster_batch_replies, cluster_fetch_request
from replag.repair.scan.ttls import (
    LOAD_TTL_SCRIPT,
    TTL_PROBE,
    TTL_SCRIPT,
    TtlSource,
    batch_ttls,
    ttl_source_from_info,
)
from replag.repair.trees.index import ScanIndex, index_batch
from replag.repair.trees.tictac import leaf_of
from replag.topology import Endpoint
from replag.wire.refusals import Refusals
from replag.wire.reply_limits import ReplyLimitError, ReplyLimits
from replag.wire.resp import (
    RespConnection,
    error_text,
    pack,
    pack_multi_and_per_key,
    pack_over_keys,
    pack_per_key,
)
from replag.wire.scan_end import ScanEnd

# Where these lived before scan.py was split; other modules import them from here still.
__all__ = [
    "LOAD_TTL_SCRIPT",
    "TTL_PROBE",
    "TTL_SCRIPT",
    "Checkpoint",
    "LeafFilter",
    "Progress",
    "ReplicaScanner",
    "ScanIndex",
    "ScanOptions",
    "ScanProgress",
    "Sink",
    "TtlSource",
    "batch_keys",
    "batch_ttls",
    "index_batch",
    "scan_arguments",
    "ttl_source_from_info",
    "without_prefix",
]


# Types whose every write publishes a keyspace event (RedisJSON's json.* included). Redis
# 8.2's vector sets publish none for VADD, VREM or VSETATTR, nor FalkorDB for GRAPH.QUERY,
# and another module's type may not either; client tracking sees them, notifications not.
NOTIFIED = frozenset(("string", "hash", "set", "zset", "list", "stream", "ReJSON-RL"))


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
    # "auto": none where INFO shows no expiring key, else "pttl" (see scan_ttls);
    # "script" where asked, "pttl" where the replica refuses scripts.
    ttls: TtlSource | Literal["auto"] = "auto"
    # Keys per second read from the replica (None: as fast as it answers).
    rate: float | None = None
    # Added to the scan process's nice value (a forked scan only).
    nice: int = 0
    # Only keys in these leaves are read (a keys-only pass over the rest).
    leaves: LeafFilter | None = None
    # The index is kept current from keyspace notifications (a region agent's live tree):
    # keys of types whose writes publish none (not `NOTIFIED`) get the changed digest, so
    # every check reads them again rather than trusting an entry no event updates.
    live: bool = False
    # The reply limits of the scan (None: the endpoint's own).
    reply_limits: ReplyLimits | None = None


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


class ScanHooks:
    """Where a scan hands what it reads, the same for the async and the blocking scan:
    each batch's index to `sink` (else into the parts the scan returns), where it stands
    to `progress` after every batch, and to `checkpoint` every `every_s` and at the end,
    once every batch up to `state.cursor` has been indexed."""

    def __init__(
        self,
        sink: Sink | None,
        checkpoint: Checkpoint | None,
        progress: Progress | None,
        *,
        every_s: float,
    ) -> None:
        self.sink, self.checkpoint, self.progress = sink, checkpoint, progress
        self.every_s = every_s
        self._last = time.monotonic()

    def started(self) -> None:
        """The scan starts (or resumes): the first checkpoint is due `every_s` from now."""
        self._last = time.monotonic()

    def keep(self, part: ScanIndex, parts: list[ScanIndex]) -> None:
        if self.sink is None:
            parts.append(part)
        else:
            self.sink(part)

    def batch_done(self, state: ScanProgress, indexed: Callable[[], None] | None = None) -> None:
        """After a batch: progress, and a checkpoint when one is due (`indexed` first
        indexes what was read and not yet indexed, so the checkpoint's cursor stands
        after every key before it)."""
        if self.progress is not None:
            self.progress(state)
        if self.checkpoint is not None and time.monotonic() - self._last >= self.every_s:
            if indexed is not None:
                indexed()
            self.checkpoint(state)
            self._last = time.monotonic()

    def finished(self, state: ScanProgress) -> None:
        if self.checkpoint is not None:
            self.checkpoint(state)


def _drop(queue: asyncio.Queue[Any]) -> None:
    """Empty a queue of batches given up (their fetches failed with the refused reply's
    connection): each future's exception is retrieved, so none is reported unretrieved."""
    while not queue.empty():
        item = queue.get_nowait()
        if isinstance(item, tuple):
            _retrieve(item[2])


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Retrieve `future`'s outcome when it comes (an exception no one awaits any more)."""
    future.add_done_callback(lambda f: f.cancelled() or f.exception())


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
        if options.reply_limits is not None:
            endpoint = dataclasses.replace(endpoint, limits=options.reply_limits)
        self.endpoint = endpoint
        self.options = options
        self.hooks = ScanHooks(sink, checkpoint, progress, every_s=options.checkpoint_every_s)
        # A key that changed type while being read gets a digest no other replica
        # can have, so it always shows up as a candidate and is read again.
        self._changed_digest = int.from_bytes(os.urandom(8), "little")
        self.bytes_received = 0
        # How TTLs are read: chosen per replica when a scan starts (see the module).
        self.ttl_source: TtlSource = "pttl"
        # Whether hashes are read with their fields' TTLs: only where INFO keyspace counts
        # keys with volatile fields when the scan starts (`field_ttls`); None: not known.
        self.field_ttls: bool | None = None
        self._script_sha = b""
        # A Redis Cluster node: batches are read with a GET per key (`fetch_request`).
        self.cluster = endpoint.cluster
        self._refusals = Refusals(endpoint)  # replies refused and read again key by key

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
        self._conns = [scan_conn, fetch_conn]  # and those a refused reply made anew
        try:
            return await self._run(state, scan_conn, fetch_conn)
        finally:
            for conn in self._conns:
                self.bytes_received += conn.bytes_received
                await conn.close()

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
        hooks = self.hooks
        started = time.perf_counter() - state.seconds
        hooks.started()
        read = state.keys
        end = ScanEnd(self.endpoint, state.total)
        producer = asyncio.create_task(self._walk(scan_conn, fetch_conn, state.cursor, queue, end))
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, ReplagError):
                    raise item
                cursor, keys, future = item
                read += len(keys)
                try:
                    replies, arrived_ns = await fetch_conn.wait(future)
                except UnreachableError as exc:
                    if not isinstance(exc.__cause__, ReplyLimitError):
                        raise
                    # The batch's reply broke max_reply_bytes (values of megabytes): both
                    # connections anew, this batch read key by key, the walk on after it.
                    await cancel_all([producer])
                    _drop(queue)
                    self._refusals.note(exc.__cause__.command or "a batch's fetch")
                    end.restart()
                    scan_conn, fetch_conn = await self._reopen(scan_conn, fetch_conn)
                    part = await self._index_by_key(fetch_conn, keys, exc.__cause__.command)
                    hooks.keep(part, parts)
                    state.cursor, state.keys = cursor, state.keys + len(part)
                    queue = asyncio.Queue(maxsize=opts.in_flight_batches)
                    # At the keyspace's end nothing is left to walk: the queue just ends.
                    walk = (
                        queue.put(None)
                        if cursor == b"0"
                        else self._walk(scan_conn, fetch_conn, cursor, queue, end)
                    )
                    producer = asyncio.create_task(walk)
                    continue
                part = await self._index_batch(fetch_conn, keys, replies, arrived_ns)
                hooks.keep(part, parts)
                state.cursor, state.keys = cursor, state.keys + len(part)
                state.seconds = time.perf_counter() - started
                if opts.rate:
                    # Throttled: the next batch is not read before its keys are due.
                    await asyncio.sleep(max(0.0, read / opts.rate - state.seconds))
                hooks.batch_done(state)
            await producer
            state.finished = True
            state.seconds = time.perf_counter() - started
            hooks.finished(state)
            return parts
        finally:
            if not producer.done():
                await cancel_all([producer])
            _drop(queue)

    async def _reopen(
        self, scan_conn: RespConnection, fetch_conn: RespConnection
    ) -> tuple[RespConnection, RespConnection]:
        """New scan and fetch connections for those a refused reply closed (all of them
        closed, and their bytes counted, by `run_parts`)."""
        await scan_conn.close()
        await fetch_conn.close()
        scan_conn = await RespConnection.open(self.endpoint, timeout_s=self.options.timeout_s)
        self._conns.append(scan_conn)
        fetch_conn = await RespConnection.open(self.endpoint, timeout_s=self.options.timeout_s)
        self._conns.append(fetch_conn)
        return scan_conn, fetch_conn

    async def _index_by_key(
        self, conn: RespConnection, keys: list[bytes], refused: str | None = None
    ) -> ScanIndex:
        """`keys` indexed from what `observe_keys` reads of each (a string in GETRANGE pages
        of half the limit, a collection in pages): no reply holds more than one value's
        page, and each digest is the one a whole read gives. `refused`: the command whose
        reply of these keys was refused (strings whose lengths add up to less than the
        limit tell a lie, `Refusals.read_back`)."""
        states = await observe_keys(conn, keys, chunk=self.options.count, keep=False)
        now_ms = time.time_ns() // 1_000_000
        present = [k for k in keys if states[k].exists and not states[k].moved]
        read = [states[k] for k in present]
        if refused is not None and all(s.type == "string" and s.size is not None for s in read):
            held = sum(s.size or 0 for s in read) + 32 * len(keys)  # with RESP's framing
            self._refusals.read_back(refused, held)
        types = np.array([TYPE_CODES.get(s.type or "", 0) for s in read], dtype=np.uint8)
        ttls = np.array(
            [-1 if s.expiry_ms is None else max(0, s.expiry_ms - now_ms) for s in read],
            dtype=np.int64,
        )
        bucket_ms = self.options.ttl_bucket_ms
        digests = {
            i: self._changed_digest
            if s.digest is None
            else entry_digest(s.digest, s.field_expiries, bucket_ms)
            for i, s in enumerate(read)
        }
        return index_batch(
            present,
            [b""] * len(present),
            ttls,
            now_ms,
            self.options.ttl_bucket_ms,
            types,
            np.ones(len(present), dtype=np.bool_),
            digests,
        )

    async def _walk(
        self,
        scan_conn: RespConnection,
        fetch_conn: RespConnection,
        cursor: bytes,
        queue: asyncio.Queue[
            tuple[bytes, list[bytes], asyncio.Future[tuple[list[object], int]]] | ReplagError | None
        ],
        end: ScanEnd,
    ) -> None:
        extra = scan_arguments(self.options)
        try:
            while True:
                replies = await scan_conn.request(pack(b"SCAN", cursor, *extra), 1)
                scan_conn.check(replies)
                cursor, keys = end.step(replies[0])
                keys = batch_keys(keys, self.options)
                if keys:
                    future = self._fetch(fetch_conn, keys, self.ttl_source)
                    try:
                        await queue.put((cursor, keys, future))
                    except asyncio.CancelledError:
                        _retrieve(future)  # given up with the walk: no "never retrieved"
                        raise
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
        # nothing about the keys a notification names later (nor of fields' TTLs).
        source: TtlSource = "pttl" if self.ttl_source == "none" else self.ttl_source
        replies, arrived_ns = await conn.wait(self._fetch(conn, keys, source))
        field_ttls = await server_has_field_ttls(conn)
        return await self._index_batch(conn, keys, replies, arrived_ns, source, field_ttls)

    async def _ttl_source(self, conn: RespConnection) -> TtlSource:
        source = self.options.ttls
        (keyspace,) = await conn.request(TTL_PROBE, 1)
        if self.note_keyspace(keyspace):
            conn.field_ttls = True  # the server has them, whether this db holds any now
        if source == "auto":
            source = ttl_source_from_info(keyspace, self.endpoint.db)
        if source != "script":
            return source
        if self.cluster:
            return "pttl"  # a script's keys must share one slot there
        loaded = await conn.request(LOAD_TTL_SCRIPT, 1)
        return self.script_loaded(loaded[0])

    def note_keyspace(self, keyspace: object) -> bool:
        """From the INFO keyspace a scan starts with: whether its hashes are read with
        their fields' TTLs (`field_ttls`); True where the server counts such keys at all."""
        volatile = keys_with_volatile_fields(keyspace, self.endpoint.db)
        self.field_ttls = volatile is not None and volatile > 0
        return volatile is not None

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
            return cluster_fetch_request(keys, source)
        if source == "pttl":
            return pack_multi_and_per_key(b"MGET", b"PTTL", keys), 1 + len(keys)
        if source == "none":
            return pack_over_keys(keys, (b"MGET",)), 1
        heads = ((b"MGET",), (b"EVALSHA", self._script_sha, len(keys)))
        return pack_over_keys(keys, *heads), 2

    def batch_replies(
        self, keys: list[bytes], replies: list[Any], source: TtlSource
    ) -> tuple[list[bytes], list[Any]]:
        """A batch's keys and replies as one MGET and its TTLs give them (on a Cluster node,
        `cluster_batch_replies`)."""
        if not self.cluster:
            return keys, replies
        return cluster_batch_replies(keys, replies, source)

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
        field_ttls: bool | None = None,
    ) -> ScanIndex:
        source = self.ttl_source if source is None else source
        keys, replies = self.batch_replies(keys, replies, source)
        conn.check(replies[:1])
        ttls = batch_ttls(replies, len(keys), source, self.endpoint)
        values: list[bytes | None] = replies[0]  # type: ignore[assignment]
        now_ms = arrived_ns // 1_000_000
        return await self.index_values(conn, keys, values, ttls, now_ms, field_ttls)

    async def index_values(
        self,
        conn: RespConnection,
        keys: list[bytes],
        values: list[bytes | None],
        ttls: npt.NDArray[np.int64],
        now_ms: int | npt.NDArray[np.int64],
        field_ttls: bool | None = None,
    ) -> ScanIndex:
        """A batch's index from its MGET reply and TTLs (read at `now_ms`: one moment, or
        one per key); keys MGET could not read (other types) are read on `conn`, hashes
        with their fields' TTLs where `field_ttls` (None: as the scan found when it began)."""
        bucket_ms = self.options.ttl_bucket_ms
        if None not in values:  # the common case: strings only, no per-key loop here
            return index_batch(keys, values, ttls, now_ms, bucket_ms)  # type: ignore[arg-type]
        n = len(keys)
        types = np.full(n, TYPE_CODES["string"], dtype=np.uint8)
        keep = ttls != -2
        digests: dict[int, int] = {}
        unread = [i for i, v in enumerate(values) if v is None and ttls[i] != -2]
        if unread:
            fields = self.field_ttls if field_ttls is None else field_ttls
            digests = await self._read_other_types(conn, keys, unread, types, keep, bool(fields))
        read = [b"" if v is None else v for v in values]
        return index_batch(keys, read, ttls, now_ms, bucket_ms, types, keep, digests)

    async def _read_other_types(
        self,
        conn: RespConnection,
        keys: list[bytes],
        unread: list[int],
        types: npt.NDArray[np.uint8],
        keep: npt.NDArray[np.bool_],
        field_ttls: bool,
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
        read = await read_values(conn, typed, chunk=self.options.count, field_ttls=field_ttls)
        bucket_ms = self.options.ttl_bucket_ms
        digests: dict[int, int] = {}
        for i in unread:
            if not keep[i]:
                continue
            value = read[keys[i]]
            # A value replag cannot read (opaque) gets the changed digest too: every such
            # key is a candidate, which verification names as not compared.
            readable = value is not None and value.opaque is None
            if self.options.live and value is not None and value.type not in NOTIFIED:
                readable = False
            digests[i] = (
                entry_digest(value.digest, value.field_expiries, bucket_ms)
                if value is not None and readable
                else self._changed_digest
            )
        return digests


def scan_arguments(options: ScanOptions, count: int | None = None) -> list[bytes | int]:
    """What follows the cursor in every SCAN of a scan with `options` (COUNT `count`
    where given, else `options.count`)."""
    extra: list[bytes | int] = [b"COUNT", options.count if count is None else count]
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
