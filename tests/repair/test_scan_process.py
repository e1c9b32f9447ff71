"""Scans in their own processes: TTLs read the cheapest way, a killed run resumes, they
run at the configured nice, and the service forks them from a fork server."""

from __future__ import annotations

import asyncio
import json
import multiprocessing.forkserver
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from replag.config import load_config
from replag.lab.server import RedisServer, free_port
from replag.repair import check
from replag.repair.runs import RunLog
from replag.repair.scan import process as scan_process
from replag.repair.scan.keep import KeepLimits
from replag.repair.scan.process import WorkerTree, fork_scans_from_server
from replag.repair.scan.scanner import ReplicaScanner, ScanOptions, ScanProgress
from replag.repair.trees.diff import differing_keys
from replag.repair.trees.walk import differing_leaves, keys_in_batches
from replag.store import Store
from replag.topology import Endpoint
from tests.helpers.cli import replag_argv, replag_env, run_replag
from tests.helpers.configs import group_config
from tests.helpers.keyspace import fill
from tests.helpers.redis_servers import RedisFactory
from tests.helpers.waiting import until


async def scan(url: str, **options: object) -> tuple[str, list[tuple[bytes, int]]]:
    scanner = ReplicaScanner(Endpoint.from_url(url, name="n"), ScanOptions(**options))  # type: ignore[arg-type]
    index = await scanner.run(ScanProgress("n"))
    return scanner.ttl_source, sorted(
        (index.key(i), int(index.entries[i])) for i in range(len(index))
    )


