"""Copies that carry everything they copy, or none: the refusal of a key replag cannot
copy whole to a target.

A repair never writes a value it could not read whole, nor onto a server that would
keep less of it than its source holds: a hash whose fields have TTLs onto a server
without hash-field TTLs (Redis < 7.4, Valkey < 9) would make fields meant to expire
live for ever. Such a key is refused (`KeyRefused`, naming the replica and why), which
the run reports by key as that key's error, and nothing is written.
"""

from __future__ import annotations

from replag.errors import KeyRefused
from replag.repair.keyspace.field_ttls import server_has_field_ttls
from replag.repair.keyspace.observe import KeyState
from replag.wire.resp import RespConnection

NOT_WHOLE = "; not copied (a copy would hold less than its source)"


def refuse_copy(key: bytes, where: str, why: str) -> KeyRefused:
    """The refusal of a copy of `key` to `where`: `why`, and that nothing was written."""
    return KeyRefused(f"{key!r}: {why}{NOT_WHOLE}", where=where)


async def require_whole_copy(target: RespConnection, key: bytes, state: KeyState) -> None:
    """KeyRefused unless `target` can hold everything `state` holds (each hash field's
    TTL: a server with HPEXPIRE)."""
    expiries = state.field_expiries
    if expiries is not None and not await server_has_field_ttls(target):
        raise refuse_copy(
            key,
            target.endpoint.name,
            f"a hash with {len(expiries)} field TTL(s), and this server keeps no field "
            "TTLs (HPEXPIRE: Redis 7.4+, Valkey 9+)",
        )
