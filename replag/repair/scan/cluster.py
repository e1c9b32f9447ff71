"""Reading a scan batch on a Redis Cluster node (`Endpoint.cluster`, read with READONLY).

A node refuses an MGET across slots (CROSSSLOT). Where SCAN walks the node slot
by slot (Redis 7.2+ and Valkey keep a table per slot) and slots hold many keys,
a batch spans one or two slots (five of its keys, spread over it, say so): it is
read with one MGET per slot it holds. Elsewhere (Redis 7.0 and older hash every
key into one table, so a batch holds about one key per slot; or sparse slots)
with a GET per key, pipelined. Measured (benchmarks/cluster_scan.py): on dense
slots an MGET per slot cost the server 17% less CPU per key than a GET per key,
in the same time; on sparse ones (Redis 7.0) it took twice the time and 20% more
CPU. A key that answers MOVED or ASK (its slot moved, or is migrating, since SCAN
named it) is left out of the index, as keys gone are: the check names such
slots (`slots`).
"""

from __future__ import annotations

from typing import Any

from replag.repair.keyspace.slots import is_moved, key_slot, slot_groups
from replag.repair.scan.ttls import TtlSource
from replag.wire.resp import error_text, pack_over_keys, pack_per_key


def cluster_fetch_request(keys: list[bytes], source: TtlSource) -> tuple[bytes, int]:
    """One pipelined write (and how many replies it gets): an MGET per slot or a GET per
    key, and the batch's TTLs as `source` says (`cluster_batch_replies` gives their
    replies one MGET's shape)."""
    groups = _slot_groups(keys)
    if groups is None:
        reads, count = pack_per_key(b"GET", keys), len(keys)
    else:
        reads = b"".join(pack_over_keys([keys[i] for i in g], (b"MGET",)) for g in groups)
        count = len(groups)
    if source == "none":
        return reads, count
    return reads + pack_per_key(b"PTTL", keys), count + len(keys)


def cluster_batch_replies(
    keys: list[bytes], replies: list[Any], source: TtlSource
) -> tuple[list[bytes], list[Any]]:
    """A batch's keys and replies as one MGET and its TTLs give them: the GETs as one
    list (nil for a key of another type: WRONGTYPE), and the keys that answered MOVED
    or ASK (served elsewhere now) left out, as keys gone are."""
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


def _slot_groups(keys: list[bytes]) -> list[list[int]] | None:
    """A Cluster batch's keys by slot where SCAN walked dense slots in order (five keys
    spread over the batch lie in at most two slots); None elsewhere: then a GET per key
    costs less."""
    if not keys:
        return None
    n = len(keys)
    sampled = {key_slot(keys[i]) for i in (0, n // 4, n // 2, 3 * n // 4, n - 1)}
    return slot_groups(keys) if len(sampled) <= 2 else None
