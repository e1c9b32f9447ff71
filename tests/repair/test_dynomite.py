"""A real 3-rack Dynomite: the majority's word repairs dropped SETs and dropped DELs alike
(needs $REPLAG_DYNOMITE).

Under DC_ONE a rack whose dynomite is down misses writes and deletes made through
the others; nothing replays them when it is back. The default policy of a
Dynomite group copies a key a majority of racks holds and deletes one only a
minority holds; the dry run says per rack what it would do and exits 1; with two
racks cut off in the probes' record the majority is no evidence, and the keys
are conflicts until an explicit policy decides.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from click.testing import CliRunner

from replag.cli import main
from replag.probes import run_probe
from replag.repair import check, repair
from replag.store import Store
from tests.helpers.dynomite_cluster import DynomiteFactory, resp2_client

GROUP = "token-12345678"


async def test_the_majority_repairs_dropped_sets_and_deletes(
    dynomite_factory: DynomiteFactory, tmp_path: Path
) -> None:
    cluster = dynomite_factory()
    path = tmp_path / "dyn.toml"
    env = {"REPLAG_STORE": str(tmp_path / "s.sqlite")}
    config = await cluster.discovered_config(path, **env)
    assert 'kind = "dynomite"' in path.read_text()
    node1, node2, node3 = (cluster.node(f"node{i}") for i in (1, 2, 3))
    with resp2_client(node1.client_port) as client:
        for i in range(10):
            client.set(f"gone:{i}", "x")
    await asyncio.to_thread(cluster.wait_connected)  # every rack holds them

    node3.stop()
    with resp2_client(node1.client_port) as client:
        for i in range(10):
            client.delete(f"gone:{i}")  # dropped on rack3
            client.set(f"new:{i}", f"v{i}")  # dropped on rack3
    await asyncio.to_thread(cluster.restart, node3)

    found = (await check(config, group=GROUP)).to_dict()
    assert found["divergent"] == 20
    assert found["groups"][0]["kind"] == "dynomite"
    assert found["groups"][0]["per_replica"]["dc1-rack3"] | {} == {
        "missing": 10, "extra": 10, "different": 0, "copy": 0, "delete": 0, "leave": 20,
    }  # fmt: skip
    assert found["groups"][0]["per_replica"]["dc1-rack1"]["leave"] == 0

    # The dry run names per rack what it would do, writes nothing, and exits 1.
    runner = CliRunner(env=env)
    dry = await asyncio.to_thread(
        runner.invoke, main, ["repair", "run", "-c", str(path), "--dry-run", "--json"]
    )
    assert dry.exit_code == 1, dry.output
    per = json.loads(dry.stdout)["groups"][0]["per_replica"]
    assert (per["dc1-rack3"]["copy"], per["dc1-rack3"]["delete"]) == (10, 10)
    assert per["dc1-rack1"] == per["dc1-rack2"] == dict.fromkeys(per["dc1-rack1"], 0)
    human = await asyncio.to_thread(runner.invoke, main, ["repair", "run", "-c", str(path),
                                                           "--dry-run"])  # fmt: skip
    assert human.exit_code == 1 and "dynomite, policy majority" in human.output
    assert "would copy, would delete, left" in human.output
    assert "would repair 20 keys: --keys-out FILE lists each" in human.output
    with node3.backend.client() as rack3:
        assert rack3.exists(*[f"gone:{i}" for i in range(10)]) == 10  # untouched

    # The default policy, no --allow-deletes: the deletes and the writes both land.
    fixed = (await repair(config, group=GROUP)).to_dict()
    assert fixed["repaired"] == 20 and fixed["conflicts"] == 0, fixed
    with node3.backend.client() as rack3:
        assert rack3.exists(*[f"gone:{i}" for i in range(10)]) == 0
        assert rack3.get("new:3") == b"v3"
    assert (await check(config, group=GROUP)).divergent == 0

    # A key one rack of three holds, no outage recorded: the majority deletes it, and the
    # text report names it (a few keys acted on are named; more: see --keys-out).
    with node1.backend.client() as rack1:
        rack1.set("lonely", "only on rack1")
    lone = await asyncio.to_thread(runner.invoke, main, ["repair", "run", "-c", str(path)])
    assert lone.exit_code == 0, lone.output
    assert f"{GROUP} 'lonely' extra: delete on dc1-rack1" in lone.output, lone.output
    with node1.backend.client() as rack1:
        assert rack1.exists("lonely") == 0

    # Two racks cut off: the probes see both miss writes; a delete made meanwhile
    # through rack1 is held by rack1 alone, and the majority would resurrect it.
    with resp2_client(node1.client_port) as client:
        client.set("both-cut", "x")
    await asyncio.to_thread(cluster.wait_connected)
    node2.stop()
    node3.stop()
    store = Store(config.settings.store)
    try:
        probe = await run_probe(config, count=5, rate=0, timeout_s=0.3, store=store)
        assert {p.replica for p in probe.pairs if p.lost} == {"dc1-rack2", "dc1-rack3"}
        with resp2_client(node1.client_port) as client:
            client.delete("both-cut")
        node2.start(cluster.binary, cluster.others(node2))
        await asyncio.to_thread(cluster.restart, node3)
        held = (await repair(config, group=GROUP, store=store)).to_dict()
        assert held["conflicts"] == 1 and held["repaired"] == 0, held
        (key,) = held["divergent_keys"]
        assert "2 racks missed probe writes" in key["reason"], key
        assert "dc1-rack2, dc1-rack3" in key["reason"]
        chosen = await repair(
            config, group=GROUP, store=store, policy="source:dc1-rack1", allow_deletes=True
        )
        assert chosen.to_dict()["repaired"] == 1
    finally:
        store.close()
    for node in (node2, node3):
        with node.backend.client() as backend:
            assert backend.exists("both-cut") == 0
