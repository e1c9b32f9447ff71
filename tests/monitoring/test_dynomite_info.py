"""Dynomite /info collection from real HTTP servers answering with captured node output."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from pathlib import Path

import jsonschema
from click.testing import CliRunner

from replag.cli import main
from replag.lab.server import free_port
from replag.monitoring.dropped_writes import (
    DROPPED_WRITES_MESSAGE,
    counter_growth,
    dropped_writes,
    find_dropped_writes,
)
from replag.monitoring.dynomite_stats import collect_dynomite_stats, recent_stats
from replag.schemas import SCHEMA_VERSION, schema
from replag.store import Store
from tests.helpers.dynomite_admin import (
    admin_server,
    admin_server_in_thread,
    fixture_bytes,
    node_routes,
)

NODES = [
    ("3rack", "node1"),
    ("3rack", "node2"),
    ("3rack", "node3"),
    ("2dc", "node1"),
    ("2dc", "node2"),
]


def info_with(layout_node: str, **changes: int) -> bytes:
    """A node's captured /info with some dyn_o_mite counters or top-level figures changed."""
    info = json.loads(fixture_bytes(f"{layout_node}_info.json"))
    for key, value in changes.items():
        (info["dyn_o_mite"] if key in info["dyn_o_mite"] else info)[key] = value
    return json.dumps(info).encode()


async def test_every_captured_node_is_parsed_and_stored(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    async with AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(admin_server(node_routes(*n))) for n in NODES]
        collected = await collect_dynomite_stats(urls, store=store, timeout_s=5)
    assert collected.errors == {}
    by_node = {s.node: s for s in collected.samples}
    rack1 = by_node[urls[0]]
    assert (rack1.dc, rack1.rack, rack1.uptime_s, rack1.backends) == (
        "dc1",
        "rack1",
        11,
        ("127.0.0.1:22121",),
    )
    assert rack1.figures["cross_zone_latency_p99_us"] == 217
    assert rack1.figures["cross_zone_queue_wait_p99_us"] == 52
    assert rack1.figures["peer_dropped_requests"] == 0
    assert rack1.figures["peer_out_queue_p99"] == 2
    dc1 = by_node[urls[3]]
    assert (dc1.dc, dc1.figures["cross_region_rtt_p99_us"]) == ("dc1", 35427)
    assert dc1.figures["client_non_quorum_w_responses"] == 3
    assert by_node[urls[4]].backends == ("127.0.0.1:22132",)
    stored = {s.node: s for s in recent_stats(store)}
    assert stored == by_node
    store.close()


async def test_growing_dropped_peer_requests_is_reported_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    routes = node_routes("3rack", "node2")
    async with admin_server(routes) as url:
        await collect_dynomite_stats([url], store=store, timeout_s=5)
        assert find_dropped_writes(store) == []  # one sample: no baseline yet
        await collect_dynomite_stats([url], store=store, timeout_s=5)
        assert find_dropped_writes(store) == []  # nothing changed

        routes["/info"] = info_with(
            "3rack_node2_22232",
            uptime=88,
            peer_dropped_requests=5,
            remote_peer_dropped_requests=2,
            peer_timedout_requests=3,
        )
        await collect_dynomite_stats([url], store=store, timeout_s=5)
        (finding,) = find_dropped_writes(store)
        assert (finding.node, finding.dc, finding.rack) == (url, "dc1", "rack2")
        assert (finding.dropped, finding.timed_out) == (7, 3)
        assert finding.message == DROPPED_WRITES_MESSAGE
        assert finding.since_ns < finding.until_ns

        await collect_dynomite_stats([url], store=store, timeout_s=5)
        assert find_dropped_writes(store) == []  # no new drops since

        # Restarted (uptime went back): what it counts now happened since the last sample.
        routes["/info"] = info_with("3rack_node2_22232", uptime=3, peer_dropped_requests=1)
        await collect_dynomite_stats([url], store=store, timeout_s=5)
        (finding,) = find_dropped_writes(store)
        assert finding.dropped == 1
    store.close()


