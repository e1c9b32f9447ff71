"""`replag repair rebuild`: refill a replaced or wiped replica of a peer group from its peers."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import click

from replag.commands.colour import paint
from replag.commands.options import config_option, json_option, load
from replag.commands.repeated_logs import stderr_line
from replag.commands.status_line import repair_progress_line
from replag.repair.rebuild import RebuildPlan, rebuild
from replag.repair.runs import resume_command
from replag.schemas import versioned
from replag.store.configs import open_config_store


@click.command("rebuild")
@config_option
@click.option("--group", "-g", help="The replica group (a Dynomite token's racks, or peers).")
@click.option("--replica", "-r", help="The member to refill (it may be empty).")
@click.option(
    "--source",
    help="The peer whose keyspace is walked (default: the one holding most keys); every "
    "peer is read, and only keys they all agree on are copied.",
)
@click.option(
    "--rate",
    type=click.FloatRange(0),
    help="Keys per second (default: the lower of scan_rate and repair_rate; 0 = as fast "
    "as the servers answer).",
)
@click.option("--dry-run", is_flag=True, help="Say what it would do (and how long), do nothing.")
@click.option(
    "--no-closing-pass",
    is_flag=True,
    help="Skip the `repair run` that follows the copy (it repairs what the bulk copy "
    "leaves: keys the peers disagree on, written meanwhile, or held only by other members).",
)
@click.option(
    "--full-closing-pass",
    is_flag=True,
    help="Make the closing pass a whole `repair run` of the group (every key compared), "
    "not only the keys the copy left.",
)
@click.option("--resume", metavar="RUN", help="Continue an interrupted or failed rebuild.")
@json_option
def command(
    config_path: Path,
    group: str | None,
    replica: str | None,
    source: str | None,
    rate: float | None,
    dry_run: bool,
    no_closing_pass: bool,
    full_closing_pass: bool,
    resume: str | None,
    as_json: bool,
) -> None:
    """Refill REPLICA of GROUP from its peers: bulk, verified, checkpointed, throttled.

    Prints the plan (keys, bytes, time at the current rate), copies what the replica
    lacks and its peers agree on, then a `repair run` of the keys the copy left (the
    peers disagreed, a client wrote them meanwhile, only other members hold them). For a Redis
    replica of a replication group it says how Redis's own full sync rebuilds it."""
    if resume is None and (group is None or replica is None):
        raise click.UsageError("--group and --replica are required (or --resume RUN)")
    config = load(config_path)
    store = open_config_store(config)
    progress = repair_progress_line(as_json=as_json)
    run_ids: list[str] = []

    def show(plan: RebuildPlan) -> None:
        if not as_json:
            click.echo(plan.render(), err=not dry_run)

    try:
        report = asyncio.run(
            rebuild(
                config,
                group=group or "",
                replica=replica or "",
                source=source,
                rate=rate,
                store=store,
                resume=resume,
                dry_run=dry_run,
                closing_pass=not no_closing_pass,
                full_closing_pass=full_closing_pass,
                progress=progress,
                on_plan=show,
                on_run=run_ids.append,
            )
        )
    except KeyboardInterrupt:
        if progress is not None:
            progress.close()
        if not run_ids:
            raise
        again = resume_command("rebuild", run_ids[-1], str(config_path))
        stderr_line(f"interrupted; run {run_ids[-1]} is saved: `{again}`", prefix="")
        sys.exit(130)
    finally:
        if progress is not None:
            progress.close()
        store.close()
    if as_json:
        click.echo(json.dumps(versioned(report.to_dict()), indent=2))
    closing = report.closing or {}
    left = closing.get("conflicts", 0) + closing.get("busy", 0) + closing.get("kept", 0)
    if not as_json and not dry_run:
        click.echo(paint(report.render(), ok=not (left or report.counts.undo_failed)))
    sys.exit(1 if left or report.counts.undo_failed else 0)
