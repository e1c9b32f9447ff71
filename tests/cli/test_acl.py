"""ACL users made from exactly the line `replag acl --mode M --user NAME` prints (plus `on`
and a password, as an operator adds them): each mode works with them, and with one
permission taken away it stops before it starts, naming the command. The probe's
narrow channel grant is enough for push observation. On Redis 7 and Valkey 9."""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from replag.cli import main
from replag.config import Config, config_from_dict
from replag.errors import PermissionRefused, RepairError
from replag.lab.server import RedisServer
from replag.metrics import ServiceMetrics
from replag.probes import run_probe
from replag.repair import check, repair
from replag.service.jobs import JobRunner
from replag.store import Store
from tests.helpers.redis_servers import RedisFactory, replica_of, wait_listed
from tests.helpers.server_kinds import acl_server_args, kind_binary, using_server_kind

USER, PASSWORD = "replag-acl", "acl-s3cret-pw"


@pytest.fixture(params=["redis-7", "valkey-9"])
def acl_kind(request: pytest.FixtureRequest) -> Iterator[str]:
    binary, missing = kind_binary(request.param)
    if binary is None:
        pytest.skip(f"server kind {request.param}: {missing}")
    with using_server_kind(binary):
        yield request.param


def acl_line(mode: str, server: RedisServer | None = None) -> str:
    """The line of `mode`, for `server`'s kind (`--server`) where given."""
    kind = acl_server_args(server.port) if server is not None else []
    result = CliRunner().invoke(main, ["acl", "--mode", mode, "--user", USER, *kind])
    assert result.exit_code == 0, result.output
    line = result.output.strip()
    assert line.startswith(f"ACL SETUSER {USER} ") and "\n" not in line
    assert " on " not in f"{line} " and ">" not in line  # rules only: no `on`, no password
    return line


def create_user(servers: list[RedisServer], line: str) -> None:
    for server in servers:
        with server.client() as client:
            client.execute_command(*shlex.split(line), "on", f">{PASSWORD}")


def take_away(servers: list[RedisServer], rule: str) -> None:
    for server in servers:
        with server.client() as client:
            client.execute_command("ACL", "SETUSER", USER, rule)


def config_of(tmp_path: Path, data: dict[str, Any]) -> Config:
    """Every endpoint logs in as USER with the password from the environment (the
    file-wide username and password_env)."""
    settings = {"store": str(tmp_path / "s.sqlite"), "repair_settle": "10ms",
                "username": USER, "password_env": "ACL_TEST_PASSWORD"}  # fmt: skip
    return config_from_dict(
        {"settings": settings, **data}, where="acl.toml", environ={"ACL_TEST_PASSWORD": PASSWORD}
    )


async def test_probe_user_pushes_with_the_narrow_channel_grant(
    acl_kind: str, redis_factory: RedisFactory, tmp_path: Path
) -> None:
    primary = redis_factory("p")
    replica = redis_factory(
        "r", extra_args=("--replicaof", "127.0.0.1", str(primary.port),
                         "--notify-keyspace-events", "K$"),
    )  # fmt: skip
    wait_listed(primary, [replica])
    line = acl_line("probe")
    assert "&__keyspace@0__:replag:probe:*" in line and "~replag:probe:*" in line
    create_user([primary, replica], line)
    config = config_of(tmp_path, {"regions": [{
        "name": "a", "write": f"redis://127.0.0.1:{primary.port}",
        "replicas": [{"name": "r", "url": f"redis://127.0.0.1:{replica.port}"}]}]})  # fmt: skip
    for mode in ("push", "poll", "auto"):
        report = await run_probe(config, count=10, rate=0, mode=mode)
        [pair] = report.pairs
        assert (pair.observed_by, pair.seen) == ("poll" if mode == "poll" else "push", 10), (
            report.notes
        )
    with replica.client() as client:  # the user could not change it, and did not
        assert set(client.config_get("notify-keyspace-events")["notify-keyspace-events"]) == set(
            "K$"
        )
    take_away([primary, replica], "-mget")
    with pytest.raises(PermissionRefused, match=rf"permission refused: MGET \(user {USER}\)"):
        await run_probe(config, count=10, rate=0, mode="push")


