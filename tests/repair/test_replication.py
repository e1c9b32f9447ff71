"""Repair of a real primary and its replicas: the primary is the truth, and the only one written.

A writable replica (`replica-read-only no`) holding a stray key, a changed value
and a changed TTL is fixed through the primary: the primary re-asserts its value
(RESTORE of its own DUMP) and removes the stray key with a SET and DEL in one
transaction (a DEL of a key it lacks would replicate nothing), and replication
carries both. MONITOR on the replicas shows no write command from any client but
the replication link. A replica that follows another primary is reported for a
resync, never written, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import jsonschema
import redis
from click.testing import CliRunner

from replag.cli import main
from replag.config import Config, config_from_dict, render_config
from replag.lab.server import RedisServer
from replag.repair import check, repair
from replag.schemas import schema
from tests.helpers.monitor import Monitor, writes_by_clients
from tests.helpers.redis_servers import RedisFactory, replica_of, wait_listed
from tests.helpers.waiting import until


def _config(tmp_path: Path, members: list[RedisServer], **group: Any) -> Config:
    """Members named by role; the primary deliberately not first (found by role)."""
    data = {
        "settings": {"store": str(tmp_path / "s.sqlite"), "repair_settle": "100ms"},
        "groups": [{"name": "g", "members": [{"name": n.name, "url": n.url} for n in members],
                    **group}],
    }  # fmt: skip
    return config_from_dict(data, where="test")


async def _same(servers: list[RedisServer], key: str) -> None:
    def agree() -> bool:
        dumps = []
        for server in servers:
            with server.client() as client:
                dumps.append((client.dump(key), client.ttl(key) > 0))
        return len(set(dumps)) == 1

    await until(lambda: asyncio.to_thread(agree), f"{key} alike on every server")


def _hlen_everywhere(servers: list[RedisServer], key: str, size: int) -> bool:
    # (a DUMP of a large hash lists fields in table order, which differs between servers)
    for server in servers:
        with server.client() as client:
            if client.hlen(key) != size:
                return False
    return True


async def test_a_writable_replica_is_fixed_through_the_primary_and_never_written(
    value_kind: str, tmp_path: Path, redis_factory: RedisFactory
) -> None:
    primary = redis_factory("p")
    writable = replica_of(redis_factory, primary, "w")
    with writable.client() as w:
        w.config_set("replica-read-only", "no")
    readonly = replica_of(redis_factory, primary, "ro")
    wait_listed(primary, [writable, readonly])
    everyone = [primary, writable, readonly]
    with primary.client() as p:
        for i in range(5):
            p.set(f"k{i}", f"v{i}")
        p.hset("h", mapping={"a": "1", "b": "2"})
        # Above repair_page_elements (2000): copied in pages, on the primary only.
        p.hset("big", mapping={f"f{i}": i for i in range(2500)})
    for key in ("k4", "h"):
        await _same(everyone, key)
    await until(lambda: asyncio.to_thread(_hlen_everywhere, everyone, "big", 2500), "big")
    with writable.client() as w:
        w.set("stray", "only on the writable replica")
        w.set("k1", "changed on the replica")
        w.expire("k2", 3600)
        w.hset("h", "c", "3")
        w.hset("big", "f7", "changed on the replica")
    config = _config(tmp_path, [writable, primary, readonly])

    found = (await check(config)).to_dict()
    assert found["divergent"] == 5 and found["groups"][0]["kind"] == "replication"
    assert found["groups"][0]["primary"] == primary.name
    assert found["groups"][0]["per_replica"][writable.name] | {} == {
        "missing": 0, "extra": 1, "different": 4, "copy": 0, "delete": 0, "leave": 5,
    }  # fmt: skip

    # The dry run says, per replica, what it would do; the CLI exits 1 (divergence remains).
    dry = (await repair(config, dry_run=True)).to_dict()
    per = dry["groups"][0]["per_replica"]
    assert per[writable.name]["copy"] == 4 and per[writable.name]["delete"] == 1
    assert per[readonly.name] == dict.fromkeys(per[readonly.name], 0)
    path = tmp_path / "replag.toml"
    path.write_text(render_config(config.topology, settings={"store": str(tmp_path / "c.db")}))
    shown = await asyncio.to_thread(
        CliRunner().invoke, main, ["repair", "run", "-c", str(path), "--dry-run"]
    )
    assert shown.exit_code == 1, shown.output
    assert f"primary {primary.name}, policy primary" in shown.output
    # One vocabulary: the summary counts keys as the per-replica table does (the stray key
    # is extra, not missing), and the few keys it would act on are named.
    summary = next(line for line in shown.output.splitlines() if line.startswith("g "))
    assert summary.split()[1:4] == ["0", "1", "4"], shown.output
    assert f"  g 'stray' extra: delete on {writable.name} (through {primary.name})" in (
        shown.output
    )
    row = next(line for line in shown.output.splitlines()
               if line.strip().startswith(writable.name) and line.count(",") == 2)  # fmt: skip
    assert row.split()[1:] == ["0", "1", "4", "4,", "1,", "0"], shown.output
    as_json = await asyncio.to_thread(
        CliRunner().invoke, main, ["repair", "run", "-c", str(path), "--dry-run", "--json"]
    )
    assert as_json.exit_code == 1
    document = json.loads(as_json.stdout)
    jsonschema.validate(document, schema("repair"))  # the published contract
    (stray,) = [k for k in document["divergent_keys"] if k["key"] == "stray"]
    assert stray["findings"] == {writable.name: "extra"} and stray["via"] == primary.name
    assert stray["plan"] == {writable.name: "delete"} and stray["status"] == "would_repair"

    monitors = [Monitor(writable.port), Monitor(readonly.port)]
    try:
        report = (await repair(config)).to_dict()
    finally:
        seen = [m.stop() for m in monitors]
    assert report["repaired"] == 5 and report["errors"] == report["resync"] == 0, report
    assert (await check(config)).divergent == 0
    with primary.client() as p, writable.client() as w:
        assert p.exists("stray") == 0 and w.exists("stray") == 0
        assert w.get("k1") == b"v1" and w.ttl("k2") == -1 and w.hlen("h") == 2
        assert w.hget("big", "f7") == b"7" and w.hlen("big") == 2500
        for server, lines in zip((writable, readonly), seen, strict=True):
            assert writes_by_clients(lines, p, primary_port=primary.port) == [], server.name
        # Replag did read both replicas (the monitors saw it), and wrote only the primary,
        # whose link carried the fixes (the filter would have caught them from anyone else).
        assert all(any('"TYPE"' in line for line in lines) for lines in seen)
        from_link = writes_by_clients(seen[0], p, primary_port=-1)
        assert any('"DEL" "stray"' in line for line in from_link), from_link
        assert any('"RESTORE" "k1"' in line for line in from_link), from_link
        # The large hash came in pages, swapped in by a RENAME: never one RESTORE.
        assert any('"RENAME"' in line and '"big"' in line for line in from_link)
        assert not any('"RESTORE" "big"' in line for line in from_link)
    assert report["replicas"][0]["writes"] == 0 and report["replicas"][2]["writes"] == 0


async def test_a_replica_of_another_primary_is_left_for_a_resync(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    primary, elsewhere = redis_factory("p"), redis_factory("x")
    follower = replica_of(redis_factory, primary, "f")
    lost = replica_of(redis_factory, elsewhere, "lost")  # read-only, follows another primary
    wait_listed(primary, [follower])
    wait_listed(elsewhere, [lost])
    with primary.client() as p, elsewhere.client() as x:
        p.set("k", "truth")
        x.set("k", "other")
    await _same([primary, follower], "k")
    await _same([elsewhere, lost], "k")
    config = _config(tmp_path, [primary, follower, lost], kind="replication")
    report = (await repair(config)).to_dict()
    assert report["resync"] == 1 and report["errors"] == 0, report
    (key,) = report["divergent_keys"]
    assert key["status"] == "resync" and f"{lost.name}: it replicates from another" in key["reason"]
    assert report["replicas"][2]["writes"] == 0
    assert report["groups"][0]["per_replica"][lost.name]["leave"] == 1  # not "copy"
    with lost.client() as c:
        assert c.get("k") == b"other"

    # A key left for a resync is left: the CLI exits 1 (a cron job must not read success),
    # says so in the summary and `repair runs`, and --keys-out lists it.
    path = tmp_path / "replag.toml"
    path.write_text(render_config(config.topology, settings={"store": str(tmp_path / "c.db")}))
    out = tmp_path / "keys.jsonl"
    ran = await asyncio.to_thread(
        CliRunner().invoke, main, ["repair", "run", "-c", str(path), "--keys-out", str(out)]
    )
    assert ran.exit_code == 1, ran.output
    assert "also: resync 1" in ran.output and "'k' value resync" in ran.output
    (line,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert line["key"] == "k" and line["status"] == "resync" and line["findings"], line
    runs = await asyncio.to_thread(CliRunner().invoke, main, ["repair", "runs", "-c", str(path)])
    assert "repaired 0, left 1" in runs.output, runs.output


async def test_a_database_with_keys_is_checked_or_said_to_be_unchecked(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    primary = redis_factory("p")
    replica = replica_of(redis_factory, primary, "r")
    wait_listed(primary, [replica])
    with replica.client() as r:
        r.config_set("replica-read-only", "no")
    with primary.client() as p:
        p.set("in-db0", "x")
        p.execute_command("SELECT", "3")
        p.mset({f"k{i}": i for i in range(100)})
    await until(lambda: asyncio.to_thread(_db3_size, replica, 100), "db3 replicated")
    with replica.client() as r:
        r.execute_command("SELECT", "3")
        r.set("k1", "changed")
        r.delete("k2")
        r.set("stray", "1")

    # A config naming db0 only: the check compares db0, finds it clean, and says plainly
    # that db3 holds keys nobody compared: not clean, exit 1.
    path = tmp_path / "db0.toml"
    path.write_text(render_config(
        _config(tmp_path, [primary, replica], kind="replication").topology,
        settings={"store": str(tmp_path / "c.db")},
    ))  # fmt: skip
    shown = await asyncio.to_thread(CliRunner().invoke, main, ["repair", "check", "-c", str(path)])
    assert shown.exit_code == 1, shown.output
    assert f"{primary.name} (127.0.0.1:{primary.port}) db3: 100 keys" in shown.output, shown.output
    assert "NOT CLEAN: 2 databases holding keys were not checked" in shown.output
    as_json = await asyncio.to_thread(
        CliRunner().invoke, main, ["repair", "check", "-c", str(path), "--json"]
    )
    document = json.loads(as_json.stdout)
    jsonschema.validate(document, schema("check"))
    assert document["divergent"] == 0 and as_json.exit_code == 1
    unchecked = sorted((u["member"], u["db"], u["keys"]) for u in document["unchecked_databases"])
    assert unchecked == sorted([(primary.name, 3, 100), (replica.name, 3, 100)]), unchecked

    # Discovery writes a group per database that holds keys: every difference is found.
    found = tmp_path / "found.toml"
    discovered = await asyncio.to_thread(
        CliRunner().invoke,
        main,
        ["topology", "discover", "--redis", primary.url, "--out", str(found)],
    )
    assert discovered.exit_code == 0, discovered.output
    env = {"REPLAG_STORE": str(tmp_path / "d.db")}
    checked = await asyncio.to_thread(
        CliRunner(env=env).invoke, main, ["repair", "check", "-c", str(found), "--json"]
    )
    document = json.loads(checked.stdout)
    assert checked.exit_code == 1 and document["unchecked_databases"] == [], checked.output
    by_group = {g["group"]: g["divergent"] for g in document["groups"]}
    # A replica set's group is named after its primary (host:port), its db 3 beside it.
    name = f"127.0.0.1:{primary.port}"
    assert by_group == {name: 0, f"{name}-db3": 3}, by_group


def _db3_size(server: RedisServer, size: int) -> bool:
    with server.client() as client:
        client.execute_command("SELECT", "3")
        return bool(client.dbsize() == size)


async def test_a_replica_whose_link_is_down_is_left_for_a_resync_and_the_run_exits_1(
    server_kind: str, lab_factory: Any, tmp_path: Path
) -> None:
    """A replica cut off from its primary (a real lab's relay partitioned) lacks what was
    written since: no write through the primary reaches it, so its keys are left for a
    resync, named with why, and `repair run` exits 1, never 0 (a cron job reads success)."""
    from replag.lab.cluster import lab_fault, lab_topology

    state = lab_factory(regions=("a", "b"), delays_ms={"b": 1})
    ports = {p["name"]: p["port"] for p in state["processes"] if p["kind"] == "redis-server"}
    primary = next(p["port"] for p in state["processes"] if p["role"] == "primary")
    lab_fault(Path(state["dir"]), "b", "partition")

    def link_down() -> bool:
        with redis.Redis(port=ports["b-1"]) as c:
            return bool(c.info("replication").get("master_link_status") == "down")

    await until(lambda: asyncio.to_thread(link_down), "b-1's link down")
    with redis.Redis(port=primary) as p:
        for i in range(5):
            p.set(f"cut:{i}", i)
        p.execute_command("WAIT", 1, 5000)  # a-1 has them
    path = tmp_path / "replag.toml"
    path.write_text(render_config(lab_topology(state), settings={"store": str(tmp_path / "s.db")}))
    ran = await asyncio.to_thread(
        CliRunner().invoke, main, ["repair", "run", "-c", str(path), "--json"]
    )
    assert ran.exit_code == 1, ran.output
    report = json.loads(ran.stdout)
    assert (report["resync"], report["repaired"], report["errors"]) == (5, 0, 0), report
    reasons = {k["key"]: k.get("reason", "") for k in report["divergent_keys"]}
    assert set(reasons) == {f"cut:{i}" for i in range(5)}, reasons
    assert all("b-1" in r and "link to its primary" in r for r in reasons.values()), reasons
    text = await asyncio.to_thread(CliRunner().invoke, main, ["repair", "run", "-c", str(path)])
    assert text.exit_code == 1 and "resync 5" in text.output, text.output