async def test_a_dead_or_confused_node_does_not_stop_the_others(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    confused = node_routes("3rack", "node3")
    confused["/info"] = confused["/cluster_describe"]
    dead = f"http://127.0.0.1:{free_port()}"
    async with admin_server(node_routes("3rack", "node1")) as good, admin_server(confused) as bad:
        collected = await collect_dynomite_stats([good, bad, dead], store=store, timeout_s=2)
    assert [s.node for s in collected.samples] == [good]
    assert (
        collected.errors[bad] == f"{bad}/info: not a Dynomite /info answer (no service: dynomite)"
    )
    assert collected.errors[dead].startswith(f"{dead}/info: unreachable")
    assert [s.node for s in recent_stats(store)] == [good]
    store.close()


async def test_growth_needs_a_baseline_and_survives_periodic_resets() -> None:
    async with admin_server(node_routes("3rack", "node1")) as url:
        (before,) = (await collect_dynomite_stats([url], store=None, timeout_s=5)).samples
    later = before.__class__(
        **{
            **before.__dict__,
            "uptime_s": 400,
            "figures": {**before.figures, "peer_dropped_requests": 9},
        }
    )
    assert counter_growth(None, later, "peer_dropped_requests") == 0
    assert dropped_writes(None, later) is None
    assert counter_growth(before, later, "peer_dropped_requests") == 9
    reset = later.__class__(
        **{
            **later.__dict__,
            "uptime_s": 700,
            "figures": {**later.figures, "peer_dropped_requests": 4},
        }
    )
    assert counter_growth(later, reset, "peer_dropped_requests") == 4
    assert dropped_writes(reset, reset) is None


def test_the_cron_command_collects_and_exits_1_on_dropped_writes(tmp_path: Path) -> None:
    routes = node_routes("3rack", "node1")
    config = tmp_path / "dyn.toml"
    with admin_server_in_thread(routes) as url:
        config.write_text(
            f'[settings]\nstore = "{tmp_path / "s.sqlite"}"\ndynomite_stats_urls = ["{url}"]\n\n'
            '[[groups]]\nname = "g"\nmembers = ["redis://127.0.0.1:22121", "redis://127.0.0.1:22122"]\n'
        )
        runner = CliRunner()
        first = runner.invoke(main, ["topology", "dynomite-stats", "-c", str(config)])
        assert first.exit_code == 0, first.output
        assert (
            "dc1/rack1: peer connections 2, link failures (eof/err/timeouts) 0/0/0, "
            "peer dropped 0" in first.stdout
        )
        routes["/info"] = info_with("3rack_node1_22222", uptime=20, peer_dropped_requests=4)
        second = runner.invoke(main, ["topology", "dynomite-stats", "-c", str(config), "--json"])
    assert second.exit_code == 1, second.output
    document = json.loads(second.stdout)
    jsonschema.validate(document, schema("dynomite-stats"))
    assert document["schema_version"] == SCHEMA_VERSION
    (finding,) = document["dropped_writes"]
    assert (finding["node"], finding["dropped"]) == (url, 4)
    assert finding["message"] == DROPPED_WRITES_MESSAGE


def test_the_cron_command_without_urls_prints_its_error_as_json(tmp_path: Path) -> None:
    config = tmp_path / "dyn.toml"
    config.write_text(
        f'[settings]\nstore = "{tmp_path / "s.sqlite"}"\n\n'
        '[[groups]]\nname = "g"\nmembers = ["redis://127.0.0.1:22121", "redis://127.0.0.1:22122"]\n'
    )
    done = CliRunner().invoke(main, ["topology", "dynomite-stats", "-c", str(config), "--json"])
    assert done.exit_code == 2
    document = json.loads(done.stdout)
    jsonschema.validate(document, schema("dynomite-stats"))
    assert "dynomite_stats_urls is empty" in document["error"] and document["exit_code"] == 2
