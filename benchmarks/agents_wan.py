"""Region agents across a WAN: the bytes one check moves between regions, and a re-check.

Lab: three independent replicas, regions a, b and c, the coordinator in a; b and c
are `--delay` ms away each way (`lab up --wan`: the coordinator reaches their servers
through delay relays), N keys × 1 KB each, `--divergent` injected divergent keys of
every kind. One `replag agent` per region; b's and c's agents are reached through
relays with the same delay. Every byte between the coordinator and regions b and c
passes a relay, which counts it: the WAN traffic below is measured, not estimated.

1. Central check (no agents): every key of b and c crosses the WAN.
2. Check through the agents: trees, the differing leaves, the candidate keys.
3. The same 1,000 keys written on every replica, then a re-check through the agents.
4. The replica's CPU at a sustained write rate, with notifications and the agent
   following them, and without (agent stopped, notifications off).

Ends with lines a script can read:

    found: N/N injected, false positives F
    wan ratio: X% of data (central scan Y%)
    recheck after 1000 writes: T s (full scan S s)

    python benchmarks/agents_wan.py [--keys 1000000] [--value-size 1024] [--delay 80]
        [--divergent 1000] [--write-rate 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import redis
from _smoke import parse_args  # --smoke: tiny sizes, same path (tests/test_benchmarks.py)

from replag.config import load_config, render_config
from replag.lab.cluster import LabSpec, lab_down, lab_topology, lab_up, read_state
from replag.lab.diverge import DivergeSpec, lab_diverge
from replag.lab.load import LoadSpec, key_name, lab_load
from replag.lab.relay import DelayRelay, Link, relay_command
from replag.lab.server import free_port
from replag.repair import RepairReport, check
from replag.repair.runs import RunLog
from replag.store import Store
from replag.topology import Topology

TOKEN = "agents-wan-benchmark"
REGIONS = ("a", "b", "c")
FAR = ("b", "c")


def found_line(store: Store, report: RepairReport, truth: dict[str, str]) -> tuple[int, int, str]:
    # Every divergent key (the report lists the first 100) is in the store.
    found = {
        key.decode("latin-1"): kind for key, kind, _, _ in RunLog(store, report.run_id).keys("lab")
    }
    hit = sum(1 for key, kind in truth.items() if found.get(key) == kind)
    false = sum(1 for key in found if key not in truth)
    return hit, false, f"found: {hit}/{len(truth)} injected, false positives {false}"


def view_bytes(state: dict[str, Any]) -> int:
    """Bytes both ways through the view links of the far regions' servers."""
    status = relay_command(state["view_relay_control_port"], {"op": "status"})
    return sum(
        link["bytes_down"] + link["bytes_up"]
        for link in status["links"]
        if any(link["name"] == f"view-{r}-1" for r in FAR)
    )


def agent_bytes(relay: DelayRelay) -> int:
    return sum(link.bytes_down + link.bytes_up for link in relay.links.values())


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def trees(port: int) -> list[dict[str, Any]]:
    answer = httpx.get(
        f"http://127.0.0.1:{port}/agent/v1/replicas",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )
    answer.raise_for_status()
    items: list[dict[str, Any]] = answer.json()["replicas"]
    return items


def wait_current(ports: dict[str, int], procs: dict[str, subprocess.Popen[bytes]]) -> None:
    """Until every agent's tree is current and saved (a save serialises the key table: the
    agent's memory is measured after it, not during)."""
    deadline = time.monotonic() + 1800
    unavailable_since: dict[str, float] = {}
    while True:
        states = {}
        for region, port in ports.items():
            if procs[region].poll() is not None:
                raise SystemExit(f"agent of {region} exited {procs[region].returncode}")
            try:
                (tree,) = trees(port)
                saved = tree["snapshots_saved"] > 0 or not tree["builds"]
                states[region] = tree["state"] + ("" if saved else " (saving)")
            except httpx.HTTPError:
                states[region] = "starting"
                continue
            # A tree that cannot be kept (notifications off, say) retries for ever: give up
            # after 30 s saying why, instead of waiting out the deadline.
            if tree["state"] != "unavailable":
                unavailable_since.pop(region, None)
            elif time.monotonic() - unavailable_since.setdefault(region, time.monotonic()) > 30:
                raise SystemExit(f"agent of {region}: tree unavailable: {tree['reason']}")
        if all(s == "current" for s in states.values()):
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"agents not current: {states}")
        time.sleep(0.2)


def start_agent(config: Path, region: str, port: int, workdir: Path) -> subprocess.Popen[bytes]:
    log = open(workdir / f"agent-{region}.log", "ab")  # noqa: SIM115 - the child keeps it
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "replag",
            "agent",
            "-c",
            str(config),
            "--region",
            region,
            "--listen",
            f"127.0.0.1:{port}",
            "--state-dir",
            str(workdir / f"agent-state-{region}"),
            "--log-level",
            "warning",
        ],
        stdout=log,
        stderr=log,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def write_keys(ports: list[int], keys: list[bytes], value: bytes) -> None:
    """The same writes on every replica, as replication (or Dynomite) would deliver them."""
    for port in ports:
        pipe = redis.Redis(port=port).pipeline(transaction=False)
        for key in keys:
            pipe.set(key, value)
        pipe.execute()


