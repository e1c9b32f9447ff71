"""Running a `LiveTree` (or an agent process) next to a test that writes with redis-py."""

from __future__ import annotations

import asyncio
import signal
import ssl
import subprocess
import threading
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import httpx

from replag.agent.livetree import LiveTree
from replag.repair.scan.scanner import ReplicaScanner, ScanOptions, ScanProgress
from replag.repair.trees.tictac import TictacTree
from replag.topology import Endpoint
from tests.helpers.cli import replag_argv, replag_env
from tests.helpers.waiting import wait_until

_T = TypeVar("_T")
# Entries hashed with these options in every agent test (the probe prefix is excluded).
OPTIONS = ScanOptions(count=100, exclude_prefix=b"replag:probe:", ttl_bucket_ms=2000)
# An agent starts a Python process and builds trees by full scans: on a shared, starved
# machine (tests run under `nice`) that can take minutes; the deadline only ends a hang.
AGENT_TIMEOUT_S = 300.0


class LoopThread:
    """An event loop in a thread, so a sync test can write with redis-py meanwhile."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[_T], timeout_s: float = 60.0) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)  # type: ignore[arg-type]

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


async def scanned_tree(endpoint: Endpoint, options: ScanOptions = OPTIONS) -> TictacTree:
    """What a direct scan of the replica's data gives now."""
    index = await ReplicaScanner(endpoint, options).run(ScanProgress(endpoint.name))
    return index.deduplicated().tree(16)


class RunningTree:
    """A LiveTree kept by its own task on a LoopThread."""

    def __init__(self, endpoint: Endpoint, *, state_dir: Path | None = None) -> None:
        self.endpoint = endpoint
        self.loop = LoopThread()
        self.tree = LiveTree(endpoint, options=OPTIONS, state_dir=state_dir, poll_s=0.1)
        self._task = self.loop.run(self._start())

    async def _start(self) -> asyncio.Task[None]:
        return asyncio.create_task(self.tree.run())

    def fresh(self) -> TictacTree:
        """The tree once it holds every write applied before this call."""

        async def go() -> TictacTree:
            await self.tree.fresh(30.0)
            assert self.tree.tree is not None
            return TictacTree(16, self.tree.tree.leaves.copy())

        return self.loop.run(go())

    def scanned(self) -> TictacTree:
        return self.loop.run(scanned_tree(self.endpoint))

    def fresh_keys(self) -> dict[bytes, int]:
        """Every key the tree's leaves hold (names read back from its file), with its entry."""

        async def go() -> dict[bytes, int]:
            await self.tree.fresh(30.0)
            index = self.tree.leaf_keys(range(1 << self.tree.depth))
            return {index.key(i): int(index.entries[i]) for i in range(len(index))}

        return self.loop.run(go())

    def scanned_keys(self) -> dict[bytes, int]:
        async def go() -> dict[bytes, int]:
            scan = ReplicaScanner(self.endpoint, OPTIONS)
            index = (await scan.run(ScanProgress(self.endpoint.name))).deduplicated()
            return {index.key(i): int(index.entries[i]) for i in range(len(index))}

        return self.loop.run(go())

    def rewrite_names_every(self, keys: int) -> None:
        """Have the table rewrite its names file once `keys` names were added or deleted
        (cooperatively, from the tree's own task, as it does past an eighth of its keys)."""

        async def go() -> None:
            assert self.tree.table is not None
            self.tree.table.rewrite_floor = keys
            self.tree.table.rewrite_share = 1 << 62

        self.loop.run(go())

    def rewrite_names(self) -> None:
        """Have the table rewrite its names file now (as it does once enough have changed)."""

        async def go() -> None:
            assert self.tree.table is not None
            self.tree.table.rewrite_names()

        self.loop.run(go())

    def wait(self, what: str, check: object) -> None:
        wait_until(
            lambda: bool(check() if callable(check) else check), what, timeout_s=AGENT_TIMEOUT_S
        )

    def stop(self) -> None:
        async def go() -> None:
            await self.tree.stop()
            await asyncio.wait_for(self._task, 30)

        self.loop.run(go())
        self.loop.close()


@contextmanager
def running_tree(endpoint: Endpoint, *, state_dir: Path | None = None) -> Iterator[RunningTree]:
    running = RunningTree(endpoint, state_dir=state_dir)
    try:
        yield running
    finally:
        running.stop()


def start_agent(
    config_path: Path,
    region: str,
    port: int,
    log: Path,
    *,
    tls: ssl.SSLContext | None = None,
    env: dict[str, str] | None = None,
    log_level: str = "info",
) -> subprocess.Popen[bytes]:
    """`replag agent` in its own process; returns once its health endpoint answers (over
    HTTPS with `tls`, the context to verify it with and present a client certificate)."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            replag_argv(
                "agent", "-c", str(config_path), "--region", region, "--log-level", log_level
            ),
            stdout=out,
            stderr=out,
            env=replag_env(env),
        )
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}/agent/v1/health"

    def healthy() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"agent of {region} exited {proc.returncode}: {log.read_text()}")
        try:
            return httpx.get(url, verify=tls or True).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy, f"agent of {region} answering on {port}", timeout_s=AGENT_TIMEOUT_S)
    except BaseException:
        proc.kill()  # never leave an agent behind a failed start
        proc.wait(10)
        raise
    return proc


def stop_agent(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(10)
