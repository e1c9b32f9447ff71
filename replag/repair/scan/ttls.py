"""How a scan reads TTLs (`TtlSource`): the cheapest way the replica allows.

TTLs cost the server as much as a third of the values' read, so they are
fetched not at all where INFO says the database holds no key with an expiry,
else with one PTTL per key, pipelined in the batch's write after its MGET.
That costs the server less than a script calling PTTL per key, even one that
returns only the keys that have an expiry (Redis 7.0, 300,000 × 1 KB keys, server
CPU over the values' read: +0.10 s per PTTL, +0.16 s by that script with 46 keys
expiring; +0.20 s and +0.23 s with 10 % expiring), and the reply per key costs this
side little when taken in bulk (`BlockingConnection.replies`). The script
(`TTL_SCRIPT`) stays for whoever asks for it (`ttls="script"`) and for reads of
peers' keys (`peer_read`).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

from replag.topology import Endpoint
from replag.wire import shapes
from replag.wire.resp import check_replies, pack

# Per batch: the 1-based position and PTTL of every key that has an expiry (or is
# gone: -2), as a flat list. A key without one costs the server no reply.
TTL_SCRIPT = b"""local out = {}
for i, key in ipairs(KEYS) do
  local ttl = redis.call('PTTL', key)
  if ttl ~= -1 then
    out[#out + 1] = i
    out[#out + 1] = ttl
  end
end
return out"""
TtlSource = Literal["none", "script", "pttl"]
# Asked of a replica before its scan: whether it holds expiring keys.
TTL_PROBE = pack(b"INFO", b"keyspace")
LOAD_TTL_SCRIPT = pack(b"SCRIPT", b"LOAD", TTL_SCRIPT)


def batch_ttls(
    replies: list[object], n: int, source: TtlSource, endpoint: Endpoint
) -> npt.NDArray[np.int64]:
    """PTTL per key (-1: no expiry, -2: gone) from a batch's replies after its MGET, each
    of its shape first (the MGET's too: `shapes`, at the door, before any is used)."""
    shapes.check_values(endpoint, replies[0], n)
    if source == "pttl":
        if not shapes.check_each(endpoint, "PTTL", replies[1:]):
            check_replies(replies[1:], endpoint)
        return np.array(replies[1:], dtype=np.int64)
    ttls = np.full(n, -1, dtype=np.int64)
    if source == "script":
        check_replies(replies[1:2], endpoint)  # NOSCRIPT after a SCRIPT FLUSH: fail, resumable
        shapes.check_int_pairs(endpoint, "EVALSHA", replies[1])
        flat = np.array(replies[1], dtype=np.int64)
        if len(flat):
            low, high = int(flat[0::2].min()), int(flat[0::2].max())
            shapes.check_indexes(endpoint, "EVALSHA", low, high, n)
        ttls[flat[0::2] - 1] = flat[1::2]
    return ttls


def ttl_source_from_info(keyspace: object, db: int) -> TtlSource:
    """How a scan with `ttls="auto"` reads TTLs, from the reply to `TTL_PROBE`."""
    return "none" if _expiring_keys(keyspace, db) == 0 else "pttl"


def _expiring_keys(info: object, db: int) -> int | None:
    """`expires=` of `db` in INFO keyspace (0 when the db has no keys), None if unreadable."""
    if not isinstance(info, bytes):
        return None
    prefix = b"db%d:" % db
    for line in info.splitlines():
        if line.startswith(prefix):
            for field in line[len(prefix) :].split(b","):
                name, _, value = field.partition(b"=")
                if name == b"expires" and value.isdigit():
                    return int(value)
            return None
    return 0
