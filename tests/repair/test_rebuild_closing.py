"""A rebuild's closing pass looks only at what the copy left, and the copy reads each peer
once: counted with INFO commandstats on the real servers. A change in any of a batch's
WATCH groups is still seen."""

from __future__ import annotations

import asyncio
from pathlib import Path

import redis

from replag.lab.server import RedisServer
from replag.repair.bulk.refill import Refill
from replag.repair.rebuild import rebuild
from replag.store import Store
from replag.topology import Endpoint
from tests.helpers.configs import group_config
from tests.helpers.keyspace import fill
from tests.helpers.redis_servers import RedisFactory
from tests.helpers.redis_servers import command_calls as calls
from tests.helpers.waiting import until

KEYS = 1500


def peers_and_target(
    redis_factory: RedisFactory,
) -> tuple[list[redis.Redis], list[RedisServer]]:
    servers = [redis_factory("c") for _ in range(3)]
    a, b, c = (s.client() for s in servers)
    for client in (a, b):
        fill(client, KEYS, size=100)
        client.set("expiring", "v", px=600_000)
        client.set("client-wrote", "old")
    a.set("disputed", "1")
    b.set("disputed", "2")
    b.set("only-on-n1", "x")  # the source's scan never returns it
    c.set("client-wrote", "new")  # a client's write that reached the target first
    return [a, b, c], servers


async def test_the_closing_pass_reads_only_what_the_copy_left(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    (a, b, c), servers = peers_and_target(redis_factory)
    for client in (a, b, c):
        client.config_resetstat()
    config = group_config(tmp_path, servers)
    store = Store(tmp_path / "replag.sqlite")
    report = await rebuild(config, group="g", replica="n2", store=store, source="n0")
    store.close()
    d = report.to_dict()
    # Left by the copy: the target's own write, the dispute; only n1 holds one key.
    assert d["present"] == 1 and d["disagree"] == 1
    assert d["closing_keys"] == 3
    assert report.closing is not None and report.closing["divergent"] == 3
    # Decided by the group's policy (quorum; deletes off): 2 of 3 hold "old"; the key only
    # n1 held is copied to both others; "disputed" (1, 2, none) is a tie, reported.
    assert c.get("client-wrote") == b"old"
    assert a.get("only-on-n1") == c.get("only-on-n1") == b"x"
    assert report.closing["repaired"] == 2 and report.closing["conflicts"] == 1
    held = KEYS + 4  # n1's keys
    # Each peer's keys read once by the copy (PTTL per key), a few more by the closing
    # pass's two verification reads of 3 keys: no second full read (a whole check would
    # read every key of every member again).
    for client in (a, b):
        assert calls(client, "pttl") < held + 50, client.info("commandstats")
    # The target is never read in full either: its writes, and the closing pass's reads.
    assert calls(c, "pttl") < 50 and calls(c, "mget") < 50


async def test_a_full_closing_pass_reads_every_key_again(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    (a, _, _), servers = peers_and_target(redis_factory)
    a.config_resetstat()
    config = group_config(tmp_path, servers)
    store = Store(tmp_path / "replag.sqlite")
    report = await rebuild(
        config, group="g", replica="n2", store=store, source="n0", full_closing_pass=True
    )
    store.close()
    assert report.closing_keys is None and report.closing is not None
    assert report.closing["divergent"] == 3
    assert calls(a, "pttl") >= 2 * KEYS  # the copy's read, then the check's scan


async def test_a_write_elsewhere_on_a_peer_makes_the_batch_read_again(
    redis_factory: RedisFactory,
) -> None:
    """A peer's write counters move with any write, here to a key outside the batch, while
    the batch waits `repair_settle`: its copies are read again on that peer, and stand
    (nothing they copied moved); a racing DEL of a copied key is undone (see
    test_rebuild.py)."""
    servers = [redis_factory("w") for _ in range(3)]
    a, b, c = (s.client() for s in servers)
    for client in (a, b):
        fill(client, 300)
    peers = [Endpoint(name=f"n{i}", host="127.0.0.1", port=s.port) for i, s in enumerate(servers)]
    refill = Refill(
        peers[:2], peers[2], settle_s=3.0, tolerance_ms=2000, timeout_s=10, page_elements=1000
    )
    keys = sorted(a.scan_iter(count=1000))
    b.config_resetstat()
    try:
        copying = asyncio.ensure_future(refill.copy(keys))
        await until(lambda: c.dbsize() == len(keys), "the copies written")
        b.set("elsewhere", "1")
        result = await copying
    finally:
        await refill.close()
    assert result.verified_by_read and result.changed == []
    assert result.copied == len(keys) and c.dbsize() == len(keys)
    # n1 read twice (the batch, then again), n0 once: no WATCH anywhere.
    assert calls(b, "mget") == 2 and calls(b, "watch") == 0
    assert calls(a, "mget") == 1


async def test_a_peer_nothing_wrote_to_is_not_walked_for_keys_the_source_lacks(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    """The other peer holds exactly the source's keys and nothing wrote to it during the
    copy: its key names are not walked (no SCAN), and nothing is left to close."""
    servers = [redis_factory("q") for _ in range(3)]
    a, b, c = (s.client() for s in servers)
    for client in (a, b):
        fill(client, KEYS, size=100)
    b.config_resetstat()
    config = group_config(tmp_path, servers)
    store = Store(tmp_path / "replag.sqlite")
    report = await rebuild(config, group="g", replica="n2", store=store, source="n0")
    store.close()
    assert report.closing_keys == 0 and report.counts.copied == KEYS
    assert calls(b, "scan") == 0 and calls(b, "pttl") < KEYS + 50
    assert c.dbsize() == KEYS


async def test_a_target_that_held_most_keys_gets_a_whole_closing_pass(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    """The copy left more than a third of the source's keys (the target held them): the
    closing pass is a whole repair run, not a read of each key on every member."""
    servers = [redis_factory("h") for _ in range(3)]
    a, b, c = (s.client() for s in servers)
    for client in (a, b, c):
        fill(client, KEYS, size=100)
    c.set("k:0000007", "changed on the target")
    config = group_config(tmp_path, servers)
    store = Store(tmp_path / "replag.sqlite")
    report = await rebuild(config, group="g", replica="n2", store=store, source="n0")
    store.close()
    assert report.counts.copied == 0 and len(report.counts.present) == KEYS
    assert report.closing_keys is None and report.closing is not None
    assert report.closing["divergent"] == 1 and report.closing["repaired"] == 1
    assert c.get("k:0000007") == a.get("k:0000007")
