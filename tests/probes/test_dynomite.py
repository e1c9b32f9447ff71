"""Probing a real Dynomite cluster through a node's client port (needs $REPLAG_DYNOMITE).

Each test discovers the cluster from a stats port, as a user would, and probes it:
writes go through Dynomite, arrivals are read on every rack's backend Redis.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from replag.cli import main
from replag.errors import UnreachableError
from replag.probes import run_probe
from replag.topology import Endpoint
from replag.wire.resp import RespConnection
from tests.helpers.dynomite_cluster import TWO_DCS, TWO_RACKS_OF_TWO, DynomiteFactory

RACKS = ["dc1-rack1", "dc1-rack2", "dc1-rack3"]
# How long a probe waits for its keys: the healthy racks must get every one (lost 0 is
# the meaning asserted), and a busy host can hold a write back well past 0.5 s; only the
# rack that never gets them costs the whole wait.
HEALTHY_RACKS_WAIT_S = 3.0


def store_env(tmp_path: Path, **more: str) -> dict[str, str]:
    return {"REPLAG_STORE": str(tmp_path / "s.sqlite"), **more}


async def test_probe_through_a_client_port_at_a_per_connection_consistency(
    dynomite_factory: DynomiteFactory, tmp_path: Path
) -> None:
    cluster = dynomite_factory()
    env = store_env(tmp_path, REPLAG_DYNOMITE_CONSISTENCY="DC_QUORUM")
    config = await cluster.discovered_config(tmp_path / "dyn.toml", **env)
    report = await run_probe(config, count=30, rate=0)
    assert report.exit_code == 0, report.to_dict()
    assert [(p.replica, p.seen, p.consistency) for p in report.pairs] == [
        (rack, 30, "DC_QUORUM") for rack in RACKS
    ]
    assert report.consistency == "DC_QUORUM"
    # What the cluster itself runs with, read from the nodes' stats ports.
    assert report.cluster_consistency is not None
    assert (report.cluster_consistency["read"], report.cluster_consistency["write"]) == (
        "DC_ONE",
        "DC_ONE",
    )
    # Only the backends' clocks are read: TIME would close the client port's connection.
    assert {c.endpoint for c in report.clock} == set(RACKS)


async def test_dc_quorum_refuses_writes_that_dc_one_accepts_with_two_racks_down(
    dynomite_factory: DynomiteFactory, tmp_path: Path
) -> None:
    """The consistency level really is set on the probe's connection: with rack2 and rack3's
    dynomite stopped, DC_ONE writes succeed on rack1 alone; DC_QUORUM ones are refused."""
    cluster = dynomite_factory()
    cluster.node("node2").stop()
    cluster.node("node3").stop()
    path = tmp_path / "dyn.toml"
    one = await cluster.discovered_config(path, **store_env(tmp_path))
    dc_one = await run_probe(one, count=10, rate=0, timeout_s=HEALTHY_RACKS_WAIT_S)
    assert dc_one.write_errors == 0
    assert [(p.replica, p.seen, p.lost) for p in dc_one.pairs] == [
        ("dc1-rack1", 10, 0),
        ("dc1-rack2", 0, 10),
        ("dc1-rack3", 0, 10),
    ]
    quorum = await cluster.discovered_config(
        path, **store_env(tmp_path, REPLAG_DYNOMITE_CONSISTENCY="DC_QUORUM")
    )
    dc_quorum = await run_probe(quorum, count=10, rate=0, timeout_s=HEALTHY_RACKS_WAIT_S)
    assert dc_quorum.write_errors == 10 and dc_quorum.exit_code == 1
    [breach] = dc_quorum.breaches
    assert breach["kind"] == "write_errors" and breach["consistency"] == "DC_QUORUM"
    assert "Peer Node is not connected" in breach["message"]


async def test_a_rack_whose_dynomite_is_down_misses_the_probes(
    dynomite_factory: DynomiteFactory, tmp_path: Path
) -> None:
    """rack3's Redis answers, but its dynomite is down: DC_ONE drops the writes for it
    silently, which the probe sees as lost keys on a reachable replica."""
    cluster = dynomite_factory()
    config = await cluster.discovered_config(tmp_path / "dyn.toml", **store_env(tmp_path))
    cluster.node("node3").stop()
    report = await run_probe(config, count=10, rate=0, timeout_s=HEALTHY_RACKS_WAIT_S)
    assert report.write_errors == 0 and report.unreachable == []
    assert [(p.replica, p.seen, p.lost) for p in report.pairs] == [
        ("dc1-rack1", 10, 0),
        ("dc1-rack2", 10, 0),
        ("dc1-rack3", 0, 10),
    ]
    assert report.exit_code == 1
    assert [b["replica"] for b in report.breaches] == ["dc1-rack3"]


async def test_a_command_dynomite_does_not_support_is_a_clear_error(
    dynomite_factory: DynomiteFactory,
) -> None:
    cluster = dynomite_factory()
    endpoint = Endpoint.from_url(cluster.node("node1").client_url, name="n1", kind="dynomite")
    conn = await RespConnection.open(endpoint, timeout_s=2)
    try:
        assert (await conn.checked("PING")) == b"PONG"
        with pytest.raises(UnreachableError, match="Dynomite closes the connection"):
            await conn.call("TIME")
    finally:
        await conn.close()


def test_both_methods_and_consistency_levels_from_the_cli(
    dynomite_factory: DynomiteFactory, tmp_path: Path
) -> None:
    """`--method dynomite-seed` (redis-py, which must speak RESP2 to a client port) and
    `--consistency DC_ONE,DC_QUORUM`: one row per rack and level, labelled."""
    cluster = dynomite_factory()
    path = tmp_path / "dyn.toml"
    stats_url, store = cluster.node("node1").stats_url, str(tmp_path / "s.sqlite")
    discover = ["topology", "discover", "--dynomite", stats_url, "--out", str(path)]
    discovered = CliRunner().invoke(main, [*discover, "--store", store, *cluster.port_map_args()])
    assert discovered.exit_code == 0, discovered.output
    base = ["probe", "--config", str(path), "--count", "20", "--rate", "0"]

    seed = CliRunner().invoke(main, [*base, "--method", "dynomite-seed", "--json"])
    assert seed.exit_code == 0, seed.output
    out = json.loads(seed.output)
    assert [(r["replica"], r["keys"]) for r in out["dynomite_seed"]] == [
        (rack, 100) for rack in RACKS
    ]
    assert all(r["avg_ms"] > 0 for r in out["dynomite_seed"])

    levels = CliRunner().invoke(main, [*base, "--consistency", "DC_ONE,DC_QUORUM", "--json"])
    assert levels.exit_code == 0, levels.output
    out = json.loads(levels.output)
    assert out["source"] == "dc1"
    assert set(out["write_ms_by_consistency"]) == {"DC_ONE", "DC_QUORUM"}
    assert [(p["consistency"], p["replica"]) for p in out["pairs"]] == [
        (level, rack) for level in ("DC_ONE", "DC_QUORUM") for rack in RACKS
    ]

    table = CliRunner().invoke(main, [*base, "--consistency", "DC_ONE,DC_QUORUM"])
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert " from dc1 " in lines[0]
    assert lines[2].split()[:3] == ["consistency", "target", "replica"]
    rows = [line.split()[:3] for line in lines[3:9]]
    assert rows == [[level, "dc1", rack] for level in ("DC_ONE", "DC_QUORUM") for rack in RACKS]
    assert any(line.startswith("write ack ms at DC_QUORUM: mean") for line in lines)


def test_two_dcs_are_probed_from_each_with_a_source_column(
    dynomite_factory: DynomiteFactory, tmp_path: Path
) -> None:
    cluster = dynomite_factory(TWO_DCS)
    path = tmp_path / "dyn.toml"
    config = asyncio.run(cluster.discovered_config(path, **store_env(tmp_path)))
    assert [r.name for r in config.topology.regions] == ["dc1", "dc2"]
    result = CliRunner().invoke(
        main,
        ["probe", "--config", str(path), "--source", "all", "--count", "10", "--no-store"],
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert " from all " in lines[0]
    assert lines[2].split()[:3] == ["source", "target", "replica"]
    rows = [line.split()[:6] for line in lines[3:7]]
    assert [r[:3] for r in rows] == [
        [source, dc, f"{dc}-rack1"] for source in ("dc1", "dc2") for dc in ("dc1", "dc2")
    ]
    assert all(r[4] == r[5] == "10" for r in rows), rows  # sent, seen


async def test_a_rack_of_several_nodes_counts_a_key_once(
    dynomite_factory: DynomiteFactory, tmp_path: Path
) -> None:
    """Two racks of two nodes: each key lives on the one node per rack owning its token."""
    cluster = dynomite_factory(TWO_RACKS_OF_TWO)
    config = await cluster.discovered_config(tmp_path / "dyn.toml", **store_env(tmp_path))
    assert len(config.topology.regions[0].replicas) == 4
    report = await run_probe(config, count=20, rate=0)
    assert [(p.replica, p.seen, p.lost) for p in report.pairs] == [
        ("rack1", 20, 0),
        ("rack2", 20, 0),
    ]
    assert report.exit_code == 0
