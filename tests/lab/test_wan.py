"""The lab's WAN geometry: the prober reaches every server through its region's (asymmetric)
path, a region's agent on the server's local address; delay, partition and heal act on both.

Only lower bounds on time: the relay holds bytes at least the delay, a loaded machine can
only add to it. Each path is given a short and a long direction, and the assertion is on
the long one, so a swapped direction fails.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import redis
from click.testing import CliRunner

from replag.cli import main
from replag.config import load_config
from replag.errors import EXIT_UNREACHABLE
from replag.lab.cluster import lab_fault, lab_status
from replag.lab.load import LoadSpec, lab_load
from replag.lab.relay import read_truth
from replag.probes import run_probe
from replag.topology import Endpoint
from tests.helpers.lab import LabFactory
from tests.helpers.waiting import wait_until


def _client(ep: Endpoint) -> redis.Redis:
    return redis.Redis(host=ep.host, port=ep.port, socket_timeout=10)


def _round_trip_ms(ep: Endpoint) -> float:
    with _client(ep) as client:
        client.ping()
        t0 = time.monotonic()
        client.ping()
        return (time.monotonic() - t0) * 1000


def _replica(config_path: Path, region: str) -> Endpoint:
    topology = load_config(config_path).topology
    return topology.region(region).replicas[0]


def test_topology_names_the_probers_view_and_the_local_address(lab_factory: LabFactory) -> None:
    state = lab_factory(
        regions=("home", "far"), delays_ms={"far": 10}, back_ms={"far": 60}, wan=True
    )
    far = _replica(Path(state["dir"]) / "topology.toml", "far")
    proc = next(p for p in state["processes"] if p["name"] == far.name)
    assert far.local == ("127.0.0.1", proc["port"])
    assert far.port != proc["port"]
    assert far.in_region().port == proc["port"] and far.in_region().local is None
    # From the prober, a round trip crosses the path out and back; inside the region, none.
    assert _round_trip_ms(far) >= 70
    with _client(far.in_region()) as local:
        assert local.info("replication")["master_link_status"] == "up"
    # The primary's view is there too (the prober's own region: no delay, no jitter).
    write = load_config(Path(state["dir"]) / "topology.toml").topology.region("home").write
    assert write is not None and write.local is not None and write.port != write.local[1]


async def test_asymmetric_paths_are_held_per_direction(lab_factory: LabFactory) -> None:
    state = lab_factory(
        regions=("home", "far"), delays_ms={"far": 10}, back_ms={"far": 60}, wan=True
    )
    lab_dir = Path(state["dir"])
    config = load_config(lab_dir / "topology.toml")
    report = await run_probe(config, count=5, rate=50, mode="push", timeout_s=10)
    far_pair = next(p for p in report.pairs if p.target == "far")
    assert (far_pair.seen, far_pair.lost) == (5, 0)
    keys = [f"{config.settings.prefix}{report.run_id}:{seq}" for seq in range(5)]
    replication = read_truth(lab_dir / "truth-far-1.log")
    events = read_truth(lab_dir / "truth-view-far-1.log")
    for key in keys:
        # Primary → replica is the way out; the keyspace event to the prober the way back.
        assert replication[key][1] - replication[key][0] >= 9.9e6
        assert events[key][1] - events[key][0] >= 59.9e6
        # The event left the replica after the replica received the write (released no
        # earlier than its entry + 10 ms; the release's own stamp may come later).
        assert events[key][0] >= replication[key][0] + 10e6

    # Turn the path round: now the way out is the long one.
    assert lab_fault(lab_dir, "far", "delay", delay_ms=60, back_ms=10) == ["far-1", "view-far-1"]
    state_links = {link["name"]: link for link in lab_status(lab_dir)["links"]}
    assert (state_links["far-1"]["delay_ms"], state_links["far-1"]["up_delay_ms"]) == (60, 10)
    assert (state_links["view-far-1"]["delay_ms"], state_links["view-far-1"]["up_delay_ms"]) == (
        10,
        60,
    )
    report = await run_probe(config, count=3, rate=50, mode="push", timeout_s=10)
    replication = read_truth(lab_dir / "truth-far-1.log")
    for seq in range(3):
        t_in, t_out = replication[f"{config.settings.prefix}{report.run_id}:{seq}"]
        assert t_out - t_in >= 59.9e6


async def test_partition_cuts_the_prober_off_and_heal_restores(lab_factory: LabFactory) -> None:
    state = lab_factory(regions=("home", "far"), delays_ms={"far": 5}, wan=True)
    lab_dir = Path(state["dir"])
    config = load_config(lab_dir / "topology.toml")
    far = config.topology.region("far").replicas[0]
    assert lab_fault(lab_dir, "far", "partition") == ["far-1", "view-far-1"]
    report = await run_probe(config, count=5, rate=0, mode="push", timeout_s=2)
    assert [u["replica"] for u in report.unreachable] == ["far-1"]
    assert report.exit_code == EXIT_UNREACHABLE
    # Inside the region the replica still answers, with its link to the primary down.
    with _client(far.in_region()) as local:
        wait_until(
            lambda: local.info("replication")["master_link_status"] == "down",
            "far-1 sees its primary link down",
        )
    lab_fault(lab_dir, "far", "heal")
    with _client(far.in_region()) as local:
        wait_until(
            lambda: local.info("replication")["master_link_status"] == "up", "far-1 relinked"
        )
    report = await run_probe(config, count=5, rate=0, mode="push", timeout_s=10)
    assert report.unreachable == [] and report.exit_code == 0


def test_independent_wan_lab_loads_on_local_addresses(lab_factory: LabFactory) -> None:
    state = lab_factory(regions=("a", "b"), delays_ms={"b": 40}, wan=True, engine="independent")
    lab_dir = Path(state["dir"])
    info = lab_load(lab_dir, LoadSpec(keys=200, value_size=16))
    assert info["members"] == ["a-1", "b-1"]
    views: dict[str, Any] = {link["name"]: link for link in lab_status(lab_dir)["links"]}
    # Nothing was loaded through the prober's view: it never had a connection.
    assert views["view-b-1"]["connections"] == 0
    b = _replica(lab_dir / "topology.toml", "b")
    with _client(b) as client:
        assert client.dbsize() == 200


def test_cli_wan_and_its_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    lab_dir = tmp_path / "lab"
    bad = runner.invoke(
        main,
        [
            "lab",
            "up",
            "--dir",
            str(lab_dir),
            "--regions",
            "a,b",
            "--delay",
            "b=5ms",
            "--wan",
            "b=5ms",
        ],
    )
    assert bad.exit_code == 2 and "--delay and --wan" in bad.output
    bad = runner.invoke(
        main, ["lab", "up", "--dir", str(lab_dir), "--regions", "a,b", "--wan", "b=5ms/x"]
    )
    assert bad.exit_code == 2 and "--wan" in bad.output
    assert not (lab_dir / "lab.json").exists()
    up = runner.invoke(
        main, ["lab", "up", "--dir", str(lab_dir), "--regions", "a,b", "--wan", "b=5ms/15ms"]
    )
    try:
        assert up.exit_code == 0, up.output
        assert "5 ms out / 15 ms back" in up.output and "prober's view" in up.output
        delay = runner.invoke(main, ["lab", "delay", "--dir", str(lab_dir), "b", "20ms/7ms"])
        assert delay.exit_code == 0, delay.output
        assert "20 ms out / 7 ms back on: b-1, view-b-1" in delay.output
        status = runner.invoke(main, ["lab", "status", "--dir", str(lab_dir)])
        assert "link view-b-1" in status.output and "7 ms down / 20 ms up" in status.output
    finally:
        runner.invoke(main, ["lab", "down", "--dir", str(lab_dir)])
