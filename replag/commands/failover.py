"""`replag failover-check`: is it safe to fail over now? JSON, exit 0 safe / 1 not / 2 error
(or a Nagios plugin line: 0 OK / 2 CRITICAL / 3 UNKNOWN)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import click

from replag.commands.colour import paint
from replag.commands.options import config_option, load
from replag.commands.repeated_logs import defer_logs, stderr_line
from replag.discovery.primaries import failover_check
from replag.durations import parse_bytes, parse_duration_s
from replag.errors import ReplagError, UsageError
from replag.probes.nagios import (
    UNKNOWN,
    failover_nagios_code,
    failover_nagios_line,
    nagios_error,
)
from replag.replication.check import FailoverCheck
from replag.schemas import versioned
from replag.store import Store, parse_location


@click.command(name="failover-check")
@config_option
@click.option("--source", help="Region (or shard) whose primary to check (default: every one).")
@click.option(
    "--max-bytes",
    default="0",
    show_default=True,
    help="Safe only if the best replica is at most this far behind: bytes, or 16kb, 1mb.",
)
@click.option("--max-lag", help="Also safe only if it lags at most this (e.g. 100ms).")
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["json", "text", "nagios"]),
    default="json",
    show_default=True,
    help="json; text: per primary its verdict and a line per replica (why each was "
    "passed over); nagios: one plugin line with perfdata (each primary's RPO), "
    "exit 0 OK / 2 CRITICAL (unsafe) / 3 UNKNOWN (error).",
)
@click.option("--json", "as_json", is_flag=True, help="The same as --format json (the default).")
def command(
    config_path: Path,
    source: str | None,
    max_bytes: str,
    max_lag: str | None,
    output_format: str,
    as_json: bool,
) -> None:
    """Sample each primary and its replicas; print what a failover would lose (JSON).

    Exit 0 when every primary has a replica within --max-bytes (and --max-lag,
    from the latest probe figures in the store), 1 when not, 2 on bad input or
    an unreachable primary (then stdout has {"error", "exit_code"}).
    """
    defer_logs()  # stdout is JSON (or the plugin line)
    try:
        if as_json and output_format != "json":
            raise UsageError(f"--json and --format {output_format}: choose one")
        result = _check(config_path, source, max_bytes, max_lag)
    except ReplagError as exc:
        if output_format == "nagios":
            click.echo(nagios_error(str(exc)))
            sys.exit(UNKNOWN)
        document = versioned({"error": str(exc), "exit_code": exc.exit_code})
        click.echo(json.dumps(document, indent=2))
        stderr_line(str(exc))
        sys.exit(exc.exit_code)
    if output_format == "nagios":
        click.echo(failover_nagios_line(result))
        sys.exit(failover_nagios_code(result))
    if output_format == "text":
        click.echo(paint("\n".join(result.render()), ok=result.exit_code == 0))
        sys.exit(result.exit_code)
    click.echo(json.dumps(versioned(result.to_dict()), indent=2))
    for assessment in result.assessments:
        state = "SAFE" if assessment.safe else "UNSAFE"
        click.echo(f"{state}: {assessment.source}: {assessment.verdict}", err=True)
    sys.exit(result.exit_code)


def _check(
    config_path: Path, source: str | None, max_bytes: str, max_lag: str | None
) -> FailoverCheck:
    try:
        limit = parse_bytes(max_bytes)
    except ValueError as exc:
        raise UsageError(f"--max-bytes: {exc}") from None
    try:
        lag_s = parse_duration_s(max_lag) if max_lag is not None else None
    except ValueError as exc:
        raise UsageError(f"--max-lag: {exc}") from None
    config = load(config_path)
    where = parse_location(config.settings.store)
    # Read-only: probe figures are used when a store exists; no SQLite file is created here.
    exists = where.backend == "postgresql" or Path(where.target).expanduser().exists()
    store = Store(config.settings.store) if exists else None
    try:
        result = asyncio.run(
            failover_check(config, source=source, max_bytes=limit, max_lag_s=lag_s, store=store)
        )
    finally:
        if store is not None:
            store.close()
    return result
