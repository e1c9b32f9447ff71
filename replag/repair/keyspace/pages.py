"""Copying a large collection in pages, so that no repair command holds a server for long.

A 1,000,000-field hash is 15 MB of DUMP; its RESTORE held the target for 2.5 s,
for every client. Above `repair_page_elements` elements a collection is copied
instead, under the same compare-and-copy guarantee as `apply`:

1. On the winner, WATCH the key and read it in pages (HSCAN, SSCAN, ZSCAN with
   COUNT `page`, LRANGE ranges, XRANGE pages), folding each page into the check's
   digest; each page is written at once to a temporary key on the target
   (`<prefix>copy:<token>`, with a safety TTL so a killed copy leaves nothing for long),
   split so no write carries more than `PAGE_BYTES`.
2. An empty MULTI/EXEC on the winner then says whether the key changed while it was
   read; with the digest equal to the decided one and no element seen twice, the
   temporary key holds exactly the decided value.
3. On the target, under WATCH, if the key still holds what was compared: in one
   MULTI, the old key (if any) is renamed aside (`<prefix>undo:<token>`, kept until
   the copy stands), the temporary key renamed in, and the winner's expiry set. RENAME
   is O(1): no command of the copy costs more than a page.
4. `repair_settle` later every replica is read again (in pages); if they all hold the
   decided value the copy stands and the old key is UNLINKed (freed in the
   background); otherwise, while the target still holds the copy, the copy is dropped
   and the old key renamed back, in one MULTI. A copy a client changed in place
   meanwhile cannot be separated from it: reported, never guessed.

A stream with consumer groups is never copied in pages: its groups' pending entries
(which consumer holds which entry, since when, delivered how often; the consumers'
seen and active times) cannot all be rebuilt with commands, and WATCH does not see
XACK, XREADGROUP, XCLAIM or XGROUP (measured on Redis 6.2, 7.0 and Valkey 9.1), so a
client's acknowledgement during a copy read in pages would be lost. It is copied
with one DUMP/RESTORE (`apply`), which carries the groups exactly, under a timeout
scaled to its size; that RESTORE holds the target for its length (docs/repair).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import xxhash

from replag.errors import KeyRefused
from replag.repair.keyspace.digest import OrderedDigest, UnorderedDigest
from replag.repair.keyspace.faithful import require_whole_copy
from replag.repair.keyspace.field_ttls import (
    FieldExpiries,
    field_expiry_writes,
    same_field_expiries,
    server_has_field_ttls,
)
from replag.repair.keyspace.observe import ABSENT, KeyState, observe_keys
from replag.repair.keyspace.timeouts import DUMP_OVERHEAD, request_within
from replag.repair.keyspace.values import string_page
from replag.settings import Settings
from replag.topology import Endpoint
from replag.wire.reply_limits import ReplyLimits
from replag.wire.resp import RespConnection, error_text, pack

logger = logging.getLogger(__name__)
PAGE_BYTES = 512 * 1024
SAFETY_TTL_MS = 3_600_000
_SCAN = {"hash": b"HSCAN", "set": b"SSCAN", "zset": b"ZSCAN"}
_CARD = {"hash": b"HLEN", "set": b"SCARD", "zset": b"ZCARD", "list": b"LLEN", "stream": b"XLEN"}
# What the empty transaction after a paged read asks (a string's length: STRLEN).
_SIZE = {**_CARD, "string": b"STRLEN"}
_WRITE = {"hash": b"HSET", "set": b"SADD", "zset": b"ZADD", "list": b"RPUSH"}
Outcome = Literal["repaired", "changed", "undo_failed"]


@dataclass(frozen=True, kw_only=True)
class PageOptions:
    page: int
    settle_s: float
    tolerance_ms: int
    timeout_s: float  # repair_command_timeout
    prefix: bytes  # replag's own key prefix: temporary keys live under it

    @classmethod
    def of(cls, s: Settings) -> PageOptions:
        return cls(
            page=max(10, s.scan_count),
            settle_s=s.repair_settle,
            tolerance_ms=int(s.ttl_tolerance * 1000),
            timeout_s=s.repair_command_timeout,
            prefix=s.prefix.encode(),
        )


@dataclass
class PagedCopy:
    """A copy swapped in on the target, awaiting re-verification."""

    key: bytes
    backup: bytes | None  # the target's old key, renamed aside (None: it had none)
    backup_expiry_ms: int | None = None  # its expiry (absolute, our clock), to put back


async def stream_groups(conn: RespConnection, key: bytes) -> int:
    """Consumer groups of the stream `key` (0 when it has none, or is no stream now)."""
    (info,) = await conn.request(pack(b"XINFO", b"STREAM", key), 1)
    if not isinstance(info, list):
        return 0
    groups = dict(zip(info[0::2], info[1::2], strict=False)).get(b"groups")
    return groups if isinstance(groups, int) else 0


async def card_of(conn: RespConnection, key: bytes, type_name: str | None) -> int:
    """Elements of a collection (0 for a string, a gone key, or another type now)."""
    if type_name not in _CARD:
        return 0
    (size,) = await conn.request(pack(_CARD[type_name], key), 1)
    return size if isinstance(size, int) else 0


def _writes(temp: bytes, type_name: str, items: list[Any]) -> list[bytes]:
    """Commands adding `items` (flat pairs for hash/zset, members, entries, a string's
    page) to `temp`, none carrying more than about PAGE_BYTES."""
    if type_name == "string":
        return [
            pack(b"APPEND", temp, page[i : i + PAGE_BYTES])
            for page in items
            for i in range(0, len(page), PAGE_BYTES)
        ]
    if type_name == "stream":
        return [pack(b"XADD", temp, entry_id, *fields) for entry_id, fields in items]
    step = 2 if type_name in ("hash", "zset") else 1
    out: list[bytes] = []
    start, size = 0, 0
    for i in range(0, len(items), step):
        size += sum(len(x) for x in items[i : i + step])
        if size >= PAGE_BYTES:
            out.append(pack(_WRITE[type_name], temp, *items[start : i + step]))
            start, size = i + step, 0
    if start < len(items):
        out.append(pack(_WRITE[type_name], temp, *items[start:]))
    return out


class _PageReader:
    """Pages of one collection on the winner, digested as they come."""

    def __init__(
        self, key: bytes, type_name: str, page: int, limits: ReplyLimits, field_ttls: bool = False
    ) -> None:
        self.key, self.type, self.page = key, type_name, page
        # A hash with field TTLs: each page's fields' TTLs are read after it (`expiries`).
        self.field_ttls = field_ttls and type_name == "hash"
        self.expiring: dict[bytes, int] = {}
        self.max_string_bytes = limits.max_string_bytes
        if type_name == "string":  # pages of bytes, each half of what a reply may carry
            self.page = string_page(limits)
        self.bytes = xxhash.xxh3_64()
        self.cursor: bytes = b"0"
        self.start = 0
        self.done = False
        self.seen = 0
        self.unordered = UnorderedDigest(type_name.encode())
        self.ordered = OrderedDigest(type_name.encode())

    def command(self) -> bytes:
        if self.type == "string":
            return pack(b"GETRANGE", self.key, self.start, self.start + self.page - 1)
        if self.type in _SCAN:
            return pack(_SCAN[self.type], self.key, self.cursor, b"COUNT", self.page)
        if self.type == "list":
            return pack(b"LRANGE", self.key, self.start, self.start + self.page - 1)
        start = self.cursor if self.cursor != b"0" else b"-"
        return pack(b"XRANGE", self.key, start, b"+", b"COUNT", self.page)

    def feed(self, reply: Any) -> list[Any]:
        """The page's items to write (zset as score, member pairs)."""
        if self.type in _SCAN:
            self.cursor, flat = reply
            self.done = self.cursor == b"0"
            if self.type == "set":
                self.unordered.add_set_page(flat)
                return list(flat)
            names, values = flat[0::2], flat[1::2]
            if self.type == "hash":
                if not self.field_ttls:
                    self.unordered.add_hash_page(names, values)
                return list(flat)
            self.unordered.add_zset_page(names, list(map(float, values)))
            return [x for m, s in zip(names, values, strict=True) for x in (s, m)]
        self.done = len(reply) < self.page
        if self.type == "string":
            self.bytes.update(reply)
            self.start += len(reply)
            if not self.done and self.start >= self.max_string_bytes:
                raise KeyRefused(
                    f"{self.key!r}: a string read past max_string_bytes = "
                    f"{self.max_string_bytes} bytes; not copied"
                )
            return [reply] if reply else []
        if self.type == "list":
            for item in reply:
                self.ordered.add(item)
            self.start += len(reply)
            return list(reply)
        for entry_id, fields in reply:
            self.ordered.add(entry_id, *fields)
        if reply:
            self.cursor = b"(" + reply[-1][0]
        return [(entry_id, list(fields)) for entry_id, fields in reply]

    def expiries_command(self, items: list[Any]) -> bytes:
        names = items[0::2]
        return pack(b"HPEXPIRETIME", self.key, b"FIELDS", len(names), *names)

    def expiries(self, items: list[Any], reply: Any) -> tuple[list[Any], list[tuple[bytes, int]]]:
        """A hash page's (items to write, (field, expiry) to set) from its HPEXPIRETIME
        reply: a field expired meanwhile (-2) is neither written nor digested."""
        names, values = items[0::2], items[1::2]
        if not isinstance(reply, list) or len(reply) != len(names):
            raise ValueError(f"HPEXPIRETIME answered {reply!r}")
        kept = [i for i, t in enumerate(reply) if t != -2]
        names, values = [names[i] for i in kept], [values[i] for i in kept]
        self.unordered.add_hash_page(names, values)
        timed = [(names[j], int(reply[i])) for j, i in enumerate(kept) if reply[i] >= 0]
        self.expiring.update(timed)
        return [x for pair in zip(names, values, strict=True) for x in pair], timed

    def field_expiries(self) -> FieldExpiries | None:
        return FieldExpiries.of(list(self.expiring), list(self.expiring.values()))

    def digest(self) -> int:
        if self.type == "string":
            return self.bytes.intdigest()  # xxh3 streamed: a whole read's string_digest
        return self.unordered.digest() if self.type in _SCAN else self.ordered.digest()

    @property
    def count(self) -> int | None:
        return self.unordered.count if self.type in _SCAN else None


