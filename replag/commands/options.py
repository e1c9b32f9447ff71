"""Options shared by several commands, declared once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from replag.config import Config, load_config

F = TypeVar("F", bound=Callable[..., Any])


def config_option(func: F) -> F:
    return click.option(
        "--config",
        "-c",
        "config_path",
        required=True,
        type=click.Path(dir_okay=False, path_type=Path),
        help="TOML file with [[regions]], [[groups]] and [settings] (see README).",
    )(func)


def json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")(func)


def load(config_path: Path) -> Config:
    return load_config(config_path)
