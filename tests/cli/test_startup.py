"""What `replag` imports to start: `--help` and a cron probe stay clear of heavy packages.

The start-up time itself is shown by benchmarks/startup.py; these tests pin
the property that keeps it low, in a fresh interpreter each.
"""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

from replag.cli import COMMANDS, main, short_help

HEAVY = ("redis", "numpy", "fastapi", "starlette", "pydantic", "uvicorn", "aiohttp", "xxhash")


def modules_after(code: str) -> set[str]:
    """Top-level packages and replag modules loaded by running `code` in a new interpreter."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    return set(json.loads(out.splitlines()[-1]))


def test_help_lists_every_command_without_importing_any() -> None:
    code = (
        "import contextlib, io\n"
        "from replag.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['--help'])"
    )
    loaded = modules_after(code)
    assert not {m for m in loaded if m.startswith("replag.commands.")}
    assert not {m for m in loaded if m.split(".")[0] in HEAVY}
    assert "msgspec" not in loaded  # the config file's tables load when a file is read


def test_probe_command_starts_without_heavy_packages() -> None:
    loaded = modules_after("import replag.commands.probe, replag.probes.runner")
    assert {m.split(".")[0] for m in loaded} & set(HEAVY) == set()


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_command_table_matches_each_command(name: str) -> None:
    """The help `replag --help` shows without importing is the command's own."""
    command = main.get_command(click.Context(main), name)
    assert command is not None and command.name == name
    assert short_help(command.help or "", 1000) == COMMANDS[name][1]


def test_help_output_lists_the_table() -> None:
    from click.testing import CliRunner

    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for name in COMMANDS:
        assert f"  {name} " in result.output
    unknown = CliRunner().invoke(main, ["no-such-command"])
    assert unknown.exit_code == 2 and "No such command" in unknown.output
