"""Asking Redis Sentinel: where a master is, its replicas, the other Sentinels.

Sentinels are asked in the order given; the first that answers wins (they
agree once a failover has ended). Replies are flat `[field, value, …]` arrays,
read into dicts of text. Errors name the Sentinel; all of them failing is one
`UnreachableError` listing each.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replag.errors import EndpointError, UnreachableError
from replag.topology import Endpoint
from replag.wire.connector import Connector
from replag.wire.resp import Arg


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def flat_dict(entry: Sequence[Any]) -> dict[str, str]:
    """`[b"name", b"mymaster", b"ip", …]` → {"name": "mymaster", "ip": …}."""
    items = [_text(v) for v in entry]
    return dict(zip(items[::2], items[1::2], strict=False))


async def sentinel_call(sentinel: Endpoint, *args: Arg, timeout_s: float) -> Any:
    """One command to one Sentinel (EndpointError naming it on failure or an error reply)."""
    return await Connector(sentinel, timeout_s=timeout_s).call(*args)


async def ask_sentinels(
    sentinels: Sequence[Endpoint], *args: Arg, timeout_s: float
) -> tuple[Any, Endpoint]:
    """The first answer any of `sentinels` gives, and who gave it."""
    if not sentinels:
        raise UnreachableError("no Sentinel to ask")
    failures = []
    for sentinel in sentinels:
        try:
            return await sentinel_call(sentinel, *args, timeout_s=timeout_s), sentinel
        except EndpointError as exc:
            failures.append(str(exc))
    raise UnreachableError("no Sentinel answered: " + "; ".join(failures))


async def master_address(
    sentinels: Sequence[Endpoint], master: str, *, timeout_s: float
) -> tuple[str, int] | None:
    """Where the Sentinels say `master` is now; None if they do not know that name."""
    answer, _ = await ask_sentinels(
        sentinels, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", master, timeout_s=timeout_s
    )
    if not answer:
        return None
    host, port = _text(answer[0]), int(_text(answer[1]))
    return host, port


async def masters(sentinel: Endpoint, *, timeout_s: float) -> list[dict[str, str]]:
    """`SENTINEL MASTERS`: every master this Sentinel monitors."""
    answer = await sentinel_call(sentinel, "SENTINEL", "MASTERS", timeout_s=timeout_s)
    return [flat_dict(entry) for entry in answer]


async def replicas(sentinel: Endpoint, master: str, *, timeout_s: float) -> list[dict[str, str]]:
    """`SENTINEL REPLICAS name` (Sentinel 5+)."""
    answer = await sentinel_call(sentinel, "SENTINEL", "REPLICAS", master, timeout_s=timeout_s)
    return [flat_dict(entry) for entry in answer]


async def other_sentinels(
    sentinel: Endpoint, master: str, *, timeout_s: float
) -> list[dict[str, str]]:
    """`SENTINEL SENTINELS name`: the other Sentinels monitoring `master`."""
    answer = await sentinel_call(sentinel, "SENTINEL", "SENTINELS", master, timeout_s=timeout_s)
    return [flat_dict(entry) for entry in answer]
