"""Reading a batch of keys on one peer for a bulk refill: values, digests, expiries, under WATCH.

One round trip carries `WATCH` of the whole batch, its `MGET` and its TTLs
(the scan's TTL script, or one PTTL per key where scripts are refused), so
every later change to any of those keys on this peer makes the connection's
next `EXEC` answer nil: that is how a refill learns, in one command, that
nothing it copied has moved since. Keys MGET cannot read get TYPE, then their
size (HLEN, SCARD, ZCARD, LLEN, XLEN); collections up to `page_elements` are
DUMPed (peers agree on a collection when their payloads are the same bytes; where
they differ, `canonical` reads them whole for the check's digest, since one value
may be encoded otherwise elsewhere); larger ones are digested in pages, marked
`big` and left to the page copier. String digests are the check's own (`digest`).

Redis checks a WATCHed key against the client's whole watch list, so a WATCH of
N keys costs the server O(N²) (6 µs a key at 400 keys, Redis 7.0): a batch is read in
groups of `WATCH_GROUP` keys, each on a connection of its own, and the groups' reads
joined (`joined`).
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
from replag.repair.keyspace.native import hash_each
from replag.repair.keyspace.observe import KeyState
from replag.repair.keyspace.values import Data, StreamEntry, read_values
from replag.repair.scan.ttls import TTL_SCRIPT, TtlSource, batch_ttls
from replag.resp import RespConnection, error_text, pack, pack_over_keys, pack_per_key

CARD = {
    "hash": b"HLEN",
    "set": b"SCARD",
    "zset": b"ZCARD",
    "list": b"LLEN",
    "stream": b"XLEN",
}
MERGEABLE = ("hash", "set", "zset")
WATCH_GROUP = 100  # keys one connection WATCHes (~1.5 µs a key on the server at 100)


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
    dumps: dict[int, bytes] = field(default_factory=dict)  # small collections
    # Collections whose `digests` entry is the check's digest; for the others (small ones
    # read by DUMP) it is a hash of the payload, equal only between identical encodings.
    canonical: set[int] = field(default_factory=set)
    data: dict[int, Data] = field(default_factory=dict)  # elements, once known (undo merges)
    sizes: dict[int, int] = field(default_factory=dict)  # element counts of collections
    big: set[int] = field(default_factory=set)  # collections above page_elements
    unreadable: set[int] = field(default_factory=set)  # a module type, or changed mid-read

    def state(self, i: int) -> KeyState:
        """Key `i` as a `KeyState` (what a copy of it should leave on every replica): a
        string, or a collection whose digest is canonical."""
        assert i not in self.dumps or i in self.canonical
        if not self.present[i]:
            return KeyState(False)
        expiry = int(self.expiry_ms[i])
        return KeyState(
            True,
            TYPE_NAMES.get(int(self.types[i])),
            int(self.digests[i]),
            expiry if expiry >= 0 else None,
        )


def joined(parts: Sequence[PeerRead]) -> PeerRead:
    """One read of consecutive groups of a batch's keys, as if read in one go."""
    if len(parts) == 1:
        return parts[0]
    out = PeerRead(
        present=np.concatenate([p.present for p in parts]),
        types=np.concatenate([p.types for p in parts]),
        digests=np.concatenate([p.digests for p in parts]),
        expiry_ms=np.concatenate([p.expiry_ms for p in parts]),
        values=[v for p in parts for v in p.values],
        read_at_ms=min(p.read_at_ms for p in parts),
    )
    at = 0
    for p in parts:
        out.dumps.update({at + i: d for i, d in p.dumps.items()})
        out.canonical.update(at + i for i in p.canonical)
        out.data.update({at + i: d for i, d in p.data.items()})
        out.sizes.update({at + i: n for i, n in p.sizes.items()})
        out.big.update(at + i for i in p.big)
        out.unreadable.update(at + i for i in p.unreadable)
        at += len(p.values)
    return out


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
        self, conn: RespConnection, keys: list[bytes], *, watch: bool = True
    ) -> PeerRead:
        """WATCH `keys` on `conn` (unless not `watch`) and read them (see the module
        docstring)."""
        await self.prepare(conn)
        n = len(keys)
        heads: list[tuple[bytes | int, ...]] = [(b"WATCH",)] if watch else []
        mget = len(heads)  # the MGET's reply; the TTLs' follow it
        heads.append((b"MGET",))
        source: TtlSource = "pttl" if self.sha is None else "script"
        if self.sha is not None:
            heads.append((b"EVALSHA", self.sha, n))
            payload, count = pack_over_keys(keys, *heads), len(heads)
        else:
            payload = pack_over_keys(keys, *heads) + pack_per_key(b"PTTL", keys)
            count = len(heads) + n
        replies, arrived_ns = await conn.wait(conn.send(payload, count))
        conn.check(replies[: mget + 1])
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
        for i, name in zip(others, names, strict=True):
            type_name = name.decode() if isinstance(name, bytes) else str(name)
            if type_name == "none":
                read.present[i] = False
            elif type_name not in CARD:
                read.unreadable.add(i)  # a module type, or a string that came meanwhile
            else:
                read.types[i] = TYPE_CODES[type_name]
                typed.append((i, type_name))
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
            digests = await read_values(conn, big, chunk=min(self.page_elements, 1000))
            for i, (key, _) in zip(sorted(read.big), big, strict=True):
                value = digests[key]
                if value is None:
                    read.unreadable.add(i)
                else:
                    read.digests[i] = value.digest
                    read.canonical.add(i)

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
        read whole on the same connection, still under the batch's WATCH."""
        wanted = [(i, TYPE_NAMES[int(read.types[i])]) for i in indexes if i in read.dumps]
        if not wanted:
            return
        replies = await conn.request(
            b"".join(whole_read(keys[i], t) for i, t in wanted), len(wanted)
        )
        for (i, type_name), reply in zip(wanted, replies, strict=True):
            if error_text(reply) is not None:
                read.unreadable.add(i)
                continue
            read.digests[i] = data_digest(type_name, whole_data(type_name, reply))
            read.canonical.add(i)


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
    if bad:
        ok[list(bad)] = False
    return ok
