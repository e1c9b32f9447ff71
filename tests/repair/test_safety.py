"""Repair under a hostile workload: the safety harness, its checker, and the undo path."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from replag.lab.safety.checker import CATEGORIES, check_history
from replag.lab.safety.harness import SafetySpec, run_once
from replag.lab.safety.model import ABSENT, Held, Keyspace
from replag.lab.safety.workload import DELETE, WRITE, Op
from replag.repair import repair
from tests.helpers.configs import group_config
from tests.helpers.redis_servers import RedisFactory


@pytest.mark.parametrize(
    ("policy", "seed", "deletes"),
    [
        ("quorum", 1, False),
        ("source:n1", 2, False),
        ("newest:ts", 3, False),
        ("quorum", 4, True),
        ("source:n1", 5, True),
        ("newest:ts", 6, False),
    ],
)
async def test_no_write_is_clobbered_resurrected_or_lost_under_concurrent_writers(
    tmp_path: Path, policy: str, seed: int, deletes: bool
) -> None:
    spec = SafetySpec(
        policy=policy,
        seed=seed,
        keys=600,
        faults=200,
        writers=6,
        drop_s=0.5,
        allow_deletes=deletes,
        # The writers overwrite the other faults, and on a busy host can heal them all
        # before the scan gets there: these 20 guarantee the repair has keys to write.
        untouched_faults=20,
    )
    run = await run_once(spec, tmp_path)
    print("\n" + run.line(), *run.verdict.examples, sep="\n  ")
    result = run.to_dict()
    assert result["writes"] > 1000 and result["divergent"] > 0 and result["repaired"] > 0
    assert run.verdict.counts == dict.fromkeys(CATEGORIES, 0)
    # The servers saw the repair's commands on every key it reported (and on more: its
    # scan): the exemption below had the instants it needs. No key is exempt: none had
    # an operation slower than repair_settle still fanning out while the repair read or
    # wrote it.
    assert result["reported_untouched"] == 0 and result["repair_touched_keys"] > 300
    assert run.verdict.outside_bound == 0


async def _keyspace_events(client: aioredis.Redis, key: str) -> asyncio.Event:
    """An event set when `key` is next written by RESTORE on `client`'s server."""
    await client.config_set("notify-keyspace-events", "Kg$")
    pubsub = client.pubsub()
    await pubsub.subscribe(f"__keyspace@0__:{key}")
    seen = asyncio.Event()

    async def listen() -> None:
        async for message in pubsub.listen():
            if message["type"] == "message" and message["data"] == b"restore":
                seen.set()
                break
        await pubsub.aclose()

    _listeners.add(asyncio.create_task(listen()))
    return seen


_listeners: set[asyncio.Task[None]] = set()


