"""`replag topology`: filled in by its issue."""

import click


@click.group(name="topology")
def command() -> None:
    """(not yet built)"""
