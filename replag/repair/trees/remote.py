"""Trees kept by region agents, seen from the coordinator: the wire format and the client.

A member whose region runs a `replag agent` is compared through it. What
travels: node values as raw little-endian uint64 (8 bytes a node; a JSON
number would be 20); a leaf's keys as a `ScanIndex` in its checkpoint form
(hashes, entries, name lengths, names); key names in JSON as base64 (keys are
bytes); a key state as `null` (absent) or `[type, digest hex or null, expiry
ms or null]`, the expiry absolute on the agent's clock, as `KeyState` has it.

`AgentClient` makes the calls over an `AgentLink` (`agent_http`: token, TLS,
and every failure an `AgentError` naming the agent), and says so too of an
answer that does not parse. It counts the bytes of the HTTP bodies and headers
it receives, per replica: with agents, that is what crosses the WAN for a
check. `AgentPool` holds one client per agent URL of the config.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from replag.config import Config
from replag.errors import AgentError, KeyRefused
from replag.repair.keyspace.field_ttls import FieldExpiries
from replag.repair.keyspace.observe import ABSENT, KeyState
from replag.repair.keyspace.write import Write
from replag.repair.trees.agent_http import PREFIX as PREFIX
from replag.repair.trees.agent_http import AgentLink, run_headers
from replag.repair.trees.index import ScanIndex
from replag.topology import Endpoint, Region, Topology
from replag.wire import reply_limits

U64 = npt.NDArray[np.uint64]
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
    value or hash fields (base64), which only a newest:FIELD policy asks for,
    `{opaque}`, why a value was not read (a module type: not compared), and
    `{field_expiries}`, a hash's fields' TTLs (`FieldExpiries.to_wire`)."""
    if not state.exists:
        return None
    digest = f"{state.digest:016x}" if state.digest is not None else None
    out: list[Any] = [state.type, digest, state.expiry_ms]
    extra: dict[str, Any] = {}
    if isinstance(state.data, bytes):
        extra["data"] = base64.b64encode(state.data).decode("ascii")
    if state.opaque is not None:
        extra["opaque"] = state.opaque
    if state.fields:
        extra["fields"] = {
            base64.b64encode(k).decode("ascii"): base64.b64encode(v).decode("ascii")
            for k, v in state.fields.items()
        }
    if state.field_expiries is not None:
        extra["field_expiries"] = state.field_expiries.to_wire()
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
        number = int(digest, 16) if digest is not None else None
        expires = int(expiry) if expiry is not None else None
        # A digest is 64 bits and an expiry milliseconds: larger ones are not states
        # (and would overflow where they are compared with numpy's integers).
        if (number is not None and not 0 <= number < 1 << 64) or (
            expires is not None and abs(expires) >= 1 << 62
        ):
            raise ValueError("digest or expiry out of range")
        return KeyState(
            True,
            str(type_name),
            number,
            expires,
            base64.b64decode(extra["data"]) if "data" in extra else None,
            {base64.b64decode(k): base64.b64decode(v) for k, v in fields.items()}
            if fields
            else None,
            field_expiries=FieldExpiries.from_wire(extra["field_expiries"])
            if "field_expiries" in extra
            else None,
            opaque=str(extra["opaque"])[:500] if extra.get("opaque") is not None else None,
        )
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        raise AgentError(f"bad key state {item!r}: {exc}", where=where) from None


class AgentClient(AgentLink):
    """The calls the coordinator makes to an agent's trees and keys (over `AgentLink`)."""

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


def agent_client(
    config: Config,
    region_name: str,
    *,
    run_id: str | None = None,
    started_by: Mapping[str, str] | None = None,
) -> AgentClient | None:
    """The client of `region_name`'s agent (None when it runs none): its TLS options, the
    token the coordinator presents (`Config.agent_token`), and what it runs, for the
    agent's audit log."""
    return _region_client(
        config.topology.region(region_name),
        token=config.agent_token(),
        timeout_s=config.settings.connect_timeout,
        headers=run_headers(run_id, started_by),
    )


def region_agent_client(
    region: Region,
    *,
    token: str | None,
    timeout_s: float,
    run_id: str | None = None,
    started_by: Mapping[str, str] | None = None,
) -> AgentClient | None:
    """As `agent_client`, from the region and the token (a run's setup), not the config."""
    return _region_client(
        region, token=token, timeout_s=timeout_s, headers=run_headers(run_id, started_by)
    )


def _region_client(
    region: Region, *, token: str | None, timeout_s: float, headers: dict[str, str]
) -> AgentClient | None:
    if region.agent is None:
        return None
    members = ((region.write,) if region.write else ()) + region.replicas
    return AgentClient(
        region.agent,
        token=token,
        timeout_s=timeout_s,
        tls=region.agent_tls,
        headers=headers,
        max_bytes=members[0].limits.max_bytes if members else reply_limits.DEFAULT.max_bytes,
    )


class AgentPool:
    """`client_for(member)`: the client of the agent of the member's region, or None when
    its region runs no agent (the member is then scanned directly). `token` is the one the
    coordinator presents (`Config.agent_token`); `run_id` and `started_by` go with every
    request, for the agents' audit logs."""

    def __init__(
        self,
        topology: Topology,
        *,
        token: str | None,
        timeout_s: float,
        run_id: str | None = None,
        started_by: Mapping[str, str] | None = None,
    ) -> None:
        self.topology = topology
        self.token, self.timeout_s = token, timeout_s
        self.run_id, self.started_by = run_id, started_by
        self._clients: dict[str, AgentClient] = {}

    def client_for(self, endpoint: Endpoint) -> AgentClient | None:
        url = self.topology.agent_of(endpoint)
        if url is None or endpoint.region is None:
            return None
        if url not in self._clients:
            client = _region_client(
                self.topology.region(endpoint.region),
                token=self.token,
                timeout_s=self.timeout_s,
                headers=run_headers(self.run_id, self.started_by),
            )
            assert client is not None
            self._clients[url] = client
        return self._clients[url]

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
