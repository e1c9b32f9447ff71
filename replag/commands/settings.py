"""`replag settings`: every setting with its default, environment variable and help."""

from __future__ import annotations

import click

from replag.settings import SETTINGS


def settings_markdown() -> str:
    rows = ["| setting | environment | default | what it does |", "|---|---|---|---|"]
    for s in SETTINGS:
        default = "(unset)" if s.default is None else f"`{s.default}`"
        rows.append(f"| `{s.name}` | `{s.env_var}` | {default} | {s.help} |")
    return "\n".join(rows)


@click.command(name="settings")
@click.option("--markdown", is_flag=True, help="Print the settings table of the docs.")
def command(markdown: bool) -> None:
    """List every setting (file key under [settings], REPLAG_* variable, default)."""
    if markdown:
        click.echo(settings_markdown())
        return
    for s in SETTINGS:
        default = "(unset)" if s.default is None else s.default
        click.echo(f"{s.name:<22} {s.env_var:<30} default {default}\n    {s.help}")
