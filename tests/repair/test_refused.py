"""Writes a server refuses (READONLY, OOM, NOPERM) are that key's error, never a traceback."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from click.testing import CliRunner

from replag.cli import main
from replag.config import render_config
from replag.lab.server import RedisServer
from replag.repair import check, repair
from tests.helpers.configs import group_config
from tests.helpers.redis_servers import RedisFactory, replica_of, wait_listed
from tests.helpers.waiting import until


async def test_refused_writes_are_each_keys_error_and_the_run_goes_on(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    # A peer group (kind stated: independent replicas) whose third member is, in fact, a
    # read-only replica of a server outside the group, and whose second is out of memory.
    a, b = redis_factory("a"), redis_factory("b")
    upstream = redis_factory("up")
    ro = replica_of(redis_factory, upstream, "ro")
    wait_listed(upstream, [ro])
    with a.client() as ca, b.client() as cb, upstream.client() as cu:
        for client in (ca, cb, cu):
            client.set("agreed", "1")
        ca.set("only-a-b", "v")
        cb.set("only-a-b", "v")  # the read-only replica lacks it: its RESTORE is refused
        cu.set("fine", "x")
        ca.set("fine", "x")
        cb.set("fine", "x")
        cb.set("stale", "old")  # a and the replica agree on "new": b must take it
        ca.set("stale", "new")
        cu.set("stale", "new")
        cb.config_set("maxmemory", 1)  # noeviction: every write to b is refused (OOM)
    await _replicated(ro, ["agreed", "fine", "stale"])
    config = group_config(tmp_path, [a, b, ro], kind="peers", repair_settle="20ms")
    report = (await repair(config)).to_dict()
    assert report["errors"] == 2 and report["repaired"] == 0, report
    by_key = {k["key"]: k for k in report["divergent_keys"]}
    assert by_key["only-a-b"]["status"] == "error"
    assert by_key["only-a-b"]["reason"].startswith("n2 refused: READONLY"), by_key["only-a-b"]
    assert by_key["stale"]["reason"].startswith("n1 refused: OOM"), by_key["stale"]
    with b.client() as cb:
        cb.config_set("maxmemory", 0)
        assert cb.get("stale") == b"old"  # nothing half-written

    # The CLI: a human report naming the replica, exit 1; --json a JSON object.
    path = tmp_path / "replag.toml"
    path.write_text(render_config(config.topology, settings={"store": str(tmp_path / "c.db")}))
    runner = CliRunner()
    args = ["repair", "run", "-c", str(path), "--policy", "source:n1"]
    human = await asyncio.to_thread(runner.invoke, main, args)
    # source:n1 (b): copies "stale"=old over a (fine) and the replica (refused).
    assert human.exit_code == 1, human.output
    assert "n2 refused: READONLY" in human.output and "Traceback" not in human.output
    assert (await check(config)).divergent >= 1


async def _replicated(replica: RedisServer, keys: list[str]) -> None:
    def arrived() -> bool:
        with replica.client() as client:
            return bool(client.exists(*keys) == len(keys))

    await until(lambda: asyncio.to_thread(arrived), "the replica has the keys")


def test_json_is_an_object_even_on_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "replag.toml"
    path.write_text(
        '[[groups]]\nname = "g"\nmembers = ["redis://127.0.0.1:1", "redis://127.0.0.1:2"]\n'
        '[settings]\nconnect_timeout = "500ms"\nstore = "' + str(tmp_path / "s.db") + '"\n'
    )
    runner = CliRunner()
    for args in (["run"], ["check"], ["run", "--dry-run"]):
        out = runner.invoke(main, ["repair", *args, "-c", str(path), "--json"])
        assert out.exit_code == 2, out.output
        body = json.loads(out.stdout)
        assert body["exit_code"] == 2 and "127.0.0.1:1" in body["error"], body
        assert body["run_id"]  # the failed run is in the store, resumable
    bad = runner.invoke(main, ["repair", "run", "-c", str(tmp_path / "nope.toml"), "--json"])
    assert bad.exit_code == 2 and "no such file" in json.loads(bad.stdout)["error"]
