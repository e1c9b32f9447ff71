"""Reading a batch of keys on one peer for a bulk refill: values, digests, expiries, and the
peer's write counters.

One round trip carries the peer's write counters (`write_counters`), the batch's
`MGET` and its TTLs (the scan's TTL script, or one PTTL per key where scripts are
refused). Any write to the peer after that moves a counter: every write command,
delete and flush adds to `rdb_changes_since_last_save` (a save resets it, and moves
`rdb_saves` / `rdb_last_save_time`), every expiry and eviction to `expired_keys` /
`evicted_keys`. Counters read again unchanged later prove that nothing on the peer
changed in between, which is how a refill learns, in one command, that nothing it
copied has moved since. (WATCH told the same per key, at ~2.3 µs a key on the
server, O(N²) in the keys one connection watches: more than the read itself.) Where
a counter moved, the copies are read again (`refill`). Keys MGET cannot read get TYPE, then their
size (HLEN, SCARD, ZCARD, LLEN, XLEN); collections up to `page_elements` are
DUMPed (peers agree on a collection when their payloads are the same bytes; where
they differ, `canonical` reads them whole for the check's digest, since one value
may be encoded otherwise elsewhere); larger ones are digested in pages, marked
`big` and left to the page copier. String digests are the check's own (`digest`).

"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from xxhash import xxh3_64_intdigest

from replag.repair.keyspace.digest import (
    TYPE_CODES,
    TYPE_NAMES,
    OrderedDigest,
    hash_digest,
    set_digest,
    zset_digest,
)
from replag.repair.keyspace.field_ttls import FieldExpiries, db_has_field_ttls, entry_digest
from replag.repair.keyspace.native import hash_each
from replag.repair.keyspace.observe import KeyState
from replag.repair.keyspace.values import Data, StreamEntry, read_values
from replag.repair.scan.ttls import TTL_SCRIPT, TtlSource, batch_ttls
from replag.wire.resp import RespConnection, error_text, pack, pack_over_keys, pack_per_key

CARD = {
    "hash": b"HLEN",
    "set": b"SCARD",
    "zset": b"ZCARD",
    "list": b"LLEN",
    "stream": b"XLEN",
}
MERGEABLE = ("hash", "set", "zset")
# What moves when anything changes a peer's keys: (INFO section, field).
WRITE_COUNTERS = (
    (b"persistence", b"rdb_changes_since_last_save"),
    (b"persistence", b"rdb_last_save_time"),
    (b"persistence", b"rdb_saves"),  # Redis 7.0 on; without it, rdb_last_save_time
    (b"stats", b"expired_keys"),
    (b"stats", b"evicted_keys"),
)
WRITES_PROBE = pack(b"INFO", b"persistence") + pack(b"INFO", b"stats")
# The counters as read; None where they could not be (then every copy is read again).
Writes = tuple[bytes, ...] | None


def writes_of(persistence: Any, stats: Any) -> Writes:
    """The write counters from the replies to `WRITES_PROBE`."""
    if not isinstance(persistence, bytes) or not isinstance(stats, bytes):
        return None
    fields: dict[bytes, bytes] = {}
    for section, text in ((b"persistence", persistence), (b"stats", stats)):
        for line in text.splitlines():
            name, sep, value = line.partition(b":")
            if sep:
                fields[section + b"." + name] = value.strip()
    if (
        b"persistence.rdb_changes_since_last_save" not in fields
        or b"persistence.rdb_last_save_time" not in fields
        or b"stats.expired_keys" not in fields
    ):
        return None
    return tuple(fields.get(section + b"." + name, b"") for section, name in WRITE_COUNTERS)


async def write_counters(conn: RespConnection) -> Writes:
    """`conn`'s server's write counters now."""
    persistence, stats = await conn.request(WRITES_PROBE, 2)
    return writes_of(persistence, stats)


def whole_read(key: bytes, type_name: str) -> bytes:
    """The one command that reads a (small) collection whole."""
    if type_name == "hash":
        return pack(b"HGETALL", key)
    if type_name == "set":
        return pack(b"SMEMBERS", key)
    if type_name == "zset":
        return pack(b"ZRANGE", key, 0, -1, b"WITHSCORES")
    if type_name == "list":
        return pack(b"LRANGE", key, 0, -1)
    return pack(b"XRANGE", key, b"-", b"+")


def whole_data(type_name: str, reply: Any) -> Data:
    """A collection's elements from its `whole_read` reply (RESP2)."""
    if type_name == "hash":
        return dict(zip(reply[0::2], reply[1::2], strict=True))
    if type_name == "set":
        return set(reply)
    if type_name == "zset":
        return {m: float(s) for m, s in zip(reply[0::2], reply[1::2], strict=True)}
    if type_name == "list":
        return list(reply)
    return [(entry_id, list(fields)) for entry_id, fields in reply]


