"""`replag topology`: discover the TOML topology of a running Dynomite, Redis or Redis Cluster,
and collect Dynomite's /info figures."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tomllib
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import click

from replag.commands.options import config_option, fail_as_json, json_option, load
from replag.config import write_config_atomic
from replag.config_security import EndpointDefaults, as_references, seed_url
from replag.discovery import Discovery
from replag.discovery.alert_rules import default_alert_rules
from replag.discovery.cluster import EarlierShard, discover_cluster
from replag.discovery.contacts import Contacts, parse_networks
from replag.discovery.dynomite import (
    PortMap,
    discover_dynomite,
    load_port_map_file,
    parse_port_override,
)
from replag.discovery.replication import discover_replication
from replag.discovery.sentinel import discover_sentinel
from replag.durations import parse_duration_s
from replag.errors import ReplagError, UsageError
from replag.monitoring.dropped_writes import find_dropped_writes
from replag.monitoring.dynomite_stats import collect_dynomite_stats
from replag.plural import count
from replag.schemas import versioned
from replag.settings import Settings, resolve_settings
from replag.store import parse_location
from replag.store.configs import open_config_store
from replag.store.location import store_for_config
from replag.wire import reply_limits


@click.group(name="topology")
def command() -> None:
    """Discover topologies from the systems that run them."""


@command.command(name="discover")
@click.option(
    "--dynomite",
    "dynomite_url",
    metavar="URL",
    help="A Dynomite node's stats port, e.g. http://10.0.0.1:22222.",
)
@click.option(
    "--redis",
    "redis_urls",
    multiple=True,
    metavar="URL",
    help="A Redis primary (or any replica of it), e.g. redis://10.0.0.1:6379; repeatable: "
    "each replica set becomes a region and group named after its primary (host:port).",
)
@click.option(
    "--cluster",
    "cluster_urls",
    multiple=True,
    metavar="URL",
    help="Any node of a Redis Cluster, e.g. redis://10.0.0.1:7000; repeatable (with "
    "several, each cluster is named after the node given: its shards NAME-shard-…).",
)
@click.option(
    "--name",
    "fleet_name",
    metavar="NAME",
    help="With one --redis or --cluster: its name (the region and group of a replica "
    "set; the cluster and its shards' prefix), instead of the primary's host:port.",
)
@click.option(
    "--sentinel",
    "sentinel_addresses",
    multiple=True,
    metavar="HOST:PORT",
    help="A Redis Sentinel (repeatable; the first that answers is asked), or a redis:// URL.",
)
@click.option(
    "--master",
    "sentinel_masters",
    multiple=True,
    metavar="NAME",
    help="With --sentinel: only this master (repeatable; default every one it monitors).",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the TOML here (atomically, mode 0600) instead of to stdout.",
)
@click.option(
    "--previous",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="With --cluster: a config (the one in use) whose shard names to keep, each shard "
    "found by its `shard` identity, else by its slots (default: the --out file, if it "
    "exists).",
)
@click.option("--peer-port", type=int, help="Dynomite peer port convention (default 8101).")
@click.option("--client-port", type=int, help="Dynomite client port convention (default 8102).")
@click.option("--stats-port", type=int, help="Dynomite stats port convention (default 22222).")
@click.option("--redis-port", type=int, help="Backend Redis port convention (default 22122).")
@click.option(
    "--port-map",
    "port_maps",
    multiple=True,
    metavar="HOST:PEER=client:PORT,redis:[HOST:]PORT,stats:PORT",
    help="Ports of one Dynomite node, named by its peer address (repeatable).",
)
@click.option(
    "--port-map-file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="TOML file of Dynomite port conventions and per-node ports.",
)
@click.option(
    "--timeout",
    "timeout",
    metavar="DURATION",
    help="Timeout of each request (default: settings.connect_timeout).",
)
@click.option(
    "--password-env",
    metavar="NAME",
    help="Environment variable holding the servers' password (--redis, --cluster, "
    "--sentinel's data nodes): the file gets `password_env = NAME`, never the password.",
)
@click.option(
    "--allow-networks",
    "allow_networks",
    metavar="CIDR,...",
    help="Contact only hosts in these networks (e.g. 10.0.0.0/8,192.168.1.0/24): discovery "
    "follows what servers say (INFO replication) and sends them the URL's credentials; "
    "a Sentinel names masters, replicas and Sentinels, Dynomite its peers: a host outside "
    "is neither contacted nor written as an endpoint, only listed in the file's header.",
)
@click.option(
    "--store",
    "store_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Results store written into the file as `store` (default: $REPLAG_STORE, else "
    "one of the file's own, ~/.local/state/replag/NAME-HASH.sqlite, named for --out: "
    "two configs never share a store unless told to).",
)
def discover(
    dynomite_url: str | None,
    redis_urls: tuple[str, ...],
    cluster_urls: tuple[str, ...],
    fleet_name: str | None,
    sentinel_addresses: tuple[str, ...],
    sentinel_masters: tuple[str, ...],
    out: Path | None,
    previous: Path | None,
    peer_port: int | None,
    client_port: int | None,
    stats_port: int | None,
    redis_port: int | None,
    port_maps: tuple[str, ...],
    port_map_file: Path | None,
    timeout: str | None,
    password_env: str | None,
    allow_networks: str | None,
    store_path: Path | None,
) -> None:
    """Discover a topology and print (or --out) the TOML file replag reads.

    A password given in a URL is written into the file (mode 0600); one given with
    --password-env NAME is read from NAME and the file refers to NAME only. rediss://
    URLs are read with the tls_* settings (REPLAG_TLS_CA, …), written into the file.

    --redis follows INFO replication (master_host, slaveN) and sends the URL's user and
    password to every host it names: the hosts that got them are listed on stderr and in
    the file; --allow-networks keeps discovery inside the networks you trust.
    """
    redis_sources = [("--redis", u) for u in redis_urls] + [("--cluster", u) for u in cluster_urls]
    kinds = sum(bool(k) for k in (dynomite_url, redis_sources, sentinel_addresses))
    if kinds != 1:
        raise UsageError(
            "give --dynomite URL, or --redis/--cluster URLs (each repeatable), or "
            "--sentinel HOST:PORT: one kind of source"
        )
    if fleet_name is not None and len(redis_sources) != 1:
        raise UsageError(
            "--name names one --redis or --cluster: with several, each is named after "
            "its primary (host:port) or the node given"
        )
    if sentinel_masters and not sentinel_addresses:
        raise UsageError("--master applies to --sentinel only")
    dynomite_only = (peer_port, client_port, stats_port, redis_port, port_map_file)
    if dynomite_url is None and (port_maps or any(v is not None for v in dynomite_only)):
        raise UsageError("port conventions and --port-map apply to --dynomite only")
    if previous is not None and not cluster_urls:
        raise UsageError("--previous applies to --cluster only")
    contacts = Contacts(networks=parse_networks(allow_networks) if allow_networks else None)
    settings = resolve_settings({}, where="defaults")
    limits = reply_limits.from_settings(settings)
    timeout_s = _timeout_s(timeout, settings)
    password = _password_from(password_env, dynomite=dynomite_url is not None)
    defaults = EndpointDefaults.of(settings, os.environ, where="environment")
    seeded_sources = []
    for option, seed in redis_sources:
        if password is not None and urlsplit(seed).password:
            raise UsageError(f"{option} {_shown(seed)}: give the password once: in the URL or "
                             "with --password-env")  # fmt: skip
        seeded_sources.append((option, seed_url(seed, password=password, tls=defaults.tls)))
    sentinel_addresses = tuple(
        seed_url(a, password=None, tls=defaults.tls) if a.startswith("rediss://") else a
        for a in sentinel_addresses
    )
    if dynomite_url:
        ports = port_map(
            settings,
            peer=peer_port,
            client=client_port,
            stats=stats_port,
            redis=redis_port,
            overrides=port_maps,
            path=port_map_file,
        )
        found = asyncio.run(
            discover_dynomite(dynomite_url, ports=ports, timeout_s=timeout_s, contacts=contacts)
        )
    elif sentinel_addresses:
        found = asyncio.run(
            discover_sentinel(
                list(sentinel_addresses),
                masters=list(sentinel_masters),
                timeout_s=timeout_s,
                contacts=contacts,
                limits=limits,
            )
        )
    else:
        earlier = _shards_in(previous, "--previous") if previous else _shards_in(out)
        several = len(seeded_sources) > 1
        parts = []
        for option, url in seeded_sources:
            if option == "--redis":
                part = asyncio.run(
                    discover_replication(
                        url, timeout_s=timeout_s, contacts=contacts, name=fleet_name, limits=limits
                    )
                )
                if several:  # two replica sets in one file: each its own cluster
                    part = _in_cluster(part, part.topology.regions[0].name)
            else:
                name = fleet_name or (_seed_address(url) if len(cluster_urls) > 1 else None)
                part = asyncio.run(
                    discover_cluster(
                        url,
                        timeout_s=timeout_s,
                        contacts=contacts,
                        previous=earlier,
                        name=name,
                        limits=limits,
                    )
                )
                if several and name is None:
                    part = _in_cluster(part, _seed_address(url))
            parts.append((f"{option} {_shown(url)}", part))
        found = merge_discoveries(parts)
    topology, references = as_references(
        found.topology, password=password, password_env=password_env
    )
    found = replace(found, topology=topology, settings={**found.settings, **references})
    lines = contacts.header_lines()
    if lines:
        found = replace(found, header="\n".join([found.header, *lines]))
    _emit(with_store(found, store_path or _own_store(found, out, settings)), out)
    for line in lines:
        click.echo(f"note: {line}", err=True)


def _own_store(found: Discovery, out: Path | None, settings: Settings) -> str:
    """The store the file gets: $REPLAG_STORE (shared on purpose), else one of its own,
    named for the --out file (or, printed, for what was discovered)."""
    if "REPLAG_STORE" in os.environ:
        return settings.store
    if out is not None:
        return str(store_for_config(out.stem, where=out))
    regions = found.topology.regions
    return str(store_for_config(regions[0].name if regions else "replag"))


def _shown(url: str) -> str:
    """`url` without its password, for a message."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    return url.replace(f":{parts.password}@", ":***@", 1)