async def copy_in_pages(
    winner: RespConnection,
    target: RespConnection,
    key: bytes,
    *,
    expected: KeyState,
    target_expected: KeyState,
    options: PageOptions,
) -> PagedCopy | None:
    """Steps 1 to 3; None (nothing left behind) if the winner or the target moved."""
    assert expected.type is not None
    token = secrets.token_hex(8).encode()
    temp = options.prefix + b"copy:" + token
    timeout = options.timeout_s
    winner.check(await winner.request(pack(b"WATCH", key), 1))
    if expected.type == "stream" and await stream_groups(winner, key):
        await winner.request(pack(b"UNWATCH"), 1)
        return None  # copied whole (DUMP/RESTORE keeps its groups), by the key-by-key path
    field_ttls = expected.field_expiries is not None
    if field_ttls and not await server_has_field_ttls(target):
        await winner.request(pack(b"UNWATCH"), 1)
        await require_whole_copy(target, key, expected)
    (pttl,) = await winner.request(pack(b"PTTL", key), 1)
    read_at = time.monotonic()
    reader = _PageReader(key, expected.type, options.page, winner.endpoint.limits, field_ttls)
    pending: asyncio.Future[tuple[list[Any], int]] | None = None
    first = True
    try:
        while not reader.done:
            (reply,) = await request_within(
                winner, reader.command(), 1, base_s=timeout, what=f"reading {key!r} in pages"
            )
            if error_text(reply) is not None:
                await _abandon(winner, target, temp, pending)
                return None
            items = reader.feed(reply)
            timed: list[tuple[bytes, int]] = []
            if reader.field_ttls and items:
                (ttls,) = await winner.request(reader.expiries_command(items), 1)
                if error_text(ttls) is not None:
                    await _abandon(winner, target, temp, pending)
                    return None
                items, timed = reader.expiries(items, ttls)
            # Each field's TTL set inside the temporary key, before the swap.
            commands = _writes(temp, expected.type, items) + field_expiry_writes(temp, timed)
            if first and commands:
                commands.append(pack(b"PEXPIRE", temp, SAFETY_TTL_MS))
                first = False
            if pending is not None:
                target.check((await target.wait(pending, timeout))[0])
            if commands:
                payload = b"".join(commands)
                pending = target.send(payload, len(commands))
        if pending is not None:
            target.check((await target.wait(pending, timeout))[0])
            pending = None
        replies = await winner.request(
            pack(b"MULTI") + pack(_SIZE[expected.type], key) + pack(b"EXEC"), 3
        )
        winner.check(replies[:1])
        unchanged = replies[-1] is not None
        card = replies[-1][0] if unchanged else None
        if (
            not unchanged
            or reader.digest() != expected.digest
            or not _counted(reader, card)
            or not same_field_expiries(
                reader.field_expiries(), expected.field_expiries, options.tolerance_ms
            )
        ):
            await _abandon(winner, target, temp, None)
            return None
        if expected.type == "stream":
            await _copy_last_id(winner, target, key, temp)
        return await _swap(target, key, temp, token, int(pttl), read_at, target_expected, options)
    except BaseException:
        target.abort()  # the temporary key expires on its own (SAFETY_TTL_MS)
        raise


