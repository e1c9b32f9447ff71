"""What each mode's user, made from exactly the line `replag acl` prints, cannot do, on
Redis 7, Valkey 9 and Redis 6.2 (the same lines work there): read the server's
passwords, run Lua, flush, reconfigure, KEYS, DEBUG, SHUTDOWN; the probe's cannot
write outside its prefix. And what they still do with only their line: the agent keeps
a tree and watches probes by push, serve probes by push (probe, check, repair: also
`test_acl.py`); `acl --check` names every missing command at once. Opt-ins widen a line
only when asked, with a warning for scripts."""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import tomli_w
from click.testing import CliRunner

from replag.agent.livetree import LiveTree
from replag.cli import main
from replag.config import config_from_dict
from replag.lab.server import RedisServer
from replag.probes import run_probe
from replag.topology import Endpoint
from replag.wire.permissions import MODES
from tests.helpers.agent import OPTIONS, scanned_tree
from tests.helpers.redis_servers import RedisFactory, wait_listed
from tests.helpers.server_kinds import acl_server_args, kind_binary, using_server_kind
from tests.helpers.waiting import until

USER, PASSWORD = "replag-recipe", "recipe-s3cret-pw"
ADMIN_SECRET = "the-admin-s3cret"


@pytest.fixture(params=["redis-7", "valkey-9", "redis-6.2"])
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
    line, _ = printed("--mode", mode, "--user", USER, *acl_server_args(server.port))
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
    line, warning = printed("--mode", "probe", "--user", USER, "--allow-config-changes")
    assert "+config|get" in line and "+config|set" in line
    assert "can read the server's passwords" in warning


async def test_each_modes_user_can_do_no_harm(acl_kind: str, redis_factory: RedisFactory) -> None:
    # DEBUG enabled, so that what refuses it is the user's ACL, not the server's default.
    # (Redis 6.2 has no such option: DEBUG is enabled there.)
    debug = () if acl_kind == "redis-6.2" else ("--enable-debug-command", "yes")
    server = redis_factory("recipes", extra_args=debug)
    for mode in MODES:
        user = make_user(server, mode)
        harmful: list[tuple[str, ...]] = [
            ("CONFIG", "GET", "requirepass"),
            ("CONFIG", "GET", "masterauth"),
            ("CONFIG", "GET", "*"),
            ("EVAL", "return 1", "0"),
            ("SCRIPT", "LOAD", "return 1"),
            ("FLUSHALL",),
            ("FLUSHDB",),
            ("CONFIG", "SET", "notify-keyspace-events", "KA"),
            ("KEYS", "*"),
            ("DEBUG", "SLEEP", "0"),
            ("SHUTDOWN", "NOSAVE"),
            ("ACL", "LIST"),
            ("MODULE", "LIST"),
        ]
        if acl_kind != "redis-6.2":  # Redis 6.2 has no functions
            harmful.append(("FUNCTION", "LIST"))
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
        await until(
            lambda: "declare them in settings.notify_keyspace_events" in tree.reason,
            "the tree saying to declare notifications",
            timeout_s=60,
        )
        assert tree.state != "current"
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


@pytest.mark.parametrize("mode", ["serve", "agent"])
async def test_serve_and_agent_users_probe_by_push_with_their_line(
    mode: str, redis_factory: RedisFactory, tmp_path: Path
) -> None:
    primary = redis_factory("p")
    replica = redis_factory(
        "r", extra_args=("--replicaof", "127.0.0.1", str(primary.port),
                         "--notify-keyspace-events", "K$"),
    )  # fmt: skip
    wait_listed(primary, [replica])
    for server in (primary, replica):
        make_user(server, mode).close()
    config = config_from_dict(
        {"settings": {"store": str(tmp_path / "s.sqlite"), "username": USER,
                      "password_env": "RECIPE_PASSWORD"},
         "regions": [{"name": "a", "write": f"redis://127.0.0.1:{primary.port}",
                      "replicas": [{"name": "r", "url": f"redis://127.0.0.1:{replica.port}"}]}]},
        where="recipe.toml", environ={"RECIPE_PASSWORD": PASSWORD},
    )  # fmt: skip
    report = await run_probe(config, count=10, rate=0, mode="auto")
    [pair] = report.pairs
    assert (pair.observed_by, pair.seen) == ("push", 10), report.notes


def test_acl_check_names_every_missing_command_at_once(
    redis_factory: RedisFactory, tmp_path: Path
) -> None:
    servers = [redis_factory("check"), redis_factory("check")]
    for server in servers:
        make_user(server, "repair").close()
    with servers[0].client() as admin:
        admin.execute_command("ACL", "SETUSER", USER, "-type", "-restore", "-hset")
    path = tmp_path / "replag.toml"
    path.write_text(
        tomli_w.dumps({
            "settings": {"username": USER, "password_env": "RECIPE_PASSWORD"},
            "groups": [{"name": "g", "members": [f"redis://127.0.0.1:{s.port}" for s in servers]}],
        })
    )  # fmt: skip
    result = CliRunner().invoke(
        main,
        ["acl", "--mode", "repair", "--user", USER, "-c", str(path), "--check"],
        env={"RECIPE_PASSWORD": PASSWORD},
    )
    assert result.exit_code == 1, result.output
    [line] = [x for x in result.stderr.splitlines() if "permission refused" in x]
    assert "permission refused: TYPE, RESTORE, HSET (user replag-recipe)" in line
    # Channel rules are tried too (a probe without its channel polls: optional).
    with servers[1].client() as admin:
        admin.execute_command("ACL", "SETUSER", USER, "+psubscribe", "+set", "+del", "+time",
                              "&other:*")  # fmt: skip
    probe = CliRunner().invoke(
        main, ["acl", "--mode", "serve", "--user", USER, "-c", str(path), "--check"],
        env={"RECIPE_PASSWORD": PASSWORD},
    )  # fmt: skip
    assert "(refused, optional: &__keyspace@0__:replag:probe:*)" in probe.stderr, probe.stderr
    assert f"127.0.0.1:{servers[1].port}): repair permissions ok" in result.stderr
