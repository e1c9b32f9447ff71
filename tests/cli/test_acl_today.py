"""The check, repair and serve recipes for today's data: `replag acl --server KIND` on Redis
8, Valkey 9, Redis 7 and Redis 6.2 (each server accepts its line: no rule names a command
it lacks). With only its line, each user checks and repairs a keyspace of every type,
with hash-field TTLs where the server has them (copied by pages: HSET, HPEXPIREAT,
RENAME, PEXPIREAT) and vector sets on Redis 8, and still cannot run what does harm.
`acl --check` of the line without `--server` names what today's servers need beyond it."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import tomli_w
from click.testing import CliRunner

from replag.cli import main
from replag.config import Config, config_from_dict
from replag.lab.server import RedisServer
from replag.repair import check, repair
from replag.wire.permissions import SERVERS
from tests.helpers.keyspace import FIELDS_EXPIRE_AT_MS, write_every_type
from tests.helpers.redis_servers import RedisFactory
from tests.helpers.server_kinds import kind_binary, using_server_kind

USER, PASSWORD = "replag-today", "today-s3cret-pw"
# The server kinds of the suite, as `replag acl --server` names them.
KINDS = {
    "redis-8": "redis-8",
    "valkey-9": "valkey-9",
    "redis-7": "redis-7",
    "redis-6.2": "redis-6.2",
}
HARMFUL: list[tuple[str, ...]] = [
    ("CONFIG", "GET", "requirepass"),
    ("EVAL", "return 1", "0"),
    ("SCRIPT", "LOAD", "return 1"),
    ("FLUSHALL",),
    ("FLUSHDB",),
    ("KEYS", "*"),
    ("DEBUG", "SLEEP", "0"),
    ("SHUTDOWN", "NOSAVE"),
    ("ACL", "LIST"),
    ("MODULE", "LIST"),
]


@pytest.fixture(params=list(KINDS))
def kind(request: pytest.FixtureRequest) -> Iterator[str]:
    binary, missing = kind_binary(request.param)
    if binary is None:
        pytest.skip(f"server kind {request.param}: {missing}")
    with using_server_kind(binary):
        yield request.param


def acl(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["acl", *args])
    return result.exit_code, result.stdout.strip(), result.stderr


def make_user(servers: list[RedisServer], line: str) -> None:
    for server in servers:
        with server.client() as admin:
            admin.execute_command("ACL", "DELUSER", USER)
            admin.execute_command(*shlex.split(line), "on", f">{PASSWORD}")


def config_of(tmp_path: Path, servers: list[RedisServer]) -> Config:
    settings = {"store": str(tmp_path / "s.sqlite"), "repair_settle": "10ms",
                "repair_page_elements": 10, "username": USER,
                "password_env": "TODAY_PW"}  # fmt: skip
    members = [
        {"name": f"m{i}", "url": f"redis://127.0.0.1:{s.port}"} for i, s in enumerate(servers)
    ]
    groups = [{"name": "g", "kind": "peers", "members": members}]
    return config_from_dict(
        {"settings": settings, "groups": groups}, where="today.toml", environ={"TODAY_PW": PASSWORD}
    )


def todays_data(kind: str, truth: redis.Redis, other: redis.Redis) -> set[str]:
    """Every type on both, with differences only `other` holds; the keys that differ."""
    write_every_type(truth)
    write_every_type(other, reverse=True)
    truth.set("ttl:key", "v", px=3_600_000)  # copied by pages with its expiry (PEXPIREAT)
    truth.hset("ttl:key:h", mapping={f"f{i}": i for i in range(20)})
    truth.pexpire("ttl:key:h", 3_600_000)
    differ = {"ttl:key", "ttl:key:h"}
    if "field_ttls" in SERVERS[kind]:
        # t:hash has 50 fields (5 with TTLs): past repair_page_elements, copied by pages.
        other.execute_command("HPEXPIREAT", "t:hash", FIELDS_EXPIRE_AT_MS + 3_600_000,
                              "FIELDS", 1, "f0")  # fmt: skip
        differ.add("t:hash")
    if "vector_sets" in SERVERS[kind]:
        for client in (truth, other):
            for i in range(5):
                client.execute_command("VADD", "v:set", "VALUES", 3, i, 1, 2, f"e{i}")
        other.execute_command("VSETATTR", "v:set", "e1", '{"c": 1}')
        differ.add("v:set")
    return differ


async def test_each_recipe_does_its_job_on_todays_data_and_no_harm(
    kind: str, redis_factory: RedisFactory, tmp_path: Path
) -> None:
    # DEBUG enabled, so that what refuses it is the user's ACL (Redis 6.2: always enabled).
    debug = () if kind == "redis-6.2" else ("--enable-debug-command", "yes")
    servers = [redis_factory("a", extra_args=debug), redis_factory("b", extra_args=debug)]
    truth, other = (s.client() for s in servers)
    with truth, other:
        differ = todays_data(kind, truth, other)
        config = config_of(tmp_path, servers)
        for mode in ("check", "repair", "serve"):
            code, line, _ = acl("--mode", mode, "--user", USER, "--server", KINDS[kind])
            assert code == 0, line
            make_user(servers, line)  # every server accepts its kind's line
            user = redis.Redis(port=servers[1].port, username=USER, password=PASSWORD)
            with user:
                for command in HARMFUL:
                    with pytest.raises(redis.exceptions.NoPermissionError):
                        user.execute_command(*command)
            found = await check(config, group="g")
            report = found.to_dict()
            assert not report["not_verified"] and not report["not_compared_total"], report
            named = {k["key"] for k in report["divergent_keys"]}
            assert named == differ, report
        # The serve user (the last made) repairs, by pages and by RESTORE, and checks clean.
        repaired = await repair(config, group="g", policy="source:m0")
        assert repaired.divergent == len(differ), repaired.to_dict()
        after = await check(config, group="g")
        assert after.divergent == 0 and not after.not_clean, after.to_dict()
        if "field_ttls" in SERVERS[kind]:
            times = other.execute_command("HPEXPIRETIME", "t:hash", "FIELDS", 2, "f0", "f5")
            assert times == [FIELDS_EXPIRE_AT_MS, -1]  # the truth's field TTLs, in pages


def test_acl_check_names_what_todays_servers_need_beyond_the_default_line(
    kind: str, redis_factory: RedisFactory, tmp_path: Path
) -> None:
    servers = [redis_factory("c"), redis_factory("d")]
    path = tmp_path / "replag.toml"
    path.write_text(
        tomli_w.dumps({
            "settings": {"username": USER, "password_env": "TODAY_PW"},
            "groups": [{"name": "g", "members": [f"redis://127.0.0.1:{s.port}" for s in servers]}],
        })
    )  # fmt: skip
    for mode in ("check", "repair"):
        _, line, _ = acl("--mode", mode, "--user", USER)
        make_user(servers, line)
        args = ("--mode", mode, "--user", USER, "-c", str(path), "--check")
        result = CliRunner().invoke(main, ["acl", *args], env={"TODAY_PW": PASSWORD})
        features = SERVERS[kind]
        if not features:  # the default line is the whole recipe there
            assert result.exit_code == 0, result.output
            continue
        assert result.exit_code == 1, result.output
        lacking = {"HPEXPIRETIME"} | ({"HPEXPIREAT"} if mode == "repair" else set())
        if "vector_sets" in features:
            lacking |= {"VINFO", "VRANDMEMBER", "VEMB", "VGETATTR", "VCARD"}
        said = result.stderr.split("permission refused: ")[1].split(" (user")[0]
        assert set(said.split(", ")) == lacking, result.stderr
        assert f"--server {kind}" in result.stderr
        _, line, _ = acl("--mode", mode, "--user", USER, "--server", kind)
        make_user(servers, line)
        result = CliRunner().invoke(main, ["acl", *args], env={"TODAY_PW": PASSWORD})
        assert result.exit_code == 0, result.output
        assert f"{mode} permissions ok" in result.stderr
