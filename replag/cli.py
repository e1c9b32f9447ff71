"""The `replag` command: a thin click layer over library functions.

ReplagErrors become one line on stderr and exit code 2 (or the error's own);
thresholds breached and divergence found exit 1, decided by each command.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from replag.errors import ReplagError


class ReplagGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ReplagError as exc:
            click.echo(f"replag: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("replag: interrupted", err=True)
            sys.exit(130)


@click.group(cls=ReplagGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More logging on stderr (-vv for debug).")
@click.version_option(package_name="replag")
def main(verbose: int) -> None:
    """Replication lag and anti-entropy for Redis across racks and regions."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _register() -> None:
    from replag.commands import (
        alerts,
        demo,
        failover,
        lab,
        probe,
        repair,
        serve,
        settings,
        topology,
    )

    for module in (demo, lab, probe, failover, repair, serve, topology, alerts, settings):
        main.add_command(module.command)


_register()
