"""Which tests need servers: the `servers` marker, put on at collection (tests/conftest.py).

A test needs servers when it starts a process of any kind (redis-server, valkey-server,
Dynomite, PostgreSQL, `replag serve` or `agent`, Prometheus, Chromium, a plain
subprocess) or waits on one. That is read from what it uses, never from a list to keep
in step:

- a fixture that starts them (`redis_factory`, `lab_factory`, `server_kind`, the
  PostgreSQL ones…), anywhere in the test's fixture closure, or the `postgresql` side of
  `store_location`;
- or its module holding, at top level, the `subprocess` module or anything of a module
  that starts processes (`replag.lab.*`, the helpers below): a module-scoped fixture
  made from them starts servers for every test of the module (and `schemathesis`: the
  fuzz of the whole API is a minute of CPU, too long for the quick loop).

`pytest -m "not servers"` is then the quick loop (pure functions, in-process APIs over
a SQLite store, parsers, the docs): seconds, not minutes.
"""

from __future__ import annotations

import types

import pytest

SERVER_FIXTURES = frozenset(
    {
        "redis_factory",
        "lab_factory",
        "dynomite_factory",
        "server_kind",
        "postgres_server",
        "postgres_url",
        "ha_store",
        "fleet",
    }
)
# Modules whose names, held by a test module, say it starts processes.
PROCESS_MODULES = (
    "subprocess",
    "replag.lab",
    "tests.helpers.agent",
    "tests.helpers.browser",
    "tests.helpers.cli",
    "tests.helpers.dynomite_cluster",
    "tests.helpers.ha",
    "tests.helpers.postgres",
    "tests.helpers.processes",
    "tests.helpers.prometheus_tools",
    "tests.helpers.redis_cluster",
    "tests.helpers.redis_servers",
    "tests.helpers.terminal",
    "tests.helpers.tls",
    # Not a process, but schemathesis over the whole API is a minute of CPU: not the quick loop.
    "schemathesis",
)


def _starts_processes(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in PROCESS_MODULES)


def _module_starts_processes(module: types.ModuleType) -> bool:
    for value in vars(module).values():
        if isinstance(value, types.ModuleType):
            name = value.__name__
        else:
            name = getattr(value, "__module__", None) or ""
        if isinstance(name, str) and _starts_processes(name):
            return True
    return False


_BY_MODULE: dict[str, bool] = {}


def needs_servers(item: pytest.Item) -> bool:
    if item.get_closest_marker("container") is not None:
        return True  # Docker: `-m "not servers"` replaces addopts' `-m 'not container'`
    if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("store_location") == "postgresql":
        return True
    module = getattr(item, "module", None)
    if module is None:
        return False
    if module.__name__ not in _BY_MODULE:
        _BY_MODULE[module.__name__] = _module_starts_processes(module)
    return _BY_MODULE[module.__name__]