def data_digest(type_name: str, data: Data) -> int:
    """The check's canonical digest (`values.read_values`) of a collection's elements."""
    if type_name == "hash":
        assert isinstance(data, dict)
        return hash_digest(data)  # type: ignore[arg-type]
    if type_name == "set":
        assert isinstance(data, set)
        return set_digest(data)
    if type_name == "zset":
        assert isinstance(data, dict)
        return zset_digest(data)  # type: ignore[arg-type]
    ordered = OrderedDigest(type_name.encode())
    if type_name == "list":
        for item in data:
            assert isinstance(item, bytes)
            ordered.add(item)
    else:
        entries: Sequence[StreamEntry] = data  # type: ignore[assignment]
        for entry_id, fields in entries:
            ordered.add(entry_id, *fields)
    return ordered.digest()


@dataclass
class PeerRead:
    """One peer's view of a batch, index-aligned with its keys."""

    present: npt.NDArray[np.bool_]
    types: npt.NDArray[np.uint8]
    digests: npt.NDArray[np.uint64]
    expiry_ms: npt.NDArray[np.int64]  # absolute, on our clock; -1: none
    values: list[bytes | None]  # strings, as MGET returned them
    read_at_ms: int
    writes: Writes = None  # the peer's write counters just before the read (`write_counters`)
    dumps: dict[int, bytes] = field(default_factory=dict)  # small collections
    # Collections whose `digests` entry is the check's digest; for the others (small ones
    # read by DUMP) it is a hash of the payload, equal only between identical encodings.
    canonical: set[int] = field(default_factory=set)
    data: dict[int, Data] = field(default_factory=dict)  # elements, once known (undo merges)
    sizes: dict[int, int] = field(default_factory=dict)  # element counts of collections
    big: set[int] = field(default_factory=set)  # collections above page_elements
    unreadable: set[int] = field(default_factory=set)  # changed mid-read
    # Values replag cannot read (a module type): index → (type, why). Copied from the one
    # peer there is; between peers, not known to agree.
    opaque: dict[int, tuple[str, str]] = field(default_factory=dict)
    # Big hashes' fields that have TTLs (a copy in pages sets them, and is verified by them).
    field_expiries: dict[int, FieldExpiries] = field(default_factory=dict)
    # Their values' digests (`digests` holds value and field expiries together, so that
    # peers agree only on both).
    value_digests: dict[int, int] = field(default_factory=dict)

    def state(self, i: int) -> KeyState:
        """Key `i` as a `KeyState` (what a copy of it should leave on every replica): a
        string, or a collection whose digest is canonical."""
        assert i not in self.dumps or i in self.canonical
        if not self.present[i]:
            return KeyState(False)
        expiry = int(self.expiry_ms[i])
        if i in self.opaque:
            type_name, why = self.opaque[i]
            return KeyState(True, type_name, None, expiry if expiry >= 0 else None, opaque=why)
        return KeyState(
            True,
            TYPE_NAMES.get(int(self.types[i])),
            int(self.digests[i]) if i not in self.field_expiries else self.value_digests[i],
            expiry if expiry >= 0 else None,
            field_expiries=self.field_expiries.get(i),
        )


