"""`replag probe`: being built."""

import click


@click.command(name="probe")
def command() -> None:
    """(not yet built)"""
