"""Trees kept by region agents, seen from the coordinator: the wire format and the client.

A member whose region runs a `replag agent` is compared through it. What
travels: node values as raw little-endian uint64 (8 bytes a node; a JSON
number would be 20); a leaf's keys as a `ScanIndex` in its checkpoint form
(hashes, entries, name lengths, names); key names in JSON as base64 (keys are
bytes); a key state as `null` (absent) or `[type, digest hex or null, expiry
ms or null]`, the expiry absolute on the agent's clock, as `KeyState` has it.

`AgentClient` turns every failure into an `AgentError` naming the agent:
unreachable or dead (refused, reset, timed out), token refused (401/403), tree
not current (503, with the agent's reason), or an answer that does not parse.
It counts the bytes of the HTTP bodies and headers it receives, per replica:
with agents, that is what crosses the WAN for a check. `AgentPool` holds one
client per agent URL of the config.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from replag.config import Config
from replag.errors import AgentError, KeyRefused
from replag.repair.guarded_write import Write
from replag.repair.observe import ABSENT, KeyState
from replag.repair.scan_index import ScanIndex
from replag.topology import Endpoint

if TYPE_CHECKING:
    import aiohttp

U64 = npt.NDArray[np.uint64]
PREFIX = "/agent/v1"
# Response headers describing how a tree was built: the coordinator refuses to compare
# trees whose entries were hashed with other settings.
DEPTH_HEADER = "X-Replag-Tree-Depth"
BUCKET_HEADER = "X-Replag-Ttl-Bucket-Ms"
KEYS_HEADER = "X-Replag-Tree-Keys"
# How many levels below the asked nodes an `auto` nodes answer went (`walk.first_down`).
DOWN_HEADER = "X-Replag-Nodes-Down"


def u64_bytes(values: U64) -> bytes:
    return np.asarray(values, np.uint64).astype("<u8").tobytes()


def u64_from(data: bytes, count: int, *, where: str) -> U64:
    if len(data) != 8 * count:
        raise AgentError(f"expected {count} tree nodes, got {len(data)} bytes", where=where)
    return np.frombuffer(data, "<u8").astype(np.uint64)


def keys_to_wire(keys: Iterable[bytes]) -> list[str]:
    return [base64.b64encode(k).decode("ascii") for k in keys]


def keys_from_wire(items: Sequence[str]) -> list[bytes]:
    return [base64.b64decode(item, validate=True) for item in items]


def state_to_wire(state: KeyState) -> list[Any] | None:
    """`[type, digest, expiry]`, plus `{data, fields}` when the state carries a string's
    value or hash fields (base64), which only a newest:FIELD policy asks for."""
    if not state.exists:
        return None
    digest = f"{state.digest:016x}" if state.digest is not None else None
    out: list[Any] = [state.type, digest, state.expiry_ms]
    extra: dict[str, Any] = {}
    if isinstance(state.data, bytes):
        extra["data"] = base64.b64encode(state.data).decode("ascii")
    if state.fields:
        extra["fields"] = {
            base64.b64encode(k).decode("ascii"): base64.b64encode(v).decode("ascii")
            for k, v in state.fields.items()
        }
    if extra:
        out.append(extra)
    return out


def state_from_wire(item: Any, *, where: str) -> KeyState:
    if item is None:
        return ABSENT
    try:
        type_name, digest, expiry, *rest = item
        extra: dict[str, Any] = rest[0] if rest else {}
        fields = extra.get("fields")
        return KeyState(
            True,
            str(type_name),
            int(digest, 16) if digest is not None else None,
            int(expiry) if expiry is not None else None,
            base64.b64decode(extra["data"]) if "data" in extra else None,
            {base64.b64decode(k): base64.b64decode(v) for k, v in fields.items()}
            if fields
            else None,
        )
    except (TypeError, ValueError, AttributeError) as exc:
        raise AgentError(f"bad key state {item!r}: {exc}", where=where) from None


class AgentClient:
    """HTTP client of the agent at `url` (http:// or https://), with the bearer token."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None,
        timeout_s: float,
        ca_file: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._token = token
        self._ca_file = ca_file
        self._session: aiohttp.ClientSession | None = None
        self.bytes_received = 0
        self.bytes_sent = 0
        self.requests = 0
        self._by_replica: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"AgentClient({self.url!r})"

    def _open(self) -> aiohttp.ClientSession:
        # aiohttp loads when an agent is first asked (a check without agents never does:
        # its import costs a check ~0.2 s of CPU).
        import aiohttp

        if self._session is None:
            headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
            connector = None
            if self.url.startswith("https://"):
                context = ssl.create_default_context(cafile=self._ca_file)
                connector = aiohttp.TCPConnector(ssl=context)
            self._session = aiohttp.ClientSession(headers=headers, connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def take_bytes(self, replica: str) -> int:
        """Bytes received for `replica`'s calls since the last take."""
        return self._by_replica.pop(replica, 0)

    async def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        wait_s: float = 0.0,
        replica: str | None = None,
    ) -> tuple[bytes, Mapping[str, str]]:
        """(body, headers) of a 200 answer; AgentError otherwise."""
        import aiohttp
        from multidict import CIMultiDict

        session = self._open()
        url = f"{self.url}{PREFIX}{path}"
        payload = json.dumps(body).encode() if body is not None else None
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self.timeout_s, sock_read=self.timeout_s + wait_s + 30.0
        )
        self.requests += 1
        try:
            async with session.request(
                method,
                url,
                data=payload,
                headers={"Content-Type": "application/json"} if payload is not None else None,
                timeout=timeout,
            ) as resp:
                data = await resp.read()
                self.bytes_sent += len(payload or b"") + len(path) + 200  # request line, headers
                received = len(data) + sum(len(k) + len(v) + 4 for k, v in resp.raw_headers)
                self.bytes_received += received
                if replica is not None:
                    self._by_replica[replica] = self._by_replica.get(replica, 0) + received
                if resp.status != 200:
                    raise self._refused(resp.status, data)
                return data, CIMultiDict(resp.headers)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            reason = str(exc) or type(exc).__name__
            if isinstance(exc, TimeoutError | asyncio.TimeoutError):
                reason = "timed out"
            raise AgentError(f"agent unreachable: {reason}", where=self.url) from None

    def _refused(self, status: int, data: bytes) -> AgentError:
        try:
            detail = str(json.loads(data).get("detail", data[:200]))
        except (ValueError, AttributeError):
            detail = data[:200].decode("utf-8", "replace")
        if status in (401, 403):
            return AgentError(f"agent refused our token ({status}): {detail}", where=self.url)
        if status == 503:
            return AgentError(f"agent has no current tree: {detail}", where=self.url)
        return AgentError(f"agent answered {status}: {detail}", where=self.url)

    # --- the calls -------------------------------------------------------------

    async def replicas(self) -> list[dict[str, Any]]:
        data, _ = await self.request("GET", "/replicas")
        items: list[dict[str, Any]] = json.loads(data)["replicas"]
        return items

    async def descendants(
        self, replica: str, level: int, nodes: Sequence[int], down: int
    ) -> tuple[U64, Mapping[str, str]]:
        body = {"level": level, "nodes": list(nodes), "down": down}
        data, headers = await self.request(
            "POST", f"/replicas/{replica}/nodes", body, replica=replica
        )
        values = u64_from(data, len(nodes) << down, where=self.url)
        return values, headers

    async def first_nodes(
        self, replica: str, depth: int, *, wait_s: float
    ) -> tuple[int, U64, Mapping[str, str]]:
        """The walk's first question: the root's descendants at the level the agent's key
        count calls for (at most `depth`), after the tree caught up with the replica's
        writes (`fresh`, waiting up to `wait_s` for a tree being built)."""
        body = {"level": 0, "nodes": [0], "down": depth, "auto": True, "fresh": True}
        body["wait_s"] = wait_s
        data, headers = await self.request(
            "POST", f"/replicas/{replica}/nodes", body, wait_s=wait_s, replica=replica
        )
        try:
            down = int(headers[DOWN_HEADER])
            if not 0 <= down <= depth:
                raise ValueError(f"{down} levels down, asked at most {depth}")
        except (KeyError, ValueError) as exc:
            raise AgentError(f"bad first nodes answer: {exc}", where=self.url) from None
        return down, u64_from(data, 1 << down, where=self.url), headers

    async def leaf_keys(self, replica: str, leaves: Sequence[int]) -> ScanIndex:
        body = {"leaves": list(leaves)}
        data, _ = await self.request("POST", f"/replicas/{replica}/leaves", body, replica=replica)
        try:
            return ScanIndex.from_bytes(data)
        except (ValueError, IndexError, struct.error) as exc:
            raise AgentError(f"bad leaf contents: {exc}", where=self.url) from None

    async def observe_once(
        self,
        replica: str,
        keys: Sequence[bytes],
        *,
        keep: bool = False,
        fields: Sequence[bytes] = (),
    ) -> dict[bytes, KeyState]:
        body = {"keys": keys_to_wire(keys), "once": True, **_reads(keep, fields)}
        data, _ = await self.request(
            "POST", f"/replicas/{replica}/keys/observe", body, replica=replica
        )
        try:
            states = json.loads(data)["first"]
            if len(states) != len(keys):
                raise ValueError("one state per key expected")
        except (ValueError, KeyError, TypeError) as exc:
            raise AgentError(f"bad key states: {exc}", where=self.url) from None
        return {k: state_from_wire(s, where=self.url) for k, s in zip(keys, states, strict=True)}

    async def _json(self, replica: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        data, _ = await self.request("POST", f"/replicas/{replica}{path}", body, replica=replica)
        try:
            answer = json.loads(data)
            if not isinstance(answer, dict):
                raise ValueError("not an object")
            return answer
        except ValueError as exc:
            raise AgentError(f"bad answer to {path}: {exc}", where=self.url) from None

    async def observe_twice(
        self,
        replica: str,
        keys: Sequence[bytes],
        settle_s: float,
        *,
        keep: bool = False,
        fields: Sequence[bytes] = (),
    ) -> tuple[dict[bytes, KeyState], dict[bytes, KeyState]]:
        body = {"keys": keys_to_wire(keys), "settle_s": settle_s, **_reads(keep, fields)}
        data, _ = await self.request(
            "POST", f"/replicas/{replica}/keys/observe", body, wait_s=settle_s, replica=replica
        )
        try:
            answer = json.loads(data)
            first, second = answer["first"], answer["second"]
            if len(first) != len(keys) or len(second) != len(keys):
                raise ValueError("one state per key expected")
        except (ValueError, KeyError, TypeError) as exc:
            raise AgentError(f"bad key states: {exc}", where=self.url) from None
        return (
            {k: state_from_wire(s, where=self.url) for k, s in zip(keys, first, strict=True)},
            {k: state_from_wire(s, where=self.url) for k, s in zip(keys, second, strict=True)},
        )


def _reads(keep: bool, fields: Sequence[bytes]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if keep:
        out["keep"] = True
    if fields:
        out["fields"] = keys_to_wire(fields)
    return out


class AgentReplica:
    """One replica as a repair lane sees it through its region's agent (`RemoteReplica`):
    the safe-apply steps run by the agent next to the replica, with the same code."""

    def __init__(self, client: AgentClient, name: str) -> None:
        self.client = client
        self.name = name

    def _key(self, key: bytes, expected: KeyState, tolerance_ms: int) -> dict[str, Any]:
        return {
            "key": base64.b64encode(key).decode("ascii"),
            "expected": state_to_wire(expected),
            "tolerance_ms": tolerance_ms,
        }

    async def read_for_copy(
        self, key: bytes, expected: KeyState, tolerance_ms: int
    ) -> tuple[bytes, int] | None:
        answer = await self.client._json(
            self.name, "/keys/read-for-copy", self._key(key, expected, tolerance_ms)
        )
        if answer.get("refused"):
            raise KeyRefused(str(answer["refused"]), where=self.name)
        if answer.get("changed"):
            return None
        try:
            return base64.b64decode(answer["payload"]), int(answer["pttl"])
        except (KeyError, TypeError, ValueError) as exc:
            raise AgentError(f"bad DUMP answer: {exc}", where=self.client.url) from None

    async def write(
        self, key: bytes, expected: KeyState, write: Write, age_ms: int, tolerance_ms: int
    ) -> tuple[bytes | None, int, int] | None:
        payload = base64.b64encode(write.payload).decode("ascii") if write.payload else None
        body = {
            **self._key(key, expected, tolerance_ms),
            "write": {"op": write.op, "payload": payload, "pttl": write.pttl},
            "age_ms": age_ms,
        }
        answer = await self.client._json(self.name, "/keys/write", body)
        if answer.get("refused"):
            raise KeyRefused(str(answer["refused"]), where=self.name)
        if not answer.get("written"):
            return None
        try:
            pre = answer["pre_image"]
            return (
                base64.b64decode(pre) if pre is not None else None,
                int(answer["pre_pttl"]),
                int(answer["count"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise AgentError(f"bad write answer: {exc}", where=self.client.url) from None

    async def observe(self, keys: Sequence[bytes]) -> dict[bytes, KeyState]:
        return await self.client.observe_once(self.name, keys)


class AgentPool:
    """`client_for(member)`: the client of the agent of the member's region, or None when
    its region runs no agent (the member is then scanned directly)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._clients: dict[str, AgentClient] = {}

    def client_for(self, endpoint: Endpoint) -> AgentClient | None:
        url = self.config.topology.agent_of(endpoint)
        if url is None:
            return None
        if url not in self._clients:
            s = self.config.settings
            self._clients[url] = AgentClient(
                url, token=s.api_token, timeout_s=s.connect_timeout, ca_file=s.agent_tls_ca
            )
        return self._clients[url]

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
