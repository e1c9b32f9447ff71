"""`replag repair`: filled in by its issue."""

import click


@click.group(name="repair")
def command() -> None:
    """(not yet built)"""
