"""`replag schema NAME`: the JSON Schema of a `--json` output (probe, check, repair, …)."""

from __future__ import annotations

import json

import click

from replag.schemas import SCHEMAS, schema


@click.command(name="schema")
@click.argument("name", type=click.Choice(list(SCHEMAS)))
def command(name: str) -> None:
    """Print the JSON Schema of what `--json` prints (probe, check, repair, …)."""
    click.echo(json.dumps(schema(name), indent=2))