class PeerReader:
    """Reads batches on connections to one peer; knows how that peer's TTLs are read."""

    def __init__(self, *, page_elements: int, scripts: bool = False) -> None:
        self.page_elements = page_elements
        self.sha: bytes | None = None  # the TTL script, once loaded; None: one PTTL per key
        # Only where settings.allow_scripts says so: a user allowed SCRIPT LOAD and
        # EVALSHA may run any Lua on the server.
        self._ready = not scripts

    async def prepare(self, conn: RespConnection) -> None:
        if self._ready:
            return
        (reply,) = await conn.request(pack(b"SCRIPT", b"LOAD", TTL_SCRIPT), 1)
        self.sha = bytes(reply) if error_text(reply) is None else None
        self._ready = True

    async def read(
        self, conn: RespConnection, keys: list[bytes], *, counters: bool = True
    ) -> PeerRead:
        """Read `keys` on `conn`, after the peer's write counters (unless not `counters`)
        in the same round trip (see the module docstring)."""
        await self.prepare(conn)
        n = len(keys)
        probe = WRITES_PROBE if counters else b""
        mget = 2 if counters else 0  # the MGET's reply; the TTLs' follow it
        heads: list[tuple[bytes | int, ...]] = [(b"MGET",)]
        source: TtlSource = "pttl" if self.sha is None else "script"
        if self.sha is not None:
            heads.append((b"EVALSHA", self.sha, n))
            payload, count = probe + pack_over_keys(keys, *heads), mget + len(heads)
        else:
            payload = probe + pack_over_keys(keys, *heads) + pack_per_key(b"PTTL", keys)
            count = mget + len(heads) + n
        replies, arrived_ns = await conn.wait(conn.send(payload, count))
        conn.check(replies[: mget + 1])
        writes = writes_of(replies[0], replies[1]) if counters else None
        ttls = batch_ttls(replies[mget:], n, source, conn.endpoint)
        values: list[bytes | None] = replies[mget]
        now_ms = arrived_ns // 1_000_000
        present = ttls != -2
        types = np.where(present, TYPE_CODES["string"], 0).astype(np.uint8)
        read = PeerRead(
            present=present,
            types=types,
            digests=hash_each([b"" if v is None else v for v in values]).copy(),
            expiry_ms=np.where(ttls >= 0, ttls + now_ms, -1),
            values=values,
            read_at_ms=now_ms,
            writes=writes,
        )
        others = [i for i, v in enumerate(values) if v is None and present[i]]
        if others:
            await self._read_collections(conn, keys, others, read)
        return read

    async def _read_collections(
        self,
        conn: RespConnection,
        keys: list[bytes],
        others: list[int],
        read: PeerRead,
    ) -> None:
        names = await conn.request(pack_per_key(b"TYPE", [keys[i] for i in others]), len(others))
        typed: list[tuple[int, str]] = []
        whole: list[tuple[int, str]] = []  # vector sets, JSON, module types: DUMPed
        for i, name in zip(others, names, strict=True):
            type_name = name.decode() if isinstance(name, bytes) else str(name)
            if type_name == "none":
                read.present[i] = False
            elif type_name in CARD:
                read.types[i] = TYPE_CODES[type_name]
                typed.append((i, type_name))
            elif type_name != "string":
                whole.append((i, type_name))
            else:
                read.unreadable.add(i)  # a string that came meanwhile
        if whole:
            await self._read_whole(conn, keys, whole, read)
        if not typed:
            return
        sizes = await conn.request(b"".join(pack(CARD[t], keys[i]) for i, t in typed), len(typed))
        small: list[tuple[int, str]] = []
        for (i, type_name), size in zip(typed, sizes, strict=True):
            if not isinstance(size, int):
                read.unreadable.add(i)  # WRONGTYPE: it changed type since TYPE
            elif size == 0:
                read.present[i] = False
            else:
                read.sizes[i] = size
                if size > self.page_elements:
                    read.big.add(i)
                else:
                    small.append((i, type_name))
        if small:
            await self._read_small(conn, keys, small, read)
        if read.big:
            # Digested in pages (HSCAN …), as a check reads them: never one long command.
            big = [(keys[i], TYPE_NAMES[int(read.types[i])]) for i in sorted(read.big)]
            fields = any(t == "hash" for _, t in big) and await db_has_field_ttls(conn)
            digests = await read_values(
                conn, big, chunk=min(self.page_elements, 1000), field_ttls=fields
            )
            for i, (key, _) in zip(sorted(read.big), big, strict=True):
                value = digests[key]
                if value is None:
                    read.unreadable.add(i)
                    continue
                read.digests[i] = value.digest
                read.canonical.add(i)
                if value.field_expiries is not None:
                    # Peers agree on the exact expiries (replication carries them as
                    # absolute times); within the tolerance only, the repair decides.
                    read.field_expiries[i] = value.field_expiries
                    read.value_digests[i] = value.digest
                    read.digests[i] = entry_digest(value.digest, value.field_expiries, 1)

    async def _read_whole(
        self, conn: RespConnection, keys: list[bytes], typed: list[tuple[int, str]], read: PeerRead
    ) -> None:
        """Values only DUMP/RESTORE copies: a vector set or JSON document digested by its
        content (`values.read_values`, the check's digest), any other type (a module's)
        `opaque`, its digest its type's. Each is DUMPed for the copy."""
        digests = await read_values(conn, [(keys[i], t) for i, t in typed], chunk=1000)
        replies = await conn.request(b"".join(pack(b"DUMP", keys[i]) for i, _ in typed), len(typed))
        for (i, type_name), dump in zip(typed, replies, strict=True):
            value = digests[keys[i]]
            if dump is None:
                read.present[i] = False
            elif value is None or not isinstance(dump, bytes):
                read.unreadable.add(i)  # changed while read
            else:
                read.types[i] = TYPE_CODES.get(type_name, 0)
                read.dumps[i] = dump
                read.canonical.add(i)
                read.digests[i] = value.digest
                if value.opaque is not None:
                    read.opaque[i] = (type_name, value.opaque)
                    read.digests[i] = xxh3_64_intdigest(type_name.encode())

    async def _read_small(
        self,
        conn: RespConnection,
        keys: list[bytes],
        small: list[tuple[int, str]],
        read: PeerRead,
    ) -> None:
        """DUMP each small collection. Peers holding one value in one encoding answer the
        same bytes, which is how agreement is judged first (`digests` holds a hash of the
        payload until `canonical` replaces it): no element is parsed on the common path."""
        replies = await conn.request(b"".join(pack(b"DUMP", keys[i]) for i, _ in small), len(small))
        for (i, _), dump in zip(small, replies, strict=True):
            if isinstance(dump, bytes):
                read.dumps[i] = dump
                read.digests[i] = xxh3_64_intdigest(dump)
            elif dump is None:
                read.present[i] = False
            else:
                read.unreadable.add(i)

    async def canonical(
        self, conn: RespConnection, keys: list[bytes], read: PeerRead, indexes: list[int]
    ) -> None:
        """The check's digest of small collections whose DUMPs differed between peers (the
        same value may be encoded otherwise on another server version or configuration),
        read whole on the same connection, before the batch's counters are read again."""
        wanted = [(i, TYPE_NAMES[int(read.types[i])]) for i in indexes if i in read.dumps]
        if not wanted:
            return
        replies = await conn.request(
            b"".join(whole_read(keys[i], t) for i, t in wanted), len(wanted)
        )
        hashes: list[tuple[int, dict[bytes, bytes]]] = []
        for (i, type_name), reply in zip(wanted, replies, strict=True):
            if error_text(reply) is not None:
                read.unreadable.add(i)
                continue
            data = whole_data(type_name, reply)
            read.digests[i] = data_digest(type_name, data)
            read.canonical.add(i)
            if type_name == "hash":
                hashes.append((i, data))  # type: ignore[arg-type]
        if hashes and await db_has_field_ttls(conn):
            await self._field_expiries(conn, keys, read, hashes)

    async def _field_expiries(
        self,
        conn: RespConnection,
        keys: list[bytes],
        read: PeerRead,
        hashes: list[tuple[int, dict[bytes, bytes]]],
    ) -> None:
        """The fields' TTLs of hashes read whole (HGETALL leaves them out): peers agree on
        a hash when they agree on those too."""
        asks = [pack(b"HPEXPIRETIME", keys[i], b"FIELDS", len(data), *data) for i, data in hashes]
        replies = await conn.request(b"".join(asks), len(asks))
        for (i, data), reply in zip(hashes, replies, strict=True):
            if not isinstance(reply, list) or len(reply) != len(data) or -2 in reply:
                read.unreadable.add(i)  # changed since, or a field expired meanwhile
                read.canonical.discard(i)
                continue
            timed = [(f, int(t)) for f, t in zip(data, reply, strict=True) if t >= 0]
            expiries = FieldExpiries.of([f for f, _ in timed], [t for _, t in timed])
            if expiries is not None:
                read.field_expiries[i] = expiries
                read.value_digests[i] = int(read.digests[i])
                read.digests[i] = entry_digest(int(read.digests[i]), expiries, 1)


def agreeing(reads: Sequence[PeerRead], *, tolerance_ms: int, ttls: bool) -> npt.NDArray[np.bool_]:
    """Per key: every peer holds it, readable, with one type and digest (and, with `ttls`,
    expiries within `tolerance_ms` of each other)."""
    first = reads[0]
    ok = first.present.copy()
    bad = set(first.unreadable)
    for other in reads[1:]:
        ok &= other.present & (other.types == first.types) & (other.digests == first.digests)
        if ttls:
            a, b = first.expiry_ms, other.expiry_ms
            same = ((a < 0) & (b < 0)) | ((a >= 0) & (b >= 0) & (np.abs(a - b) <= tolerance_ms))
            ok &= same
        bad |= other.unreadable
    if len(reads) > 1:
        bad |= {i for r in reads for i in r.opaque}  # opaque values: agreement not known
    if bad:
        ok[list(bad)] = False
    return ok
