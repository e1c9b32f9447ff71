"""Fixtures that start real redis-server processes and labs on free ports and stop them.

Only fixtures live here; what tests import (the factories' types, helpers) is in
`tests/helpers/`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replag.lab.cluster import LabSpec, lab_down, lab_up
from replag.lab.server import RedisServer
from replag.store import Store
from tests.helpers import process_logs
from tests.helpers.dynomite_cluster import (
    THREE_RACKS,
    DynomiteCluster,
    DynomiteFactory,
    Layout,
    dynomite_cluster,
)
from tests.helpers.ha import Instance, Receiver
from tests.helpers.lab import LabFactory
from tests.helpers.postgres import (
    NO_POSTGRES,
    LocalPostgres,
    database_name,
    empty_database,
    postgres_available,
)
from tests.helpers.redis_servers import RedisFactory, start_redis
from tests.helpers.server_kinds import KINDS, VALUE_KINDS, kind_binary, using_server_kind
from tests.helpers.servers_marker import needs_servers

# The tests never touch the real home: a command run without settings.store opens the
# default store, ~/.local/state/replag/replag.sqlite, and one left there by another
# checkout's tests (migrated further) would be refused, or its rows read, by this one.
_HOME = tempfile.mkdtemp(prefix="replag-test-home-")
os.environ["HOME"] = _HOME
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)


# How the suite spreads over xdist's workers (`-n 3`; pyproject's addopts: --dist loadgroup
# --no-loadscope-reorder): each test goes to whichever worker is free, except that a
# module sharing an expensive module-scoped fixture (a Redis Cluster per server kind, a
# primary with replicas, a TLS server) runs whole on one worker, which starts it once
# instead of each worker starting its own.
SHARED_FIXTURE_MODULES = frozenset(
    {
        "discovery/test_cluster.py",
        "discovery/test_cluster_follow.py",
        "repair/test_cluster.py",
        "cli/test_output_contracts.py",
        "service/test_reload.py",
        "wire/test_tls.py",
        "agent/test_security.py",
    }
)
# The longest modules (--durations in CI says which) start first, so that no worker is
# left running a long one alone at the end; the others follow in their usual order.
LONGEST_FIRST = (
    "service/test_ha.py",
    "test_benchmarks.py",
    "repair/test_cluster.py",
    "discovery/test_sentinel.py",
    "discovery/test_cluster_follow.py",
    "api/test_schema.py",
    "agent/test_check.py",
    "repair/test_runs.py",
    "service/test_store_backends.py",
    "service/test_outage.py",
    "replication/test_alerts.py",
    "repair/test_big_keys.py",
    "discovery/test_cluster.py",
    "test_install.py",
    "agent/test_lag_agents.py",
    "cli/test_output_contracts.py",
    "repair/test_run.py",
    "test_docs_pictures.py",
)


TESTS = Path(__file__).resolve().parent


def _module(item: pytest.Item) -> str:
    """The test's file as named above: its path under tests/ ("repair/test_cluster.py")."""
    path = item.path.resolve()
    return path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else path.name


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_module(item), len(rank)))  # stable: modules whole
    for item in items:
        if _module(item) in SHARED_FIXTURE_MODULES:
            item.add_marker(pytest.mark.xdist_group(_module(item)))
        if needs_servers(item):
            item.add_marker(pytest.mark.servers)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    process_logs.began(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report carries the tails of the process logs written while it ran."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed:
        factory = getattr(item.config, "_tmp_path_factory", None)
        basetemp = factory.getbasetemp() if factory is not None else None
        for title, tail in process_logs.failure_sections(item, basetemp):
            report.sections.append((title, tail))


@pytest.fixture
def redis_factory(tmp_path: Path) -> Iterator[RedisFactory]:
    """`redis_factory(name="a", password=None, extra_args=())` → a started RedisServer."""
    servers: list[RedisServer] = []

    def start(
        name: str = "r", *, password: str | None = None, extra_args: tuple[str, ...] = ()
    ) -> RedisServer:
        srv = start_redis(
            f"{name}{len(servers)}",
            tmp_path / "redis",
            password=password,
            extra_args=extra_args,
        )
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.stop()


@pytest.fixture
def lab_factory(tmp_path: Path) -> Iterator[LabFactory]:
    """`lab_factory(regions=(…), delays_ms={…}, …)` → lab state; the lab is torn down after."""
    dirs: list[Path] = []

    def start(name: str = "lab", **spec: Any) -> dict[str, Any]:
        lab_dir = tmp_path / name
        dirs.append(lab_dir)
        spec.setdefault("regions", ("us-east", "us-west", "eu-west"))
        spec.setdefault("delays_ms", {})
        state = lab_up(lab_dir, LabSpec(**spec))
        state["dir"] = lab_dir
        return state

    yield start
    for lab_dir in dirs:
        if (lab_dir / "lab.json").exists():
            lab_down(lab_dir)


@pytest.fixture
def dynomite_factory(tmp_path: Path) -> Iterator[DynomiteFactory]:
    """`dynomite_factory(layout=THREE_RACKS, …)` → a real Dynomite cluster whose peers are all
    connected; every dynomite and backend redis-server is stopped after. Skips without
    $REPLAG_DYNOMITE."""
    started: list[DynomiteCluster] = []
    with contextlib.ExitStack() as stack:

        def start(layout: Layout = THREE_RACKS, **options: Any) -> DynomiteCluster:
            workdir = tmp_path / f"dynomite{len(started)}"
            started.append(stack.enter_context(dynomite_cluster(workdir, layout, **options)))
            return started[-1]

        yield start


def _as_kind(kind: str) -> Iterator[str]:
    binary, missing = kind_binary(kind)
    if binary is None:
        pytest.skip(f"server kind {kind}: {missing}")
    with using_server_kind(binary):
        yield kind


@pytest.fixture(params=KINDS)
def server_kind(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the test once per server kind (valkey-9, redis-7, redis-6.2): every redis-server it
    starts is that kind's binary. A kind whose binary is missing skips, saying why."""
    yield from _as_kind(request.param)


@pytest.fixture(params=VALUE_KINDS)
def value_kind(request: pytest.FixtureRequest) -> Iterator[str]:
    """`server_kind` for tests that read, compare or write values: Redis 8, Valkey 9 (with
    hash-field TTLs) and Redis 6.2 (tests/helpers/server_kinds.py says why)."""
    yield from _as_kind(request.param)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[LocalPostgres]:
    """One PostgreSQL per test session (per xdist worker); skips when there is none."""
    if not postgres_available():
        pytest.skip(NO_POSTGRES)
    server = LocalPostgres().start()
    process_logs.keep(server.log)
    yield server
    server.destroy()


@pytest.fixture(scope="module")
def postgres_url(request: pytest.FixtureRequest, postgres_server: LocalPostgres) -> str:
    """A fresh database for this test module on the session's PostgreSQL; its URL."""
    return postgres_server.create_database(database_name(request.module.__name__))


@pytest.fixture(params=["sqlite", "postgresql"])
def store_location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a store for this test is: a new SQLite file, or the module's PostgreSQL
    database emptied (tests parametrized with it run on both backends)."""
    if request.param == "sqlite":
        return str(tmp_path / "store.sqlite")
    url: str = request.getfixturevalue("postgres_url")
    Store(url).close()  # migrated, so every table exists to be emptied
    empty_database(url)
    return url


@pytest.fixture
def store(store_location: str) -> Iterator[Store]:
    """An empty, migrated store on each backend in turn."""
    opened = Store(store_location)
    yield opened
    opened.close()


# --- several `replag serve` on one PostgreSQL (tests/service/test_ha*.py) -----------------------


@pytest.fixture
def ha_store(postgres_url: str) -> str:
    """The module's PostgreSQL database, migrated and emptied."""
    Store(postgres_url).close()
    empty_database(postgres_url)
    return postgres_url


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[list[Instance]]:
    """The `replag serve` instances a test starts (`tests.helpers.ha.start`), stopped after."""
    started: list[Instance] = []
    yield started
    for inst in started:
        inst.stop()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A webhook receiver counting the notifications it gets."""
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
