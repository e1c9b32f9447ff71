"""A `replag agent` per lab region (`lab up --agents`), reached as a prober would reach it.

Each agent runs in its own process on a free port, reads the lab's
`topology.toml` and talks to its region's servers on their local addresses.
In a WAN lab the prober reaches the agent through the region's path like the
servers (a view link), so round trips to it are as slow and as asymmetric as
the WAN's. The lab writes an `api_token` (the agents refuse to start without
one) and, with `clock_error_bound`, what every host's clock error is taken to
be: the lab's processes share one clock, unsynchronised to UTC here, so the
kernel says nothing useful; a stated bound plays a synchronised fleet's. An
agent can be given a clock offset (`--agent-clock-offset REGION=3ms`) to show
that lag error bars hold when clocks differ.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from replag.errors import LabError
from replag.lab.processes import LabProcess, record

AGENT_START_S = 60.0


def plan_agents(state: dict[str, Any], offsets_ms: dict[str, float]) -> None:
    """Choose each region's agent port (before the view relay, which fronts them)."""
    from replag.lab.server import free_port

    state["agents"] = {
        region: {"port": free_port(), "offset_ms": offsets_ms.get(region, 0.0)}
        for region in state["regions"]
    }


def agent_urls(state: dict[str, Any]) -> dict[str, str]:
    """Region → the URL the prober uses for its agent (the view link's, in a WAN lab)."""
    views = {link["server"]: link["listen_port"] for link in state.get("views", [])}
    return {
        region: f"http://127.0.0.1:{views.get(f'agent-{region}', agent['port'])}"
        for region, agent in state.get("agents", {}).items()
    }


def start_agents(lab_dir: Path, state: dict[str, Any], started: list[dict[str, Any]]) -> None:
    """Start every planned agent on the written topology; return once each is healthy."""
    procs = []
    for region, agent in state.get("agents", {}).items():
        log = lab_dir / f"agent-{region}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "replag",
                    "agent",
                    "--config",
                    str(lab_dir / "topology.toml"),
                    "--region",
                    region,
                    "--listen",
                    f"127.0.0.1:{agent['port']}",
                    "--state-dir",
                    str(lab_dir / f"agent-{region}"),
                    "--clock-offset",
                    f"{agent['offset_ms']}ms",
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            )
        name = f"agent-{region}"
        process = LabProcess(
            name=name, pid=proc.pid, port=agent["port"], region=region, role="agent", kind="agent"
        )
        record(lab_dir, started, process)
        procs.append((region, agent["port"], proc, log))
    deadline = time.monotonic() + AGENT_START_S
    for region, port, proc, log in procs:
        while not _healthy(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise LabError(f"the agent of {region} did not start; see {log}:\n{tail}")
            time.sleep(0.05)


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/agent/v1/health", timeout=2) as r:
            return r.status == 200 and bool(json.loads(r.read()).get("region"))
    except (urllib.error.URLError, OSError, ValueError):
        return False
