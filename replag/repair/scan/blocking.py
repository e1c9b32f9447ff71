"""A replica's scan as a blocking loop on one socket: what a scan process runs.

The loop is the physical ceiling's (benchmarks/ceiling.py) plus what a check
needs: one SCAN reply is read, then the next SCAN and the batch's fetch (MGET
and its TTLs, `ReplicaScanner.fetch_request`) go out in one write, and only
then is the previous batch's reply read and indexed, so the server works on
the next batch while this side hashes the last one. No event loop, no kernel
receive stamps: a scan needs neither, and on a CPU-bound client they cost
about a fifth of its time. What is read, how, and the index of a batch are
`ReplicaScanner`'s (the same functions, so both scans give the same entries);
keys of other types than strings (MGET answers nil) are read through an
asyncio connection opened for them, as `ReplicaScanner` reads them. They are
read `options.count` at a time, when that many have gathered, before each
checkpoint and at the end: a few such keys spread over the keyspace (a type
changed here and there) would otherwise cost one round trip each, with the
server idle meanwhile. A Tictac tree is an XOR, so the order does not matter.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Coroutine
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from replag.errors import EndpointError, ReplyShapeError
from replag.repair.scan.scanner import (
    Checkpoint,
    Progress,
    ReplicaScanner,
    ScanOptions,
    ScanProgress,
    Sink,
    batch_keys,
    scan_arguments,
)
from replag.repair.scan.ttls import (
    LOAD_TTL_SCRIPT,
    TTL_PROBE,
    TtlSource,
    batch_ttls,
    ttl_source_from_info,
)
from replag.repair.trees.index import ScanIndex, index_batch
from replag.topology import Endpoint
from replag.wire import shapes
from replag.wire.refusals import Refusals
from replag.wire.reply_limits import command_name, size_text
from replag.wire.resp import RespConnection, check_replies, pack
from replag.wire.resp_blocking import BlockingConnection
from replag.wire.scan_end import ScanEnd

I64 = npt.NDArray[np.int64]
# A batch's replies are kept near this size (SCAN's COUNT lowered from `options.count`
# once the values' size is known): Redis builds a reply whole before writing it, and
# one larger than its caches costs it more CPU per key. Measured on Redis 7.0.15 with
# 1 KB values (300,000 keys, server CPU of one scan): 0.59 s at COUNT 1000 (1 MB
# replies), 0.55 s at 500, 0.51 s at 300; two replicas at once, 1.29 s at 1000, 1.12 s
# at 400, 1.14 s at 250, 1.15 s at 150 (this side's CPU grows below 250).
REPLY_BUDGET = 256 * 1024
_MIN_COUNT = 100
# The most one GETRANGE of a string too long for one reply asks for.
_BIG_PAGE = 8 << 20
# A batch sent and not yet indexed: the cursor after it, its keys, its reply count, the
# COUNT its SCAN asked for.
_Batch = tuple[bytes, list[bytes], int, int]


class BlockingScan:
    """Scans one endpoint from `state.cursor` to the end, like `ReplicaScanner.run_parts`
    (same `sink`, `checkpoint` and `progress`), without an event loop."""

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
        self.limits = endpoint.limits
        # Its batches' requests and replies, TTL source and values are the async scan's.
        self.scanner = ReplicaScanner(
            endpoint, options, sink=sink, checkpoint=checkpoint, progress=progress
        )
        self.endpoint, self.options, self.hooks = endpoint, options, self.scanner.hooks
        self.bytes_received = 0
        self._parts: list[ScanIndex] = []
        self._source: TtlSource = "pttl"
        # For keys of other types: an event loop and a connection, made when first needed.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._other: RespConnection | None = None
        # Keys of other types not yet read: names, PTTLs, when their PTTLs were read.
        self._deferred: list[tuple[bytes, int, int]] = []
        self._asked = 0  # the COUNTs of the batches whose replies were read (for `_count`)
        self._received = 0  # bytes received on connections closed since (for `_count`)
        self._pending: _Batch | None = None  # the batch sent and not yet indexed
        self._big_strings = 0  # strings read in pages (longer than max_reply_bytes allows)
        self._refusals = Refusals(endpoint)  # replies refused and read again in pieces
        self._end: ScanEnd | None = None  # the scan's bound (kept when it resumes)
        self._fetch_command = "MGET"  # the batches' first command, to name a refusal

    @property
    def ttl_source(self) -> TtlSource:
        return self._source

    def run(self, state: ScanProgress) -> ScanIndex:
        return ScanIndex.concat(self.run_parts(state))

    def run_parts(self, state: ScanProgress) -> list[ScanIndex]:
        conn = self._open()
        try:
            resumed = False
            while True:
                try:
                    self._scan(conn, state, resumed)
                    return self._parts
                except EndpointError:
                    # None pending: the refused reply was a SCAN's (nothing smaller to ask).
                    if not conn.refused or self._pending is None:
                        raise
                    # The refused reply is the batch's fetch (SCAN went out with it).
                    self._refusals.note(self._fetch_command)
                # A reply broke max_reply_bytes (a batch of big values): the batch sent and
                # not indexed is read again in smaller pieces, and the scan goes on after it.
                self.bytes_received += conn.bytes_received
                self._received += conn.bytes_received
                conn.close()
                conn = self._open()
                pending, self._pending = self._pending, None
                self._read_in_pieces(pending[1], state)
                state.cursor = pending[0]
                if pending[0] == b"0":
                    self._finish(state)
                    return self._parts
                resumed = True
        finally:
            self.bytes_received += conn.bytes_received
            conn.close()
            self._close_other()

    def _open(self) -> BlockingConnection:
        return BlockingConnection.open(self.endpoint, timeout_s=self.options.timeout_s)

    def _scan(self, conn: BlockingConnection, state: ScanProgress, resumed: bool) -> None:
        opts = self.options
        if not resumed:
            (size,) = conn.request(pack(b"DBSIZE"), 1)
            state.total = size if isinstance(size, int) else None
            self._source = self.scanner.ttl_source = self._ttl_source(conn)
        started = time.perf_counter() - state.seconds
        self.hooks.started()
        read = state.keys
        asked = self._count(conn)  # the COUNT of the SCAN whose reply is read next
        conn.send(pack(b"SCAN", state.cursor, *scan_arguments(opts, asked)))
        self._pending = None
        if self._end is None:
            self._end = ScanEnd(self.endpoint, state.total)
        else:
            self._end.restart()
        end = self._end
        while self._pending is None or self._pending[0] != b"0":
            scanned = conn.reply()
            conn.check([scanned])
            cursor, keys = end.step(scanned)
            keys = batch_keys(keys, opts)
            out = b""
            if cursor != b"0":
                next_asked = self._count(conn)
                out = pack(b"SCAN", cursor, *scan_arguments(opts, next_asked))
            count = 0
            if keys:
                payload, count = self.scanner.fetch_request(keys, self._source)
                self._fetch_command = command_name(payload)
                out += payload
            if out:
                conn.send(out)
            if self._pending is not None:
                self._index(conn, self._pending, state)
            self._pending = (cursor, keys, count, asked)
            if cursor != b"0":
                asked = next_asked
            read += len(keys)
            state.seconds = time.perf_counter() - started
            if opts.rate:
                # Throttled: the next batch is not read before its keys are due.
                time.sleep(max(0.0, read / opts.rate - state.seconds))
            # A checkpoint's cursor stands after every key indexed: the deferred ones first.
            self.hooks.batch_done(state, indexed=lambda: self._flush(state))
        self._index(conn, self._pending, state)
        self._pending = None
        state.seconds = time.perf_counter() - started
        self._finish(state)

    def _finish(self, state: ScanProgress) -> None:
        self._flush(state)
        state.finished = True
        self.hooks.finished(state)

    def _count(self, conn: BlockingConnection) -> int:
        """SCAN's COUNT for the next batch: `options.count` (`_MIN_COUNT` until a batch
        was read), lowered so that a batch's replies stay near `REPLY_BUDGET` by the bytes
        per key received so far, and below half of max_reply_bytes even at `_MIN_COUNT`
        (values of megabytes)."""
        count = self.options.count
        if not self._asked:
            # No batch read yet, the values' size unknown: a small batch first (values of
            # megabytes must not make a first reply of gigabytes, refused at the limit).
            return min(count, _MIN_COUNT)
        # Bytes per unit of COUNT asked: whatever share of the keys visited SCAN returns
        # (MATCH, TYPE) and the scan fetches (a scan of a few leaves fetches few).
        per_unit = max(1.0, (self._received + conn.bytes_received) / self._asked)
        floor = min(_MIN_COUNT, max(1, int(self.limits.max_bytes / 2 / per_unit)))
        return max(min(count, floor), min(count, int(REPLY_BUDGET / per_unit)))

    def _ttl_source(self, conn: BlockingConnection) -> TtlSource:
        source = self.options.ttls
        (keyspace,) = conn.request(TTL_PROBE, 1)
        self.scanner.note_keyspace(keyspace)  # hashes' field TTLs: read only where some are
        if source == "auto":
            source = ttl_source_from_info(keyspace, self.endpoint.db)
        if source != "script":
            return source
        if self.scanner.cluster:
            return "pttl"  # a script's keys must share one slot there
        return self.scanner.script_loaded(conn.request(LOAD_TTL_SCRIPT, 1)[0])

    def _index(self, conn: BlockingConnection, batch: _Batch, state: ScanProgress) -> None:
        """Read a batch's replies and index it; `state` then stands after it."""
        cursor, keys, count, asked = batch
        if keys:
            replies = conn.replies(count)
            self._index_replies(keys, replies, state)
        self._asked += asked
        state.cursor = cursor

    def _index_replies(self, keys: list[bytes], replies: list[Any], state: ScanProgress) -> None:
        now_ms = time.time_ns() // 1_000_000
        keys, replies = self.scanner.batch_replies(keys, replies, self._source)
        check_replies(replies[:1], self.endpoint)
        ttls = batch_ttls(replies, len(keys), self._source, self.endpoint)
        values = replies[0]
        if None in values:  # other types (or gone): rare, read later, together
            others = [i for i, v in enumerate(values) if v is None]
            self._deferred += [(keys[i], int(ttls[i]), now_ms) for i in others]
            strings = np.ones(len(keys), dtype=np.bool_)
            strings[others] = False
            keys = [k for k, v in zip(keys, values, strict=True) if v is not None]
            values = [v for v in values if v is not None]
            ttls = ttls[strings]
        self._keep(index_batch(keys, values, ttls, now_ms, self.options.ttl_bucket_ms), state)
        if len(self._deferred) >= self.options.count:
            self._flush(state)

    def _read_in_pieces(self, keys: list[bytes], state: ScanProgress) -> None:
        """Index `keys`, whose batch's reply broke max_reply_bytes: in halves, down to
        single keys; a single string longer than the limit is hashed in GETRANGE pages
        (`_index_big_string`), the same digest as if read whole."""
        parts = [keys]
        while parts:
            part = parts.pop()
            conn = self._open()
            try:
                payload, count = self.scanner.fetch_request(part, self._source)
                replies = conn.request(payload, count)
            except EndpointError:
                if not conn.refused:
                    raise
                self._refusals.note(conn.refused)
                if len(part) > 1:
                    half = len(part) // 2
                    parts += [part[half:], part[:half]]
                else:
                    self._index_big_string(part[0], state)
                continue
            finally:
                self.bytes_received += conn.bytes_received
                conn.close()
            self._index_replies(part, replies, state)

    def _index_big_string(self, key: bytes, state: ScanProgress) -> None:
        """Index a string too long for one reply: its xxh3 fed page by page (GETRANGE of at
        most a quarter of max_reply_bytes). Pages are separate reads: a string written
        meanwhile gets a digest of no single moment, a difference the check reads again."""
        page = max(1, min(_BIG_PAGE, self.limits.max_bytes // 4))
        conn = self._open()
        try:
            length, ttl = conn.request(pack(b"STRLEN", key) + pack(b"PTTL", key), 2)
            now_ms = time.time_ns() // 1_000_000
            if not isinstance(length, int) or not isinstance(ttl, int):
                # Not a string now (its type changed): read as other types are.
                self._deferred.append((key, ttl if isinstance(ttl, int) else -1, now_ms))
                return
            if length > self.limits.max_string_bytes:
                # A string claimed longer than any read of it may be: the scan's end.
                raise ReplyShapeError(
                    f"STRLEN of {key[:64]!r} answered {length} bytes, over max_string_bytes "
                    f"= {size_text(self.limits.max_string_bytes)}",
                    where=f"{self.endpoint.name} ({self.endpoint.url()})",
                )
            digest = xxhash.xxh3_64()
            for start in range(0, length, page):
                (chunk,) = conn.request(pack(b"GETRANGE", key, start, start + page - 1), 1)
                check_replies([chunk], self.endpoint)
                if not isinstance(chunk, bytes):
                    raise shapes.wrong(self.endpoint, "GETRANGE", "a bulk string", chunk)
                digest.update(chunk)
            self._big_strings += 1
        finally:
            self.bytes_received += conn.bytes_received
            conn.close()
        ttls = np.array([ttl], dtype=np.int64)
        index = index_batch(
            [key],
            [b""],
            ttls,
            now_ms,
            self.options.ttl_bucket_ms,
            digests_of={0: digest.intdigest()},
        )
        self._keep(index, state)

    def _keep(self, part: ScanIndex, state: ScanProgress) -> None:
        if not len(part):
            return
        self.hooks.keep(part, self._parts)
        state.keys += len(part)

    def _flush(self, state: ScanProgress) -> None:
        """Read and index the deferred keys of other types, the way ReplicaScanner does."""
        if not self._deferred:
            return
        keys, ttls, read_ms = zip(*self._deferred, strict=True)
        self._deferred = []
        self._keep(self._in_loop(self._index_values(list(keys), ttls, read_ms)), state)

    async def _index_values(
        self, keys: list[bytes], ttls: tuple[int, ...], read_ms: tuple[int, ...]
    ) -> ScanIndex:
        if self._other is None:
            self._other = await RespConnection.open(self.endpoint, timeout_s=self.options.timeout_s)
        # Each expiry from the moment its PTTL was read.
        return await self.scanner.index_values(
            self._other,
            keys,
            [None] * len(keys),
            np.array(ttls, dtype=np.int64),
            np.array(read_ms, dtype=np.int64),
        )

    def _in_loop(self, work: Coroutine[Any, Any, ScanIndex]) -> ScanIndex:
        # A bare loop, not asyncio.Runner: on 3.11 each Runner.run formats the repr of
        # its SIGINT handler, and with it of the last result (an index: seconds).
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(work)

    def _close_other(self) -> None:
        if self._loop is None:
            return
        if self._other is not None:
            self.bytes_received += self._other.bytes_received
            self._loop.run_until_complete(self._other.close())
        self._loop.close()
