"""Lag through agents on a real WAN lab: `replag agent` processes watch their region's replicas,
the prober merges their arrivals with its write moments, and every sample's error bar carries
the clocks' error bound.

The relay's truth for a key is how long the replication link held it (t_out − t_in). The
loopback hops around it are outside the truth and inside the measurement; the bounds used
here are wide (tens of ms) so that no stall of this shared machine can push a sample out of
its bar, while an agent 30 ms off would land every sample outside a bar that left the clocks
out.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import tomllib
from pathlib import Path
from typing import Any

import httpx
import tomli_w
from click.testing import CliRunner

from replag.cli import main
from replag.config import load_config
from replag.lab.relay import read_truth
from replag.lab.server import free_port
from replag.probes import run_probe
from tests.helpers.cli import spawn_replag
from tests.helpers.lab import LabFactory
from tests.helpers.waiting import wait_until


def _truth_ms(lab_dir: Path, replica: str, key: str) -> float:
    t_in, t_out = read_truth(lab_dir / f"truth-{replica}.log")[key]
    return (t_out - t_in) / 1e6


async def test_the_truth_stays_inside_the_bars_of_an_agent_30ms_off(
    lab_factory: LabFactory,
) -> None:
    state = lab_factory(
        regions=("home", "far"),
        delays_ms={"far": 20},
        back_ms={"far": 60},
        wan=True,
        agents=True,
        agent_clock_offsets_ms={"far": 30.0},
        clock_error_bound_ms=50.0,
    )
    lab_dir = Path(state["dir"])
    config = load_config(lab_dir / "topology.toml")
    assert config.topology.region("far").agent is not None
    report = await run_probe(config, count=30, rate=100, mode="push", timeout_s=10)
    far = next(p for p in report.pairs if p.target == "far")
    assert (far.observed_by, far.seen, far.lost) == ("agent/push", 30, 0), report.notes
    agent: dict[str, Any] = next(a for a in report.agents if a["region"] == "far")
    assert agent["error"] is None and agent["clock"]["note"] is None
    # 50 ms stated for each host bounds the offset to ±100 ms; a round trip (at least
    # 20 + 60 ms) may tighten it, never loosen it.
    bound = agent["clock"]["bound_ms"]
    assert agent["clock"]["source"] in ("kernel", "round trip", "kernel ∩ round trip")
    assert 40.0 <= bound <= 100.0
    samples = [s for s in report.samples if s.replica == "far-1"]
    assert len(samples) == 30
    for sample in samples:
        assert sample.lag_ns is not None
        key = f"{config.settings.prefix}{report.run_id}:{sample.seq}"
        truth = _truth_ms(lab_dir, "far-1", key)
        lag, bar = sample.lag_ns / 1e6, sample.uncertainty_ns / 1e6
        assert bar >= bound  # the clock bound is in every bar
        assert lag - bar <= truth <= lag + bar, (lag, bar, truth)
    # The agent watched on the local address: the prober never opened the far replica.
    assert report.clock == [] or all(c.endpoint != "far-1" for c in report.clock)


async def test_unsynchronised_clocks_fall_back_to_the_round_trip_bound(
    lab_factory: LabFactory,
) -> None:
    state = lab_factory(
        regions=("home", "far"), delays_ms={"far": 10}, back_ms={"far": 40}, wan=True, agents=True
    )
    config = load_config(Path(state["dir"]) / "topology.toml")
    _api_refuses_what_it_should(config.settings.api_token or "", state)
    report = await run_probe(config, count=5, rate=0, mode="auto", timeout_s=10)
    far = next(p for p in report.pairs if p.target == "far")
    assert far.observed_by.startswith("agent/") and far.lost == 0
    entry = next(a for a in report.agents if a["region"] == "far")
    clock, ours, theirs = entry["clock"], entry["prober_clock"], entry["agent_clock"]
    if ours["synchronised"] and theirs["synchronised"]:  # hosts whose kernels keep a bound
        assert clock["bound_ms"] <= ours["maxerror_ms"] + theirs["maxerror_ms"]
    else:
        # Unsynchronised (this lab's VM): only round trips bound the offset, and across
        # the WAN a round trip takes at least out + back.
        assert clock["source"] == "round trip"
        assert clock["bound_ms"] >= (10 + 40) / 2

    # Poll through the agent: MGETs on the local address, the same merge.
    polled = await run_probe(config, count=5, rate=0, mode="poll", timeout_s=10)
    far = next(p for p in polled.pairs if p.target == "far")
    assert (far.observed_by, far.seen, far.lost) == ("agent/poll", 5, 0)

    # The cron probe's JSON says which agent observed what, and how the clocks compare.
    result = await asyncio.to_thread(
        CliRunner().invoke,
        main,
        ["probe", "--config", str(Path(state["dir"]) / "topology.toml"), "--count", "3",
         "--no-store", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert {a["region"] for a in out["agents"]} == {"home", "far"}
    assert all(a["error"] is None and a["clock"]["bound_ms"] > 0 for a in out["agents"])
    assert {p["observed_by"] for p in out["pairs"]} <= {"agent/push", "agent/poll"}


def _api_refuses_what_it_should(token: str, state: dict[str, Any]) -> None:
    port = next(p["port"] for p in state["processes"] if p["name"] == "agent-far")
    base = f"http://127.0.0.1:{port}/agent/v1/lag"
    auth = {"Authorization": f"Bearer {token}"}
    assert httpx.get(f"{base}/clock").status_code == 401
    clock = httpx.get(f"{base}/clock", headers=auth).json()["clock"]
    assert set(clock) == {"now_ns", "host"} and clock["host"]["source"] in (
        "adjtimex",
        "unavailable",
    )
    stem = base64.b64encode(b"user:").decode()
    body = {"run_id": "r", "stem": stem, "count": 1, "pattern": stem}
    refused = httpx.post(f"{base}/watches", json=body, headers=auth)
    assert refused.status_code == 400 and "probe prefix" in refused.text
    bad = httpx.post(f"{base}/watches", json={**body, "stem": "%%%"}, headers=auth)
    assert bad.status_code == 400 and "base64" in bad.text
    assert httpx.get(f"{base}/watches/nope", headers=auth).status_code == 404
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", headers=auth).text
    assert "replag_agent_lag_watches " in metrics and "replag_agent_clock_synchronised" in metrics


async def test_a_dead_agent_is_noted_and_its_region_observed_directly(
    lab_factory: LabFactory,
) -> None:
    state = lab_factory(regions=("home", "far"), delays_ms={"far": 5}, wan=True, agents=True)
    agent = next(p for p in state["processes"] if p["name"] == "agent-far")
    os.kill(agent["pid"], signal.SIGKILL)
    config = load_config(Path(state["dir"]) / "topology.toml")
    report = await run_probe(config, count=5, rate=0, mode="push", timeout_s=10)
    far = next(p for p in report.pairs if p.target == "far")
    assert (far.observed_by, far.seen) == ("push", 5)
    assert any(
        "agent of far could not watch" in n and "observed directly" in n for n in report.notes
    )
    assert [a["region"] for a in report.agents] == ["home"]


def test_serve_probes_through_the_agents(lab_factory: LabFactory, tmp_path: Path) -> None:
    state = lab_factory(regions=("home", "far"), delays_ms={"far": 5}, wan=True, agents=True)
    data = tomllib.loads((Path(state["dir"]) / "topology.toml").read_text())
    data["settings"].update(
        count=10, rate=0, timeout="5s", probe_interval="300ms", store=str(tmp_path / "s.sqlite")
    )
    config_path = tmp_path / "replag.toml"
    config_path.write_text(tomli_w.dumps(data))
    token = data["settings"]["api_token"]
    agent_port = next(p["port"] for p in state["processes"] if p["name"] == "agent-far")
    port = free_port()
    serve = ["serve", "--config", str(config_path), "--port", str(port)]
    proc = spawn_replag(*serve, log=tmp_path / "serve.log")
    try:

        def far_measured() -> bool:
            assert proc.poll() is None, "serve exited"
            try:
                pairs = httpx.get(f"http://127.0.0.1:{port}/api/v1/lag?since=5m").json()["pairs"]
            except (httpx.TransportError, ValueError):
                return False
            return any(p["target"] == "far" and p["seen"] for p in pairs)

        wait_until(far_measured, "serve measured lag to far")
        metrics = httpx.get(
            f"http://127.0.0.1:{agent_port}/metrics", headers={"Authorization": f"Bearer {token}"}
        ).text
        opened = next(
            float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith("replag_agent_lag_watches_opened_total ")
        )
        assert opened >= 1  # the service's runs were watched by far's agent
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
