"""`replag alerts …`: exercise the configured alert hooks."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import click

from replag.alerts.evaluate import AlertSender, DeliveryResult, sample_events
from replag.commands.options import config_option, json_option, load
from replag.config import Config
from replag.errors import UsageError
from replag.plural import count
from replag.store import Store


@click.group(name="alerts")
def command() -> None:
    """Alert rules and hooks (rules and sinks live in the config's [alerts] table)."""


@command.command("test")
@config_option
@json_option
def test(config_path: Path, as_json: bool) -> None:
    """Send a test alert to every sink; exit 1 if any sink failed."""
    config = load(config_path)
    if not config.alerts.sinks:
        raise UsageError(
            "no [[alerts.sinks]] in the config: nothing to test", where=str(config_path)
        )
    results = asyncio.run(_send_test(config))
    if as_json:
        click.echo(json.dumps({"deliveries": [r.to_dict() for r in results]}, indent=2))
    else:
        for sink, result in zip(config.alerts.sinks, results, strict=True):
            outcome = "ok" if result.ok else f"FAILED: {result.error}"
            click.echo(
                f"{sink.name:<20} {sink.kind:<10} {sink.target_description():<40} "
                f"{outcome} ({count(result.attempts, 'attempt')})"
            )
    if not all(r.ok for r in results):
        sys.exit(1)


async def _send_test(config: Config) -> list[DeliveryResult]:
    store = Store(config.settings.store)
    sender = AlertSender(config.alerts.sinks, store)
    try:
        return await sender.deliver(sample_events())
    finally:
        await sender.close()
        store.close()
