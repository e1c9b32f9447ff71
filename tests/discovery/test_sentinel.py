"""Redis Sentinel with real Sentinels: discovery, a real failover, the probe following it."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from replag.cli import main
from replag.config import config_from_dict, load_config
from replag.errors import ConfigError, EndpointError
from replag.lab.cluster import lab_failover, lab_fault, lab_status
from replag.lab.sentinel import master_port as sentinel_master_port
from replag.lab.server import RedisServer, pid_alive
from replag.probes.runner import run_probe
from replag.replication import history
from replag.store import Store
from tests.helpers.lab import LabFactory
from tests.helpers.waiting import until, wait_until


def sentinel_lab(lab_factory: LabFactory, **spec: Any) -> dict[str, Any]:
    spec.setdefault("regions", ("a", "b"))
    spec.setdefault("delays_ms", {"b": 2})
    return lab_factory(sentinel=True, **spec)


def sentinel_ports(state: dict[str, Any]) -> list[int]:
    return [int(p["port"]) for p in state["processes"] if p["role"] == "sentinel"]


def test_discover_through_sentinel_finds_master_replicas_and_sentinels(
    lab_factory: LabFactory, tmp_path: Path
) -> None:
    state = sentinel_lab(lab_factory)
    first = sentinel_ports(state)[0]
    out = tmp_path / "found.toml"
    result = CliRunner().invoke(
        main,
        ["topology", "discover", "--sentinel", f"127.0.0.1:{first}", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    topology = load_config(out, environ={}).topology
    (region,) = topology.regions
    primary = next(p for p in state["processes"] if p["role"] == "primary")
    replicas = {p["port"] for p in state["processes"] if p["role"] == "replica"}
    assert region.name == "replag-lab" and region.write is not None
    assert region.write.port == primary["port"]
    assert {r.port for r in region.replicas} == replicas
    assert region.sentinel is not None and region.sentinel.master == "replag-lab"
    assert {s.port for s in region.sentinel.sentinels} == set(sentinel_ports(state))
    (group,) = topology.groups
    assert {m.port for m in group.members} == replicas | {primary["port"]}

    named = CliRunner().invoke(
        main, ["topology", "discover", "--sentinel", f"127.0.0.1:{first}", "--master", "nope"]
    )
    assert named.exit_code == 2
    assert "'nope' is not monitored" in named.stderr and "replag-lab" in named.stderr


def test_discover_with_no_sentinel_answering_is_one_line_exit_2() -> None:
    result = CliRunner().invoke(
        main, ["topology", "discover", "--sentinel", "127.0.0.1:1", "--timeout", "200ms"]
    )
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert "no Sentinel answered" in line and "127.0.0.1:1" in line


async def test_the_probe_follows_a_real_failover_and_reports_it(
    server_kind: str, lab_factory: LabFactory, tmp_path: Path
) -> None:
    state = sentinel_lab(lab_factory)
    lab_dir = Path(state["dir"])
    config = load_config(lab_dir / "topology.toml", environ={})
    store = Store(tmp_path / "store.sqlite")
    try:
        before = await run_probe(config, count=20, store=store)
        assert before.failovers == [] and before.exit_code == 0, before.render()
        old_port = next(p["port"] for p in state["processes"] if p["role"] == "primary")

        result = lab_failover(lab_dir)
        assert result["old"]["port"] == old_port and result["new"]["port"] != old_port
        promoted = result["new"]["name"]

        after = await run_probe(config, count=20, store=store)
        (event,) = after.failovers
        assert event.old_primary == f"127.0.0.1:{old_port}"
        assert event.new_primary == f"127.0.0.1:{result['new']['port']}"
        assert event.new_primary_name == promoted
        # Nothing was written between the last sample and the (graceful) failover.
        assert event.bytes_lost == 0 and event.promoted_at_offset is not None
        assert event.lag_after_ms is not None
        assert after.write_endpoint.endswith(f":{result['new']['port']}")
        assert after.exit_code == 0, after.render()
        assert all(p.seen == p.sent for p in after.pairs)
        assert promoted not in {p.replica for p in after.pairs}  # now the primary
        assert "FAILOVER: a (Sentinel master replag-lab)" in after.render()
        assert after.to_dict()["failovers"][0]["new_primary_name"] == promoted

        again = await run_probe(config, count=20, store=store)
        assert again.failovers == []  # the store remembers where the primary is now
        assert any("resolved through Sentinel" in n for n in again.notes)
        assert [e["new_primary"] for e in history.failover_events(store)] == [event.new_primary]
    finally:
        store.close()


async def test_a_killed_primary_fails_over_by_itself_and_the_probe_follows(
    lab_factory: LabFactory, tmp_path: Path
) -> None:
    state = sentinel_lab(lab_factory)
    lab_dir = Path(state["dir"])
    config = load_config(lab_dir / "topology.toml", environ={})
    store = Store(tmp_path / "store.sqlite")
    try:
        await run_probe(config, count=20, store=store)
        primary = next(p for p in state["processes"] if p["role"] == "primary")
        os.kill(primary["pid"], signal.SIGKILL)
        first = sentinel_ports(state)[0]

        def moved() -> bool:
            try:
                return sentinel_master_port(first) != primary["port"]
            except redis.RedisError:
                return False

        # Sentinel sees it down after 1 s, votes, and promotes a replica on its own.
        await until(moved, "Sentinel promotes a replica", timeout_s=60)

        async def probed() -> bool:
            try:
                report = await run_probe(config, count=20, store=store)
            except EndpointError:
                return False  # the promoted replica not yet answering as a primary
            return bool(report.failovers)

        await until(probed, "the probe writes to the new primary", timeout_s=60)
        (event,) = history.failover_events(store)
        assert event["old_primary"] == f"127.0.0.1:{primary['port']}"
        assert event["new_primary"] == f"127.0.0.1:{sentinel_master_port(first)}"
        # The old primary is gone: bytes lost are measured from its last sampled offset.
        assert event["old_last_offset"] is not None and event["bytes_lost"] is not None
    finally:
        store.close()


async def test_bytes_lost_in_a_failover_are_measured(
    lab_factory: LabFactory, tmp_path: Path
) -> None:
    state = sentinel_lab(lab_factory)
    lab_dir = Path(state["dir"])
    config = load_config(lab_dir / "topology.toml", environ={})
    store = Store(tmp_path / "store.sqlite")
    try:
        # Every replica cut off: the probe's writes reach the primary only, and its
        # offset at the end of the run is on record. Sentinel still promotes a replica
        # cut off for less than 10 × down-after-milliseconds.
        for region in ("a", "b"):
            lab_fault(lab_dir, region, "partition")
        cut = await run_probe(config, count=20, timeout_s=0.5, store=store)
        assert all(p.lost == p.sent for p in cut.pairs)
        assert cut.replication is not None
        behind = [r.bytes_behind for r in cut.replication.primaries[0].replicas]
        result = lab_failover(lab_dir)
        for region in ("a", "b"):
            lab_fault(lab_dir, region, "heal")

        after = await run_probe(config, count=20, store=store)
        (event,) = after.failovers
        assert event.new_primary_name == result["new"]["name"]
        assert event.bytes_lost is not None and event.old_last_offset is not None
        # At least the 20 probe SETs the promoted replica never received.
        assert event.bytes_lost >= 20 * len("SET replag:probe:0123456789ab:0 x")
        assert event.bytes_lost in behind  # what the last sample said it was behind
    finally:
        store.close()


def test_lab_failover_cli_and_down_stops_the_sentinels(tmp_path: Path) -> None:
    runner = CliRunner()
    lab_dir = tmp_path / "lab"
    up = runner.invoke(
        main, ["lab", "up", "--dir", str(lab_dir), "--regions", "a,b", "--sentinel", "--json"]
    )
    assert up.exit_code == 0, up.output
    pids = [p["pid"] for p in json.loads(up.output)["processes"]]
    try:
        done = runner.invoke(main, ["lab", "failover", "--dir", str(lab_dir)])
        assert done.exit_code == 0, done.output
        assert done.output.startswith("failover of replag-lab: a-primary")
        roles = {p["name"]: p for p in lab_status(lab_dir)["processes"]}
        assert roles["a-primary"]["role"] == "replica"
        new = next(p for p in roles.values() if p["role"] == "primary")
        assert all(
            p["link"] == f"names primary 127.0.0.1:{new['port']}"
            for p in roles.values()
            if p["role"] == "sentinel"
        )
    finally:
        down = runner.invoke(main, ["lab", "down", "--dir", str(lab_dir)])
    assert down.exit_code == 0 and "sentinel-1" in down.output
    assert not any(pid_alive(p) for p in pids)


def test_failover_without_sentinels_is_a_lab_error(lab_factory: LabFactory) -> None:
    state = lab_factory(regions=("a",))
    result = CliRunner().invoke(main, ["lab", "failover", "--dir", str(state["dir"])])
    assert result.exit_code == 2 and "--sentinel" in result.stderr


@pytest.mark.parametrize(
    ("sentinel", "key", "message"),
    [
        ({"sentinels": ["127.0.0.1:26379"]}, "sentinel.master", "missing Sentinel master"),
        ({"master": "m"}, "sentinel.sentinels", "list the Sentinels"),
        ({"master": "m", "sentinels": "x"}, "sentinel.sentinels", "array"),
        ({"master": "m", "sentinels": ["ftp://x"]}, "sentinel.sentinels[0]", "redis://"),
        ({"master": "m", "quorum": 2}, "sentinel", "unknown key 'quorum'"),
    ],
)
def test_bad_sentinel_tables_name_the_key(sentinel: dict[str, Any], key: str, message: str) -> None:
    data = {"regions": [{"name": "a", "write": "redis://127.0.0.1:6379", "sentinel": sentinel}]}
    with pytest.raises(ConfigError) as raised:
        config_from_dict(data, where="t.toml", environ={})
    assert f"regions[0].{key}" in str(raised.value) and message in str(raised.value)


def test_sentinel_regions_observe_only_their_master() -> None:
    def region(name: str, master: str, write: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": name,
            "replicas": [f"redis://127.0.0.1:{7000 + len(name) + ord(name[-1])}"],
            "sentinel": {"master": master, "sentinels": ["127.0.0.1"]},
        }
        if write:
            out["write"] = f"redis://127.0.0.1:{6000 + ord(name[-1])}"
        return out

    data = {
        "regions": [
            region("m1", "one", True),
            region("m2", "two", True),
            region("r1", "one", False),
        ]
    }
    topology = config_from_dict(data, where="t.toml", environ={}).topology
    assert [r.name for r in topology.observed_from(topology.region("m1"))] == ["m1", "r1"]
    assert [r.name for r in topology.observed_from(topology.region("m2"))] == ["m2"]
    ref = topology.region("m1").sentinel
    assert ref is not None and ref.sentinels[0].port == 26379  # the default Sentinel port


def test_failover_check_right_after_a_failover_checks_the_new_primary(
    lab_factory: LabFactory,
) -> None:
    """failover-check asks the Sentinels where the master is: right after a failover it
    samples the promoted replica (the config still names the old primary), and the demoted
    old primary is one of its candidates."""
    state = sentinel_lab(lab_factory)
    lab_dir = Path(state["dir"])
    result = lab_failover(lab_dir)
    config = ["--config", str(lab_dir / "topology.toml")]

    def check() -> Any:
        return CliRunner().invoke(main, ["failover-check", *config])

    first = check()
    assert first.exit_code in (0, 1), first.output  # an answer, not "role slave" (exit 2)
    (primary,) = json.loads(first.stdout)["primaries"]
    assert primary["primary"] == result["new"]["name"]
    assert any(
        "resolved through Sentinel" in n for n in json.loads(first.stdout)["replication"]["notes"]
    )
    old = next(p["name"] for p in state["processes"] if p["role"] == "primary")
    assert old in {c["replica"] for c in primary["candidates"]}

    def safe() -> bool:
        return check().exit_code == 0  # once the replicas follow the new primary

    wait_until(safe, "failover-check finds a safe candidate of the new primary", timeout_s=60)


async def test_the_old_primary_is_observed_again_once_it_rejoins(
    lab_factory: LabFactory, tmp_path: Path
) -> None:
    """A killed primary is failed over; while it is down the probe reports it unreachable,
    and once it comes back (as a replica of the new primary) the probe observes it again."""
    state = sentinel_lab(lab_factory)
    lab_dir = Path(state["dir"])
    config = load_config(lab_dir / "topology.toml", environ={})
    store = Store(tmp_path / "store.sqlite")
    old = next(p for p in state["processes"] if p["role"] == "primary")
    first = sentinel_ports(state)[0]
    rejoined = None
    try:
        await run_probe(config, count=10, store=store)
        os.kill(old["pid"], signal.SIGKILL)

        def moved() -> bool:
            try:
                return sentinel_master_port(first) != old["port"]
            except redis.RedisError:
                return False

        await until(moved, "Sentinel promotes a replica", timeout_s=60)

        async def followed() -> bool:
            try:
                return bool((await run_probe(config, count=10, store=store)).failovers)
            except EndpointError:
                return False

        await until(followed, "the probe writes to the new primary", timeout_s=60)
        down = await run_probe(config, count=10, store=store)
        assert old["name"] in {u["replica"] for u in down.unreachable}
        new_port = sentinel_master_port(first)
        rejoined = RedisServer(
            name=old["name"], port=old["port"], workdir=tmp_path / "rejoined",
            extra_args=("--replicaof", "127.0.0.1", str(new_port)),
        ).start()  # fmt: skip

        async def observed() -> bool:
            report = await run_probe(config, count=10, store=store)
            pair = next((p for p in report.pairs if p.replica == old["name"]), None)
            return pair is not None and pair.seen == pair.sent

        await until(observed, "the old primary observed again as a replica", timeout_s=60)
    finally:
        store.close()
        if rejoined is not None:
            rejoined.stop()
