"""`replag alerts`: filled in by its issue."""

import click


@click.group(name="alerts")
def command() -> None:
    """(not yet built)"""