def _seed_address(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 6379}"


def _in_cluster(found: Discovery, cluster: str) -> Discovery:
    """`found` with every region in `cluster` (probes then expect its writes only there)."""
    regions = tuple(replace(r, cluster=r.cluster or cluster) for r in found.topology.regions)
    return replace(found, topology=replace(found.topology, regions=regions))


def merge_discoveries(parts: list[tuple[str, Discovery]]) -> Discovery:
    """One file of several discoveries (`parts`: (the option and URL given, what it found));
    a region or group found twice (two URLs of one replica set) is refused, naming both."""
    if len(parts) == 1:
        return parts[0][1]
    seen: dict[str, str] = {}
    for given, part in parts:
        names = {r.name for r in part.topology.regions} | {g.name for g in part.topology.groups}
        for name in sorted(names):
            if name in seen:
                raise UsageError(
                    f"{given} and {seen[name]} both found {name!r}: the same replica set or "
                    "cluster given twice (or give each a --name in a file of its own)"
                )
            seen[name] = given
    first = parts[0][1]
    return Discovery(
        topology=replace(
            first.topology,
            regions=tuple(r for _, p in parts for r in p.topology.regions),
            groups=tuple(g for _, p in parts for g in p.topology.groups),
        ),
        header="\n".join(p.header for _, p in parts),
        comments={k: v for _, p in parts for k, v in p.comments.items()},
        endpoint_comments={k: v for _, p in parts for k, v in p.endpoint_comments.items()},
        settings={k: v for _, p in parts for k, v in p.settings.items()},
        facts={k: v for _, p in parts for k, v in p.facts.items()},
    )


