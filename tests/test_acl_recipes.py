"""What each mode's user, made from exactly the line `replag acl` prints, cannot do, on
Redis 7 and Valkey 9: read the server's passwords, run Lua, flush, reconfigure, KEYS,
DEBUG, SHUTDOWN; the probe's cannot write outside its prefix. And the agent keeps a
tree with only its line (the other modes: `test_acl.py`). Opt-ins widen a line only
when asked, with a warning for scripts."""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner

from replag.agent.livetree import LiveTree
from replag.cli import main
from replag.lab.server import RedisServer
from replag.permissions import MODES
from replag.topology import Endpoint
from tests.helpers.agent import OPTIONS, scanned_tree
from tests.helpers.redis_servers import RedisFactory
from tests.helpers.server_kinds import kind_binary, using_server_kind

USER, PASSWORD = "replag-recipe", "recipe-s3cret-pw"
ADMIN_SECRET = "the-admin-s3cret"


@pytest.fixture(params=["redis-7", "valkey-9"])
def acl_kind(request: pytest.FixtureRequest) -> Iterator[str]:
    binary, missing = kind_binary(request.param)
    if binary is None:
        pytest.skip(f"server kind {request.param}: {missing}")
    with using_server_kind(binary):
        yield request.param


def printed(*args: str) -> tuple[str, str]:
    result = CliRunner().invoke(main, ["acl", *args])
    assert result.exit_code == 0, result.output
    return result.stdout.strip(), result.stderr


def make_user(server: RedisServer, mode: str) -> redis.Redis:
    line, _ = printed("--mode", mode, "--user", USER)
    with server.client() as admin:
        admin.execute_command(*shlex.split(line), "on", f">{PASSWORD}")
        admin.config_set("masterauth", ADMIN_SECRET)
    return redis.Redis(port=server.port, username=USER, password=PASSWORD)


def test_no_default_line_grants_secrets_code_or_a_category() -> None:
    for mode in MODES:
        line, warning = printed("--mode", mode, "--user", USER)
        rules = line.split()[3:]
        assert warning == ""
        assert not [r for r in rules if r.startswith("+@")], line
        for granted in ("+config|get", "+config", "+eval", "+evalsha", "+script", "+function"):
            assert not [r for r in rules if r == granted or r.startswith(granted + "|")], line
    line, warning = printed("--mode", "repair", "--user", USER, "--allow-scripts")
    assert "+script|load" in line and "+evalsha" in line
    assert "can run any Lua" in warning
    line, _ = printed("--mode", "probe", "--user", USER, "--allow-config-changes")
    assert "+config|get" in line and "+config|set" in line


async def test_each_modes_user_can_do_no_harm(acl_kind: str, redis_factory: RedisFactory) -> None:
    # DEBUG enabled, so that what refuses it is the user's ACL, not the server's default.
    server = redis_factory("recipes", extra_args=("--enable-debug-command", "yes"))
    for mode in MODES:
        user = make_user(server, mode)
        harmful: list[tuple[str, ...]] = [
            ("CONFIG", "GET", "requirepass"),
            ("CONFIG", "GET", "masterauth"),
            ("CONFIG", "GET", "*"),
            ("EVAL", "return 1", "0"),
            ("SCRIPT", "LOAD", "return 1"),
            ("FUNCTION", "LIST"),
            ("FLUSHALL",),
            ("FLUSHDB",),
            ("CONFIG", "SET", "notify-keyspace-events", "KA"),
            ("KEYS", "*"),
            ("DEBUG", "SLEEP", "0"),
            ("SHUTDOWN", "NOSAVE"),
            ("ACL", "LIST"),
            ("MODULE", "LIST"),
        ]
        if mode == "probe":
            harmful += [("SET", "not-a-probe-key", "x"), ("DEL", "not-a-probe-key")]
        with user:
            for command in harmful:
                with pytest.raises(redis.exceptions.NoPermissionError):
                    user.execute_command(*command)
            if mode == "probe":  # its own prefix it may write
                assert user.set("replag:probe:x", "1", px=1000)
    with server.client() as admin:  # the server lived through it, unchanged
        assert admin.config_get("masterauth")["masterauth"] == ADMIN_SECRET
        assert admin.config_get("notify-keyspace-events")["notify-keyspace-events"] == ""


async def test_the_agent_keeps_a_tree_with_only_its_line(
    acl_kind: str, redis_factory: RedisFactory
) -> None:
    server = redis_factory("agent", extra_args=("--notify-keyspace-events", "KA"))
    make_user(server, "agent").close()
    endpoint = Endpoint.from_url(
        f"redis://{USER}:{PASSWORD}@127.0.0.1:{server.port}", name="agent-r"
    )
    with server.client() as admin:
        admin.set("k1", "v1")
        admin.hset("h1", "f", "v")
    # Undeclared, the agent's user may not read the flags: it says to declare them.
    tree = LiveTree(endpoint, options=OPTIONS, poll_s=0.1, manage_notifications=False)
    task = asyncio.create_task(tree.run())
    try:
        with pytest.raises(Exception, match=r"declare them in settings\.notify_keyspace_events"):
            await tree.fresh(10.0)
    finally:
        await tree.stop()
        await asyncio.gather(task, return_exceptions=True)
    tree = LiveTree(
        endpoint,
        options=OPTIONS,
        poll_s=0.1,
        manage_notifications=False,
        declared_notifications="KA",
    )
    task = asyncio.create_task(tree.run())
    try:
        await tree.fresh(30.0)
        with server.client() as admin:
            admin.set("k2", "v2")
            admin.delete("k1")
        await tree.fresh(30.0)
        assert tree.tree is not None
        assert (await scanned_tree(endpoint)).leaves.tolist() == tree.tree.leaves.tolist()
        assert tree.state == "current"
    finally:
        await tree.stop()
        await asyncio.wait_for(task, 30)