async def test_ttls_are_read_the_cheapest_way_the_replica_allows(
    redis_factory: RedisFactory,
) -> None:
    server = redis_factory("ttl")
    with server.client() as client:
        fill(client, 3000)
        source, plain = await scan(server.url)
        assert source == "none"  # INFO: no key with an expiry, so no TTL is asked for
        assert (await scan(server.url, ttls="pttl"))[1] == plain
        # Expiries mid-bucket (an entry holds its expiry's bucket): the scans read them at
        # different moments, and a starved machine's delay must not cross a bucket's edge.
        bucket_ms = ScanOptions().ttl_bucket_ms
        at_ms = (int(time.time() * 1000) // bucket_ms + 600_000 // bucket_ms) * bucket_ms
        at_ms += bucket_ms // 2
        for i in range(0, 3000, 7):
            client.pexpireat(f"k:{i:07d}", at_ms)
        client.set("gone-soon", "x", pxat=at_ms)
        # A user who may not run scripts, as some managed services configure them.
        client.acl_setuser("noscript", enabled=True, passwords=["+pw"], keys=["*"],
                           commands=["+@all", "-@scripting"])  # fmt: skip
    per_key, with_ttls = await scan(server.url)
    assert per_key == "pttl"  # expiring keys: a PTTL per key, the server's cheapest way
    by_script, scripted = await scan(server.url, ttls="script")
    assert by_script == "script"
    refused, fallen_back = await scan(f"redis://noscript:pw@127.0.0.1:{server.port}", ttls="script")
    assert refused == "pttl"
    # The same entries whichever way the TTLs came (they differ from the TTL-less scan).
    assert with_ttls == scripted == fallen_back and with_ttls != plain


def write_config(path: Path, servers: list[RedisServer], **settings: str | int) -> Path:
    lines = ["[settings]", f'store = "{path.parent / "replag.sqlite"}"', 'repair_settle = "10ms"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    for i, s in enumerate(servers):
        lines += [
            "[[regions]]",
            f'name = "r{i}"',
            f'replicas = [{{ name = "n{i}", url = "{s.url}" }}]',
        ]
    names = ", ".join(f'"n{i}"' for i in range(len(servers)))
    lines += ["[[groups]]", 'name = "g"', f"members = [{names}]"]
    path.write_text("\n".join(lines) + "\n")
    return path


def replag(*args: str) -> subprocess.CompletedProcess[str]:
    return run_replag(*args, timeout=300)


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        out += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return out


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def scans_checkpointed(store: Path, scans: int) -> bool:
    """Whether `scans` unfinished scans have saved a checkpoint with keys in `store`."""
    try:
        with sqlite3.connect(store) as db:
            rows = db.execute(
                "SELECT COUNT(*) FROM repair_scan_state WHERE finished = 0 AND keys > 0"
            ).fetchone()
    except sqlite3.Error:
        return False
    return bool(rows[0] == scans)


@pytest.mark.parametrize("command", ["check", "run"])
async def test_a_killed_check_or_repair_resumes_from_its_checkpoints(
    tmp_path: Path, redis_factory: RedisFactory, command: str
) -> None:
    servers = [redis_factory("kill"), redis_factory("kill")]
    for s in servers:
        with s.client() as c:
            fill(c, 40_000)
    with servers[0].client() as a, servers[1].client() as b:
        diverged = set()
        for i in range(0, 40_000, 1000):  # 40 keys rewritten on n1
            b.set(f"k:{i:07d}", "changed")
            diverged.add(f"k:{i:07d}")
        for i in range(500, 40_000, 2000):  # 20 deleted on n0
            a.delete(f"k:{i:07d}")
            diverged.add(f"k:{i:07d}")
    # Slow enough to be killed mid-scan, checkpointing often.
    config = write_config(
        tmp_path / "replag.toml", servers, scan_rate=20_000, scan_checkpoint="100ms"
    )
    store = tmp_path / "replag.sqlite"
    # n1 holds the truth: its rewritten values and the keys n0 lost get copied to n0.
    policy = ["--policy", "source:n1"] if command == "run" else []
    proc = await asyncio.create_subprocess_exec(
        *replag_argv("repair", command, "--config", str(config), *policy),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=replag_env(),
    )

    try:
        await until(lambda: scans_checkpointed(store, 2), "both scans checkpointed mid-way")
        workers = children(proc.pid)
        assert len(workers) == 2  # one scan process per replica
        proc.send_signal(signal.SIGKILL)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
    # The scan processes notice their parent is gone and stop.
    await until(lambda: not any(running(w) for w in workers), "the scan processes gone")
    with sqlite3.connect(store) as db:
        ((run_id, status),) = db.execute("SELECT run_id, status FROM repair_runs").fetchall()
    assert status == "running"  # killed: nothing could mark it

    if command == "check":
        # (The library: `repair check` has no --resume flag yet.)
        resumed = await check(load_config(config), store=Store(store), resume=run_id)
        assert resumed.run_id == run_id and resumed.status == "done"
        keys = {k for k, _, _, _ in RunLog(Store(store), run_id).keys("g")}
        assert keys == {k.encode() for k in diverged}
    else:
        done = replag("repair", command, "--config", str(config), "--resume", run_id, "--json")
        assert done.stdout, done.stderr
        report = json.loads(done.stdout)
        assert report["run_id"] == run_id and report["status"] == "done", done.stderr
        assert report["repaired"] == len(diverged)
        again = replag("repair", "check", "--config", str(config), "--json")
        assert again.returncode == 0 and json.loads(again.stdout)["divergent"] == 0
    with sqlite3.connect(store) as db:
        # The finished run's checkpoints are gone.
        assert db.execute("SELECT COUNT(*) FROM repair_scan_state").fetchone() == (0,)


def _children_nice() -> dict[int, int]:
    """nice value of every process whose parent is this one, by pid (from /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid():  # ppid, then nice is the 19th field overall
            found[int(entry.name)] = int(fields[16])
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
async def test_scan_processes_run_at_the_configured_nice(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    servers = [redis_factory("a"), redis_factory("b")]
    for server in servers:
        with server.client() as client:
            fill(client, 3000)
    config = group_config(tmp_path, servers, scan_nice=7, scan_rate=3000, scan_count=100)
    base = os.nice(0)
    running = asyncio.ensure_future(check(config, group="g"))
    seen: dict[int, int] = {}
    while not running.done():
        seen |= _children_nice()
        await asyncio.sleep(0.05)
    assert (await running).divergent == 0
    scans = {pid: nice for pid, nice in seen.items() if nice != base}
    assert scans and set(scans.values()) == {base + 7}, seen


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
async def test_scans_from_the_fork_server_find_what_forked_scans_find(
    redis_factory: RedisFactory,
) -> None:
    servers = [redis_factory("a"), redis_factory("b")]
    for server in servers:
        with server.client() as client:
            fill(client, 5000)
    with servers[1].client() as b:
        for i in range(0, 5000, 250):
            b.set(f"k:{i:07d}", "changed")

    async def members() -> list[WorkerTree]:
        return [
            await WorkerTree.scan(
                Endpoint.from_url(s.url, name=f"n{i}"),
                ScanOptions(),
                ScanProgress(f"n{i}"),
                None,
                depth=12,
            )
            for i, s in enumerate(servers)
        ]

    forked = await members()
    fork_scans_from_server()
    try:
        served = await members()
    finally:
        fork_scans_from_server(enabled=False)
    try:
        # Scanned away from this process: children of the fork server, not of this process.
        for worker in served:
            assert _parent(worker.pid) != os.getpid()
            assert "forkserver" in _cmdline(_parent(worker.pid))
        assert all(_parent(worker.pid) == os.getpid() for worker in forked)
        for a, b in zip(forked, served, strict=True):
            assert a.keys == b.keys == 5000
            assert a.tree.leaves.tobytes() == b.tree.leaves.tobytes()
        differing = np.flatnonzero(served[0].tree.leaves != served[1].tree.leaves)
        keys = await served[1].leaf_keys(differing.astype(np.int64))
        assert len(keys) >= 20  # every rewritten key's leaf, with the keys sharing them
    finally:
        for worker in [*forked, *served]:
            worker.close()
    assert not any(running(worker.pid) for worker in served)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
async def test_a_killed_serve_leaves_no_scan_of_its_check_running(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    servers = [redis_factory("kill"), redis_factory("kill")]
    for s in servers:
        with s.client() as c:
            fill(c, 40_000)
    config = write_config(
        tmp_path / "replag.toml",
        servers,
        service_scan_rate=10_000,
        scan_checkpoint="100ms",
        check_interval="1h",
    )
    store = tmp_path / "replag.sqlite"
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        *replag_argv("serve", "--config", str(config), "--port", str(port)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=replag_env(),
    )

    try:
        await until(lambda: scans_checkpointed(store, 2), "the service's check mid-scan")
        # The scans are the fork server's children; the service forked none itself.
        servers_of_scans = [c for c in children(proc.pid) if "forkserver" in _cmdline(c)]
        assert len(servers_of_scans) == 1
        workers = children(servers_of_scans[0])
        assert len(workers) == 2
        proc.send_signal(signal.SIGKILL)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
    await until(
        lambda: not any(running(p) for p in [*workers, *servers_of_scans]),
        "the fork server and its scans gone with the service",
    )


def test_without_a_fork_server_scans_fork_this_process(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refused() -> None:
        raise PermissionError("no temporary directory for the fork server's socket")

    monkeypatch.setattr(multiprocessing.forkserver, "ensure_running", refused)
    fork_scans_from_server()
    assert scan_process._context.get_start_method() == "fork"
    assert "no fork server for scans" in caplog.text and "checks fork this process" in caplog.text


@pytest.mark.parametrize(
    ("kept", "depth"),
    [("kept", 12), ("read again", 12), ("kept", 4)],
    ids=["kept", "read again", "few big leaves"],
)
async def test_the_keys_of_many_differing_leaves_come_from_the_scans_in_batches(
    redis_factory: RedisFactory, kept: str, depth: int
) -> None:
    # 3,000 of 20,000 keys differ, in ~2,800 of 4,096 leaves; batches of 32 kB are ~70
    # leaves: ~40 batches, each answered from one pass over what the scan kept (spilled
    # a few hundred keys at a time) or, past the spill's limit, one rescan of its leaves.
    # With 16 leaves, every one differs and holds ~1,250 keys (100 kB on 2 members),
    # more than a batch: a leaf is a batch of its own.
    servers = [redis_factory("a"), redis_factory("b")]
    for server in servers:
        with server.client() as client:
            fill(client, 20_000)
    changed = {f"k:{i:07d}".encode() for i in range(0, 20_000, 7)} | {b"only-in-b"}
    with servers[1].client() as b:
        for key in changed:
            b.set(key, "changed")
    limits = KeepLimits(memory_bytes=16 << 10, disk_bytes=0 if kept == "read again" else 1 << 30)
    trees = [
        await WorkerTree.scan(
            Endpoint.from_url(s.url, name=f"n{i}"),
            ScanOptions(),
            ScanProgress(f"n{i}"),
            None,
            depth=depth,
            limits=limits,
        )
        for i, s in enumerate(servers)
    ]
    try:
        leaves = await differing_leaves(trees, depth)
        found: set[bytes] = set()
        batches = 0
        async for parts in keys_in_batches(trees, leaves, depth, 32 << 10):
            batches += 1
            found |= set(differing_keys(parts))
    finally:
        for worker in trees:
            worker.close()
    assert found == changed
    if depth == 4:
        assert len(leaves) == 16 and batches == 16  # a leaf a batch
    else:
        assert batches > 10
