"""`replag lab diverge`: make the lab's replicas differ, and write down exactly how.

Each injected divergence touches one randomly chosen member (seeded): a key
deleted there (missing), rewritten (changed), created only there (extra),
replaced by another type (type), or given a TTL the others lack (ttl). The
ground truth lists every key with the kind a check should report for it.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replag.errors import UsageError
from replag.lab.cluster import lab_topology, read_state
from replag.lab.load import key_name, key_type, read_load
from replag.repair.keyspace.observe import key_to_json
from replag.topology import Endpoint
from replag.wire.resp import RespConnection, pack

# injected → what `repair check` should call it (an extra key is missing elsewhere)
EXPECTED_KIND = {
    "missing": "missing",
    "changed": "value",
    "extra": "missing",
    "type": "type",
    "ttl": "ttl",
}


@dataclass(frozen=True)
class DivergeSpec:
    missing: int = 0
    changed: int = 0
    extra: int = 0
    type: int = 0
    ttl: int = 0
    seed: int = 0


def plan(
    spec: DivergeSpec,
    members: tuple[Endpoint, ...],
    keys: list[bytes],
) -> list[dict[str, Any]]:
    """Which key gets which injection on which member (no key is used twice)."""
    rng = random.Random(spec.seed)
    needed = spec.missing + spec.changed + spec.type + spec.ttl
    if needed > len(keys):
        raise UsageError(
            f"asked for {needed} divergent existing keys but only {len(keys)} "
            f"string keys are loaded"
        )
    chosen = rng.sample(keys, needed)
    out: list[dict[str, Any]] = []
    for injected in ("missing", "changed", "type", "ttl"):
        for _ in range(getattr(spec, injected)):
            out.append(
                {"key": chosen.pop(), "injected": injected, "replica": rng.choice(members).name}
            )
    for j in range(spec.extra):
        out.append(
            {
                "key": b"extra:%d:%06d" % (spec.seed, j),
                "injected": "extra",
                "replica": rng.choice(members).name,
            }
        )
    return out


def _command(item: dict[str, Any]) -> bytes:
    key: bytes = item["key"]
    injected = item["injected"]
    if injected == "missing":
        return pack(b"DEL", key)
    if injected == "changed":
        return pack(b"SET", key, b"changed value of " + key, b"KEEPTTL")
    if injected == "extra":
        return pack(b"SET", key, b"only here")
    if injected == "type":
        return pack(b"DEL", key) + pack(b"RPUSH", key, b"now", b"a", b"list")
    return pack(b"PEXPIRE", key, 3_600_000)


async def _apply(members: tuple[Endpoint, ...], items: list[dict[str, Any]]) -> None:
    for member in members:
        mine = [i for i in items if i["replica"] == member.name]
        if not mine:
            continue
        conn = await RespConnection.open(member, timeout_s=30.0)
        try:
            payload = b"".join(_command(i) for i in mine)
            count = sum(2 if i["injected"] == "type" else 1 for i in mine)
            conn.check(await conn.request(payload, count))
        finally:
            await conn.close()


def lab_diverge(lab_dir: Path, spec: DivergeSpec, truth: Path | None) -> dict[str, Any]:
    """Inject `spec` into the lab in `lab_dir`; write and return the ground truth."""
    state = read_state(lab_dir)
    if state.get("engine") == "replicated":
        # Its replicas are read-only (a replica written directly answers READONLY), and
        # replication would carry a write on the primary everywhere: no divergence.
        raise UsageError(
            f"lab diverge writes each replica directly, and the lab in {lab_dir} replicates "
            "(its replicas refuse writes: READONLY); start one with "
            "`replag lab up --engine independent` to inject divergence"
        )
    # The lab writes as the operator on each host would: on the local addresses, not the WAN.
    members = tuple(m.in_region() for m in lab_topology(state).groups[0].members)
    load = read_load(lab_dir)
    strings = [key_name(load, i) for i in range(load.keys) if key_type(load, i) == "string"]
    items = plan(spec, members, strings)
    asyncio.run(_apply(members, items))
    counts: dict[str, int] = {}
    for item in items:
        counts[EXPECTED_KIND[item["injected"]]] = counts.get(EXPECTED_KIND[item["injected"]], 0) + 1
    result = {
        "seed": spec.seed,
        "members": [m.name for m in members],
        "total": len(items),
        "counts": counts,
        "divergent": [
            {
                **key_to_json(i["key"]),
                "kind": EXPECTED_KIND[i["injected"]],
                "injected": i["injected"],
                "replica": i["replica"],
            }
            for i in items
        ],
    }
    if truth is not None:
        truth.write_text(json.dumps(result, indent=2))
    return result