def _shards_in(path: Path | None, option: str = "--out") -> list[EarlierShard]:
    """The shards (regions with slots) of an earlier discovery: the file --out rewrites,
    or --previous's: each shard keeps its name through a reshard, a dead node and a
    failover."""
    if path is None or not path.exists():
        return []
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{option}: cannot read the file, {path}: {exc}") from None
    out = []
    for region in data.get("regions", []):
        slots = region.get("slots") if isinstance(region, dict) else None
        if isinstance(slots, list) and isinstance(region.get("name"), str):
            try:
                pairs = tuple((int(a), int(b)) for a, b in slots)
            except (TypeError, ValueError):
                continue  # not slot ranges: the file's own check says so when it is loaded
            shard = region.get("shard")
            identity = shard if isinstance(shard, str) and shard else None
            out.append(EarlierShard(region["name"], pairs, identity))
    return out


def _password_from(name: str | None, *, dynomite: bool) -> str | None:
    if name is None:
        return None
    if dynomite:
        raise UsageError("--password-env applies to --redis, --cluster and --sentinel")
    if name not in os.environ:
        raise UsageError(f"--password-env: environment variable {name} is not set")
    return os.environ[name]


def _timeout_s(timeout: str | None, settings: Settings) -> float:
    """--timeout in seconds (settings.connect_timeout when not given)."""
    try:
        timeout_s = parse_duration_s(timeout) if timeout else settings.connect_timeout
        if timeout_s <= 0:
            raise ValueError("must be more than 0 (0 would wait forever)")
    except ValueError as exc:
        raise UsageError(f"--timeout: {exc}") from None
    return timeout_s