async def test_a_delete_that_reached_the_target_first_undoes_the_copy(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    # c lacks the key (a dropped write). A client's DEL reaches c first (a no-op
    # there), then a and b, but only after the repair has copied a's value to c:
    # the copy must be undone, not leave the deleted key alive on c.
    servers = [redis_factory("undo") for _ in range(3)]
    a, b, c = (aioredis.Redis(port=s.port) for s in servers)
    await a.set("k", "v1")
    await b.set("k", "v1")

    restored = await _keyspace_events(c, "k")

    async def delete_in_flight() -> None:
        await restored.wait()
        await a.delete("k")
        await b.delete("k")

    deleter = asyncio.create_task(delete_in_flight())
    report = await repair(group_config(tmp_path, servers, repair_settle="300ms"))
    await asyncio.wait_for(deleter, 30)
    result = report.to_dict()
    assert [await x.exists("k") for x in (a, b, c)] == [0, 0, 0]
    assert result["undone"] == 1 and result["repaired"] == 0
    assert result["divergent_keys"][0]["status"] == "agreed"
    for client in (a, b, c):
        await client.aclose()


async def test_a_client_write_on_the_copy_before_its_undo_is_kept_and_the_copy_removed(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    # As above, but the client's next write (an HSET on every replica) lands on c's
    # copy before the repair can undo it: the undo must keep that write and drop the
    # fields the copy brought back, not leave a hash resurrected around it.
    servers = [redis_factory("merge") for _ in range(3)]
    a, b, c = (aioredis.Redis(port=s.port) for s in servers)
    await a.hset("h", mapping={"old1": "1", "old2": "1"})
    await b.hset("h", mapping={"old1": "1", "old2": "1"})
    restored = await _keyspace_events(c, "h")

    async def delete_then_write() -> None:
        await restored.wait()
        for client in (a, b):
            await client.delete("h")
        for client in (c, a, b):
            await client.hset("h", "new", "2")

    writer = asyncio.create_task(delete_then_write())
    report = await repair(group_config(tmp_path, servers, repair_settle="300ms"))
    await asyncio.wait_for(writer, 30)
    assert [await x.hgetall("h") for x in (a, b, c)] == [{b"new": b"2"}] * 3
    assert report.to_dict()["undone"] == 1 and report.to_dict()["undo_failed"] == 0
    for client in (a, b, c):
        await client.aclose()


def test_element_changes_replay_what_clients_did_to_the_copy() -> None:
    from replag.repair.writes.undo import element_changes
    from replag.wire.resp import pack

    ours = {b"f1": b"1", b"f2": b"1"}
    now = {b"f1": b"1", b"f3": b"9"}  # f2 deleted, f3 added after the copy
    assert element_changes(b"k", "hash", ours, now) == [
        pack(b"HSET", b"k", b"f3", b"9"),
        pack(b"HDEL", b"k", b"f2"),
    ]
    assert element_changes(b"k", "set", {b"a", b"b"}, {b"b", b"c"}) == [
        pack(b"SADD", b"k", b"c"),
        pack(b"SREM", b"k", b"a"),
    ]
    assert element_changes(b"k", "zset", {b"m": 1.0}, {b"m": 2.5}) == [
        pack(b"ZADD", b"k", b"2.5", b"m")
    ]


async def test_an_undo_puts_back_the_old_value_and_its_ttl(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    servers = [redis_factory("back") for _ in range(3)]
    a, b, c = (aioredis.Redis(port=s.port) for s in servers)
    await a.set("k", "v1")
    await b.set("k", "v1")
    await c.set("k", "v0", px=100_000)

    restored = await _keyspace_events(c, "k")

    async def winner_moves() -> None:
        await restored.wait()
        await a.set("k", "v2")  # now a, b and c all differ: a conflict, nothing to copy

    mover = asyncio.create_task(winner_moves())
    report = await repair(group_config(tmp_path, servers, repair_settle="300ms"))
    await asyncio.wait_for(mover, 30)
    result = report.to_dict()
    assert result["undone"] == 1 and result["conflicts"] == 1
    assert await c.get("k") == b"v0" and 90_000 < await c.pttl("k") <= 100_000
    for client in (a, b, c):
        await client.aclose()


# --- the checker: it must see each anomaly it claims to count -------------------


def _check(
    history: list[Op],
    final: list[dict[bytes, Held]],
    outcomes: dict[bytes, str] | None = None,
    touched: dict[bytes, list[int]] | None = None,
) -> dict[str, int]:
    space = Keyspace(5)
    keys = [space.name(i) for i in range(5)]
    verdict = check_history(
        space,
        keys,
        ["n0", "n1", "n2"],
        history,
        final,
        outcomes or {},
        bound_ms=50,
        repair_touched=touched or {},
    )
    return {
        **verdict.counts,
        "left_reported": verdict.left_reported,
        "outside": verdict.outside_bound,
    }


def _string(version: int) -> Held:
    return Held("string", {b"": version})


MS = 1_000_000


def _everywhere(key: int, version: int, kind: str, spread_ms: float = 1.0, at_ms: int = 0) -> Op:
    """`version` of `key` applied on all three, from `at_ms` for `spread_ms`."""
    started = at_ms * MS
    ended = started + int(spread_ms * MS)
    return Op(key, version, kind, 0, ((0, 1), (1, 1), (2, 1)), spread_ms, True, started, ended)


def test_the_checker_counts_each_kind_of_anomaly() -> None:
    space = Keyspace(5)
    k0, k2 = space.name(0), space.name(2)  # both strings
    deleted = [_everywhere(0, 5, DELETE)]
    assert _check(deleted, [{}, {k0: _string(3)}, {}])["resurrected"] == 1
    written = [_everywhere(0, 7, WRITE)]
    seven = _string(7)
    assert _check(written, [{k0: _string(6)}, {k0: seven}, {k0: seven}])["clobbered"] == 1
    assert _check(written, [{k0: seven}, {k0: seven}, {}])["lost"] == 1
    # Untouched by the writers, still different, and the run called it repaired:
    differ = [{k2: _string(1)}, {k2: _string(1)}, {k2: _string(0)}]
    assert _check([], differ, {k2: "repaired"})["falsely_fixed"] == 1
    assert _check([], differ, {k2: "conflict"})["left_reported"] == 1


def test_the_checker_accepts_a_dropped_write_copied_in() -> None:
    k0 = Keyspace(5).name(0)
    dropped = [Op(0, 9, WRITE, 0, ((0, 1), (1, 1)), 1.0)]  # n2 never got v9
    nine = _string(9)
    counts = _check([_everywhere(0, 5, DELETE), *dropped], [{k0: nine}] * 3)
    assert not any(counts[c] for c in CATEGORIES)


def test_a_slow_operation_exempts_its_key_only_while_the_repair_touched_the_key() -> None:
    k0 = Keyspace(5).name(0)
    resurrected = [{}, {k0: _string(3)}, {k0: ABSENT}]
    # A slow write long before the repair, then a fast DEL: its resurrection counts.
    early_slow = [_everywhere(0, 3, WRITE, spread_ms=80.0, at_ms=0)]
    fast_delete = _everywhere(0, 5, DELETE, at_ms=1000)
    repair_reads = {k0: [900 * MS, 1000 * MS + MS // 2, 1100 * MS]}
    counts = _check([*early_slow, fast_delete], resurrected, touched=repair_reads)
    assert counts["resurrected"] == 1 and counts["outside"] == 0
    # The same DEL fanning out slowly while the repair read the key: set apart.
    slow_delete = _everywhere(0, 5, DELETE, spread_ms=80.0, at_ms=1000)
    counts = _check([*early_slow, slow_delete], resurrected, touched=repair_reads)
    assert counts["resurrected"] == 0 and counts["outside"] == 1
    # ... but not where the repair touched only other keys.
    elsewhere = {Keyspace(5).name(1): repair_reads[k0]}
    counts = _check([*early_slow, slow_delete], resurrected, touched=elsewhere)
    assert counts["resurrected"] == 1 and counts["outside"] == 0