def _counted(reader: _PageReader, card: Any) -> bool:
    """Every element read once: as many as the server counts, or (a hash with field
    TTLs) no more: HLEN still counts fields expired but not yet reclaimed."""
    if reader.count is None:
        return True
    return bool(reader.count <= card if reader.field_ttls else reader.count == card)


async def _abandon(
    winner: RespConnection,
    target: RespConnection,
    temp: bytes,
    pending: asyncio.Future[tuple[list[Any], int]] | None,
) -> None:
    if pending is not None:
        await target.wait(pending)
    await winner.request(pack(b"UNWATCH"), 1)
    await target.request(pack(b"UNLINK", temp), 1)


async def _copy_last_id(
    winner: RespConnection, target: RespConnection, key: bytes, temp: bytes
) -> None:
    """A stream's last generated ID (beyond its last entry after an XDEL) goes along."""
    (info,) = await winner.request(pack(b"XINFO", b"STREAM", key), 1)
    if not isinstance(info, list):
        return
    fields = dict(zip(info[0::2], info[1::2], strict=False))
    last = fields.get(b"last-generated-id")
    if isinstance(last, bytes):
        await target.request(pack(b"XSETID", temp, last), 1)  # an error leaves it as is


async def _swap(
    target: RespConnection,
    key: bytes,
    temp: bytes,
    token: bytes,
    pttl: int,
    read_at: float,
    target_expected: KeyState,
    options: PageOptions,
) -> PagedCopy | None:
    """Step 3: rename the copy in, under WATCH, if the target still holds what was compared."""
    target.check(await target.request(pack(b"WATCH", key), 1))
    now = (await observe_keys(target, [key], chunk=options.page, keep=False))[key]
    left = pttl - int((time.monotonic() - read_at) * 1000) if pttl >= 0 else 0
    # PEXPIREAT, not PEXPIRE: the expiry stays the winner's however long the swap waits.
    expire_at = time.time_ns() // 1_000_000 + left
    if not now.same_as(target_expected, options.tolerance_ms) or (pttl >= 0 and left <= 0):
        await target.request(pack(b"UNWATCH") + pack(b"UNLINK", temp), 2)
        return None
    backup = options.prefix + b"undo:" + token if now.exists else None
    body = [pack(b"MULTI")]
    if backup is not None:
        body += [pack(b"RENAME", key, backup), pack(b"PEXPIRE", backup, SAFETY_TTL_MS)]
    body.append(pack(b"RENAME", temp, key))
    body.append(pack(b"PEXPIREAT", key, expire_at) if pttl >= 0 else pack(b"PERSIST", key))
    body.append(pack(b"EXEC"))
    replies = await target.request(b"".join(body), len(body))
    target.check(replies[:1])
    if replies[-1] is None:
        await target.request(pack(b"UNLINK", temp), 1)
        return None
    target.check(replies[-1])
    return PagedCopy(key, backup, now.expiry_ms)


