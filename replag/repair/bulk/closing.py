"""What a rebuild's closing pass looks at: the keys its copy handed back, and the keys
other members hold that the source's scan never returned.

A copy verified `repair_settle` after its write stands: every client write reaches
every replica within that time, so what a client writes to a key after its batch was
verified reaches the rebuilt replica too. What the copy did not settle is what it
handed back (present on the target, disagreed on, changed while copied, big and not
copied). What the source's SCAN cannot show is a key the source lacks: the other
peers are walked by name (SCAN alone, no values) and their keys looked up among the
source's, by 64-bit hash (`SourceKeys`). Those two lists, and nothing else, go to the
key-by-key verify-and-repair path.

A peer nothing wrote to during the copy (its write counters unchanged: every write,
delete, expiry and eviction moves one; `peer_read.write_counters`) that holds
exactly as many keys as the copy read on it, all of them source keys, holds no other
key: its walk is skipped (`quiet`). Keys only the rebuilt replica holds are not looked
for (the next check reports them; deletes are off unless asked for).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from replag.repair.bulk.peer_read import WRITES_PROBE, Writes, writes_of
from replag.repair.keyspace.native import hash_each
from replag.repair.keyspace.together import all_of
from replag.repair.scan.scanner import without_prefix
from replag.topology import Endpoint
from replag.wire.resp import RespConnection, pack

SCAN_COUNT = 1000


class SourceKeys:
    """The hashes of every key the source's scan returned (8 bytes a key)."""

    def __init__(self) -> None:
        self._parts: list[npt.NDArray[np.uint64]] = []
        self._sorted: npt.NDArray[np.uint64] | None = None

    def __len__(self) -> int:
        return sum(len(p) for p in self._parts)

    def add(self, keys: list[bytes]) -> None:
        if keys:
            self._parts.append(hash_each(keys).copy())
            self._sorted = None

    def _ordered(self) -> npt.NDArray[np.uint64]:
        if self._sorted is None:
            joined = np.concatenate(self._parts) if self._parts else np.zeros(0, np.uint64)
            self._sorted = np.sort(joined)  # (np.unique hashes: 4x slower; repeats are fine)
            self._parts = [self._sorted]
        return self._sorted

    def repeats(self) -> bool:
        """Whether the scan returned some key twice (SCAN may, while the table grows)."""
        ordered = self._ordered()
        return bool(len(ordered) > 1 and not np.all(np.diff(ordered)))

    def lacks(self, keys: list[bytes]) -> list[bytes]:
        """Those of `keys` the source's scan did not return."""
        if not keys:
            return []
        self._sorted = self._ordered()
        hashes = hash_each(keys)
        at = np.searchsorted(self._sorted, hashes)
        at[at >= len(self._sorted)] = 0
        found = self._sorted[at] == hashes if len(self._sorted) else np.zeros(len(keys), np.bool_)
        return [k for k, seen in zip(keys, found, strict=True) if not seen]


async def writes_seen(endpoint: Endpoint, timeout_s: float) -> tuple[Writes, int]:
    """`endpoint`'s write counters (`peer_read.write_counters`: they move when anything
    writes, deletes, expires or evicts a key there) and its DBSIZE."""
    conn = await RespConnection.open(endpoint, timeout_s=timeout_s)
    try:
        persistence, stats, size = await conn.request(WRITES_PROBE + pack(b"DBSIZE"), 3)
        conn.check([size])
    finally:
        await conn.close()
    return writes_of(persistence, stats), int(size)


def quiet(before: tuple[Writes, int], after: tuple[Writes, int], held: int) -> bool:
    """Whether a peer provably holds no key but the `held` source keys the copy read on it:
    nothing written to it meanwhile, and as many keys as those."""
    return before[0] is not None and before[0] == after[0] and after[1] == held


async def keys_elsewhere(
    members: Sequence[Endpoint],
    source: SourceKeys,
    *,
    prefix: bytes,
    timeout_s: float,
) -> list[bytes]:
    """Keys `members` hold that `source` lacks, each once, sorted."""

    async def one(member: Endpoint) -> list[bytes]:
        found: list[bytes] = []
        conn = await RespConnection.open(member, timeout_s=timeout_s)
        try:
            cursor = b"0"
            while True:
                ((cursor, keys),) = await conn.request(
                    pack(b"SCAN", cursor, b"COUNT", SCAN_COUNT), 1
                )
                found += source.lacks(without_prefix(keys, prefix))
                if cursor == b"0":
                    return found
        finally:
            await conn.close()

    lists = await all_of(one(m) for m in members)
    return sorted({k for keys in lists for k in keys})
