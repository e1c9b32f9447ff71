"""`replag probe`: one probe run for cron: a table or JSON, exit 0 ok / 1 breach / 2 error."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import click

from replag.commands.colour import paint
from replag.commands.options import (
    config_option,
    json_option,
    load,
    machine_readable,
    setting_option,
)
from replag.commands.repeated_logs import stderr_line
from replag.commands.status_line import StatusLine, status_line
from replag.config import Config
from replag.durations import parse_duration_s
from replag.errors import ReplagError, UsageError
from replag.plural import count
from replag.private_files import open_private
from replag.probes import ProbeReport, run_probe, run_probe_all, run_seed_method
from replag.probes.nagios import UNKNOWN, nagios_code, nagios_error, nagios_line
from replag.probes.progress import ProbeProgress, ProgressCallback
from replag.probes.report import combine_reports
from replag.schemas import versioned
from replag.settings import DYNOMITE_CONSISTENCIES
from replag.store import Store
from replag.store.configs import open_config_store


async def probe_once(
    config: Config,
    *,
    source: str | None,
    count: int | None,
    rate: float | None,
    mode: str | None,
    wait_s: float | None,
    method: str,
    store: Store | None,
    consistency: str | None = None,
    progress: ProgressCallback | None = None,
) -> ProbeReport:
    if consistency:
        # One run per Dynomite consistency level, write latency reported per level.
        runs = []
        for level in consistency.split(","):
            settings = config.settings.replace(dynomite_consistency=level.strip())
            runs.append(
                await probe_once(
                    dataclasses.replace(config, settings=settings),
                    source=source,
                    count=count,
                    rate=rate,
                    mode=mode,
                    wait_s=wait_s,
                    method=method,
                    store=store,
                    progress=progress,
                )
            )
        return combine_reports(runs)
    if source == "all":
        report = await run_probe_all(
            config,
            count=count,
            rate=rate,
            mode=mode,
            timeout_s=wait_s,
            store=store,
            progress=progress,
        )
    else:
        report = await run_probe(
            config,
            source=source,
            count=count,
            rate=rate,
            mode=mode,
            timeout_s=wait_s,
            store=store,
            progress=progress,
        )
    if method == "dynomite-seed":
        sources = [p.source for p in report.pairs] or [report.source]
        report.seed_method = []
        for name in dict.fromkeys(sources):
            rows = await run_seed_method(config, source=name)
            report.seed_method += [{"source": name, **row} for row in rows]
    return report


@click.command(name="probe")
@config_option
@click.option(
    "--source",
    help="Region to write probes in (default: the first with a write endpoint); "
    "`all` probes from every region (every shard of a Redis Cluster) in turn.",
)
@setting_option("count", type=click.IntRange(1, 1_000_000))
@setting_option("rate", type=click.FloatRange(0))
@setting_option("mode")
@setting_option("timeout")
@setting_option("max_p99")
@setting_option("max_loss")
@click.option(
    "--method",
    type=click.Choice(["replag", "dynomite-seed"]),
    default="replag",
    show_default=True,
    help="dynomite-seed also runs the Dynomite benchmark's method, reported beside ours.",
)
@click.option(
    "--consistency",
    help=f"Dynomite write consistency per probe connection: {', '.join(DYNOMITE_CONSISTENCIES)}, "
    "or a comma-separated list to compare write latency across levels "
    "[settings.dynomite_consistency].",
)
@click.option(
    "--alerts",
    "with_alerts",
    is_flag=True,
    help="Evaluate the config's alert rules on this run and fire its hooks.",
)
@click.option("--no-store", is_flag=True, help="Do not append this run to the results store.")
@click.option(
    "--samples-out",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Also write every sample to this file, JSON Lines, one probe write on one replica "
    "a line (lag, its uncertainty, how it was stamped; `replag schema samples`). Mode 0600.",
)
@json_option
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["table", "json", "nagios"]),
    callback=machine_readable,
    help="table (default), json (= --json), or nagios: one plugin line with perfdata, "
    "exit 0 OK / 2 CRITICAL / 3 UNKNOWN.",
)
def command(config_path: Path, as_json: bool, output_format: str | None, **options: Any) -> None:
    """Write probe keys in one region and measure their arrival on every replica."""
    fmt = output_format or ("json" if as_json else "table")
    try:
        _probe_and_report(config_path, fmt, **options)
    except ReplagError as exc:
        if fmt == "table":
            raise
        if fmt == "nagios":
            click.echo(nagios_error(str(exc)))
            sys.exit(UNKNOWN)
        document = versioned({"error": str(exc), "exit_code": exc.exit_code})
        click.echo(json.dumps(document, indent=2))
        stderr_line(str(exc))
        sys.exit(exc.exit_code)


def _probe_and_report(
    config_path: Path,
    fmt: str,
    *,
    source: str | None,
    count: int | None,
    rate: float | None,
    mode: str | None,
    timeout: str | None,
    max_p99: str | None,
    max_loss: str | None,
    method: str,
    consistency: str | None,
    with_alerts: bool,
    no_store: bool,
    samples_out: Path | None,
) -> None:
    as_json = fmt != "table"
    config = load(config_path)
    settings = config.settings.replace(max_p99=max_p99, max_loss=max_loss)
    config = dataclasses.replace(config, settings=settings)
    store = None if no_store else open_config_store(config)
    status = status_line(as_json=as_json)
    try:
        report = asyncio.run(
            probe_once(
                config,
                source=source,
                count=count,
                rate=rate,
                mode=mode,
                wait_s=_seconds(timeout, option="--timeout"),
                method=method,
                store=store,
                consistency=consistency,
                progress=None if status is None else _progress_to(status),
            )
        )
        if samples_out is not None:
            write_samples(samples_out, report)
        outcome = _fire_alerts(config, store, report) if with_alerts else None
        unstored = _unstored(store)
    finally:
        if status is not None:
            status.close()
        if store is not None:
            store.close()
    if fmt == "nagios":
        click.echo(
            nagios_line(report, max_p99_ms=_ms(settings.max_p99), max_loss=settings.max_loss)
        )
        sys.exit(nagios_code(report))
    if as_json:
        out = versioned(report.to_dict())
        if outcome is not None:
            out["alerts"] = outcome
        click.echo(json.dumps(out, indent=2))
    else:
        click.echo(paint(report.render(), ok=report.exit_code == 0))
        for line in _alert_lines(outcome) if outcome is not None else []:
            click.echo(line)
    if unstored is not None:
        # Measured and shown, but not kept: say so in one line, and exit 2 for cron.
        stderr_line(str(unstored))
        sys.exit(max(report.exit_code, 2))
    sys.exit(report.exit_code)


def write_samples(path: Path, report: ProbeReport) -> None:
    """Every sample of `report` to `path` as JSON Lines, readable by its owner only (the
    keys name the probe prefix and the replicas); UsageError when it cannot be written."""
    try:
        with open_private(path, "w") as out:
            for sample in report.samples:
                out.write(json.dumps(sample.to_line()) + "\n")
    except OSError as exc:
        raise UsageError(f"--samples-out {path}: {exc.strerror or exc}") from None


def _unstored(store: Store | None) -> str | None:
    """Why this run's results are not in the store (it could not take them), or None."""
    if store is None or store.flush():
        return None
    health = store.health
    return (
        f"{store.shown}: {health.reason}: this run's results were not stored "
        f"({health.deferred} writes lost)"
    )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _progress_to(line: StatusLine) -> ProgressCallback:
    shown: list[tuple[str, str]] = []  # the last (source, phase): a new one shows at once

    def show(event: ProbeProgress) -> None:
        new = not shown or shown[-1] != (event.source, event.phase)
        shown[:] = [(event.source, event.phase)]
        if event.phase == "writing":
            text = f"probe {event.source}: {event.done}/{event.total} keys written"
        else:
            pct = 100 * event.done / event.total if event.total else 100.0
            text = f"probe {event.source}: {event.done}/{event.total} arrivals seen ({pct:.0f}%)"
        line.show(text, force=new)

    return show


def _seconds(text: str | None, *, option: str) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration_s(text)
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}") from None


def _fire_alerts(config: Config, store: Store | None, report: ProbeReport) -> dict[str, Any]:
    """Evaluate the alert rules with this run (cron path) and wait for the deliveries."""
    from replag.alerts.evaluate import evaluate_and_notify

    own = store is None
    store = Store(config.settings.store) if store is None else store
    try:
        return asyncio.run(evaluate_and_notify(config, store, report)).to_dict()
    finally:
        if own:
            store.close()


def _alert_lines(outcome: dict[str, Any]) -> list[str]:
    lines = [f"alerts: {count(outcome['active_conditions'], 'condition')} active"]
    lines += [f"  {e['status'].upper()}: {e['rule']}: {e['summary']}" for e in outcome["events"]]
    for d in outcome["deliveries"]:
        state = "sent" if d["ok"] else f"FAILED ({d['error']})"
        lines.append(f"  → {d['sink']}: {state} after {count(d['attempts'], 'attempt')}")
    return lines
