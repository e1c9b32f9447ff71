"""The one door to an endpoint: a `Connector` opens every connection to it.

It owns what applies to every exchange with the endpoint: its TLS context (made once),
its limits (`endpoint.limits`: each reply, INFO's size and lines, bytes unrequested,
nodes per topology answer), its timeout, and what the server is (kind, version and
modules, learned once from INFO server). Every reply read through a connection it
opens is checked against its command's shape (`shapes`). A host a server's answer
names is reached only through `derived`, which `Reach` must admit first. A component
is handed a Connector (or builds one from the endpoint it is given), never the config.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from replag.topology import Endpoint
from replag.wire.connections import async_client, tls_context
from replag.wire.reach import Reach
from replag.wire.reply_limits import ReplyLimits
from replag.wire.resp import Arg, Clock, PushHandler, RespConnection

if TYPE_CHECKING:
    import redis.asyncio as aioredis


class Connection(Protocol):
    """What components use of a connection (`RespConnection` is the one implementation)."""

    endpoint: Endpoint

    async def request(
        self, payload: bytes, count: int, timeout_s: float | None = None
    ) -> list[Any]: ...

    async def checked(self, *args: Arg) -> Any: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class ServerFacts:
    """What a server said it is (INFO server), learned once per Connector."""

    kind: str  # redis | valkey | unknown
    version: tuple[int, ...]
    modules: tuple[str, ...] = ()

    def at_least(self, *version: int) -> bool:
        return self.version >= version

    @classmethod
    def from_info(cls, text: bytes) -> ServerFacts:
        fields: dict[str, str] = {}
        for line in text.decode("utf-8", "replace").splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        kind = "valkey" if "valkey_version" in fields else "redis"
        raw = fields.get("valkey_version") or fields.get("redis_version") or ""
        parts = tuple(int(p) for p in raw.split(".") if p.isdigit())
        return cls(kind=kind if parts else "unknown", version=parts)


class Connector:
    """Opens connections to `endpoint`; `timeout_s` bounds each exchange."""

    def __init__(self, endpoint: Endpoint, *, timeout_s: float) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._tls: ssl.SSLContext | None = tls_context(endpoint)
        self._facts: ServerFacts | None = None

    def __repr__(self) -> str:
        return f"Connector({self.endpoint.name} {self.endpoint.url()})"

    @property
    def limits(self) -> ReplyLimits:
        return self.endpoint.limits

    @property
    def tls(self) -> ssl.SSLContext | None:
        return self._tls

    async def open(
        self, *, clock: Clock = time.time_ns, on_push: PushHandler | None = None
    ) -> RespConnection:
        """A RESP connection, authenticated and on the endpoint's db."""
        return await RespConnection.open(
            self.endpoint, timeout_s=self.timeout_s, clock=clock, on_push=on_push
        )

    def client(self, *, single_connection: bool = False) -> aioredis.Redis:
        """A redis-py client (admin, discovery), its replies guarded and shape-checked."""
        return async_client(
            self.endpoint, timeout_s=self.timeout_s, single_connection=single_connection
        )

    async def call(self, *args: Arg) -> Any:
        """One command on a connection of its own (closed after), its reply checked."""
        conn = await self.open(clock=time.monotonic_ns)
        try:
            return await conn.checked(*args)
        finally:
            await conn.close()

    async def facts(self) -> ServerFacts:
        """What the server is, asked once (INFO server)."""
        if self._facts is None:
            self._facts = ServerFacts.from_info(await self.call("INFO", "server"))
        return self._facts

    def derived(
        self, host: str, port: int, *, reach: Reach, named_by: str, as_what: str
    ) -> Connector:
        """A Connector for a host this server's answer named, with this endpoint's
        credentials and limits, if `reach` admits it (OutsideReach if not)."""
        endpoint = replace(self.endpoint, name=f"{host}:{port}", host=host, port=port)
        reach.admit(endpoint, named_by=named_by, as_what=as_what)
        return Connector(endpoint, timeout_s=self.timeout_s)


def connectors(endpoints: Sequence[Endpoint], *, timeout_s: float) -> dict[str, Connector]:
    """One Connector per endpoint, by name."""
    return {ep.name: Connector(ep, timeout_s=timeout_s) for ep in endpoints}


__all__ = ["Connection", "Connector", "ServerFacts", "connectors"]
