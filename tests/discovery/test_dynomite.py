"""Dynomite discovery against real HTTP servers answering with captured admin output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aiohttp import web

from replag.config import load_config
from replag.discovery.dynomite import (
    Address,
    NodePorts,
    PortMap,
    discover_dynomite,
    load_port_map_file,
    parse_port_override,
)
from replag.errors import DiscoveryError, UnreachableError, UsageError
from replag.lab.server import free_port
from tests.helpers.dynomite_admin import Route, admin_server, fixture_bytes, node_routes

LOCAL = "127.0.0.1"
# The fixture clusters run on one host, so every node needs its own ports (README table).
THREE_RACK = {8101: (8102, 22121, 22222), 8111: (8112, 22122, 22232), 8121: (8122, 22123, 22242)}
TWO_DC = {8201: (8202, 22131, 22252), 8211: (8212, 22132, 22262)}


def port_map(
    table: dict[int, tuple[int, int, int]], *, seed: tuple[int, str] | None = None
) -> PortMap:
    """Overrides for the fixture layout; `seed` = (peer port, served URL) of the node we ask."""
    overrides = {}
    for peer, (client, redis_port, stats) in table.items():
        stats_address = Address(LOCAL, stats)
        if seed is not None and seed[0] == peer:
            stats_address = Address(LOCAL, int(seed[1].rsplit(":", 1)[1]))
        overrides[f"{LOCAL}:{peer}"] = NodePorts(
            client=Address(LOCAL, client), redis=Address(LOCAL, redis_port), stats=stats_address
        )
    return PortMap(overrides=overrides)


async def test_three_racks_form_one_region_and_one_replica_group(tmp_path: Path) -> None:
    async with admin_server(node_routes("3rack", "node1")) as url:
        found = await discover_dynomite(
            url, ports=port_map(THREE_RACK, seed=(8101, url)), timeout_s=5
        )
    (region,) = found.topology.regions
    assert region.name == "dc1"
    assert region.write is not None
    assert (region.write.kind, region.write.port, region.write.rack) == ("dynomite", 8102, "rack1")
    assert [(r.port, r.rack, r.kind) for r in region.replicas] == [
        (22121, "rack1", "redis"),
        (22122, "rack2", "redis"),
        (22123, "rack3", "redis"),
    ]
    (group,) = found.topology.groups
    assert group.name == "token-12345678"
    assert [m.port for m in group.members] == [22121, 22122, 22123]
    assert found.facts["consistency"] == {"read": "DC_ONE", "write": "DC_ONE"}

    path = tmp_path / "dyn.toml"
    path.write_text(found.render())
    text = path.read_text()
    assert "read DC_ONE, write DC_ONE" in text
    assert "backend Redis of node 127.0.0.1:8111: dc1/rack2, token 12345678" in text
    loaded = load_config(path, environ={})
    assert loaded.topology.to_dict() == found.topology.to_dict()
    assert loaded.settings.dynomite_stats_urls[1:] == (
        "http://127.0.0.1:22232",
        "http://127.0.0.1:22242",
    )
    assert loaded.settings.dynomite_stats_urls[0] == url


async def test_the_node_asked_is_the_one_written_through() -> None:
    async with admin_server(node_routes("3rack", "node2")) as url:
        found = await discover_dynomite(
            url, ports=port_map(THREE_RACK, seed=(8111, url)), timeout_s=5
        )
    write = found.topology.regions[0].write
    assert write is not None and (write.port, write.rack) == (8112, "rack2")


async def test_two_dcs_become_two_regions_sharing_one_replica_group(tmp_path: Path) -> None:
    async with admin_server(node_routes("2dc", "node2")) as url:
        found = await discover_dynomite(url, ports=port_map(TWO_DC, seed=(8211, url)), timeout_s=5)
    regions = found.topology.regions
    # node2 lists its own DC first; its region is the default probe source.
    assert [r.name for r in regions] == ["dc2", "dc1"]
    assert [(r.write.port if r.write else None, [x.port for x in r.replicas]) for r in regions] == [
        (8212, [22132]),
        (8202, [22131]),
    ]
    (group,) = found.topology.groups
    assert [(m.region, m.port) for m in group.members] == [("dc2", 22132), ("dc1", 22131)]
    path = tmp_path / "dyn.toml"
    path.write_text(found.render())
    assert load_config(path, environ={}).topology.to_dict() == found.topology.to_dict()


async def test_quorum_consistency_is_reported() -> None:
    routes = node_routes("3rack", "node1")
    capture = json.loads(fixture_bytes("3rack_node1_22222_get_consistency_dcquorum.json"))
    routes["/get_consistency"] = capture["body"].encode()
    async with admin_server(routes) as url:
        found = await discover_dynomite(url, ports=port_map(THREE_RACK), timeout_s=5)
    assert found.facts["consistency"] == {"read": "DC_QUORUM", "write": "DC_QUORUM"}
    assert "read DC_QUORUM, write DC_QUORUM" in found.header


async def test_a_node_without_get_consistency_still_discovers() -> None:
    routes = node_routes("3rack", "node1")
    del routes["/get_consistency"]
    async with admin_server(routes) as url:
        found = await discover_dynomite(
            url + "/cluster_describe", ports=port_map(THREE_RACK), timeout_s=5
        )
    assert found.facts["consistency"] is None
    assert len(found.topology.regions[0].replicas) == 3


async def test_production_layout_maps_ports_by_convention() -> None:
    # The 3-rack capture as production runs it: one host per node, every port by convention.
    describe = json.loads(fixture_bytes("3rack_node1_22222_cluster_describe.json"))
    for i, rack in enumerate(describe["dcs"][0]["racks"]):
        rack["servers"][0].update(host=f"10.0.0.{i + 1}", name=f"10.0.0.{i + 1}", port=8101)
    routes = node_routes("3rack", "node1")
    routes["/cluster_describe"] = json.dumps(describe).encode()
    async with admin_server(routes) as url:
        found = await discover_dynomite(url, ports=PortMap(), timeout_s=5)
    region = found.topology.regions[0]
    assert region.write is not None and region.write.address == "10.0.0.1:8102"
    assert [r.address for r in region.replicas] == [
        "10.0.0.1:22122",
        "10.0.0.2:22122",
        "10.0.0.3:22122",
    ]
    assert found.settings["dynomite_stats_urls"] == [
        "http://10.0.0.1:22222",
        "http://10.0.0.2:22222",
        "http://10.0.0.3:22222",
    ]


async def test_peer_ports_off_convention_need_a_port_map() -> None:
    async with admin_server(node_routes("3rack", "node1")) as url:
        with pytest.raises(DiscoveryError) as err:
            await discover_dynomite(url, ports=PortMap(), timeout_s=5)
    assert err.value.where == f"{url}/cluster_describe"
    assert "127.0.0.1:8111" in err.value.message and "--port-map" in err.value.message


async def test_two_nodes_mapped_to_one_backend_is_an_error() -> None:
    table = dict(THREE_RACK)
    table[8121] = (8122, 22121, 22242)  # same backend as rack1
    async with admin_server(node_routes("3rack", "node1")) as url:
        with pytest.raises(DiscoveryError, match=r"both map to 127\.0\.0\.1:22121"):
            await discover_dynomite(url, ports=port_map(table), timeout_s=5)


def _describe_without(key: str) -> bytes:
    describe = json.loads(fixture_bytes("3rack_node1_22222_cluster_describe.json"))
    del describe["dcs"][0]["racks"][1]["servers"][0][key]
    return json.dumps(describe).encode()


async def _cut_short(request: web.Request) -> web.StreamResponse:
    # Announce the whole body, send half of it, then drop the connection.
    body = fixture_bytes("3rack_node1_22222_cluster_describe.json")
    response = web.StreamResponse(headers={"Content-Length": str(len(body))})
    response.content_type = "application/json"
    await response.prepare(request)
    await response.write(body[: len(body) // 2])
    assert request.transport is not None
    request.transport.close()
    return response


async def _server_error(request: web.Request) -> web.StreamResponse:
    return web.Response(status=500, text="oops")


MALFORMED: dict[str, tuple[Route, str]] = {
    "plain text": (b"OK\r\n", "not valid JSON"),
    "truncated": (
        fixture_bytes("3rack_node1_22222_cluster_describe.json")[:150],
        "ends early (truncated JSON)",
    ),
    "empty": (b"", "the answer is empty"),
    "an array": (b"[]", "expected a JSON object, got list"),
    "info instead": (fixture_bytes("3rack_node1_22222_info.json"), "no `dcs` list"),
    "no dcs": (b'{"dcs": []}', "no `dcs` list"),
    "no racks": (b'{"dcs": [{"name": "dc1"}]}', "DC 'dc1' has no `racks` list"),
    "no servers": (
        b'{"dcs": [{"name": "dc1", "racks": [{"name": "r1", "servers": []}]}]}',
        "rack dc1/r1 lists no servers",
    ),
    "no port": (_describe_without("port"), "servers[0] (dc1/rack2) has no valid peer `port`"),
    "no token": (_describe_without("token"), "servers[0] (dc1/rack2) has no `token`"),
    "cut short": (_cut_short, "the answer was cut short"),
    "HTTP 500": (_server_error, "answered HTTP 500"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
async def test_malformed_cluster_describe_is_one_clear_error(case: str) -> None:
    body, message = MALFORMED[case]
    routes = node_routes("3rack", "node1")
    routes["/cluster_describe"] = body
    async with admin_server(routes) as url:
        with pytest.raises(DiscoveryError) as err:
            await discover_dynomite(url, ports=port_map(THREE_RACK), timeout_s=5)
    assert err.value.where == f"{url}/cluster_describe"
    assert message in err.value.message
    assert str(err.value).startswith(f"{url}/cluster_describe: ")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"Read Consistency: DC_ONE\r\n", "no 'Write Consistency:' line"),
        (b"Read Consistency: DC_ALL\r\nWrite Consistency: DC_ONE\r\n", "unknown read consistency"),
        (b"<html>hello</html>", "no 'Read Consistency:' line"),
    ],
)
async def test_malformed_consistency_is_one_clear_error(body: bytes, message: str) -> None:
    routes = node_routes("3rack", "node1")
    routes["/get_consistency"] = body
    async with admin_server(routes) as url:
        with pytest.raises(DiscoveryError, match=message) as err:
            await discover_dynomite(url, ports=port_map(THREE_RACK), timeout_s=5)
    assert err.value.where == f"{url}/get_consistency"


async def test_nothing_listening_is_unreachable() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(UnreachableError) as err:
        await discover_dynomite(url, ports=PortMap(), timeout_s=2)
    assert err.value.where == f"{url}/cluster_describe"


def test_port_overrides_from_the_command_line_and_a_file(tmp_path: Path) -> None:
    peer, ports = parse_port_override("127.0.0.1:8111=client:8112,redis:10.0.0.9:22122,stats:22232")
    assert peer == "127.0.0.1:8111"
    assert ports == NodePorts(
        client=Address(LOCAL, 8112), redis=Address("10.0.0.9", 22122), stats=Address(LOCAL, 22232)
    )
    for bad in (
        "127.0.0.1:8111",
        "127.0.0.1=client:1",
        "127.0.0.1:8111=backend:1",
        "127.0.0.1:8111=client:x",
    ):
        with pytest.raises(UsageError):
            parse_port_override(bad)
    path = tmp_path / "ports.toml"
    path.write_text(
        "[conventions]\nclient_port = 9102\n\n"
        '[nodes."10.0.0.1:8101"]\nredis = 6379\nstats = "10.0.0.1:9000"\n'
    )
    loaded = load_port_map_file(path, PortMap())
    assert loaded.client == 9102 and loaded.redis == 22122
    assert loaded.resolve("10.0.0.1", 8101, where="w", label="l") == {
        "client": Address("10.0.0.1", 9102),
        "redis": Address("10.0.0.1", 6379),
        "stats": Address("10.0.0.1", 9000),
    }
    path.write_text("[nodes]\nx = 1\n")
    with pytest.raises(UsageError, match="expected client, redis, stats"):
        load_port_map_file(path, PortMap())


async def test_a_backend_named_outside_allow_networks_is_not_written() -> None:
    """A node's /info naming its backend on 127.0.0.2, with --allow-networks 127.0.0.1/32:
    that node is left out of the file, and the header names the backend."""
    from replag.discovery.contacts import Contacts, parse_networks

    servers = [{"name": LOCAL, "host": LOCAL, "port": peer, "token": 1} for peer in (8101, 8111)]
    describe = {"dcs": [{"name": "dc1", "racks": [{"name": "r1", "servers": servers}]}]}
    info = {"dyn_o_mite": {"127.0.0.2:22122": {"server_status": "ONLINE"}}}
    routes = {
        "/cluster_describe": json.dumps(describe).encode(),
        "/info": json.dumps(info).encode(),
    }
    async with admin_server(routes) as url:
        port = int(url.rsplit(":", 1)[1])
        ports = PortMap(
            overrides={
                f"{LOCAL}:8101": NodePorts(redis=Address(LOCAL, 22199)),
                f"{LOCAL}:8111": NodePorts(client=Address(LOCAL, 8112), stats=Address(LOCAL, port)),
            }
        )
        contacts = Contacts(networks=parse_networks("127.0.0.1/32"))
        found = await discover_dynomite(url, ports=ports, timeout_s=5, contacts=contacts)
    backends = {ep.address for r in found.topology.regions for ep in r.replicas}
    assert backends == {f"{LOCAL}:22199"}, backends
    assert "127.0.0.2:22122" in "\n".join(contacts.header_lines())
