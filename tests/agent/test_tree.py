"""An agent's live tree on real servers: it equals a fresh full scan, whatever happened.

Writes of every type, deletes, renames, expiries (short TTLs that fire, long ones at
fixed absolute times), writes racing with the initial scan; and the events that could
let a change go unseen (a killed subscription, a flush, a full resync, notifications
turned off) each lead to a rebuild, never to a silently wrong tree.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replag.agent.keyspace import notifications_cover
from replag.lab.server import RedisServer
from replag.topology import Endpoint
from tests.helpers.agent import AGENT_TIMEOUT_S, running_tree
from tests.helpers.keyspace import fill, write_every_type
from tests.helpers.redis_servers import FAST_SYNC, RedisFactory, replica_of, wait_listed
from tests.helpers.waiting import wait_until

KEYS = [b"k%d" % i for i in range(8)] + [b"\xff\x00bin"]


def _endpoint(server: RedisServer) -> Endpoint:
    return Endpoint.from_url(server.url, name=server.name)


def _bucket_centre_ms(seconds_ahead: int) -> int:
    """An absolute expiry in the middle of a 2 s TTL bucket: reading it a few ms early or
    late never moves it to another bucket, so scan and agent agree exactly."""
    now_ms = int(time.time() * 1000)
    return (now_ms // 2000 + seconds_ahead) * 2000 + 1000


key = st.sampled_from(KEYS)
small = st.binary(max_size=8)
op = st.one_of(
    st.tuples(st.just("set"), key, small),
    st.tuples(st.just("set_px"), key, st.integers(1, 150)),
    st.tuples(st.just("delete"), key),
    st.tuples(st.just("pexpireat"), key, st.integers(10, 100)),
    st.tuples(st.just("persist"), key),
    st.tuples(st.just("rename"), key, key),
    st.tuples(st.just("hset"), key, small, small),
    st.tuples(st.just("hdel"), key, small),
    st.tuples(st.just("sadd"), key, small),
    st.tuples(st.just("srem"), key, small),
    st.tuples(st.just("zadd"), key, small, st.floats(-1e6, 1e6)),
    st.tuples(st.just("zrem"), key, small),
    st.tuples(st.just("rpush"), key, small),
    st.tuples(st.just("lpop"), key),
    st.tuples(st.just("xadd"), key, small),
    st.tuples(st.just("probe"), st.integers(0, 3)),
)


def _apply(client: redis.Redis, step: tuple[Any, ...]) -> bool:
    """Run one step; True when it set a short TTL the comparison must wait out."""
    name, *args = step
    try:
        if name == "set":
            client.set(args[0], args[1])
        elif name == "set_px":
            client.set(args[0], b"short", px=args[1])
            return True
        elif name == "delete":
            client.delete(args[0])
        elif name == "pexpireat":
            client.pexpireat(args[0], _bucket_centre_ms(args[1]))
        elif name == "persist":
            client.persist(args[0])
        elif name == "rename":
            client.rename(args[0], args[1])
        elif name == "hset":
            client.hset(args[0], args[1], args[2])
        elif name == "hdel":
            client.hdel(args[0], args[1])
        elif name == "sadd":
            client.sadd(args[0], args[1])
        elif name == "srem":
            client.srem(args[0], args[1])
        elif name == "zadd":
            client.zadd(args[0], {args[1]: args[2]})
        elif name == "zrem":
            client.zrem(args[0], args[1])
        elif name == "rpush":
            client.rpush(args[0], args[1])
        elif name == "lpop":
            client.lpop(args[0])
        elif name == "xadd":
            client.xadd(args[0], {b"f": args[1]})
        elif name == "probe":
            client.set(b"replag:probe:%d" % args[0], b"x", px=5000)
    except redis.ResponseError:
        pass  # WRONGTYPE, or RENAME of a missing key: the server refused, nothing changed
    return False


def test_tree_equals_a_fresh_scan_after_any_write_delete_and_expiry(
    redis_factory: RedisFactory,
) -> None:
    server = redis_factory("tree")  # notifications off: the agent turns them on
    client = server.client()
    write_every_type(client)
    with running_tree(_endpoint(server)) as running:
        running.fresh()

        @settings(
            max_examples=40,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        )
        @given(steps=st.lists(op, max_size=25))
        def check(steps: list[tuple[Any, ...]]) -> None:
            short = any([_apply(client, step) for step in steps])
            if short:
                time.sleep(0.2)  # past every short TTL: those keys are logically gone
            # The scan's reads delete keys whose TTL passed (each an `expired` event);
            # the agent then catches up with every write up to that moment.
            scanned = running.scanned()
            assert running.fresh() == scanned

        check()
        tree = running.tree
        assert tree.stats.builds == 1 and tree.stats.rebuilds == {}
        assert tree.stats.keys_applied > 0


def test_writes_racing_with_the_first_scan_are_applied(redis_factory: RedisFactory) -> None:
    server = redis_factory("race", extra_args=("--notify-keyspace-events", "KA"))
    client = server.client()
    fill(client, 60_000, size=16)
    stop = threading.Event()
    written = [0]

    def writer() -> None:
        w = server.client()
        i = 0
        while not stop.is_set():
            pipe = w.pipeline(transaction=False)
            for j in range(50):
                n = (i * 7919 + j * 104_729) % 70_000
                if j % 5 == 0:
                    pipe.delete(f"k:{n:07d}")
                else:
                    pipe.set(f"k:{n:07d}", f"new {i}")
            pipe.execute()
            i += 1
            written[0] += 50

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        with running_tree(_endpoint(server)) as running:
            wait_until(
                lambda: running.tree.state == "current", "tree built", timeout_s=AGENT_TIMEOUT_S
            )
            running.rewrite_names_every(300)  # by the tree itself, past 300 added or deleted
            wait_until(
                lambda: running.tree.stats.keys_applied > 500,
                "events applied",
                timeout_s=AGENT_TIMEOUT_S,
            )
            stop.set()
            thread.join()
            assert running.fresh() == running.scanned()
            # The leaves' keys too: names of keys added since the build (the file's log)
            # and of deleted ones (still in the file) sorted out, before and after a rewrite.
            assert running.fresh_keys() == running.scanned_keys()
            running.rewrite_names()
            long_names = {b"long:%d:" % i + b"x" * (200 + 37 * i): b"v" for i in range(50)}
            client.mset(long_names)
            client.delete(*[f"k:{n:07d}" for n in range(0, 70_000, 97)])
            assert running.fresh() == running.scanned()
            assert running.fresh_keys() == running.scanned_keys()
            assert running.tree.stats.builds == 1
            # Over 300 deletes since the rewrite above: rewritten by the tree itself.
            assert running.tree.stats.names_rewrites > 0
    finally:
        stop.set()
        thread.join()


@pytest.mark.parametrize(
    ("cause", "act"),
    [
        ("lost", lambda c: c.execute_command("CLIENT", "KILL", "TYPE", "pubsub")),
        ("flush", lambda c: c.flushdb()),
        ("notifications", lambda c: c.config_set("notify-keyspace-events", "")),
    ],
)
def test_a_change_that_could_go_unseen_rebuilds_the_tree(
    redis_factory: RedisFactory, cause: str, act: Any
) -> None:
    server = redis_factory("stale", extra_args=("--notify-keyspace-events", "KEA"))
    client = server.client()
    fill(client, 2_000)
    with running_tree(_endpoint(server)) as running:
        running.fresh()
        act(client)
        client.set(b"after", b"1")  # written while the tree is (about to be) stale
        fill(client, 100, prefix="more:")
        wait_until(
            lambda: running.tree.stats.rebuilds.get(cause) == 1,
            f"a {cause} rebuild",
            timeout_s=AGENT_TIMEOUT_S,
        )
        assert running.fresh() == running.scanned()
        assert running.tree.stats.builds == 2
    if cause == "notifications":  # turned back on by the rebuild
        flags = client.config_get("notify-keyspace-events")["notify-keyspace-events"]
        assert notifications_cover(flags)


def test_a_full_resync_of_a_replica_rebuilds_the_tree(redis_factory: RedisFactory) -> None:
    primary = redis_factory("primary", extra_args=FAST_SYNC)
    replica = replica_of(redis_factory, primary, "replica")
    wait_listed(primary, [replica])
    fill(primary.client(), 1_000)
    wait_until(
        lambda: replica.client().dbsize() == 1_000, "replica synced", timeout_s=AGENT_TIMEOUT_S
    )
    with running_tree(_endpoint(replica)) as running:
        running.fresh()
        rc = replica.client()
        rc.replicaof("no", "one")
        primary.client().set(b"while-detached", b"1")
        rc.replicaof("127.0.0.1", primary.port)  # new history: a full resync, no key events
        wait_until(lambda: rc.get(b"while-detached") == b"1", "resynced", timeout_s=AGENT_TIMEOUT_S)
        wait_until(
            lambda: running.tree.stats.rebuilds.get("flush") == 1,
            "a resync rebuild",
            timeout_s=AGENT_TIMEOUT_S,
        )
        assert running.fresh() == running.scanned()


def test_a_restart_against_unchanged_data_loads_the_saved_tree(
    redis_factory: RedisFactory, tmp_path: Path
) -> None:
    server = redis_factory("saved", extra_args=("--notify-keyspace-events", "KA"))
    client = server.client()
    fill(client, 5_000)
    state = tmp_path / "agent"
    with running_tree(_endpoint(server), state_dir=state) as running:
        first = running.fresh()
    with running_tree(_endpoint(server), state_dir=state) as running:
        assert running.fresh() == first
        assert (running.tree.stats.restores, running.tree.stats.builds) == (1, 0)
        assert running.fresh_keys() == running.scanned_keys()
    # The state directory holds the snapshot alone: the names file has no name.
    assert [p.suffix for p in state.iterdir()] == [".tree"]
    client.set(b"k:0000001", b"changed while no agent watched")
    with running_tree(_endpoint(server), state_dir=state) as running:
        assert running.fresh() == running.scanned() != first
        assert (running.tree.stats.restores, running.tree.stats.builds) == (0, 1)


def test_a_names_directory_it_cannot_write_is_one_line_and_no_tree(
    redis_factory: RedisFactory, tmp_path: Path
) -> None:
    server = redis_factory("nodir", extra_args=("--notify-keyspace-events", "KA"))
    fill(server.client(), 100)
    (tmp_path / "a-file").write_text("not a directory")
    seen: list[str] = []

    def failed() -> bool:  # (it retries: the state moves on to another build meanwhile)
        state, reason = running.tree.state, running.tree.reason
        if state == "unavailable" and "cannot keep the key names" in reason:
            seen.append(reason)
        return bool(seen)

    with running_tree(_endpoint(server), state_dir=tmp_path / "a-file" / "agent") as running:
        wait_until(failed, "the failure reported", timeout_s=AGENT_TIMEOUT_S)
    assert "a-file" in seen[0] and "\n" not in seen[0]