# Where a printed file expects the password it does not show.
PRINTED_PASSWORD_ENV = "REPLAG_REDIS_PASSWORD"


def printable(found: Discovery) -> Discovery:
    """`found` as a terminal may show it and a file may hold it: a password the servers
    share becomes `password_env` (a placeholder variable, said in a comment at the top),
    so the printed file works once the variable is set. Passwords that differ stay `***`,
    and the comment says to fill them in."""
    passwords = {ep.password for ep in found.topology.endpoints() if ep.password}
    if not passwords:
        return found
    if len(passwords) == 1 and "password_env" not in found.settings:
        topology, references = as_references(
            found.topology, password=passwords.pop(), password_env=PRINTED_PASSWORD_ENV
        )
        note = (
            f"The servers' password is not printed: set {PRINTED_PASSWORD_ENV} to it\n"
            '(or replace password_env with password_file = "/path/to/secret");\n'
            "--out FILE writes it instead (mode 0600)."
        )
        settings = {**found.settings, **references}
        return replace(
            found, topology=topology, settings=settings, header=f"{found.header}\n{note}"
        )
    note = (
        "Passwords are not printed: replace each *** in a url with its server's password\n"
        "(or use password_env / password_file per endpoint);\n"
        "--out FILE writes them (mode 0600)."
    )
    return replace(found, header=f"{found.header}\n{note}")


def _emit(found: Discovery, out: Path | None) -> None:
    """Print the file (no password: a placeholder to fill in) or write it to `out` (0600,
    atomically)."""
    store = parse_location(found.settings["store"]).shown
    rules = "\n" + default_alert_rules(found.topology)
    if out is None:
        # The terminal (and whatever log captures it) never sees a password: the file does.
        shown = printable(found)
        click.echo(shown.render(redact=True) + rules, nl=False)
        if shown is not found:
            note = shown.header[len(found.header) :].strip().replace("\n", " ")
            click.echo(f"note: {note}", err=True)
        click.echo(f"results store (state of probe, repair, serve): {store}", err=True)
        return
    write_config_atomic(out, found.render() + rules)
    click.echo(f"wrote {out}: {summary(found)}", err=True)
    click.echo(f"results store (state of probe, repair, serve): {store}", err=True)


def with_store(found: Discovery, path: Path | str) -> Discovery:
    """`found` with `store` in its settings (a SQLite path made absolute), and a header line
    saying what it is: whoever runs replag on the file sees where its state goes."""
    where = parse_location(path)
    if where.backend == "sqlite":
        store = str(Path(where.target).expanduser().resolve())
        shown = store
    else:
        store, shown = where.target, where.shown
    header = (
        f"{found.header}\n" if found.header else ""
    ) + f"Results store (lag windows, repair runs, alert state): {shown} (settings.store)."
    return replace(found, settings={"store": store, **found.settings}, header=header)


