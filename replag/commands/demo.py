"""`replag demo`: being built."""

import click


@click.command(name="demo")
def command() -> None:
    """(not yet built)"""
