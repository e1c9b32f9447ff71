"""`replag repair check|run`: find and repair divergence between the replicas of a group."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import click

from replag.commands.options import config_option, json_option, load, setting_option
from replag.repair import RepairProgress, RepairReport, check, repair
from replag.store import Store

_GROUP = click.option("--group", "-g", help="Replica group to compare (default: every group).")
_MATCH = click.option("--match", help="Only keys matching this SCAN MATCH pattern.")
_TYPE = click.option(
    "--type",
    "type_filter",
    type=click.Choice(["string", "hash", "set", "zset", "list", "stream"]),
    help="Only keys of this type (SCAN TYPE; Redis >= 6.0).",
)


class _ProgressLine:
    """One \\r-rewritten status line on stderr: keys scanned per replica, rate, ETA."""

    def __init__(self) -> None:
        self._last = 0.0
        self._shown = False

    def __call__(self, event: RepairProgress) -> None:
        now = time.monotonic()
        if now - self._last < 0.2:
            return
        self._last = now
        total = f"/{event.total:,}" if event.total else ""
        eta = f" ETA {event.eta_s:4.0f}s" if event.eta_s is not None else ""
        where = event.replica if event.replica != "*" else event.group
        line = f"{event.phase} {where}: {event.done:,}{total} keys {event.rate:,.0f}/s{eta}"
        click.echo(f"\r{line:<78}", nl=False, err=True)
        self._shown = True

    def close(self) -> None:
        if self._shown:
            click.echo("\r" + " " * 78 + "\r", nl=False, err=True)


def _emit(report: RepairReport, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        click.echo(report.render())


def _progress(as_json: bool) -> _ProgressLine | None:
    return _ProgressLine() if not as_json and sys.stderr.isatty() else None


def _run(
    config_path: Path,
    as_json: bool,
    job: Callable[..., Coroutine[Any, Any, RepairReport]],
    **options: Any,
) -> RepairReport:
    """Load the config, open the store, run `job` with a progress line on a terminal, report."""
    config = load(config_path)
    store = Store(config.settings.store)
    progress = _progress(as_json)
    try:
        report = asyncio.run(job(config, store=store, progress=progress, **options))
    finally:
        if progress is not None:
            progress.close()
        store.close()
    _emit(report, as_json)
    return report


@click.group(name="repair")
def command() -> None:
    """Find keys that differ between replicas (Tictac Merkle trees) and repair them safely."""


@command.command("check")
@config_option
@_GROUP
@_MATCH
@_TYPE
@json_option
def check_command(
    config_path: Path, group: str | None, match: str | None, type_filter: str | None, as_json: bool
) -> None:
    """Compare the replicas; exit 0 if they agree, 1 if divergence is found."""
    report = _run(config_path, as_json, check, group=group, match=match, type_filter=type_filter)
    sys.exit(1 if report.divergent else 0)


@command.command("run")
@config_option
@_GROUP
@click.option(
    "--policy",
    default="quorum",
    show_default=True,
    help="quorum | source:REPLICA_OR_REGION | newest:FIELD (see README).",
)
@click.option("--dry-run", is_flag=True, help="Decide everything, write nothing.")
@click.option(
    "--allow-deletes",
    is_flag=True,
    help="Let the policy delete keys (quorum: where a majority lacks the key).",
)
@setting_option("repair_rate", "--rate", type=click.FloatRange(0))
@setting_option("max_inflight", type=click.IntRange(1))
@click.option("--resume", "resume", metavar="RUN", help="Continue an interrupted run.")
@_MATCH
@_TYPE
@json_option
def run_command(
    config_path: Path,
    group: str | None,
    policy: str,
    dry_run: bool,
    allow_deletes: bool,
    rate: float | None,
    max_inflight: int | None,
    resume: str | None,
    match: str | None,
    type_filter: str | None,
    as_json: bool,
) -> None:
    """Find and repair divergence. Exit 1 if conflicts or changing keys were left."""
    report = _run(
        config_path,
        as_json,
        repair,
        group=group,
        policy=policy,
        dry_run=dry_run,
        allow_deletes=allow_deletes,
        rate=rate,
        max_inflight=max_inflight,
        resume=resume,
        match=match,
        type_filter=type_filter,
    )
    left = report.to_dict()
    sys.exit(1 if left["conflicts"] or left["busy"] or left["kept"] else 0)
