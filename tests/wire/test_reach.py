"""Sent only where allowed (`replag.wire.reach`): a Sentinel that names a host the topology
does not name, outside allow_networks, gets that host neither the credentials nor a write.
A capture server on 127.0.0.2 (loopback) records every command it receives: none arrives.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from replag.errors import OutsideReach
from replag.topology import Endpoint, Region, Topology
from replag.wire.reach import Reach
from tests.helpers.cli import run_replag
from tests.helpers.redis_servers import RedisFactory
from tests.helpers.scripted import ScriptedServer, array, bulk, capture_server


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return run_replag(*args, cwd=cwd, timeout=60, env={"REPLAG_CONNECT_TIMEOUT": "1s", **env})


def test_reach_admits_named_hosts_and_allowed_networks_only() -> None:
    a = Endpoint.from_url("redis://10.0.0.1:6379", name="a")
    topology = Topology(
        regions=(Region(name="r", write=a, replicas=()),), allow_networks=("10.1.0.0/16",)
    )
    reach = Reach.of(topology)
    assert reach.outside("10.0.0.1", 6379) is None
    assert reach.outside("10.1.2.3", 6379) is None
    assert reach.outside("10.0.0.1", 6380) is not None
    assert "host name" in (reach.outside("evil.example", 6379) or "")
    with pytest.raises(
        OutsideReach, match=r"named 10.9.9.9:1 as the primary.*allow_networks = 10.1.0.0/16"
    ):
        reach.admit(Endpoint.from_url("redis://10.9.9.9:1"), named_by="S", as_what="the primary")


def _sentinel_naming(host: str, port: int) -> ScriptedServer:
    return ScriptedServer({"SENTINEL GET-MASTER-ADDR-BY-NAME": array(bulk(host), bulk(str(port)))})


def _sentinel_config(tmp_path: Path, primary_port: int, sentinel_port: int) -> Path:
    """Region a: its primary (password s3cret) followed through one Sentinel."""
    config = tmp_path / "t.toml"
    config.write_text(
        f'[settings]\nstore = "{tmp_path / "s.sqlite"}"\nconnect_timeout = "1s"\n'
        f'[[regions]]\nname = "a"\nwrite = "redis://:s3cret@127.0.0.1:{primary_port}"\n'
        f'replicas = ["redis://:s3cret@127.0.0.1:{primary_port}"]\n'
        f'sentinel = {{master = "m", sentinels = ["127.0.0.1:{sentinel_port}"]}}\n'
    )
    return config


def test_a_sentinel_naming_a_host_outside_gets_it_no_auth_and_no_write(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    primary = redis_factory("primary", password="s3cret")
    with capture_server() as capture, _sentinel_naming(capture.host, capture.port) as sentinel:
        config = _sentinel_config(tmp_path, primary.port, sentinel.port)
        probe = _run(["probe", "-c", str(config), "--count", "3"], tmp_path)
        assert capture.commands == [], capture.commands
        assert sentinel.names() and "AUTH" not in sentinel.names()
        out = probe.stdout + probe.stderr
        assert probe.returncode in (2, 3), out
        assert "Traceback" not in out, out
        lines = [line for line in out.splitlines() if capture.address in line]
        assert len(lines) == 1 and "not contacted" in lines[0] and "allow_networks" in lines[0]

        # Allowed, it is followed (and the capture server sees the credentials).
        allowed = _run(
            ["probe", "-c", str(config), "--count", "1"],
            tmp_path,
            REPLAG_ALLOW_NETWORKS="127.0.0.2/32",
        )
        assert "AUTH" in capture.names(), allowed.stdout + allowed.stderr


def _entry(**fields: str) -> bytes:
    return array(*(bulk(x) for kv in fields.items() for x in kv))


def test_discover_sentinel_writes_hosts_outside_allow_networks_as_comments(
    tmp_path: Path,
) -> None:
    masters = array(
        _entry(name="inside", ip="127.0.0.1", port="7001", flags="master"),
        _entry(name="outside", ip="127.0.0.2", port="7002", flags="master"),
    )
    replicas = array(
        _entry(ip="127.0.0.1", port="7003", flags="slave"),
        _entry(ip="127.0.0.2", port="7004", flags="slave"),
    )
    others = array(_entry(ip="127.0.0.2", port="26380"))
    answers = {
        "SENTINEL MASTERS": masters,
        "SENTINEL REPLICAS": replicas,
        "SENTINEL SENTINELS": others,
    }
    with ScriptedServer(answers) as sentinel:
        out = tmp_path / "found.toml"
        found = _run(
            [
                "topology",
                "discover",
                "--sentinel",
                f"127.0.0.1:{sentinel.port}",
                "--allow-networks",
                "127.0.0.1/32",
                "--out",
                str(out),
            ],
            tmp_path,
        )
    assert found.returncode == 0, found.stdout + found.stderr
    text = out.read_text()
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    assert "127.0.0.1:7001" in body and "127.0.0.1:7003" in body
    assert "127.0.0.2" not in body, body
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    for address in ("127.0.0.2:7002", "127.0.0.2:7004", "127.0.0.2:26380"):
        assert address in header, header


async def test_under_serve_a_sentinel_naming_a_host_outside_is_a_probe_problem(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    import httpx

    from replag.alerts.condition import RuleContext
    from replag.alerts.config import AlertRule
    from replag.alerts.rules import no_probe_conditions
    from replag.api.app import create_app
    from replag.config import load_config
    from replag.store import Store

    primary = redis_factory("primary", password="s3cret")
    with capture_server() as capture, _sentinel_naming(capture.host, capture.port) as sentinel:
        path = _sentinel_config(tmp_path, primary.port, sentinel.port)
        app = create_app(
            load_config(path), store=Store(tmp_path / "s.sqlite"), run_schedulers=False
        )
        async with app.router.lifespan_context(app):
            svc = app.state.service
            assert await svc.probe_rounds[0].probe() is None
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
                body = (await client.get("/api/v1/health")).json()
            # And alerted: the no-probe rule's condition names the host not contacted.
            rule = AlertRule(name="no-probe", kind="no_probe", threshold=0)
            ctx = RuleContext(config=svc.config, index=svc.index, now_ns=time.time_ns() + 10**9)
            [condition] = no_probe_conditions(rule, ctx)
        assert condition.active and capture.address in condition.summary, condition.summary
        assert "not contacted" in condition.summary, condition.summary
        assert capture.commands == []
    assert body["status"] != "ok", body
    [problem] = [p for p in body["problems"] if p["kind"] == "probe_error"]
    assert "not contacted" in problem["message"] and capture.address in problem["message"]


async def test_a_slot_move_naming_a_host_outside_gets_it_nothing_from_a_check() -> None:
    """A check (or run) of a cluster group reads the other end of a slot move its member
    marks: a host the topology does not name is not asked, and the run says so."""
    from replag.repair.keyspace.slots import SlotMap
    from replag.wire.reach import parse_networks

    mine, other = "a" * 40, "b" * 40
    with capture_server() as capture:
        member_port: list[int] = []

        def nodes(_: list[bytes]) -> bytes:
            return bulk(
                f"{mine} 127.0.0.1:{member_port[0]}@1 myself,master - 0 0 1 connected 0-100 "
                f"[5->-{other}]\n"
                f"{other} {capture.address}@1 master - 0 0 2 connected 101-200\n"
            )

        answers = {
            "CLUSTER NODES": nodes,
            "CLUSTER COUNTKEYSINSLOT": b":0\r\n",
            "INFO": bulk("# Server\r\nredis_version:7.2.4\r\n"),
        }
        with ScriptedServer(answers) as member:
            member_port.append(member.port)
            endpoint = Endpoint.from_url(f"redis://:s3cret@{member.address}", name="m")
            topology = Topology(regions=(Region(name="r", write=endpoint, replicas=()),))
            read = await SlotMap.read([endpoint], timeout_s=1, reach=Reach.of(topology))
            assert capture.commands == [], capture.commands
            assert "CLUSTER" in member.names()
            [line] = [r for r in read.refused if capture.address in r]
            assert "not contacted" in line and "allow_networks = none" in line, line

            # Allowed, the other end is asked (with the member's credentials).
            allowed = Reach.of(topology, networks=[str(n) for n in parse_networks("127.0.0.2/32")])
            await SlotMap.read([endpoint], timeout_s=1, reach=allowed)
            assert "AUTH" in capture.names() and "CLUSTER" in capture.names()


def _shard(i: int, host: str, port: int, *, role: str = "master") -> bytes:
    node = array(
        bulk("id"), bulk(f"{i:040x}"), bulk("port"), b":%d\r\n" % port,
        bulk("ip"), bulk(host), bulk("role"), bulk(role), bulk("health"), bulk("online"),
    )  # fmt: skip
    slots = array(b":%d\r\n" % (i * 100), b":%d\r\n" % (i * 100 + 99))
    return array(bulk("slots"), slots, bulk("nodes"), array(node))


async def test_discover_cluster_asks_no_shard_outside_allow_networks(tmp_path: Path) -> None:
    """CLUSTER SHARDS naming a primary on 127.0.0.2: with --allow-networks 127.0.0.1/32 it
    gets no INFO (nor AUTH), is not written, and the header names it; allowed, it is asked."""
    from replag.discovery.cluster import discover_cluster
    from replag.discovery.contacts import Contacts, parse_networks

    with capture_server() as capture:
        keyspace = {"INFO": bulk("# Keyspace\r\n")}
        with ScriptedServer(keyspace) as inside:
            shards = array(
                _shard(0, "127.0.0.1", inside.port), _shard(1, capture.host, capture.port)
            )
            answers = {"CLUSTER INFO": bulk("cluster_state:ok\r\n"), "CLUSTER SHARDS": shards}
            with ScriptedServer(answers) as seed:
                url = f"redis://:s3cret@{seed.address}"
                contacts = Contacts(networks=parse_networks("127.0.0.1/32"))
                found = await discover_cluster(url, timeout_s=1, contacts=contacts)
                assert capture.commands == [], capture.commands
                assert "AUTH" in inside.names()
                written = {
                    ep.address
                    for r in found.topology.regions
                    for ep in (r.write, *r.replicas)
                    if ep
                }
                assert written == {inside.address}, written
                assert any(capture.address in line for line in contacts.header_lines())

                await discover_cluster(url, timeout_s=1, contacts=Contacts())
                assert "AUTH" in capture.names()


async def test_discover_redis_sends_nothing_to_a_replica_outside_allow_networks() -> None:
    """INFO replication naming a replica on 127.0.0.2: with --allow-networks 127.0.0.1/32
    it gets no AUTH and no INFO, is not written, and the header names it."""
    from replag.discovery.contacts import Contacts, parse_networks
    from replag.discovery.replication import discover_replication

    with capture_server() as capture:
        info = (
            "# Replication\r\nrole:master\r\nconnected_slaves:1\r\n"
            f"slave0:ip={capture.host},port={capture.port},state=online,offset=0,lag=0\r\n"
        )
        answers = {"INFO REPLICATION": bulk(info), "INFO KEYSPACE": bulk("# Keyspace\r\n")}
        with ScriptedServer(answers) as primary:
            url = f"redis://:s3cret@{primary.address}"
            contacts = Contacts(networks=parse_networks("127.0.0.1/32"))
            found = await discover_replication(url, timeout_s=1, contacts=contacts)
            assert capture.commands == [], capture.commands
            assert "AUTH" in primary.names()
            assert [r.replicas for r in found.topology.regions] == [()]
            assert any(capture.address in line for line in contacts.header_lines())

            await discover_replication(url, timeout_s=1, contacts=Contacts())
            assert "AUTH" in capture.names()