async def settle(
    replicas: Sequence[RespConnection],
    target: RespConnection,
    copy: PagedCopy,
    *,
    expected: KeyState,
    options: PageOptions,
) -> Outcome:
    """Step 4: `repair_settle` after the swap, keep the copy if every replica (`replicas`
    includes the target) holds `expected`, else put the target back while it holds it."""
    await asyncio.sleep(options.settle_s)
    key = copy.key
    states = [
        (await observe_keys(conn, [key], chunk=options.page, keep=False))[key] for conn in replicas
    ]
    if all(s.same_as(expected, options.tolerance_ms) for s in states):
        if copy.backup is not None:
            await target.request(pack(b"UNLINK", copy.backup), 1)
        return "repaired"
    return await _put_back(target, copy, expected, options)


async def _put_back(
    target: RespConnection, copy: PagedCopy, expected: KeyState, options: PageOptions
) -> Outcome:
    """While the target still holds the copy: drop it and rename the old key back."""
    key = copy.key
    target.check(await target.request(pack(b"WATCH", key), 1))
    now = (await observe_keys(target, [key], chunk=options.page, keep=False))[key]
    if now.same_as(expected, options.tolerance_ms):
        body = [pack(b"MULTI"), pack(b"UNLINK", key)]
        if copy.backup is not None:
            # Aside, the old key wore the safety TTL: it gets its own expiry back.
            body.append(pack(b"RENAME", copy.backup, key))
            if copy.backup_expiry_ms is None:
                body.append(pack(b"PERSIST", key))
            else:
                left = copy.backup_expiry_ms - time.time_ns() // 1_000_000
                body.append(pack(b"PEXPIRE", key, max(1, left)))
        body.append(pack(b"EXEC"))
        replies = await target.request(b"".join(body), len(body))
        target.check(replies[:1])
        return "changed" if replies[-1] is not None else "undo_failed"
    await target.request(pack(b"UNWATCH"), 1)
    if copy.backup is not None:
        await target.request(pack(b"UNLINK", copy.backup), 1)
    if not now.exists or now.type != expected.type:
        return "changed"  # a client deleted or replaced it: that write stays
    logger.warning(
        "%s: %r: a client changed the paged copy in place before it was verified; check this key",
        target.endpoint.name,
        key,
    )
    return "undo_failed"


