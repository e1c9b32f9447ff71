"""Probing through a Dynomite client port: only commands Dynomite accepts are sent to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from replag.config import load_config
from replag.errors import UnreachableError
from replag.probes import run_probe
from replag.resp import RespConnection
from replag.topology import Endpoint
from tests.helpers.dynomite_admin import admin_server, node_routes
from tests.helpers.dynomite_proxy import REJECTED, running_proxy
from tests.helpers.redis_servers import RedisFactory


def _config(
    tmp_path: Path,
    proxy_port: int,
    backends: list[int],
    consistency: str = "",
    stats_url: str = "",
) -> Path:
    path = tmp_path / "dyno.toml"
    replicas = ", ".join(
        f'{{ name = "rack{i + 1}", url = "redis://127.0.0.1:{port}", rack = "rack{i + 1}" }}'
        for i, port in enumerate(backends)
    )
    path.write_text(
        f'[settings]\nstore = "{tmp_path / "s.sqlite"}"\n'
        + (f'dynomite_consistency = "{consistency}"\n' if consistency else "")
        + (f'dynomite_stats_urls = ["{stats_url}"]\n' if stats_url else "")
        + f'[[regions]]\nname = "dc1"\nwrite = "redis://127.0.0.1:{proxy_port}"\n'
        f'write_kind = "dynomite"\nreplicas = [{replicas}]\n'
    )
    return path


async def test_probe_through_a_dynomite_client_port(
    redis_factory: RedisFactory, tmp_path: Path
) -> None:
    racks = [
        redis_factory(f"rack{i}", extra_args=("--notify-keyspace-events", "K$")) for i in range(3)
    ]
    with running_proxy(racks[0].port, [r.port for r in racks[1:]]) as proxy:
        async with admin_server(node_routes("3rack", "node1")) as stats_url:
            config = load_config(
                _config(
                    tmp_path,
                    proxy.port,
                    [r.port for r in racks],
                    consistency="DC_QUORUM",
                    stats_url=stats_url,
                )
            )
            report = await run_probe(config, count=30, rate=0)
    assert report.exit_code == 0, report.to_dict()
    assert [(p.replica, p.seen) for p in report.pairs] == [
        ("rack1", 30),
        ("rack2", 30),
        ("rack3", 30),
    ]
    assert report.consistency == "DC_QUORUM" and proxy.consistency == [b"DC_QUORUM"]
    # What the cluster itself runs with, read from the node's stats port (captured answer).
    assert report.cluster_consistency is not None
    assert (report.cluster_consistency["read"], report.cluster_consistency["write"]) == (
        "DC_ONE",
        "DC_ONE",
    )
    assert not set(proxy.commands) & REJECTED, "a command Dynomite rejects reached the proxy"
    assert b"CONFIG" not in proxy.commands
    # The clock of the proxy is never read (TIME closes the connection); the racks' are.
    assert {c.endpoint for c in report.clock} == {"rack1", "rack2", "rack3"}


async def test_a_rack_down_under_dc_one_loses_probes(
    redis_factory: RedisFactory, tmp_path: Path
) -> None:
    racks = [redis_factory(f"rack{i}") for i in range(3)]
    with running_proxy(racks[0].port, [r.port for r in racks[1:]]) as proxy:
        config = load_config(_config(tmp_path, proxy.port, [r.port for r in racks]))
        racks[2].stop()
        report = await run_probe(config, count=10, rate=0, timeout_s=0.5)
    assert report.exit_code == 1
    assert [u["replica"] for u in report.unreachable] == ["rack3"]
    assert [(p.replica, p.seen) for p in report.pairs][:2] == [("rack1", 10), ("rack2", 10)]


async def test_a_rejected_command_is_a_clear_error(redis_factory: RedisFactory) -> None:
    rack = redis_factory("rack")
    with running_proxy(rack.port, []) as proxy:
        endpoint = Endpoint.from_url(
            f"redis://127.0.0.1:{proxy.port}", name="dc1-node1", kind="dynomite"
        )
        conn = await RespConnection.open(endpoint, timeout_s=2)
        with pytest.raises(UnreachableError, match="Dynomite closes the connection"):
            await conn.call("TIME")
        await conn.close()


def test_write_latency_per_consistency_level(redis_factory: RedisFactory, tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from replag.cli import main

    racks = [redis_factory(f"rack{i}") for i in range(2)]
    with running_proxy(racks[0].port, [racks[1].port]) as proxy:
        path = _config(tmp_path, proxy.port, [r.port for r in racks])
        result = CliRunner().invoke(
            main,
            [
                "probe",
                "--config",
                str(path),
                "--count",
                "10",
                "--rate",
                "0",
                "--consistency",
                "DC_ONE,DC_QUORUM",
                "--json",
            ],
        )
        bad = CliRunner().invoke(main, ["probe", "--config", str(path), "--consistency", "ALL"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert set(out["write_ms_by_consistency"]) == {"DC_ONE", "DC_QUORUM"}
    assert proxy.consistency == [b"DC_ONE", b"DC_QUORUM"]
    assert bad.exit_code == 2 and "--dynomite-consistency" in bad.output


async def test_a_rack_of_several_nodes_counts_a_key_once(
    redis_factory: RedisFactory, tmp_path: Path
) -> None:
    # rack1 and rack2 each hold two nodes; each key lives on one node per rack (here:
    # the proxy writes rack1's first node and forwards to rack2's first node only).
    nodes = [redis_factory(f"n{i}") for i in range(4)]
    with running_proxy(nodes[0].port, [nodes[2].port]) as proxy:
        path = tmp_path / "dyno.toml"
        replicas = ", ".join(
            f'{{ name = "n{i}", url = "redis://127.0.0.1:{n.port}", rack = "rack{i // 2 + 1}" }}'
            for i, n in enumerate(nodes)
        )
        path.write_text(
            f'[settings]\nstore = "{tmp_path / "s.sqlite"}"\n[[regions]]\nname = "dc1"\n'
            f'write = "redis://127.0.0.1:{proxy.port}"\nwrite_kind = "dynomite"\n'
            f"replicas = [{replicas}]\n"
        )
        report = await run_probe(load_config(path), count=10, rate=0)
    assert [(p.replica, p.seen, p.lost) for p in report.pairs] == [
        ("rack1", 10, 0),
        ("rack2", 10, 0),
    ]
    assert report.exit_code == 0
