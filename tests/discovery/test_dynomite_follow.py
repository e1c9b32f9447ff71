"""Following a real Dynomite DC (needs $REPLAG_DYNOMITE): discovery reads each node's
backend from its own /info, and the probe writes through another rack's node when the
one it uses is down, saying so."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from replag.cli import main
from replag.config import load_config
from replag.discovery.dynomite import PortMap, discover_dynomite
from replag.discovery.dynomite_ports import Address, NodePorts
from replag.errors import DiscoveryError
from replag.probes import run_probe
from tests.helpers.dynomite_admin import admin_server, node_routes
from tests.helpers.dynomite_cluster import DynomiteFactory

RACKS = ("dc1-rack1", "dc1-rack2", "dc1-rack3")


def test_discovery_without_a_port_map_finds_every_backend(
    dynomite_factory: DynomiteFactory, tmp_path: Path
) -> None:
    """One node per host (here one loopback address each), every port by convention but
    the backends': no --port-map, each node's /info names its backend."""
    cluster = dynomite_factory(host_per_node=True)
    first = cluster.nodes[0]
    out = tmp_path / "dyn.toml"
    conventions = ["--peer-port", str(first.peer_port), "--client-port", str(first.client_port),
                   "--stats-port", str(first.stats_port)]  # fmt: skip
    result = CliRunner().invoke(
        main,
        ["topology", "discover", "--dynomite", first.stats_url, *conventions, "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    (region,) = load_config(out, environ={}).topology.regions
    assert [(r.address, r.rack) for r in region.replicas] == [
        (f"127.0.0.1:{n.backend.port}", n.rack) for n in cluster.nodes
    ]
    assert "(from /info)" in out.read_text()
    # Every rack's client port takes writes: the first node's, then the others' in order.
    assert region.write is not None and region.write.address == f"{first.host}:{first.client_port}"
    assert [w.address for w in region.write_fallbacks] == [
        f"{n.host}:{n.client_port}" for n in cluster.nodes[1:]
    ]


async def test_a_port_map_without_redis_reads_the_backends_from_info(
    dynomite_factory: DynomiteFactory,
) -> None:
    cluster = dynomite_factory()
    ports = PortMap(
        overrides={
            n.peer: NodePorts(
                client=Address("127.0.0.1", n.client_port), stats=Address("127.0.0.1", n.stats_port)
            )
            for n in cluster.nodes
        }
    )
    found = await discover_dynomite(cluster.nodes[0].stats_url, ports=ports, timeout_s=5)
    (region,) = found.topology.regions
    assert [r.port for r in region.replicas] == [n.backend.port for n in cluster.nodes]


async def test_a_port_map_missing_a_port_says_which() -> None:
    """Off the peer-port convention, a map giving client but not stats names stats (and
    not redis: /info names the backend)."""
    routes = node_routes("3rack", "node1")
    overrides = {
        f"127.0.0.1:{peer}": NodePorts(client=Address("127.0.0.1", peer + 1))
        for peer in (8101, 8111, 8121)
    }
    async with admin_server(routes) as url:
        with pytest.raises(DiscoveryError) as err:
            await discover_dynomite(url, ports=PortMap(overrides=overrides), timeout_s=5)
    message = err.value.message
    assert "its --port-map gives client but not stats" in message
    assert (
        "give it with --port-map 127.0.0.1:8111=stats:PORT" in message
        and "redis: is optional" in message
    )


async def test_the_write_endpoints_node_down_the_probe_writes_through_another_rack(
    dynomite_factory: DynomiteFactory, tmp_path: Path
) -> None:
    cluster = dynomite_factory()
    config = await cluster.discovered_config(
        tmp_path / "dyn.toml", REPLAG_STORE=str(tmp_path / "s.sqlite")
    )
    (region,) = config.topology.regions
    assert region.write is not None and region.write.port == cluster.node("node1").client_port
    cluster.node("node1").stop()  # rack1's dynomite; its backend keeps running
    report = await run_probe(config, count=20, rate=0, timeout_s=3)
    node2 = cluster.node("node2")
    assert report.write_endpoint.endswith(f":{node2.client_port}")
    [note] = [n for n in report.notes if "writing through" in n]
    assert "dc1-rack1-dynomite" in note and "dc1-rack2-dynomite" in note
    seen = {p.replica: (p.seen, p.lost) for p in report.pairs}
    # rack2 and rack3 get every write; rack1's node is down, so its backend gets none.
    assert seen == {"dc1-rack1": (0, 20), "dc1-rack2": (20, 0), "dc1-rack3": (20, 0)}
    assert "writing through" in report.render()