async def copy_big_keys(
    options: PageOptions,
    peers: Sequence[Endpoint],
    target: Endpoint,
    items: Sequence[tuple[bytes, KeyState]],
    *,
    refill_source: int = 0,
) -> tuple[int, list[bytes]]:
    """A refill's large collections (absent on the target, the peers agreeing on
    `expected`): (copied and stood, keys left for the anti-entropy pass)."""
    timeout_s = options.timeout_s
    conns = [await RespConnection.open(p, timeout_s=timeout_s) for p in peers]
    dest = await RespConnection.open(target, timeout_s=timeout_s)
    copied, left = 0, []
    try:
        for key, expected in items:
            copy = await copy_in_pages(
                conns[refill_source],
                dest,
                key,
                expected=expected,
                target_expected=ABSENT,
                options=options,
            )
            if copy is None:
                left.append(key)
                continue
            outcome = await settle([*conns, dest], dest, copy, expected=expected, options=options)
            if outcome == "repaired":
                copied += 1
            else:
                left.append(key)
    finally:
        for conn in (*conns, dest):
            await conn.close()
    return copied, left


class PagedLane(Protocol):
    """What `repair_big_key` needs of a replica lane (`lanes.ReplicaLane`)."""

    writes: int

    @property
    def name(self) -> str: ...

    def connection(self, *, write: bool = False) -> AbstractAsyncContextManager[RespConnection]: ...


async def copied_in_pages(lane: PagedLane, key: bytes, state: KeyState, page_elements: int) -> bool:
    """Whether the winner's value of `key` is copied in pages: a collection above
    `page_elements`, but not a stream with consumer groups (see the module); a string
    whose DUMP could not pass max_reply_bytes in one reply (read in GETRANGE pages)."""
    if state.type == "string":
        size = state.size
        async with lane.connection() as conn:
            limit = conn.endpoint.limits.max_bytes
            if size is None:
                (size,) = await conn.request(pack(b"STRLEN", key), 1)
        return isinstance(size, int) and size + DUMP_OVERHEAD > limit
    if state.type not in _CARD:
        return False
    async with lane.connection() as conn:
        if await card_of(conn, key, state.type) <= page_elements:
            return False
        return state.type != "stream" or not await stream_groups(conn, key)


async def repair_big_key(
    lanes: Sequence[PagedLane],
    key: bytes,
    winner: int,
    targets: Sequence[int],
    states: Sequence[KeyState],
    options: PageOptions,
) -> Outcome:
    """A key-by-key repair's copy of one large collection to `targets`, in pages (steps 1
    to 4 for each target, one re-verification for all)."""
    expected = states[winner]
    copies: list[tuple[int, PagedCopy]] = []
    moved = False
    for t in targets:
        async with lanes[winner].connection() as source, lanes[t].connection(write=True) as dest:
            copy = await copy_in_pages(
                source, dest, key, expected=expected, target_expected=states[t], options=options
            )
        if copy is None:
            moved = True
            continue
        lanes[t].writes += 1
        copies.append((t, copy))
    if not copies:
        return "changed"
    outcomes: list[Outcome] = []
    for t, copy in copies:
        async with contextlib.AsyncExitStack() as stack:
            conns = [await stack.enter_async_context(lane.connection()) for lane in lanes]
            target = conns[t]
            if moved:  # one target did not take the copy: the others are put back
                await asyncio.sleep(options.settle_s)
                outcomes.append(await _put_back(target, copy, expected, options))
            else:
                outcomes.append(
                    await settle(conns, target, copy, expected=expected, options=options)
                )
    if "undo_failed" in outcomes:
        return "undo_failed"
    return "repaired" if not moved and all(o == "repaired" for o in outcomes) else "changed"
