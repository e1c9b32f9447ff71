"""Every member of the groups a run compares must answer before anything is scanned.

A check that scans two healthy replicas for minutes and then fails on the third
wastes the scans and leaves a half-done run; one PING per member first costs a
round trip each and fails in a second, naming every member that did not answer.
The same goes for ACL permissions: each member's user is checked for what the
run will do (`replag.wire.permissions`), before any scan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from replag.errors import EndpointError
from replag.repair.keyspace.together import all_of
from replag.topology import Endpoint, ReplicaGroup
from replag.wire.permissions import Mode, require
from replag.wire.resp import RespConnection, pack


async def _ping(member: Endpoint, timeout_s: float) -> EndpointError | None:
    try:
        conn = await RespConnection.open(member, timeout_s=timeout_s)
    except EndpointError as exc:
        return exc
    try:
        conn.check(await conn.request(pack(b"PING"), 1))
    except EndpointError as exc:
        return exc
    finally:
        await conn.close()
    return None


async def _permitted(
    member: Endpoint, timeout_s: float, mode: Mode, prefix: str, advise: Mode | None
) -> EndpointError | None:
    try:
        await require(
            member, mode, prefix=prefix, timeout_s=timeout_s, what=f"a {mode}", advise=advise
        )
    except EndpointError as exc:
        return exc
    return None


async def members_reachable(
    groups: Sequence[ReplicaGroup],
    *,
    timeout_s: float,
    through_agent: Callable[[Endpoint], bool] = lambda _: False,
    mode: Mode | None = None,
    prefix: str = "replag:probe:",
    advise: Mode | None = None,
) -> None:
    """Connect (AUTH, SELECT) and PING every member at once, and check its user may do
    what `mode` does (check or repair; a refusal suggests `advise`'s recipe, the mode the
    process runs in, when given); raise the first failure as an
    EndpointError that names the others that failed too. Members read through their
    region's agent are left to it (the tree walk names them if it fails)."""
    members = list({m.name: m for g in groups for m in g.members if not through_agent(m)}.values())
    answers = await all_of(_ping(m, timeout_s) for m in members)
    failures = [f for f in answers if f is not None]
    if not failures and mode is not None:  # once every member answers
        answers = await all_of(_permitted(m, timeout_s, mode, prefix, advise) for m in members)
        failures = [f for f in answers if f is not None]
    if not failures:
        return
    first = failures[0]
    message = first.message
    if len(failures) > 1:
        message += "; also failing: " + ", ".join(str(f.where) for f in failures[1:])
    message += f" (all {len(members)} members are checked before any scan: nothing was scanned)"
    raise type(first)(message, where=first.where)