def used_cpu(port: int) -> float:
    info = redis.Redis(port=port).info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def _sustained_writes(port: int, rate: int, seconds: float) -> int:
    from replag.topology import Endpoint
    from replag.wire.resp import RespConnection, pack

    conn = await RespConnection.open(Endpoint.from_url(f"redis://127.0.0.1:{port}"), timeout_s=10.0)
    tick, per_tick, sent, i = 0.01, max(1, int(rate * 0.01)), 0, 0
    started = time.monotonic()
    try:
        while (now := time.monotonic()) - started < seconds:
            due = int((now - started) * rate)
            while sent < due:
                batch = b"".join(
                    pack(b"SET", b"cpu:%07d" % ((i + j) % 50_000), b"v%d" % (i + j))
                    for j in range(per_tick)
                )
                await conn.request(batch, per_tick)
                sent += per_tick
                i += per_tick
            await asyncio.sleep(tick)
    finally:
        await conn.close()
    return sent


def cpu_at_rate(port: int, rate: int, seconds: float) -> tuple[float, int]:
    """(replica CPU seconds per wall second, writes sent) under `rate` writes/s."""
    before, started = used_cpu(port), time.monotonic()
    sent = asyncio.run(_sustained_writes(port, rate, seconds))
    return (used_cpu(port) - before) / (time.monotonic() - started), sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--value-size", type=int, default=1024)
    parser.add_argument("--delay", type=float, default=80.0, help="one-way ms to b and c")
    parser.add_argument("--divergent", type=int, default=1000)
    parser.add_argument("--writes", type=int, default=1000)
    parser.add_argument("--write-rate", type=int, default=5000)
    parser.add_argument("--cpu-seconds", type=float, default=10.0)
    args = parse_args(
        parser, keys=3000, value_size=64, divergent=50, writes=50, write_rate=500, cpu_seconds=1.0
    )

    workdir = Path(tempfile.mkdtemp(prefix="replag-agents-wan-"))
    lab_dir = workdir / "lab"
    procs: dict[str, subprocess.Popen[bytes]] = {}
    relay: DelayRelay | None = None
    print(f"uptime: {os.getloadavg()[0]:.2f} 1-min load; workdir {workdir}")
    try:
        lab_up(
            lab_dir,
            LabSpec(
                regions=REGIONS,
                delays_ms=dict.fromkeys(FAR, args.delay),
                wan=True,
                engine="independent",
            ),
        )
        state = read_state(lab_dir)
        topology = lab_topology(state)
        ports = {m.region: m.in_region().port for m in topology.groups[0].members}
        # The agents keep their trees from keyspace notifications, which replag does not
        # turn on by default (allow_config_changes = false): the operator does, as here.
        for port in ports.values():
            with redis.Redis(port=port) as admin:
                admin.config_set("notify-keyspace-events", "KA")
        load = LoadSpec(keys=args.keys, value_size=args.value_size)
        key_bytes = len(key_name(load, 0))
        data = {r: args.keys * (key_bytes + args.value_size) for r in REGIONS}

        # Agents: a's next to the coordinator, b's and c's behind relays with the WAN delay.
        agent_ports = {r: free_port() for r in REGIONS}
        relay = DelayRelay(
            [
                Link(
                    name=f"agent-{r}",
                    listen_port=0,
                    upstream_port=agent_ports[r],
                    delay_ms=args.delay,
                )
                for r in FAR
            ]
        ).start()
        urls = {"a": f"http://127.0.0.1:{agent_ports['a']}"}
        urls |= {r: f"http://127.0.0.1:{relay.links[f'agent-{r}'].listen_port}" for r in FAR}
        settings = {
            "store": str(workdir / "replag.sqlite"),
            "api_token": TOKEN,
            "scan_parallel": 0,
        }
        central = workdir / "central.toml"
        central.write_text(render_config(topology, settings=settings))
        with_agents = Topology(
            regions=tuple(replace(r, agent=urls[r.name]) for r in topology.regions),
            groups=topology.groups,
        )
        agents_toml = workdir / "agents.toml"
        agents_toml.write_text(render_config(with_agents, settings=settings))

        # An agent's memory with no keys (imports, HTTP server, an empty tree): the
        # baseline its RSS per key is measured against.
        for region in REGIONS:
            procs[region] = start_agent(agents_toml, region, agent_ports[region], workdir)
        wait_current(agent_ports, procs)
        empty_rss = {r: rss_mb(p.pid) for r, p in procs.items()}
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)

        t0 = time.perf_counter()
        lab_load(lab_dir, load)
        print(
            f"loaded {args.keys:,} keys × {args.value_size} B on 3 replicas in "
            f"{time.perf_counter() - t0:.1f} s"
        )
        for region in REGIONS:
            procs[region] = start_agent(agents_toml, region, agent_ports[region], workdir)
        wait_current(agent_ports, procs)
        for region in REGIONS:
            (tree,) = trees(agent_ports[region])
            rss = rss_mb(procs[region].pid)
            grown = (rss - empty_rss[region]) * 2**20 / max(tree["keys"], 1)
            print(
                f"agent {region}: tree of {tree['keys']:,} keys built by a full scan in "
                f"{tree['last_build_s']:.1f} s; key table {tree['bytes_per_key']:.1f} B/key; "
                f"process RSS {rss:.0f} MB ({empty_rss[region]:.0f} MB with no keys: "
                f"{grown:.1f} B/key)"
            )

        divergence = lab_diverge(
            lab_dir,
            DivergeSpec(
                missing=args.divergent // 5,
                changed=args.divergent // 5,
                extra=args.divergent // 5,
                type=args.divergent // 5,
                ttl=args.divergent - 4 * (args.divergent // 5),
                seed=1,
            ),
            workdir / "truth.json",
        )
        truth = {d["key"]: d["kind"] for d in divergence["divergent"]}
        print(f"injected {len(truth)} divergent keys: {json.dumps(divergence['counts'])}")

        # 1. Central check.
        before = view_bytes(state)
        t0 = time.perf_counter()
        store = Store(workdir / "replag.sqlite")
        report = asyncio.run(check(load_config(central), store=store))
        full_s = time.perf_counter() - t0
        central_wan = view_bytes(state) - before
        _, central_false, central_found = found_line(store, report, truth)
        print(f"central check: {full_s:.1f} s, {central_found}")

        # 2. Through the agents.
        before = agent_bytes(relay)
        t0 = time.perf_counter()
        report = asyncio.run(check(load_config(agents_toml), store=store))
        agent_s = time.perf_counter() - t0
        agent_wan = agent_bytes(relay) - before
        hit, false, found = found_line(store, report, truth)
        print(f"agent check: {agent_s:.2f} s, {found}")
        for region in REGIONS:
            fetched = report.groups[0].bytes_by_region().get(region, 0)
            print(f"  region {region}: {fetched:,} bytes fetched (HTTP client's count)")

        # 3. 1,000 writes on every replica, then a re-check.
        candidates = (key_name(load, i) for i in range(args.keys - 1, -1, -1))
        written = list(
            itertools.islice((k for k in candidates if k.decode() not in truth), args.writes)
        )
        write_keys(list(ports.values()), written, b"rewritten" * 8)
        before = agent_bytes(relay)
        t0 = time.perf_counter()
        report = asyncio.run(check(load_config(agents_toml), store=store))
        recheck_s = time.perf_counter() - t0
        recheck_wan = agent_bytes(relay) - before
        _, recheck_false, recheck_found = found_line(store, report, truth)
        print(
            f"re-check after {len(written)} writes: {recheck_s:.2f} s, {recheck_found}, "
            f"{recheck_wan:,} bytes across the WAN"
        )

        time.sleep(2.0)  # steady state: the agents' next poll hands freed heap back
        for region in REGIONS:
            rss = rss_mb(procs[region].pid)
            grown = (rss - empty_rss[region]) * 2**20 / args.keys
            print(f"agent {region} after the checks: process RSS {rss:.0f} MB ({grown:.1f} B/key)")

        # 4. The replica's CPU under sustained writes, with and without the agent.
        with_agent, sent = cpu_at_rate(ports["b"], args.write_rate, args.cpu_seconds)
        procs["b"].send_signal(signal.SIGTERM)
        procs["b"].wait(60)
        redis.Redis(port=ports["b"]).config_set("notify-keyspace-events", "")
        without, _ = cpu_at_rate(ports["b"], args.write_rate, args.cpu_seconds)
        extra = (with_agent - without) / without * 100 if without > 0 else float("nan")
        print(
            f"replica CPU at {sent / args.cpu_seconds:,.0f} writes/s: {with_agent * 100:.1f}% "
            f"of a core with notifications + agent, {without * 100:.1f}% without "
            f"(+{extra:.0f}%)"
        )

        far_data = sum(data[r] for r in FAR)
        print(
            f"WAN bytes (b and c relays, both ways): agents {agent_wan:,}, central "
            f"{central_wan:,}; data held in b and c {far_data:,} bytes"
        )
        print(found)
        print(
            f"wan ratio: {agent_wan / far_data * 100:.3f}% of data "
            f"(central scan {central_wan / far_data * 100:.1f}%)"
        )
        print(f"recheck after {len(written)} writes: {recheck_s:.2f} s (full scan {full_s:.1f} s)")
        if central_false or recheck_false or false or hit != len(truth):
            sys.exit(1)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        if relay is not None:
            relay.stop()
        if (lab_dir / "lab.json").exists():
            lab_down(lab_dir)


if __name__ == "__main__":
    main()
