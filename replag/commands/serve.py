"""`replag serve`: filled in by its issue."""

import click


@click.group(name="serve")
def command() -> None:
    """(not yet built)"""
