"""The lab's WAN geometry: every server seen from the prober's region through its region's path.

In a real fleet the prober sits in one region (here the first, beside the
primary) and reaches every other region's servers over a WAN whose two
directions need not be equally fast. With `wan`, the lab starts a second delay
relay ("view relay") with one link per server: the prober connects to the
link, which holds prober → server bytes for the region's *out* delay and
server → prober bytes for its *back* delay, with the lab's jitter. Replication
links use the same path (primary → replica out, replica → primary back).
`topology.toml` then names the view address as each endpoint's `url` and the
server's own port as its `local` address, which a region's agent uses.

The view links log probe keys passing server → prober (keyspace events) in
`DIR/truth-view-<server>.log`: with the replication links' truth this shows
exactly how long each direction took, and so what a prober that halves a
round trip gets wrong on an asymmetric path. The primary's view link also logs
probe writes as it delivers them to the primary (`DIR/truth-write-<primary>.log`):
from that moment to the replication link's delivery of the same key is the
key's lag as the lab's network gave it, processes' wake-ups included.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from replag.durations import parse_duration_ns
from replag.errors import UsageError
from replag.lab.processes import LabProcess, record
from replag.lab.relay import fill_listen_ports, spawn_relay

VIEW_RELAY = "view-relay"


def parse_paths(text: str, *, option: str) -> tuple[dict[str, float], dict[str, float]]:
    """`eu-west=60ms/100ms,us-west=40ms` → out delays {eu-west: 60, us-west: 40} and the
    back delays that differ {eu-west: 100} (ms). OUT is from the primary's (and prober's)
    region to REGION, BACK the other way; one value means both."""
    out: dict[str, float] = {}
    back: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        region, sep, value = part.partition("=")
        if not sep or not region.strip():
            raise UsageError(f"{option}: expected REGION=OUT[/BACK], got {part!r}")
        first, _, second = value.partition("/")
        out[region.strip()] = parse_ms(first, option=option)
        if second:
            back[region.strip()] = parse_ms(second, option=option)
    return out, back


def parse_path(text: str, *, option: str) -> tuple[float, float | None]:
    """`60ms/100ms` → (60.0, 100.0); `80ms` → (80.0, None)."""
    first, _, second = text.partition("/")
    return parse_ms(first, option=option), parse_ms(second, option=option) if second else None


def parse_ms(text: str, *, option: str) -> float:
    try:
        return parse_duration_ns(text.strip(), default_unit="ms") / 1e6
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}") from None


def start_views(
    lab_dir: Path,
    state: dict[str, Any],
    started: list[dict[str, Any]],
    paths: dict[str, tuple[float, float]],
    *,
    jitter_ms: float,
    prefix: str,
) -> None:
    """Start the view relay in front of every server of `state` (recorded in `started`).

    `paths` maps a region to its (out, back) delays in ms. Records the links in
    `state["views"]` and the relay's control port in `state["view_relay_control_port"]`.
    """
    servers = [p for p in state["processes"] if p["kind"] == "redis-server"]
    links: list[dict[str, Any]] = []
    for proc in servers:
        out_ms, back_ms = paths.get(proc["region"], (0.0, 0.0))
        links.append(
            {
                "name": f"view-{proc['name']}",
                "server": proc["name"],
                "region": proc["region"],
                "kind": "view",
                "listen_port": 0,
                "upstream_port": proc["port"],
                # Downstream is server → prober: the path back.
                "delay_ms": back_ms,
                "up_delay_ms": out_ms,
                # A server in the prober's own region is local to it: no WAN jitter.
                "jitter_ms": jitter_ms if out_ms or back_ms else 0.0,
                "truth_path": str(lab_dir / f"truth-view-{proc['name']}.log"),
                # Probe writes delivered to the primary: the truth's start of a key's lag.
                "truth_up_path": (
                    str(lab_dir / f"truth-write-{proc['name']}.log")
                    if proc["role"] == "primary"
                    else None
                ),
                "truth_prefix": prefix,
            }
        )
    for region, agent in state.get("agents", {}).items():
        # A region's agent is reached over the same path as its servers (nothing logged).
        out_ms, back_ms = paths.get(region, (0.0, 0.0))
        links.append(
            {
                "name": f"view-agent-{region}",
                "server": f"agent-{region}",
                "region": region,
                "kind": "view",
                "listen_port": 0,
                "upstream_port": agent["port"],
                "delay_ms": back_ms,
                "up_delay_ms": out_ms,
                "jitter_ms": jitter_ms if out_ms or back_ms else 0.0,
            }
        )
    pid, control = spawn_relay(lab_dir, VIEW_RELAY, links)
    record(
        lab_dir,
        started,
        LabProcess(
            name=VIEW_RELAY, pid=pid, port=None, region=None, role="view-relay", kind="relay"
        ),
    )
    fill_listen_ports(control, links)
    state["views"] = links
    state["view_relay_control_port"] = control


def view_ports(state: dict[str, Any]) -> dict[str, int]:
    """Server name → the port the prober reaches it on (only in a WAN lab)."""
    return {link["server"]: int(link["listen_port"]) for link in state.get("views", [])}


def delay_request(link: dict[str, Any], out_ms: float, back_ms: float) -> dict[str, Any]:
    """The relay request giving `link` a region's path: a view link's downstream is the way
    back to the prober, a replication link's the way out from the primary."""
    if link.get("kind") == "view":
        return {"op": "delay", "link": link["name"], "delay_ms": back_ms, "up_delay_ms": out_ms}
    return {"op": "delay", "link": link["name"], "delay_ms": out_ms, "up_delay_ms": back_ms}
