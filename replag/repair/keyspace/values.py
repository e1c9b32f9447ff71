"""Reading whole values of any type in pipelined chunks, as digests or as data.

Large collections are read with HSCAN/SSCAN/ZSCAN (COUNT `chunk`), LRANGE
ranges and XRANGE pages; every key still being read gets one chunk command
per round, and a round is one pipelined write. Each page is folded into the
key's digest as it arrives (`UnorderedDigest`, `OrderedDigest`) and dropped,
so memory does not grow with a collection unless the data is asked for
(`keep`). SCAN-family commands may return an element twice, so the first
round also asks HLEN/SCARD/ZCARD: a count that does not match means the key
moved (or was resized) while being read, and the read counts as changed.

Where asked (`field_ttls`), a hash's fields' TTLs are read with it (`FieldExpiries`): a
field the server says has expired is absent, as HSCAN already leaves it out. HLEN
still counts such a field until the server reclaims it (a replica never does), so a
hash that may hold field TTLs and reads fewer fields than HLEN says is read once more:
the same fields, values and TTLs twice is the hash as it is, not a hash changing.

Vector sets (`vector_sets`) and RedisJSON documents (`json_values`) are read by
their content in the same rounds. Any other type (a module's) is `opaque`: its
type and expiry are known, its value is not compared. No server digest stands in
for it: DEBUG DIGEST-VALUE is refused unless enable-debug-command allows it, and
where it runs, FalkorDB's `graphdata` answers one digest for every graph (Redis 8.2.3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hiredis import ReplyError

from replag.repair.keyspace import json_values, vector_sets
from replag.repair.keyspace.digest import OrderedDigest, UnorderedDigest, string_digest
from replag.repair.keyspace.field_ttls import PLAIN_ENCODINGS, FieldExpiries
from replag.wire import reply_limits
from replag.wire.reply_limits import ReplyLimits
from replag.wire.resp import RespConnection, pack

StreamEntry = tuple[bytes, list[bytes]]
Data = (
    bytes | dict[bytes, bytes] | set[bytes] | dict[bytes, float] | list[bytes] | list[StreamEntry]
)

# Elements a collection's first page asks for, their size unknown (then `chunk`, or
# fewer where their size says so).
_FIRST_PAGE = 100
_SCAN = {"hash": b"HSCAN", "set": b"SSCAN", "zset": b"ZSCAN"}
_CARD = {"hash": b"HLEN", "set": b"SCARD", "zset": b"ZCARD"}


def string_page(limits: ReplyLimits) -> int:
    """The most bytes one read of a string (GETRANGE) asks for: half of max_reply_bytes,
    so that a reply never breaks the limit (the rest of a longer string in more pages)."""
    return max(1, limits.max_bytes // 2)


@dataclass(frozen=True)
class ReadValue:
    """A key's value as read: its type, canonical digest and (if kept) the data; or,
    `opaque`, why its value could not be read (its digest then means nothing)."""

    type: str
    digest: int
    data: Data | None = None
    # A hash's fields that have a TTL (None: none has, or they were not asked for).
    field_expiries: FieldExpiries | None = None
    opaque: str | None = None


class _Reader:
    """The state of one key being read chunk by chunk."""

    def __init__(
        self,
        key: bytes,
        type_name: str,
        chunk: int,
        keep: bool,
        limits: ReplyLimits = reply_limits.DEFAULT,
        field_ttls: bool = False,
    ) -> None:
        self.key, self.type, self.chunk, self.keep = key, type_name, chunk, keep
        self.limits = limits
        # A hash whose fields may have TTLs: its encoding is asked with its HLEN, and
        # unless plain, each page's fields' TTLs with the next page (`held` till then).
        self.field_ttls = field_ttls and type_name == "hash"
        self.volatile = False
        self.held: tuple[list[bytes], list[bytes]] | None = None
        self.scanned = False
        self.expiring: list[tuple[bytes, int]] = []  # the fields with a TTL, and their TTLs
        self.confirm: tuple[int, int, int, int] | None = None
        self.cursor: bytes = b"0"
        self.start = 0
        self.done = False
        self.failed = False
        self.card: int | None = None  # HLEN/SCARD/ZCARD, asked with the first page
        self.asked = chunk  # the COUNT (or range) of the last page asked
        self.bytes = 0  # of the elements read so far, to size the pages by
        self.elements = 0
        self.pairs: dict[bytes, Any] = {}
        self.members: set[bytes] = set()
        self.items: list[Any] = []
        self.ordered = OrderedDigest(type_name.encode())
        self.unordered = UnorderedDigest(type_name.encode())

    @property
    def replies(self) -> int:
        """Replies the next `command()` produces."""
        if self.type not in _SCAN:
            return 1
        first = (2 if self.field_ttls else 1) if self.card is None else 0
        return first + (self.held is not None) + (not self.scanned)

    def _count(self) -> int:
        """Elements the next page asks for: `chunk`, fewer while their size is unknown
        (`_FIRST_PAGE`) or where `chunk` of them would pass a quarter of max_reply_bytes."""
        if not self.elements:
            return min(self.chunk, _FIRST_PAGE)
        per_element = max(1.0, self.bytes / self.elements)
        fit = int(self.limits.max_bytes / 4 / per_element)
        return max(1, min(self.chunk, fit))

    def _sized(self, items: Sequence[Any], elements: int) -> None:
        self.bytes += sum(map(len, items))
        self.elements += elements

    def command(self) -> bytes:
        k = self.key
        n = self.asked = self._count()
        if self.type == "string":  # in pages of half of what one reply may carry
            return pack(b"GETRANGE", k, self.start, self.start + string_page(self.limits) - 1)
        if self.type in _SCAN:
            out = b""
            if self.card is None:
                out = pack(_CARD[self.type], k)
                if self.field_ttls:
                    out += pack(b"OBJECT", b"ENCODING", k)
            if self.held is not None:
                names = self.held[0]
                out += pack(b"HPEXPIRETIME", k, b"FIELDS", len(names), *names)
            if not self.scanned:
                out += pack(_SCAN[self.type], k, self.cursor, b"COUNT", n)
            return out
        if self.type == "list":
            return pack(b"LRANGE", k, self.start, self.start + n - 1)
        # Streams: "(" makes the start exclusive (Redis >= 6.2).
        return pack(b"XRANGE", k, self.cursor, b"+", b"COUNT", n)

    def feed(self, replies: list[Any]) -> None:
        if _any_error(replies) or (replies[0] is None and self.type == "string"):
            # WRONGTYPE or gone: the key changed under us; the caller re-reads it later.
            self.failed = self.done = True
            return
        if self.type in _SCAN:
            at = 0
            if self.card is None:
                self.card = int(replies[0])
                if not self.card:  # gone since its TYPE was read (collections are never empty)
                    self.failed = self.done = True
                    return
                at = 1
                if self.field_ttls:
                    self.volatile = replies[1] not in PLAIN_ENCODINGS
                    at = 2
            if self.held is not None:
                self._expiries(replies[at])
                at += 1
            if not self.scanned:
                self._page(*replies[at])
            if self.scanned and self.held is None:
                self._finished()
            return
        reply = replies[0]
        if self.type == "string":
            self.items.append(reply)
            self.start += len(reply)
            self.done = len(reply) < string_page(self.limits)
            if not self.done and self.start >= self.limits.max_string_bytes:
                # A server claiming a string longer than any: read no further (counted
                # as changed, so the key is named, never taken as equal).
                self.failed = self.done = True
        elif self.type == "list":
            for item in reply:
                self.ordered.add(item)
            if self.keep:
                self.items.extend(reply)
            self.start += len(reply)
            self._sized(reply, len(reply))
            self.done = len(reply) < self.asked
        else:
            for entry_id, fields in reply:
                self.ordered.add(entry_id, *fields)
                self._sized(fields, 1)
                if self.keep:
                    self.items.append((entry_id, list(fields)))
            if reply:
                self.cursor = b"(" + reply[-1][0]
            self.done = len(reply) < self.asked

    def _page(self, cursor: bytes, flat: list[bytes]) -> None:
        self._sized(flat, len(flat) if self.type == "set" else len(flat) // 2)
        self.cursor = cursor
        self.scanned = cursor == b"0"
        if self.volatile:
            if flat:
                self.held = (flat[0::2], flat[1::2])  # digested once their TTLs are known
            return
        if self.type == "set":
            self.unordered.add_set_page(flat)
            if self.keep:
                self.members.update(flat)
        else:
            names, values = flat[0::2], flat[1::2]
            if self.type == "hash":
                self.unordered.add_hash_page(names, values)
                if self.keep:
                    self.pairs.update(zip(names, values, strict=True))
            else:
                scores = list(map(float, values))
                self.unordered.add_zset_page(names, scores)
                if self.keep:
                    self.pairs.update(zip(names, scores, strict=True))

    def _expiries(self, reply: Any) -> None:
        """The held page's fields' TTLs (absolute ms on the server's clock, as replication
        carries them): an expired field (-2) is absent; then the page is digested. Plain
        integers: a page of a few fields (the common hash) costs no array here."""
        assert self.held is not None
        names, values = self.held
        self.held = None
        if not isinstance(reply, list) or len(reply) != len(names):
            self.failed = self.done = True
            return
        if -2 in reply:
            kept = [i for i, t in enumerate(reply) if t != -2]
            names, values = [names[i] for i in kept], [values[i] for i in kept]
            reply = [reply[i] for i in kept]
        if max(reply, default=-1) >= 0:
            self.expiring.extend((n, t) for n, t in zip(names, reply, strict=True) if t >= 0)
        self.unordered.add_hash_page(names, values)
        if self.keep:
            self.pairs.update(zip(names, values, strict=True))

    def _finished(self) -> None:
        self.done = True
        if self.failed or self.unordered.count == self.card:
            return
        assert self.card is not None
        if not self.volatile or self.unordered.count > self.card:
            self.failed = True  # an element seen twice, or the key changed meanwhile
            return
        # Fewer fields than HLEN in a hash with field TTLs: expired ones the server has
        # not reclaimed yet, or a change meanwhile. The same read twice says which.
        expiries = self._field_expiries()
        seen = (
            self.unordered.digest(),
            self.unordered.count,
            self.card,
            expiries.bucket_digest(1) if expiries is not None else 0,
        )
        if self.confirm is None:
            self.confirm = seen
            self.cursor, self.card, self.scanned, self.done = b"0", None, False, False
            self.unordered = UnorderedDigest(self.type.encode())
            self.pairs, self.expiring = {}, []
        elif self.confirm != seen:
            self.failed = True

    def _field_expiries(self) -> FieldExpiries | None:
        if not self.expiring:
            return None
        names, times = zip(*self.expiring, strict=True)
        return FieldExpiries.of(names, times, every_name=self.keep)

    def result(self) -> ReadValue | None:
        if self.failed:
            return None
        if self.type == "string":
            value: bytes = b"".join(self.items)
            return ReadValue("string", string_digest(value), value if self.keep else None)
        if self.type in _SCAN:
            data: Data | None = None
            if self.keep:
                data = self.members if self.type == "set" else self.pairs
            return ReadValue(self.type, self.unordered.digest(), data, self._field_expiries())
        return ReadValue(self.type, self.ordered.digest(), self.items if self.keep else None)


def _any_error(replies: list[Any]) -> bool:
    """Whether any of a command's replies is an error (hiredis's own class: its Reader makes
    no other; no generator, as this runs for every reply of every key read)."""
    return ReplyError in map(type, replies)


SUPPORTED_TYPES = ("string", "hash", "set", "zset", "list", "stream")
# Types read by their content besides those (never kept: no typed write rebuilds them).
CONTENT_TYPES = (vector_sets.TYPE, json_values.TYPE)
_ContentReader = vector_sets.VectorSetReader | json_values.JsonReader


def opaque_value(type_name: str) -> ReadValue:
    """A value of `type_name`, not one replag reads: not compared, and why."""
    return ReadValue(type_name, 0, opaque=f"a {type_name} value: no command reads it whole")


def _content_reader(key: bytes, type_name: str, chunk: int, limits: ReplyLimits) -> _ContentReader:
    if type_name == vector_sets.TYPE:
        return vector_sets.VectorSetReader(key, chunk, limits)
    return json_values.JsonReader(key, limits)


def _content_result(reader: _ContentReader) -> ReadValue | None:
    if reader.opaque is not None:
        return ReadValue(reader.type, 0, opaque=reader.opaque)
    return None if reader.failed else ReadValue(reader.type, reader.digest)


async def read_values(
    conn: RespConnection,
    typed_keys: Sequence[tuple[bytes, str]],
    *,
    chunk: int = 1000,
    keep: bool = False,
    field_ttls: bool = False,
) -> dict[bytes, ReadValue | None]:
    """Read every (key, type); None for a key that vanished or changed type meanwhile.
    `field_ttls`: hashes with their fields' TTLs (a server that has them).

    A type replag does not read (a module type) raises nothing: it gets an `opaque`
    ReadValue.
    """
    limits = conn.endpoint.limits
    readers = [
        _Reader(k, t, chunk, keep, limits, field_ttls)
        for k, t in typed_keys
        if t in SUPPORTED_TYPES
    ]
    content = [_content_reader(k, t, chunk, limits) for k, t in typed_keys if t in CONTENT_TYPES]
    out: dict[bytes, ReadValue | None] = {
        k: None if t in SUPPORTED_TYPES or t in CONTENT_TYPES else opaque_value(t)
        for k, t in typed_keys
    }
    active: list[_Reader | _ContentReader] = [*readers, *content]
    while active:
        counts = [r.replies for r in active]
        payload = b"".join(r.command() for r in active)
        replies = await conn.request(payload, sum(counts))
        at = 0
        for reader, count in zip(active, counts, strict=True):
            reader.feed(replies[at : at + count])
            at += count
        active = [r for r in active if not r.done]
    for reader in readers:
        out[reader.key] = reader.result()
    for other in content:
        out[other.key] = _content_result(other)
    return out
