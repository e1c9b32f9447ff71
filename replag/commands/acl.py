"""`replag acl`: the ACL rules a least-privilege user needs for one mode of replag."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import cast

import click

from replag.commands.options import load
from replag.errors import ReplagError
from replag.settings import resolve_settings
from replag.topology import Endpoint
from replag.wire.permissions import (
    CONFIG_WARNING,
    MODES,
    SCRIPT_MODES,
    SCRIPT_WARNING,
    SERVERS,
    Mode,
    acl_line,
    require,
)


@click.command(name="acl")
@click.option("--mode", required=True, type=click.Choice(MODES), help="What the user will run.")
@click.option("--user", required=True, metavar="NAME", help="The ACL user's name.")
@click.option(
    "--config",
    "-c",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Read the probe prefix, databases and allow_config_changes from this file.",
)
@click.option("--prefix", help="Probe key prefix (default: settings.prefix).")
@click.option("--db", "dbs", type=int, multiple=True, help="Database (repeatable; default 0).")
@click.option(
    "--allow-config-changes/--no-allow-config-changes",
    default=None,
    help="Grant CONFIG SET (default: settings.allow_config_changes).",
)
@click.option(
    "--allow-scripts/--no-allow-scripts",
    default=None,
    help="Grant SCRIPT LOAD and EVALSHA (repair, serve; default: settings.allow_scripts): "
    "the user can then run any Lua.",
)
@click.option(
    "--server",
    "server",
    type=click.Choice(list(SERVERS)),
    help="The servers' kind: also grant what only it has (redis-7.4, redis-8, valkey-9: "
    "hash-field TTLs; redis-8: vector sets; valkey-9: CLUSTER GETSLOTMIGRATIONS; "
    "valkey-8, valkey-9, redis-8.2: CLUSTER SLOT-STATS). A server refuses a rule naming "
    "a command it lacks, so the default line has none of them.",
)
@click.option(
    "--valkey-9",
    "valkey_9",
    is_flag=True,
    help="The same as --server valkey-9.",
)
@click.option(
    "--slot-stats",
    "slot_stats",
    is_flag=True,
    help="The servers have CLUSTER SLOT-STATS (Valkey 8+, Redis 8.2+): also grant it, for "
    "the check's per-slot key counts (older servers refuse that rule; implied by "
    "--server valkey-8, valkey-9, redis-8.2).",
)
@click.option(
    "--rejson",
    is_flag=True,
    help="The servers load RedisJSON: also grant its readers (JSON.GET, JSON.DEBUG).",
)
@click.option(
    "--check",
    "check_servers",
    is_flag=True,
    help="With -c: connect to every endpoint as configured and say what the mode lacks there.",
)
def command(
    mode: str,
    user: str,
    config_path: Path | None,
    prefix: str | None,
    dbs: tuple[int, ...],
    allow_config_changes: bool | None,
    allow_scripts: bool | None,
    server: str | None,
    valkey_9: bool,
    slot_stats: bool,
    rejson: bool,
    check_servers: bool,
) -> None:
    """Print `ACL SETUSER NAME <rules>`: only what MODE needs (probe, check, repair,
    serve, agent). Add `on` and a password (`>…`) yourself; replag never prints one.

    Probe keys and their keyspace channel are granted by pattern (the probe
    subscribes to `__keyspace@<db>__:<prefix>*`, which the rule grants exactly).
    No recipe grants CONFIG GET (it reads passwords) or scripts unless
    allow_config_changes or allow_scripts asks for them (a warning says so).
    """
    chosen = cast(Mode, mode)
    if valkey_9 and server not in (None, "valkey-9"):
        raise click.UsageError(f"--valkey-9 and --server {server} name different servers")
    kind = "valkey-9" if valkey_9 else server
    features = SERVERS[kind] if kind else ()
    features += ("slot_stats",) if slot_stats and "slot_stats" not in features else ()
    features += ("rejson",) if rejson else ()
    endpoints: list[Endpoint] = []
    if config_path is not None:
        config = load(config_path)
        settings = config.settings
        endpoints = [ep for ep in config.topology.endpoints() if ep.kind == "redis"]
        dbs = dbs or tuple(sorted({ep.db for ep in endpoints})) or (0,)
    else:
        settings = resolve_settings({}, where="defaults")
    scripts = settings.allow_scripts if allow_scripts is None else allow_scripts
    if check_servers and config_path is None:
        raise click.UsageError("--check needs -c CONFIG (the endpoints to check)")
    line = acl_line(
        chosen,
        user,
        prefix=prefix or settings.prefix,
        dbs=dbs or (0,),
        allow_config_changes=(
            settings.allow_config_changes if allow_config_changes is None else allow_config_changes
        ),
        allow_scripts=scripts,
        features=features,
    )
    click.echo(line)
    if scripts and chosen in SCRIPT_MODES:
        click.echo(f"replag: {SCRIPT_WARNING}", err=True)
    if "+config|get" in line.split():
        click.echo(f"replag: {CONFIG_WARNING}", err=True)
    if check_servers:
        failed = asyncio.run(_check(endpoints, chosen, prefix or settings.prefix,
                                    settings.connect_timeout))  # fmt: skip
        sys.exit(1 if failed else 0)


async def _check(endpoints: list[Endpoint], mode: Mode, prefix: str, timeout_s: float) -> int:
    """Each endpoint's verdict on stderr; how many lack something (or failed)."""
    failed = 0
    for ep in endpoints:
        try:
            optional = await require(
                ep, mode, prefix=prefix, timeout_s=timeout_s, what=f"replag {mode}", always=True
            )
        except ReplagError as exc:
            failed += 1
            click.echo(f"{exc}", err=True)
            continue
        extra = f" (refused, optional: {', '.join(optional)})" if optional else ""
        click.echo(f"{ep.name} ({ep.url()}): {mode} permissions ok{extra}", err=True)
    return failed
