"""Bulk refill: copy to one replica, hundreds of keys a round trip, the keys it lacks and
its peers agree on, as safely as a key-by-key repair.

For a batch of keys (`Refill.copy`):

1. **Read every peer** (`peer_read`): its write counters, then values, digests and
   expiries, one round trip for strings. A key is copied only if every peer holds it
   with one type, digest and expiry (within `ttl_tolerance`): where peers disagree,
   the key is handed back for the key-by-key repair and its policy.
2. **Write the target once**, pipelined: `SET key value [PX ms] NX` for strings,
   `RESTORE key ttl payload` (without REPLACE) for the rest. Neither touches a key the
   target holds, so a client write that reached the target first stands (the key is
   counted `present`); nothing else needs comparing, so this costs no extra round trip.
3. **Re-verify** `repair_settle` after the write: each peer's write counters, read
   again, differ if anything on it has changed since the read (any key: stricter than
   a WATCH of the batch, at a fraction of its cost). Every
   client write reaches every replica within `repair_settle` (the assumption the
   key-by-key repair rests on too), so a delete or write that the target applied
   before the copy (and that NX could not see: a DEL of a key it lacked) has reached
   the peers by then, and shows here. If no peer saw a change, every copy stands.
   Otherwise the copies are read again on the peers that saw one (one pipelined read,
   as the first); a copy whose key still reads the same there stands. The others are
   read back on every replica: a copy stands where every replica holds what was
   copied, and is undone elsewhere (`undo.undo` with "no key" as the pre-image: DEL
   while the target still holds the copy; a client's later write stays), and the key
   is handed back as `changed`.

Collections above `page_elements` are never DUMPed whole: they are handed back as
`big` (agreed on by the peers) for `pages.copy_in_pages`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from replag.errors import RepairError
from replag.repair.bulk.peer_read import (
    MERGEABLE,
    PeerRead,
    PeerReader,
    Writes,
    agreeing,
    data_digest,
    whole_data,
    whole_read,
    write_counters,
)
from replag.repair.keyspace.digest import TYPE_CODES, TYPE_NAMES
from replag.repair.keyspace.observe import KeyState, observe_keys
from replag.repair.keyspace.timeouts import request_within
from replag.repair.keyspace.together import all_of
from replag.repair.keyspace.values import Data
from replag.repair.writes.guarded_write import TYPED_WRITES
from replag.repair.writes.undo import PreImage, undo
from replag.topology import Endpoint
from replag.wire.resp import RespConnection, error_text, pack

logger = logging.getLogger(__name__)
BATCH = 1000  # keys a batch (their values in one MGET reply per peer)
IN_FLIGHT = 16  # batches at once: their waits of repair_settle overlap


@dataclass
class BatchResult:
    """What one batch did. Keys handed back go to the key-by-key repair (or are left)."""

    keys: int = 0
    copied: int = 0  # written and stood
    copied_keys: list[bytes] = field(default_factory=list)  # the same keys (not summed by add)
    bytes_copied: int = 0
    present: list[bytes] = field(default_factory=list)  # the target had them
    disagree: list[bytes] = field(default_factory=list)  # peers differ (or some lack it)
    gone: int = 0  # no peer holds it any more (deleted or expired)
    changed: list[bytes] = field(default_factory=list)  # moved during the copy: undone
    undo_failed: list[bytes] = field(default_factory=list)
    big: list[tuple[bytes, KeyState]] = field(default_factory=list)  # for the page copier
    expired: int = 0  # expired between read and write
    verified_by_read: bool = False  # a peer saw a change: copies were read back
    # Per peer, how many of the batch's keys it held when read (not summed by add): a
    # rebuild counts what each peer holds of the source's keys (`bulk.closing`).
    held: list[int] = field(default_factory=list)

    def add(self, other: BatchResult) -> None:
        self.keys += other.keys
        self.copied += other.copied
        self.bytes_copied += other.bytes_copied
        self.present += other.present
        self.disagree += other.disagree
        self.gone += other.gone
        self.changed += other.changed
        self.undo_failed += other.undo_failed
        self.big += other.big
        self.expired += other.expired


class ConnectionPool:
    """Idle connections to one endpoint; one is lent per batch."""

    def __init__(self, endpoint: Endpoint, timeout_s: float) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._idle: list[RespConnection] = []
        self.bytes_received = 0

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[RespConnection]:
        conn = (
            self._idle.pop()
            if self._idle
            else await RespConnection.open(self.endpoint, timeout_s=self.timeout_s)
        )
        before = conn.bytes_received
        clean = False
        try:
            yield conn
            clean = True
        finally:
            self.bytes_received += conn.bytes_received - before
            if clean:
                self._idle.append(conn)
            else:
                conn.abort()  # its replies are in an unknown state

    async def close(self) -> None:
        while self._idle:
            await self._idle.pop().close()


class Refill:
    """Copies batches of keys from `peers` to `target` (see the module docstring)."""

    def __init__(
        self,
        peers: Sequence[Endpoint],
        target: Endpoint,
        *,
        settle_s: float,
        tolerance_ms: int,
        timeout_s: float,
        page_elements: int,
        compare_ttls: bool = True,
        scratch_prefix: bytes = b"replag:",
        scripts: bool = False,
    ) -> None:
        if not peers:
            raise ValueError("a refill needs at least one peer")
        self.peers = [ConnectionPool(p, timeout_s) for p in peers]
        self.target = ConnectionPool(target, timeout_s)
        self.readers = [PeerReader(page_elements=page_elements, scripts=scripts) for _ in peers]
        self.settle_s = settle_s
        self.tolerance_ms = tolerance_ms
        self.compare_ttls = compare_ttls
        self.scratch_prefix = scratch_prefix
        self._batches = 0
        self._absolute: bool | None = None

    @property
    def bytes_received(self) -> int:
        return sum(p.bytes_received for p in self.peers) + self.target.bytes_received

    async def close(self) -> None:
        for pool in (*self.peers, self.target):
            await pool.close()

    async def read_only(self, keys: list[bytes]) -> list[bytes]:
        """Step 1 alone, nothing written (a plan's rate sample): the keys the peers agree on."""
        async with contextlib.AsyncExitStack() as stack:
            conns = [await stack.enter_async_context(p.connection()) for p in self.peers]
            reads = await all_of(r.read(c, keys) for r, c in zip(self.readers, conns, strict=True))
        ok = agreeing(list(reads), tolerance_ms=self.tolerance_ms, ttls=self.compare_ttls)
        return [k for k, agreed in zip(keys, ok, strict=True) if agreed]

    async def copy(self, keys: list[bytes]) -> BatchResult:
        """Steps 1 to 3 for one batch of keys."""
        result = BatchResult(keys=len(keys))
        if not keys:
            return result
        # The copy's source (whose DUMPs are written) turns with each batch: the peers
        # share the load of reading.
        source = self._batches % len(self.peers)
        self._batches += 1
        async with contextlib.AsyncExitStack() as stack:
            conns = [await stack.enter_async_context(p.connection()) for p in self.peers]
            pairs = list(zip(self.readers, conns, strict=True))
            reads = await all_of(r.read(c, keys) for r, c in pairs)
            result.held = [int(np.count_nonzero(r.present)) for r in reads]
            ok = agreeing(reads, tolerance_ms=self.tolerance_ms, ttls=self.compare_ttls)
            # Collections whose payloads differ may hold one value encoded otherwise.
            recheck = [
                i
                for i in range(len(keys))
                if not ok[i] and all(i in r.dumps for r in reads) and len(reads) > 1
            ]
            if recheck:
                await all_of(
                    r.canonical(c, keys, read, recheck)
                    for (r, c), read in zip(pairs, reads, strict=True)
                )
                ok = agreeing(reads, tolerance_ms=self.tolerance_ms, ttls=self.compare_ttls)
            src = reads[source]
            copies: list[int] = []
            for i, key in enumerate(keys):
                if ok[i]:
                    if i in src.big:
                        result.big.append((key, src.state(i)))
                    else:
                        copies.append(i)
                elif not any(r.present[i] for r in reads) and not any(
                    i in r.unreadable for r in reads
                ):
                    result.gone += 1
                else:
                    result.disagree.append(key)
            written, written_at = await self._write(keys, copies, src, result)
            if written:
                await asyncio.sleep(max(0.0, written_at + self.settle_s - time.monotonic()))
            touched = [
                p
                for p, same in enumerate(await _unchanged(conns, [r.writes for r in reads]))
                if not same
            ]
            if written and touched:
                # Which of the copies did the change hit? Each such peer is read again (a
                # read like the first, without its counters): a copy whose key still reads
                # the same on every peer stands, the others are read back everywhere.
                result.verified_by_read = True
                moved = await self._moved(keys, written, reads, [(pairs[p], p) for p in touched])
                if moved:
                    await self._verify_by_read(keys, moved, src, result)
                written = [i for i in written if i not in set(moved)]
        result.copied += len(written)
        result.copied_keys += [keys[i] for i in written]
        return result

    async def _moved(
        self,
        keys: list[bytes],
        written: list[int],
        reads: list[PeerRead],
        touched: list[tuple[tuple[PeerReader, RespConnection], int]],
    ) -> list[int]:
        """The copied keys that read otherwise now on a peer whose counters moved."""
        names = [keys[i] for i in written]
        again = await all_of(
            reader.read(conn, names, counters=False) for (reader, conn), _ in touched
        )
        moved: set[int] = set()
        for now, (_, p) in zip(again, touched, strict=True):
            before = reads[p]
            for j, i in enumerate(written):
                if (
                    i in before.canonical
                    or not now.present[j]
                    or i in now.unreadable
                    or now.types[j] != before.types[i]
                    or now.digests[j] != before.digests[i]
                    or not _same_expiry(int(now.expiry_ms[j]), int(before.expiry_ms[i]), self)
                ):
                    moved.add(i)
        return sorted(moved)

    async def _absolute_expiry(self) -> bool:
        """Whether the target takes absolute expiry times (SET … PXAT, RESTORE … ABSTTL:
        Redis 6.2 on). A relative TTL counts from when the server runs the command,
        which a busy server, or many batches in flight, can put seconds after the read;
        an absolute one is exact (up to the hosts' clocks)."""
        if self._absolute is None:
            async with self.target.connection() as conn:
                (info,) = await conn.request(pack(b"INFO", b"server"), 1)
            self._absolute = server_version(info) >= (6, 2)
        return self._absolute

    async def _write(
        self, keys: list[bytes], copies: list[int], src: PeerRead, result: BatchResult
    ) -> tuple[list[int], float]:
        """Step 2: one pipelined write of every copy; the indexes written, and when."""
        if not copies:
            return [], time.monotonic()
        absolute = await self._absolute_expiry()
        now_ms = time.time_ns() // 1_000_000
        commands: list[bytes] = []
        sent: list[int] = []
        expiries: list[int] = src.expiry_ms.tolist()  # Python ints: no numpy scalar a key
        values = src.values
        copied_bytes = 0
        for i in copies:
            expiry = expiries[i]
            left = expiry - now_ms if expiry >= 0 else 0
            if expiry >= 0 and left <= 0:
                result.expired += 1
                continue
            value = values[i]
            key = keys[i]
            if value is not None:
                if expiry < 0:
                    commands.append(_SET_NX % (len(key), key, len(value), value))
                else:
                    at = b"%d" % (expiry if absolute else left)
                    template = _SET_PXAT_NX if absolute else _SET_PX_NX
                    commands.append(template % (len(key), key, len(value), value, len(at), at))
                copied_bytes += len(value)
            else:
                dump = src.dumps[i]
                if expiry >= 0 and absolute:
                    commands.append(pack(b"RESTORE", keys[i], expiry, dump, b"ABSTTL"))
                else:
                    commands.append(pack(b"RESTORE", keys[i], left, dump))
                result.bytes_copied += len(dump)
            sent.append(i)
        result.bytes_copied += copied_bytes
        if not sent:
            return [], time.monotonic()
        what = f"writing {len(sent)} keys ({keys[sent[0]]!r} … {keys[sent[-1]]!r})"
        async with self.target.connection() as conn:
            replies = await request_within(
                conn, b"".join(commands), len(commands), base_s=self.target.timeout_s, what=what
            )
        written_at = time.monotonic()
        written: list[int] = []
        for i, reply in zip(sent, replies, strict=True):
            if reply == b"OK":  # the common case, before any parsing of errors
                written.append(i)
                continue
            text = error_text(reply)
            if reply is None or (text is not None and text.startswith("BUSYKEY")):
                result.present.append(keys[i])
            elif text is None:
                written.append(i)
            elif "payload" in text.lower() or int(src.types[i]) not in TYPED_CODES:
                # The target cannot read this DUMP (an older server; a module it does not
                # load): the key-by-key repair rebuilds it with typed writes, or, for a
                # type no typed write rebuilds, names it as not copied.
                result.disagree.append(keys[i])
            else:
                raise RepairError(
                    f"writing {keys[i]!r} failed: {text}", where=self.target.endpoint.name
                )
        return written, written_at

    async def _verify_by_read(
        self, keys: list[bytes], written: list[int], src: PeerRead, result: BatchResult
    ) -> None:
        """Step 3 when a peer saw a change: read the copies back everywhere; undo those
        that do not hold on every replica."""
        names = [keys[i] for i in written]
        pools = [*self.peers, self.target]

        async def observe(pool: ConnectionPool) -> dict[bytes, KeyState]:
            async with pool.connection() as conn:
                return await observe_keys(conn, names, keep=False)

        now = await all_of(observe(pool) for pool in pools)
        await self._payload_digests(keys, [i for i in written if i in src.dumps], src)
        for i in written:
            key = keys[i]
            if i in src.dumps and i not in src.canonical:
                result.undo_failed.append(key)  # its payload could not be read back
                continue
            wrote = src.state(i)
            if all(states[key].same_as(wrote, self.tolerance_ms) for states in now):
                result.copied += 1
                result.copied_keys.append(key)
                continue
            outcome = await self._undo(key, wrote, src.data.get(i))
            if outcome == "failed":
                result.undo_failed.append(key)
                logger.warning(
                    "%s: %r: the refill's copy could not be undone (a client changed it in "
                    "place before it was verified); check this key",
                    self.target.endpoint.name,
                    key,
                )
            else:
                result.changed.append(key)

    async def _undo(self, key: bytes, wrote: KeyState, data: Data | None) -> str:
        """`undo.undo` with "no key" as the pre-image, a few tries on a key still moving."""
        outcome = "failed"
        for attempt in range(3):
            if attempt:
                await asyncio.sleep(self.settle_s / 2)
            async with self.target.connection() as conn:
                outcome = await undo(
                    conn,
                    key,
                    wrote=wrote,
                    wrote_data=data,
                    before=PreImage(None, None, -2, time.monotonic()),
                    tolerance_ms=self.tolerance_ms,
                )
            if outcome != "failed":
                return outcome
        return outcome

    async def _payload_digests(self, keys: list[bytes], indexes: list[int], src: PeerRead) -> None:
        """The check's digest (and elements) of what was copied, for collections agreed on
        by payload: each payload RESTOREd into a scratch key under replag's prefix on the
        target, read whole and unlinked, in one round trip."""
        wanted = [i for i in indexes if i not in src.canonical]
        if not wanted:
            return
        token = secrets.token_hex(6).encode()
        body: list[bytes] = []
        for n, i in enumerate(wanted):
            scratch = self.scratch_prefix + b"scratch:" + token + b":%d" % n
            type_name = TYPE_NAMES[int(src.types[i])]
            body += [
                pack(b"RESTORE", scratch, 0, src.dumps[i], b"REPLACE"),
                whole_read(scratch, type_name),
                pack(b"UNLINK", scratch),
            ]
        async with self.target.connection() as conn:
            replies = await conn.request(b"".join(body), len(body))
        for n, i in enumerate(wanted):
            reply = replies[3 * n + 1]
            if error_text(replies[3 * n]) is not None or error_text(reply) is not None:
                continue
            type_name = TYPE_NAMES[int(src.types[i])]
            data = whole_data(type_name, reply)
            src.digests[i] = data_digest(type_name, data)
            src.canonical.add(i)
            if type_name in MERGEABLE:
                src.data[i] = data


# Types a typed write rebuilds where a target refuses their DUMP (`guarded_write`).
TYPED_CODES = frozenset(TYPE_CODES[t] for t in TYPED_WRITES)

# SET key value [PXAT ms | PX ms] NX in RESP, formatted here: hiredis's pack_command costs
# ~5 µs a command, as much as the server spends on it.
_SET_NX = b"*4\r\n$3\r\nSET\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n$2\r\nNX\r\n"
_SET_PXAT_NX = (
    b"*6\r\n$3\r\nSET\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n$4\r\nPXAT\r\n$%d\r\n%b\r\n$2\r\nNX\r\n"
)
_SET_PX_NX = b"*6\r\n$3\r\nSET\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n$2\r\nPX\r\n$%d\r\n%b\r\n$2\r\nNX\r\n"


def server_version(info: object) -> tuple[int, ...]:
    """redis_version from an INFO reply ((0,) when it cannot be read)."""
    if not isinstance(info, bytes):
        return (0,)
    for line in info.splitlines():
        if line.startswith(b"redis_version:"):
            try:
                return tuple(int(x) for x in line.split(b":", 1)[1].strip().split(b".")[:3])
            except ValueError:
                return (0,)
    return (0,)


def _same_expiry(a: int, b: int, refill: Refill) -> bool:
    if not refill.compare_ttls or (a < 0 and b < 0):
        return True
    return a >= 0 and b >= 0 and abs(a - b) <= refill.tolerance_ms


async def _unchanged(conns: Sequence[RespConnection], before: Sequence[Writes]) -> list[bool]:
    """Each peer's write counters read again: False for a peer where they moved since
    `before` (or could not be read: then nothing is assumed)."""
    now = await all_of(write_counters(conn) for conn in conns)
    return [b is not None and b == n for b, n in zip(before, now, strict=True)]