def port_map(
    settings: Settings,
    *,
    peer: int | None,
    client: int | None,
    stats: int | None,
    redis: int | None,
    overrides: tuple[str, ...],
    path: Path | None,
) -> PortMap:
    """Conventions from settings < --port-map-file < flags; per-node overrides on top."""
    ports = PortMap(
        peer=settings.dynomite_peer_port,
        client=settings.dynomite_client_port,
        stats=settings.dynomite_stats_port,
        redis=settings.dynomite_redis_port,
    )
    if path is not None:
        ports = load_port_map_file(path, ports)
    ports = replace(
        ports,
        peer=ports.peer if peer is None else peer,
        client=ports.client if client is None else client,
        stats=ports.stats if stats is None else stats,
        redis=ports.redis if redis is None else redis,
    )
    nodes = dict(ports.overrides)
    for text in overrides:
        peer_address, node_ports = parse_port_override(text)
        nodes[peer_address] = node_ports
    return replace(ports, overrides=nodes)


def summary(found: Discovery) -> str:
    regions, groups = found.topology.regions, found.topology.groups
    line = f"{count(len(regions), 'region')}, {count(len(groups), 'replica group')}"
    consistency = found.facts.get("consistency")
    if isinstance(consistency, dict):
        line += f"; Dynomite consistency read {consistency['read']}, write {consistency['write']}"
    return line


@command.command(name="dynomite-stats")
@config_option
@json_option
@click.option(
    "--timeout",
    "timeout",
    metavar="DURATION",
    help="Timeout of each /info request (default: settings.connect_timeout).",
)
def dynomite_stats(config_path: Path, as_json: bool, timeout: str | None) -> None:
    """Collect every Dynomite node's /info into the store; exit 1 if writes were dropped.

    Reads settings.dynomite_stats_urls (written by `topology discover --dynomite`).
    Run it from cron: a growth of dropped peer requests since the previous
    sample means replicas may have diverged.
    """
    try:
        _dynomite_stats(config_path, as_json, timeout)
    except ReplagError as exc:
        if not as_json:
            raise
        fail_as_json(exc)


def _dynomite_stats(config_path: Path, as_json: bool, timeout: str | None) -> None:
    config = load(config_path)
    urls = config.settings.dynomite_stats_urls
    if not urls:
        raise UsageError("settings.dynomite_stats_urls is empty: nothing to collect")
    timeout_s = _timeout_s(timeout, config.settings)
    store = open_config_store(config)
    try:
        collected = asyncio.run(collect_dynomite_stats(urls, store=store, timeout_s=timeout_s))
        findings = find_dropped_writes(store)
    finally:
        store.close()
    if as_json:
        document = {
            "samples": [s.to_dict() for s in collected.samples],
            "errors": dict(collected.errors),
            "dropped_writes": [f.to_dict() for f in findings],
        }
        click.echo(json.dumps(versioned(document), indent=2))
    else:
        for s in collected.samples:
            f = s.figures
            click.echo(
                f"{s.node} {s.dc}/{s.rack}: peer connections {f['peer_connections']}, "
                f"link failures (eof/err/timeouts) {f['peer_eof']}/{f['peer_err']}/"
                f"{f['peer_timedout']}, peer dropped {f['peer_dropped_requests']}, "
                f"timed out {f['peer_timedout_requests']}; cross-zone p99 "
                f"{f['cross_zone_latency_p99_us']} µs, cross-region rtt p99 "
                f"{f['cross_region_rtt_p99_us']} µs"
            )
        for url, error in collected.errors.items():
            click.echo(f"{url}: error: {error}", err=True)
        for finding in findings:
            click.echo(
                f"{finding.node} ({finding.dc}/{finding.rack}): {finding.describe()}: "
                f"{finding.message}",
                err=True,
            )
    # As with a probe's unreachable replicas: a node we could not read is a finding too.
    if findings or collected.errors:
        sys.exit(1)
