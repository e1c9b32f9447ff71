"""`replag serve` as a subprocess over a lab: its config written from the lab's topology,
the process started, and what its health says of a region pair."""

from __future__ import annotations

import asyncio
import tomllib
from pathlib import Path
from typing import Any

import httpx
import tomli_w

from tests.helpers.cli import replag_argv, replag_env


def lab_config(lab_dir: Path, path: Path, *, groups: bool = True, **settings: Any) -> Path:
    """The lab's topology with `settings` added, written to `path`."""
    data = tomllib.loads((lab_dir / "topology.toml").read_text())
    if not groups:
        data.pop("groups", None)
    data["settings"].update(settings)
    path.write_text(tomli_w.dumps(data))
    return path


async def start_serve(config: Path, port: int, log: Path) -> asyncio.subprocess.Process:
    """`replag serve --config CONFIG --port PORT`, its stderr into `log`."""
    with log.open("w") as out:
        return await asyncio.create_subprocess_exec(
            *replag_argv("serve", "--config", str(config), "--port", str(port)),
            stderr=out, env=replag_env(),
        )  # fmt: skip


def pair_state(base: str, source: str, target: str, want: str, recovered: bool = False) -> bool:
    """Whether serve's health says source→target is `want` (and, with `recovered`, since
    when it recovered); False while serve does not answer yet."""
    try:
        pairs = httpx.get(base + "/api/v1/health", timeout=10).json()["pairs"]
    except httpx.TransportError:
        return False
    pair = next((p for p in pairs if (p["source"], p["target"]) == (source, target)), None)
    return (
        pair is not None
        and pair["state"] == want
        and (not recovered or pair.get("recovered_ns") is not None)
    )
