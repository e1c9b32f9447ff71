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

from replag.repair.bulk.peer_read import WRITES_PROBE, Writes, writes_of
from replag.repair.bulk.source_keys import SourceKeys
from replag.repair.keyspace.together import all_of
from replag.repair.scan.scanner import without_prefix
from replag.topology import Endpoint
from replag.wire.resp import RespConnection, pack

SCAN_COUNT = 1000


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
