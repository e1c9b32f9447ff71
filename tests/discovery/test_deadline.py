"""Discovery contacts what it finds at once, under one overall deadline, for every kind
(`replag.discovery.deadline`): a primary listing 100 replicas, 40 Sentinels given, a
cluster of 100 shards and a Dynomite cluster of 40 nodes, every one of them a host that
never answers. Contacted one by one, never more than one connection would be open on
them at a time (and 100 would cost 100 timeouts); here as many as `AT_ONCE` are, and
every host that did not answer is reported, the deadline or its timeout named.
(A hang guard only bounds each run; how long each kind takes with SYNs dropped is
printed by `python -m tests.discovery.test_deadline`.)
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable
from typing import TypeVar

from replag.discovery.cluster import discover_cluster
from replag.discovery.deadline import AT_ONCE, DEADLINE_TIMEOUTS
from replag.discovery.dynomite import Address, NodePorts, PortMap, discover_dynomite
from replag.discovery.replication import discover_replication
from replag.discovery.result import Discovery
from replag.discovery.sentinel import discover_sentinel
from tests.helpers.dynomite_admin import admin_server
from tests.helpers.scripted import ScriptedServer, array, bulk
from tests.helpers.silent import DroppingHosts, SilentHosts

TIMEOUT_S = 0.5
HANG_GUARD_S = 60
MANY = 100

_T = TypeVar("_T")


async def _guarded(run: Awaitable[_T]) -> _T:
    return await asyncio.wait_for(run, HANG_GUARD_S)  # a hang guard only


def _in_parallel(silent: SilentHosts, count: int) -> None:
    assert silent.accepted >= count, (silent.accepted, count)
    assert silent.peak > min(count, AT_ONCE) // 2, (silent.peak, count)


def _primary_listing(host: str, ports: list[int]) -> ScriptedServer:
    lines = ["# Replication", "role:master", f"connected_slaves:{len(ports)}"]
    lines += [
        f"slave{i}:ip={host},port={port},state=online,offset=0,lag=0"
        for i, port in enumerate(ports)
    ]
    return ScriptedServer(
        {
            "INFO REPLICATION": bulk("\r\n".join(lines) + "\r\n"),
            "INFO KEYSPACE": bulk("# Keyspace\r\n"),
        }
    )


def _entry(**fields: str) -> bytes:
    return array(*(bulk(x) for kv in fields.items() for x in kv))


def _shards(host: str, ports: list[int]) -> bytes:
    shards = []
    width = 16384 // len(ports)
    for i, port in enumerate(ports):
        last = 16383 if i == len(ports) - 1 else (i + 1) * width - 1
        node = array(
            bulk("id"), bulk(f"{i:040x}"), bulk("port"), b":%d\r\n" % port,
            bulk("ip"), bulk(host), bulk("role"), bulk("master"), bulk("health"), bulk("online"),
        )  # fmt: skip
        slots = array(b":%d\r\n" % (i * width), b":%d\r\n" % last)
        shards.append(array(bulk("slots"), slots, bulk("nodes"), array(node)))
    return array(*shards)


async def _replication(silent: SilentHosts) -> Discovery:
    with _primary_listing(silent.host, silent.ports) as primary:
        return await _guarded(
            discover_replication(f"redis://{primary.address}", timeout_s=TIMEOUT_S)
        )


async def test_replicas_that_never_answer_are_asked_at_once_and_reported() -> None:
    with SilentHosts(MANY) as silent:
        found = await _replication(silent)
    _in_parallel(silent, MANY)
    (region,) = found.topology.regions
    assert len(region.replicas) == MANY
    unread = [t for t in found.endpoint_comments.values() if "could not be read" in t]
    assert len(unread) == MANY, found.endpoint_comments


async def _sentinels(silent: SilentHosts) -> Discovery:
    masters = array(_entry(name="m", ip="127.0.0.1", port="7001", flags="master"))
    answers = {
        "SENTINEL MASTERS": masters,
        "SENTINEL REPLICAS": array(_entry(ip="127.0.0.1", port="7002", flags="slave")),
        "SENTINEL SENTINELS": array(),
    }
    with ScriptedServer(answers) as sentinel:
        # The one Sentinel that answers is given last.
        addresses = [*silent.addresses, sentinel.address]
        return await _guarded(discover_sentinel(addresses, masters=[], timeout_s=TIMEOUT_S))


async def test_sentinels_that_never_answer_are_asked_at_once() -> None:
    with SilentHosts(40) as silent:
        found = await _sentinels(silent)
    _in_parallel(silent, 40)
    assert [r.name for r in found.topology.regions] == ["m"]


async def _cluster(silent: SilentHosts) -> Discovery:
    answers = {
        "CLUSTER INFO": bulk("cluster_state:ok\r\n"),
        "CLUSTER SHARDS": _shards(silent.host, silent.ports),
    }
    with ScriptedServer(answers) as seed:
        return await _guarded(discover_cluster(f"redis://{seed.address}", timeout_s=TIMEOUT_S))


async def test_shard_primaries_that_never_answer_are_asked_at_once_and_reported() -> None:
    with SilentHosts(MANY) as silent:
        found = await _cluster(silent)
    _in_parallel(silent, MANY)
    assert len(found.topology.regions) == MANY
    note = next(line for line in found.header.splitlines() if "INFO keyspace not read" in line)
    assert all(address in note for address in silent.addresses), note
    assert f"deadline ({DEADLINE_TIMEOUTS} x the timeout" in note or "timed out" in note, note


def _describe(hosts: list[str]) -> bytes:
    """A /cluster_describe of a node on each of `hosts` (the convention's peer port), one
    rack, one token each."""
    servers = [
        {"name": host, "host": host, "port": 8101, "token": i + 1} for i, host in enumerate(hosts)
    ]
    return json.dumps(
        {"dcs": [{"name": "dc1", "racks": [{"name": "r1", "servers": servers}]}]}
    ).encode()


async def _dynomite(silent: SilentHosts) -> Discovery:
    # Each node's stats port (its /info) is a silent host: its backend is then taken by
    # the convention, with a note naming the node.
    overrides = {
        f"{host}:8101": NodePorts(stats=Address(host, port))
        for host, port in zip(silent.hosts, silent.ports, strict=True)
    }
    async with admin_server({"/cluster_describe": _describe(silent.hosts)}) as url:
        return await _guarded(
            discover_dynomite(url, ports=PortMap(overrides=overrides), timeout_s=TIMEOUT_S)
        )


DYNOMITE_HOSTS = [f"127.0.0.{10 + i}" for i in range(40)]


async def test_dynomite_nodes_that_never_answer_are_asked_at_once_and_noted() -> None:
    with SilentHosts(hosts=DYNOMITE_HOSTS) as silent:
        found = await _dynomite(silent)
    _in_parallel(silent, len(DYNOMITE_HOSTS))
    notes = [line for line in found.header.splitlines() if "/info could not be read" in line]
    assert len(notes) == len(DYNOMITE_HOSTS), found.header


def main() -> None:
    """Each kind's discovery against hosts whose SYNs are dropped: its seconds, and what
    one by one would cost (one timeout each)."""
    kinds = [
        ("redis (INFO replication)", MANY, None, _replication),
        ("sentinel", 40, None, _sentinels),
        ("cluster", MANY, None, _cluster),
        ("dynomite", len(DYNOMITE_HOSTS), DYNOMITE_HOSTS, _dynomite),
    ]
    print(f"timeout {TIMEOUT_S}s; deadline {DEADLINE_TIMEOUTS} x the timeout")
    for kind, count, hosts, run in kinds:
        with DroppingHosts(count, hosts=hosts) as dropping:
            started = time.monotonic()
            asyncio.run(run(dropping))
            seconds = time.monotonic() - started
        print(
            f"{kind}: {count} hosts dropping SYNs: {seconds:.2f} s "
            f"(one by one: {count * TIMEOUT_S:.0f} s)"
        )


if __name__ == "__main__":
    main()
