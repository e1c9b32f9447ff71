"""`repair check` and `repair run` through real `replag agent` processes.

Three independent servers, one per region; regions b and c run agents, region a has
none and is scanned directly (a mixed group). This process cannot reach b's and c's
servers at all (their `url` is a closed port): every read and write of them, the
repair's compare-and-set writes included, goes through their agents. Divergence of
every kind is injected at known keys; the check must report exactly those, the repair
fix exactly those, and an agent that dies during a check must be named with the
replicas it leaves uncompared.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from replag.config import load_config
from replag.errors import ReplagError
from replag.lab.server import RedisServer, free_port
from replag.repair import RepairProgress, check
from tests.helpers.agent import start_agent, stop_agent
from tests.helpers.cli import run_replag
from tests.helpers.keyspace import fill, write_every_type
from tests.helpers.redis_servers import RedisFactory

TOKEN = "check-t0ken"


@dataclass
class AgentsLab:
    config: Path
    servers: dict[str, RedisServer]
    agents: dict[str, subprocess.Popen[bytes]]


def _replica(region: str, server: RedisServer) -> dict[str, str]:
    """Regions with an agent get a `url` nothing listens on: this process can reach their
    servers only through the agent, which uses `local`."""
    if region == "a":
        return {"name": "a-1", "url": server.url}
    return {
        "name": f"{region}-1",
        "url": f"redis://127.0.0.1:{free_port()}",
        "local": f"redis://127.0.0.1:{server.port}",
    }


@pytest.fixture
def agents_lab(redis_factory: RedisFactory, tmp_path: Path) -> Iterator[AgentsLab]:
    servers = {r: redis_factory(r) for r in "abc"}
    for server in servers.values():
        fill(server.client(), 20_000)
        write_every_type(server.client())
    ports = {r: free_port() for r in "bc"}
    data = {
        "settings": {
            "api_token": TOKEN,
            "store": str(tmp_path / "replag.sqlite"),
            "repair_settle": "20ms",
            "agent_state_dir": str(tmp_path / "agents"),
            # The servers start with notifications off: the agents turn them on.
            "allow_config_changes": True,
            # Generous: the agents build their trees while the check starts (a starved
            # machine can take minutes); the wait ends as soon as the trees are current.
            "agent_wait": "300s",
        },
        "regions": [
            {
                "name": r,
                **({"agent": f"http://127.0.0.1:{ports[r]}"} if r in ports else {}),
                "replicas": [_replica(r, servers[r])],
            }
            for r in "abc"
        ],
        "groups": [{"name": "g", "members": ["a-1", "b-1", "c-1"]}],
    }
    config = tmp_path / "topology.toml"
    config.write_text(tomli_w.dumps(data))
    agents = {r: start_agent(config, r, ports[r], tmp_path / f"agent-{r}.log") for r in ports}
    try:
        yield AgentsLab(config, servers, agents)
    finally:
        for proc in agents.values():
            stop_agent(proc)


def _inject(lab: AgentsLab) -> dict[str, str]:
    """Divergence of every kind on one member each; the key → the kind a check reports."""
    a, b, c = (lab.servers[r].client() for r in "abc")
    b.set(b"k:0000010", b"changed in b")
    c.delete(b"k:0000020")
    a.set(b"only-in-a", b"extra")
    c.delete(b"t:hash")
    c.set(b"t:hash", b"now a string")
    b.expire(b"k:0000030", 3600)
    a.sadd(b"t:set", b"only in a")
    return {
        "t:set": "value",
        "k:0000010": "value",
        "k:0000020": "missing",
        "only-in-a": "missing",
        "t:hash": "type",
        "k:0000030": "ttl",
    }


def _replag(*args: str) -> subprocess.CompletedProcess[str]:
    return run_replag(*args, timeout=900)


def _found(report: dict[str, object]) -> dict[str, str]:
    keys = report["divergent_keys"]
    assert isinstance(keys, list)
    return {k["key"]: k["kind"] for k in keys}


def _check_in_batches_at_a_low_budget(
    agents_lab: AgentsLab, caplog: pytest.LogCaptureFixture
) -> None:
    """4,000 of 20,000 keys changed behind c's agent: ~3,800 of the 65,536 leaves differ,
    and at check_memory_mb = 40 a batch of their keys is at most 256 KB (~1,700 leaves
    of 3 members here): the agents are asked batch by batch, and every key is found."""
    changed = {f"k:{i:07d}".encode() for i in range(0, 20_000, 5)}
    with agents_lab.servers["c"].client() as c:
        pipe = c.pipeline(transaction=False)
        for key in changed:
            pipe.set(key, b"changed behind c's agent")
        pipe.execute()
    config = load_config(agents_lab.config)
    config = replace(config, settings=replace(config.settings, check_memory_mb=40))
    found: set[bytes] = set()

    def sink(group: str, key: bytes, detail: dict[str, Any]) -> None:
        found.add(key)

    with caplog.at_level(logging.INFO, logger="replag.repair.group_run"):
        report = asyncio.run(check(config, key_sink=sink))
    assert found == changed
    assert report.divergent == len(changed)
    batches = [r.getMessage() for r in caplog.records if "differing leaves" in r.getMessage()]
    assert len(batches) == 1
    assert int(batches[0].split(" compared in ")[1].split()[0]) >= 2, batches


def test_check_and_repair_through_agents_find_and_fix_exactly_the_injected_keys(
    agents_lab: AgentsLab, caplog: pytest.LogCaptureFixture
) -> None:
    injected = _inject(agents_lab)
    checked = _replag("repair", "check", "-c", str(agents_lab.config), "--json")
    assert checked.returncode == 1, checked.stderr
    report = json.loads(checked.stdout)
    assert _found(report) == injected
    via = {r["replica"]: r["via"] for r in report["replicas"]}
    assert via == {"a-1": "scan", "b-1": "agent", "c-1": "agent"}
    fetched = report["groups"][0]["bytes_by_region"]
    # The direct scan pulled every key of a; the agents sent trees and a few keys.
    assert fetched["a"] > 10 * max(fetched["b"], fetched["c"]) > 0
    # Expiries not compared: the agents' trees still hold them, the verification drops
    # the difference in TTL alone.
    values_only = _replag("repair", "check", "-c", str(agents_lab.config), "--ttls", "ignore")
    assert values_only.returncode == 1, values_only.stderr
    assert "TTLs not compared" in values_only.stdout
    assert f"{len(injected) - 1} divergent keys" in values_only.stdout

    repaired = _replag("repair", "run", "-c", str(agents_lab.config), "--json")
    assert repaired.returncode == 0, repaired.stderr
    result = json.loads(repaired.stdout)
    assert result["repaired"] == len(injected)
    writes = {r["replica"]: r["writes"] for r in result["replicas"]}
    assert writes["b-1"] > 0 and writes["c-1"] > 0
    assert {k["key"] for k in result["divergent_keys"]} == set(injected)

    again = _replag("repair", "check", "-c", str(agents_lab.config), "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads(again.stdout)["divergent"] == 0

    # The same bound through agents: many differing leaves are asked for in batches.
    _check_in_batches_at_a_low_budget(agents_lab, caplog)


def test_an_agent_dying_mid_check_is_reported_with_the_replicas_not_compared(
    agents_lab: AgentsLab,
) -> None:
    _inject(agents_lab)
    config = load_config(agents_lab.config)
    victim = agents_lab.agents["c"]

    def kill_when_scanning(event: RepairProgress) -> None:
        # Region a is scanned here while b and c wait to be walked: c dies in between.
        if event.phase == "scan" and victim.poll() is None:
            victim.send_signal(signal.SIGKILL)
            victim.wait(10)

    with pytest.raises(ReplagError) as failed:
        asyncio.run(check(config, progress=kill_when_scanning))
    assert victim.returncode == -signal.SIGKILL
    message = str(failed.value)
    assert "could not compare c-1" in message and "b-1" not in message
    assert failed.value.exit_code == 2

    cli = _replag("repair", "check", "-c", str(agents_lab.config))
    assert cli.returncode == 2
    assert "could not compare c-1" in cli.stderr and "Traceback" not in cli.stderr
    assert len(cli.stderr.strip().splitlines()) == 1


def test_newest_field_reads_timestamps_through_the_agents(agents_lab: AgentsLab) -> None:
    a, b, c = (agents_lab.servers[r].client() for r in "abc")
    a.set(b"doc", b'{"ts": 1, "v": "old"}')
    b.set(b"doc", b'{"ts": 1, "v": "old"}')
    c.set(b"doc", b'{"ts": 7, "v": "new"}')  # newest, behind an agent
    for client, ts in ((a, b"3"), (b, b"9"), (c, b"5")):
        client.hset(b"row", mapping={b"ts": ts, b"v": b"from " + ts})  # b (agent) newest
    ran = _replag("repair", "run", "-c", str(agents_lab.config), "--policy", "newest:ts", "--json")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert json.loads(ran.stdout)["repaired"] == 2
    assert a.get(b"doc") == b.get(b"doc") == b'{"ts": 7, "v": "new"}'
    assert a.hgetall(b"row") == c.hgetall(b"row") == {b"ts": b"9", b"v": b"from 9"}