async def test_probe_auto_polls_when_the_channel_is_not_granted(
    acl_kind: str, redis_factory: RedisFactory, tmp_path: Path
) -> None:
    primary = redis_factory("p")
    replica = replica_of(redis_factory, primary, "r")
    with replica.client() as client:
        client.config_set("notify-keyspace-events", "K$")
    wait_listed(primary, [replica])
    create_user([primary, replica], acl_line("probe"))
    take_away([primary, replica], "resetchannels")
    config = config_of(tmp_path, {"regions": [{
        "name": "a", "write": f"redis://127.0.0.1:{primary.port}",
        "replicas": [{"name": "r", "url": f"redis://127.0.0.1:{replica.port}"}]}]})  # fmt: skip
    report = await run_probe(config, count=10, rate=0, mode="auto")
    [pair] = report.pairs
    assert (pair.observed_by, pair.seen) == ("poll", 10)
    [note] = [n for n in report.notes if "subscription refused" in n]
    assert "permission refused: PSUBSCRIBE" in note and "polling" in note
    assert not report.unreachable
    with pytest.raises(PermissionRefused, match="permission refused: PSUBSCRIBE"):
        await run_probe(config, count=10, rate=0, mode="push")


def _group(servers: list[RedisServer]) -> dict[str, Any]:
    return {"groups": [{"name": "g", "members": [
        {"name": f"m{i}", "url": f"redis://127.0.0.1:{s.port}"} for i, s in enumerate(servers)
    ]}]}  # fmt: skip


def _diverge(servers: list[RedisServer]) -> None:
    with servers[0].client() as client:
        client.set("acl:only-on-m0", "1")
        client.hset("acl:hash", mapping={"f": "v"})
        client.xadd("acl:stream", {"f": "v"})
        client.zadd("acl:zset", {"m": 1.0})
        client.rpush("acl:list", "a", "b")
        client.sadd("acl:set", "x")
        client.set("acl:ttl", "1", ex=3600)


async def test_check_user(acl_kind: str, redis_factory: RedisFactory, tmp_path: Path) -> None:
    servers = [redis_factory("a"), redis_factory("b")]
    _diverge(servers)
    create_user(servers, acl_line("check", servers[0]))
    config = config_of(tmp_path, _group(servers))
    report = await check(config, group="g")
    assert report.divergent == 7
    take_away(servers, "-type")
    with pytest.raises(RepairError, match=rf"permission refused: TYPE \(user {USER}\)") as caught:
        await check(config, group="g")
    assert "nothing was scanned" in str(caught.value)


@pytest.mark.parametrize("mode", ["repair", "serve"])
async def test_repair_user(
    acl_kind: str, mode: str, redis_factory: RedisFactory, tmp_path: Path
) -> None:
    servers = [redis_factory("a"), redis_factory("b")]
    _diverge(servers)
    create_user(servers, acl_line(mode, servers[0]))
    config = config_of(tmp_path, _group(servers))
    take_away(servers, "-restore")
    # Refused before any scan, naming what is missing, not after the scans.
    with pytest.raises(RepairError, match=rf"permission refused: RESTORE \(user {USER}\)"):
        await repair(config, group="g", policy="source:m0")
    if mode == "serve":
        # The service's repair names the recipe the service's user needs (serve's: repair's
        # would take away its probe rights).
        store = Store(config.settings.store)
        try:
            jobs = JobRunner(config, store=store, metrics=ServiceMetrics(), counters=Counter())
            job = await jobs.wait(jobs.start("repair", "g", policy="source:m0").id)
        finally:
            store.close()
        assert job.state == "failed" and job.error is not None
        assert f"`replag acl --mode serve --user {USER}`" in job.error, job.error
    take_away(servers, "+restore")
    report = await repair(config, group="g", policy="source:m0")
    assert report.divergent == 7
    assert (await check(config, group="g")).divergent == 0


def test_the_docs_show_each_modes_line_as_printed() -> None:
    page = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    for mode in ("probe", "check", "repair", "serve", "agent"):
        result = CliRunner().invoke(main, ["acl", "--mode", mode, "--user", f"replag-{mode}"])
        assert result.output.strip() in page, f"docs/security.md: the {mode} line is stale"


async def test_a_probe_user_without_time_gets_a_note_not_an_empty_clock(
    redis_factory: RedisFactory, tmp_path: Path
) -> None:
    primary = redis_factory("p")
    create_user([primary], acl_line("probe"))
    take_away([primary], "-time")
    config = config_of(tmp_path, {"regions": [{"name": "a", "write": {
        "name": "p", "url": f"redis://127.0.0.1:{primary.port}"}}]})  # fmt: skip
    report = await run_probe(config, count=5, rate=0, mode="poll")
    assert report.clock == []
    [note] = [n for n in report.notes if "clock offset unknown" in n]
    assert note.startswith("p: clock offset unknown (TIME failed: permission refused: TIME")
