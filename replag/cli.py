"""The `replag` command: a thin click layer over library functions.

ReplagErrors become one line on stderr and exit code 2 (or the error's own);
thresholds breached and divergence found exit 1, decided by each command.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import click

from replag.errors import ReplagError

# Each command's module is imported only when it runs (or its own --help is
# asked for): importing them all cost most of a second. `replag --help` lists
# them with the help here, which a test checks against each command's docstring.


def short_help(text: str, limit: int) -> str:
    """The first sentence of `text`, cut at a word to fit `limit` ("..." marks a cut).
    Click's own helper for this is deprecated in Click 8.5 (and gone in 9)."""
    sentence = text.strip().split("\n\n", 1)[0].replace("\n", " ")
    words = sentence.split()
    out: list[str] = []
    for word in words:
        candidate = " ".join([*out, word])
        if len(candidate) > limit:
            return " ".join(out) + "..."
        out.append(word)
        if word.endswith("."):
            return candidate[:-1] if len(out) < len(words) else candidate
    return " ".join(out)


def _acl() -> click.Command:
    from replag.commands import acl

    return acl.command


def _agent() -> click.Command:
    from replag.commands import agent

    return agent.command


def _alerts() -> click.Command:
    from replag.commands import alerts

    return alerts.command


def _demo() -> click.Command:
    from replag.commands import demo

    return demo.command


def _failover() -> click.Command:
    from replag.commands import failover

    return failover.command


def _lab() -> click.Command:
    from replag.commands import lab

    return lab.command


def _probe() -> click.Command:
    from replag.commands import probe

    return probe.command


def _repair() -> click.Command:
    from replag.commands import repair

    return repair.command


def _schema() -> click.Command:
    from replag.commands import schema

    return schema.command


def _serve() -> click.Command:
    from replag.commands import serve

    return serve.command


def _settings() -> click.Command:
    from replag.commands import settings

    return settings.command


def _topology() -> click.Command:
    from replag.commands import topology

    return topology.command


COMMANDS: dict[str, tuple[Callable[[], click.Command], str]] = {
    "acl": (
        _acl,
        "Print `ACL SETUSER NAME <rules>`: only what MODE needs (probe, check, repair, serve, "
        "agent)",
    ),
    "agent": (_agent, "Keep Tictac trees of one region's replicas current and serve them."),
    "alerts": (
        _alerts,
        "Alert rules and hooks (rules and sinks live in the config's [alerts] table).",
    ),
    "demo": (
        _demo,
        "Start a local three-region lab with injected delay, probe it and print the lag table.",
    ),
    "failover-check": (
        _failover,
        "Sample each primary and its replicas; print what a failover would lose (JSON).",
    ),
    "lab": (
        _lab,
        "A local lab of real redis-server processes with injected delay between regions.",
    ),
    "probe": (_probe, "Write probe keys in one region and measure their arrival on every replica."),
    "repair": (
        _repair,
        "Find keys that differ between replicas (Tictac Merkle trees) and repair them safely.",
    ),
    "schema": (
        _schema,
        "Print the JSON Schema of what `--json` prints (probe, check, repair, …).",
    ),
    "serve": (
        _serve,
        "Probe on a schedule, check replica groups, alert, and serve the dashboard and API.",
    ),
    "settings": (
        _settings,
        "List every setting (file key under [settings], REPLAG_* variable, default).",
    ),
    "topology": (_topology, "Discover topologies from the systems that run them."),
}


def machine_output(args: list[str]) -> str | None:
    """ "json" or "nagios" when the command line asks a program's output (`--json`,
    `--format json|nagios`; `failover-check` prints JSON unless told otherwise), else None.
    Read from the raw arguments: a usage error stops before any option is parsed."""
    fmt = None
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == "--json":
            fmt = fmt or "json"
        elif arg == "--format" and i + 1 < len(args):
            fmt = args[i + 1] if args[i + 1] in ("json", "nagios") else fmt
        elif arg.startswith("--format="):
            value = arg.split("=", 1)[1]
            fmt = value if value in ("json", "nagios") else fmt
    if fmt is None and "failover-check" in args:
        fmt = "json"
    return fmt


def usage_error_for_machines(exc: click.UsageError, output: str) -> None:
    """A usage error where a program reads stdout: the JSON error document (exit 2), or a
    Nagios plugin line (UNKNOWN, exit 3: a CRITICAL would page for a typo)."""
    import json

    from replag.schemas import versioned

    where = exc.ctx.command_path if exc.ctx is not None else "replag"
    message = f"{where}: {exc.format_message()}"
    if output == "nagios":
        click.echo(f"REPLAG UNKNOWN - usage: {message}".replace("|", "/").replace("\n", " "))
        click.echo(f"replag: error: {message}", err=True)
        sys.exit(3)
    click.echo(json.dumps(versioned({"error": message, "exit_code": 2}), indent=2))
    click.echo(f"replag: error: {message}", err=True)
    sys.exit(2)


class ReplagGroup(click.Group):
    """Subcommands are imported only when one is run (or its own --help is asked for)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        return COMMANDS[cmd_name][0]()

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        limit = formatter.width - 6 - max(map(len, COMMANDS))
        rows = [(name, short_help(help, limit)) for name, (_, help) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(sorted(rows))

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["replag.args"] = list(args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            output = machine_output(ctx.meta.get("replag.args", []))
            if output is None:
                raise
            usage_error_for_machines(exc, output)
        except ReplagError as exc:
            from replag.commands.repeated_logs import stderr_line

            stderr_line(str(exc))
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            from replag.commands.repeated_logs import stderr_line

            stderr_line("interrupted", prefix="")
            sys.exit(130)


@click.group(cls=ReplagGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More logging on stderr (-vv for debug).")
@click.option(
    "--log-format",
    type=click.Choice(["human", "json"]),
    default="human",
    show_default=True,
    envvar="REPLAG_LOG_FORMAT",
    show_envvar=True,
    help="Log lines on stderr: human, or json (one object per line: time, level, logger, "
    "message, and unit, group, region, replica where a line has them), for every command.",
)
@click.version_option(package_name="replag")
def main(verbose: int, log_format: str) -> None:
    """Replication lag and anti-entropy for Redis across racks and regions."""
    from replag.commands import repeated_logs

    level = logging.WARNING - 10 * min(verbose, 2)
    handler = repeated_logs.install(level, log_format)
    click.get_current_context().call_on_close(handler.summarise)
