"""`replag repair check|run|runs`: find and repair divergence between the replicas of a group."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import click

from replag.commands.colour import paint
from replag.commands.options import config_option, json_option, load, setting_option
from replag.commands.repeated_logs import stderr_line
from replag.commands.status_line import repair_progress_line
from replag.errors import ReplagError, UsageError
from replag.private_files import open_private
from replag.repair import RepairReport, check, list_runs, repair
from replag.repair.keyspace.observe import key_text
from replag.repair.runs import RunLog, resumable, resume_command
from replag.schemas import versioned
from replag.store import Store, parse_location
from replag.store.configs import open_config_store

_GROUP = click.option("--group", "-g", help="Replica group to compare (default: every group).")
_MATCH = click.option("--match", help="Only keys matching this SCAN MATCH pattern.")
_TYPE = click.option(
    "--type",
    "type_filter",
    type=click.Choice(["string", "hash", "set", "zset", "list", "stream"]),
    help="Only keys of this type (SCAN TYPE; Redis >= 6.0).",
)

# A resumed run keeps the choice it started with.
_TTLS = setting_option("repair_ttls", "--ttls")


def _emit(report: RepairReport, as_json: bool, *, repairing: bool) -> None:
    if as_json:
        click.echo(json.dumps(versioned(report.to_dict()), indent=2))
        return
    # A check is clean with no divergence; a repair when it left nothing divergent.
    found = _left(report.to_dict()) if repairing else report.divergent
    ok = not (found or report.not_clean or report.not_verified)
    click.echo(paint(report.render(), ok=ok))


@contextlib.contextmanager
def _json_errors(as_json: bool, run_ids: list[str]) -> Iterator[None]:
    """With --json, an error is a JSON object on stdout too ({"error", "exit_code",
    "run_id" once the run was recorded}), so a script reading stdout always gets one."""
    try:
        yield
    except ReplagError as exc:
        if not as_json:
            raise
        out: dict[str, Any] = versioned({"error": str(exc), "exit_code": exc.exit_code})
        if run_ids:
            out["run_id"] = run_ids[-1]
        click.echo(json.dumps(out, indent=2))
        stderr_line(str(exc))
        sys.exit(exc.exit_code)


def _run(
    config_path: Path,
    as_json: bool,
    job: Callable[..., Coroutine[Any, Any, RepairReport]],
    after: Callable[[Store, RepairReport], None] | None = None,
    **options: Any,
) -> RepairReport:
    """Load the config, open the store, run `job` with a progress line on a terminal, report.

    Ctrl-C leaves the run `interrupted` in the store; the message says how to resume it."""
    run_ids: list[str] = []
    with _json_errors(as_json, run_ids):
        return _run_job(config_path, as_json, job, run_ids, after, **options)


def _run_job(
    config_path: Path,
    as_json: bool,
    job: Callable[..., Coroutine[Any, Any, RepairReport]],
    run_ids: list[str],
    after: Callable[[Store, RepairReport], None] | None,
    **options: Any,
) -> RepairReport:
    config = load(config_path)
    store = open_config_store(config)
    progress = repair_progress_line(as_json=as_json)
    # This process forks its scans, which share its pages until one side writes them; the
    # collector's full passes wrote them all (~1 MB of copies each, ~4 MB over a 10 s
    # check of 2M keys). What it holds by now is never garbage: out of the collector's
    # sight, those pages stay shared however long the scans run.
    gc.freeze()
    try:
        report = asyncio.run(
            job(config, store=store, progress=progress, on_run=run_ids.append, **options)
        )
    except KeyboardInterrupt:
        if progress is not None:
            progress.close()
        if not run_ids:
            raise
        kind = "check" if job is check else "repair"
        again = resume_command(kind, run_ids[-1], str(config_path))
        stderr_line(f"interrupted; run {run_ids[-1]} is saved: `{again}`", prefix="")
        sys.exit(130)
    else:
        if after is not None:
            after(store, report)
    finally:
        if progress is not None:
            progress.close()
        store.close()
    _emit(report, as_json, repairing=job is not check)
    return report


class _KeysOut:
    """JSON Lines, one divergent key a line, written as the check finds them."""

    def __init__(self, path: Path) -> None:
        try:
            self._file = open_private(path, "w")
        except OSError as exc:
            raise UsageError(f"--keys-out: cannot write {path}: {exc.strerror}") from None
        self.count = 0

    def __call__(self, group: str, key: bytes, found: dict[str, Any]) -> None:
        line = {"group": group, **key_text(key), "kind": found["kind"]}
        line["replicas"] = found["replicas"]
        self._file.write(json.dumps(line) + "\n")
        self.count += 1

    def close(self) -> None:
        self._file.close()

    def run_keys(self, store: Store, report: RepairReport) -> None:
        """Every key a finished run recorded, with its outcome and what was planned."""
        log = RunLog(store, report.run_id)
        for g in report.groups:
            for key, kind, status, detail in log.keys(g.group):
                line = {"group": g.group, **key_text(key), "kind": kind, "status": status}
                line.update(
                    (k, detail[k]) for k in ("findings", "plan", "via", "reason") if k in detail
                )
                line["replicas"] = detail.get("replicas", {})
                self._file.write(json.dumps(line) + "\n")
                self.count += 1


@click.group(name="repair")
def command() -> None:
    """Find keys that differ between replicas (Tictac Merkle trees) and repair them safely."""


@command.command("check")
@config_option
@_GROUP
@_MATCH
@_TYPE
@click.option(
    "--keys-out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write every divergent key to this file as JSON Lines as they are found "
    "(key, key_b64 when not UTF-8, kind, each replica's state).",
)
@click.option("--resume", metavar="RUN", help="Continue an interrupted or failed check.")
@_TTLS
@json_option
def check_command(
    config_path: Path,
    group: str | None,
    match: str | None,
    type_filter: str | None,
    keys_out: Path | None,
    resume: str | None,
    ttls: str | None,
    as_json: bool,
) -> None:
    """Compare the replicas; exit 0 if they agree, 1 if divergence is found (or a
    database holding keys is covered by no group: it was not compared), 3 if the check
    could not see all it needs (a read refused, a Cluster shard changed: not verified)."""
    with _json_errors(as_json, []):
        sink = _KeysOut(keys_out) if keys_out is not None else None
    try:
        report = _run(
            config_path,
            as_json,
            check,
            group=group,
            match=match,
            type_filter=type_filter,
            resume=resume,
            key_sink=sink,
            ttls=ttls,
        )
    finally:
        if sink is not None:
            sink.close()
    # A database with keys that nothing compared is not a clean result; nor is a run that
    # could not read all its verdict depends on.
    sys.exit(1 if report.divergent or report.not_clean else 3 if report.not_verified else 0)


@command.command("runs")
@config_option
@click.option("--limit", type=click.IntRange(1), default=20, show_default=True)
@json_option
def runs_command(config_path: Path, limit: int, as_json: bool) -> None:
    """Recent check and repair runs, newest first: state, findings, how to resume."""
    with _json_errors(as_json, []):
        _list_runs(config_path, limit, as_json)


def _list_runs(config_path: Path, limit: int, as_json: bool) -> None:
    config = load(config_path)
    store = Store(config.settings.store)
    try:
        runs = list_runs(store, limit=limit)
    finally:
        store.close()
    for run in runs:
        run["resume"] = (
            resume_command(run["kind"], run["run_id"], str(config_path))
            if resumable(run["status"])
            else None
        )
    shown = parse_location(config.settings.store).shown
    if as_json:
        document = {"store": shown, "runs": runs}
        click.echo(json.dumps(versioned(document), indent=2))
        return
    if not runs:
        click.echo(f"no runs in {shown}")
    for run in runs:
        click.echo(_run_line(run))
        if run.get("owner_alive") is False:
            click.echo(f"    {run['error']}")
        elif run["resume"]:
            click.echo(f"    resume: {run['resume']}")


def _run_line(run: dict[str, Any]) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run["started"]))
    params = run["params"]
    what = f"group {params['group']}" if params.get("group") else "every group"
    if run["kind"] == "repair":
        what += f", policy {params['policy'] or 'by kind'}" + (
            ", dry run" if params["dry_run"] else ""
        )
    report = run["report"]
    if run["kind"] == "rebuild":
        what = f"group {params['group']}, rebuild {params['replica']}"
        if report is not None:
            found = f"copied {report['copied'] + report['big_copied']:,} keys"
        else:
            found = run["error"] or ""
    elif report is not None:
        found = f"divergent {report['divergent']}"
        if run["kind"] == "repair":
            found += f", repaired {report['repaired']}, left {_left(report)}"
    else:
        found = run["error"] or ""
    return f"{run['run_id']}  {run['status']:<11} {started}  {what}; {found}"


def _left(report: dict[str, Any]) -> int:
    """Keys a run left divergent: conflicts, busy, kept, refused, left for a resync (the
    primary's write does not reach that replica), not reached, and a dry run's all."""
    left = ("conflicts", "busy", "kept", "errors", "resync", "pending", "would_repair")
    return sum(int(report.get(name, 0)) for name in left)


@command.command("run")
@config_option
@_GROUP
@click.option(
    "--policy",
    default=None,
    help="Who wins, for every group of the run: primary | majority | quorum | "
    "source:REPLICA_OR_REGION | newest:FIELD. Default: the group's kind's. A replication "
    "group (a primary and its replicas, a Cluster shard): primary, its state wins both "
    "ways, written only on the primary for replication to carry. A Dynomite group: "
    "majority, the racks' majority wins both ways (copy or delete); a tie, or two racks "
    "cut off in the probes' record, is a conflict. Independent peers: quorum, the "
    "majority value wins, a key some lack is copied (deleted only with --allow-deletes). "
    "See docs/repair/kinds.md.",
)
@click.option("--dry-run", is_flag=True, help="Decide everything, write nothing.")
@click.option(
    "--allow-deletes",
    is_flag=True,
    help="Let quorum or source: delete keys (quorum: where a majority lacks the key). "
    "primary and majority delete without it.",
)
@setting_option("repair_rate", "--rate", type=click.FloatRange(0))
@setting_option("max_inflight", type=click.IntRange(1))
@click.option(
    "--resume",
    "resume",
    metavar="RUN",
    help="Continue an interrupted or failed repair run (`replag repair runs` lists them); "
    "what it had repaired is read again first.",
)
@_MATCH
@_TYPE
@click.option(
    "--keys-out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write every divergent key of the run to this file as JSON Lines once it ends "
    "(key, key_b64 when not UTF-8, kind, status, findings, plan, reason, replicas).",
)
@_TTLS
@json_option
def run_command(
    config_path: Path,
    group: str | None,
    policy: str | None,
    dry_run: bool,
    allow_deletes: bool,
    rate: float | None,
    max_inflight: int | None,
    resume: str | None,
    match: str | None,
    type_filter: str | None,
    keys_out: Path | None,
    ttls: str | None,
    as_json: bool,
) -> None:
    """Find and repair divergence. Exit 1 if divergence was left (conflicts, keys still
    changing, refused writes, replicas left for a resync; a dry run: anything it would
    repair)."""
    with _json_errors(as_json, []):
        sink = _KeysOut(keys_out) if keys_out is not None else None
    try:
        report = _run(
            config_path,
            as_json,
            repair,
            sink.run_keys if sink is not None else None,
            group=group,
            policy=policy,
            dry_run=dry_run,
            allow_deletes=allow_deletes,
            rate=rate,
            max_inflight=max_inflight,
            resume=resume,
            match=match,
            type_filter=type_filter,
            ttls=ttls,
        )
    finally:
        if sink is not None:
            sink.close()
    failed = _left(report.to_dict()) or report.not_clean
    sys.exit(1 if failed else 3 if report.not_verified else 0)


def _add_rebuild() -> None:
    from replag.commands.rebuild import command as rebuild_command

    command.add_command(rebuild_command)


_add_rebuild()
