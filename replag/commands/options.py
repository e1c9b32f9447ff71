"""Options shared by several commands, declared once."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from replag.commands.repeated_logs import defer_logs, stderr_line
from replag.config import Config, load_config
from replag.errors import ReplagError
from replag.schemas import versioned
from replag.settings import SETTINGS_BY_NAME

F = TypeVar("F", bound=Callable[..., Any])


def config_option(func: F) -> F:
    return click.option(
        "--config",
        "-c",
        "config_path",
        required=True,
        type=click.Path(dir_okay=False, path_type=Path),
        help="TOML file with [[regions]], [[groups]] and [settings] (see docs/configuration.md).",
    )(func)


def machine_readable(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A flag or format whose stdout a program reads: log lines wait for the summary."""
    if value is True or value in ("json", "nagios"):
        defer_logs()
    return value


def json_option(func: F) -> F:
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        callback=machine_readable,
        help="Print one JSON object (log lines go to stderr once, at the end).",
    )(func)


def setting_option(name: str, *param_decls: str, **attrs: Any) -> Callable[[F], F]:
    """A flag overriding setting `name` for one run: help (and choices) come from the
    setting's declaration, so the CLI never restates them. `param_decls` default to
    `--name-with-dashes`."""
    declared = SETTINGS_BY_NAME[name]
    if declared.choices and "type" not in attrs:
        attrs["type"] = click.Choice(declared.choices)
    default = "unset" if declared.default is None else declared.default
    attrs.setdefault("help", f"{declared.help} [settings.{name}, default {default}]")
    return click.option(*(param_decls or (declared.option,)), **attrs)


def load(config_path: Path) -> Config:
    return load_config(config_path)


def fail_as_json(exc: ReplagError) -> NoReturn:
    """A `--json` command that failed: the error document on stdout (`{"schema_version",
    "error", "exit_code"}`, each output's schema allows it), one line on stderr, its exit."""
    click.echo(json.dumps(versioned({"error": str(exc), "exit_code": exc.exit_code}), indent=2))
    stderr_line(str(exc))
    raise SystemExit(exc.exit_code)
