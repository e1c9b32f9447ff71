"""A member's scan in a process of its own: the client side of a full check is CPU-bound.

`WorkerTree.scan` forks a worker that runs `BlockingScan` on one member and
keeps its keys (entry hash and name; `scan_keep.KeptKeys`: in memory up to a
limit, the rest in a temporary file; they never cross into this process).
Back come a progress event per batch, a checkpoint every `checkpoint_every_s`
(the cursor and the Tictac tree of the keys so far: 512 KB, whatever the
keyspace), and, when the scan ends, the member's tree. The
walk then asks the worker for the keys of the differing leaves only
(`leaf_keys`), which is what makes it a `MemberTree`.

A scan resumed from a checkpoint starts from its cursor with the tree saved
there; the keys read before the checkpoint are not kept anywhere (nor are those
of a keyspace past the spill file's limit), so the keys
of differing leaves are then found by a second pass that reads only keys in
those leaves (SCAN of the names, values of the few that fall in them).

The worker is forked after the parent's imports, so it shares their pages.
It exits when the parent says so, and on its own when the parent's end of
the pipe goes away (a killed check leaves no scan running).

A long-running process with a large heap and threads (`replag serve`) forks
its scans from a small fork server instead (`fork_scans_from_server`): a fork
of the service copied its page tables with the GIL held (4–17 ms per scan, four
in a row at each check's start), then made every page it wrote afterwards a
copy-on-write fault, and the API's requests waited through both.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import os
import signal
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import numpy.typing as npt

from replag.errors import RepairError, ReplagError
from replag.repair.scan.blocking import BlockingScan
from replag.repair.scan.keep import KeepLimits, KeptKeys
from replag.repair.scan.scanner import LeafFilter, ScanOptions, ScanProgress
from replag.repair.scan.selection import LeafSelection
from replag.repair.trees.index import ScanIndex
from replag.repair.trees.tictac import TictacTree
from replag.repair.trees.walk import first_down, fold
from replag.topology import Endpoint

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
Checkpointed = Callable[[ScanProgress, TictacTree], None]
Progressed = Callable[[ScanProgress], None]
_PROGRESS_EVERY_S = 0.05
log = logging.getLogger(__name__)
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# How scan processes start: forked from this process, or from the fork server.
_context: multiprocessing.context.ForkContext | multiprocessing.context.ForkServerContext = (
    multiprocessing.get_context("fork")
)


def fork_scans_from_server(enabled: bool = True) -> None:
    """Fork this process's scans from a fork server (started now, with this module
    imported, so each scan still starts in milliseconds) rather than from this process.

    For a process whose own fork is costly: a large heap, and threads that must not stall
    (the service's API). The fork server ends when this process does, and its scans with
    it. `enabled=False` returns to forking this process."""
    global _context
    if not enabled:
        _context = multiprocessing.get_context("fork")
        return
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    try:
        multiprocessing.forkserver.ensure_running()
    except OSError as exc:  # e.g. no writable temporary directory for its socket
        log.warning("no fork server for scans (%s): checks fork this process", exc)
        _context = multiprocessing.get_context("fork")
        return
    _context = context


class WorkerTree:
    """One member scanned in a worker process (a `MemberTree` for the walk)."""

    def __init__(
        self,
        name: str,
        process: Any,
        conn: Connection,
        tree: TictacTree,
        bytes_received: int,
        state: ScanProgress,
        resumed: bool,
    ) -> None:
        self.name = name
        self.keys = state.keys  # keys the scan read
        self._process = process
        self._conn = conn
        self.tree = tree
        self.bytes_received = bytes_received
        # Where the scan ended, and whether it resumed from a checkpoint: a caller saves
        # the finished tree once the scan processes are gone (`checkpoint` is called
        # during the scan only): saved at the end here, the store's writes of every
        # member's tree cost the check's process ~2.5 MB a member while they still ran.
        self.state, self.resumed = state, resumed

    @classmethod
    async def scan(
        cls,
        endpoint: Endpoint,
        options: ScanOptions,
        state: ScanProgress,
        saved: TictacTree | None,
        *,
        depth: int,
        progress: Progressed | None = None,
        checkpoint: Checkpointed | None = None,
        limits: KeepLimits | None = None,
    ) -> WorkerTree:
        """Scan `endpoint` from `state` (with `saved`, the tree of what a checkpoint
        covered) in a new process; returns once its tree is complete. `state` follows
        the worker's progress."""
        context = _context
        parent_end, child_end = context.Pipe()
        forked_here = context.get_start_method() == "fork"
        # A worker forked here holds copies of this end and must close it; and its parent
        # is this process. One from the fork server holds neither.
        parents = (parent_end, os.getpid()) if forked_here else (None, None)
        process = context.Process(
            target=_worker,
            args=(child_end, *parents, endpoint, options, state, depth, saved, limits),
            name=f"replag-scan {endpoint.name}",
            daemon=True,
        )
        process.start()
        child_end.close()
        inbox = _Inbox(parent_end, endpoint)
        scanning = not state.finished
        try:
            while True:
                kind, *body = await inbox.get()
                if kind == "progress" or kind == "checkpoint":
                    _update(state, body[0])
                    if kind == "checkpoint" and checkpoint is not None:
                        checkpoint(state, TictacTree.from_bytes(body[1]))
                    if progress is not None:
                        progress(state)
                elif kind == "done":
                    _update(state, body[0])
                    if progress is not None and scanning:
                        progress(state)  # the last word: every key read
                    inbox.close()
                    tree = TictacTree.from_bytes(body[1])
                    resumed = saved is not None
                    return cls(endpoint.name, process, parent_end, tree, body[2], state, resumed)
                else:
                    raise body[0]
        except BaseException:
            inbox.close()
            _stop(process, parent_end)
            raise

    @property
    def pid(self) -> int:
        """The worker's process id."""
        return int(self._process.pid)

    # A level is folded from the leaves when asked (not every level kept: 512 KB a
    # member, in the check's own process).
    async def first_nodes(self, depth: int) -> tuple[int, U64]:
        down = first_down(self.keys, depth)
        return down, fold(self.tree.leaves, self.tree.depth - down)

    async def descendants(self, level: int, nodes: I64, down: int) -> U64:
        below = fold(self.tree.leaves, self.tree.depth - level - down)
        width = 1 << down
        index = (nodes[:, None] * width + np.arange(width, dtype=np.int64)[None, :]).ravel()
        values: U64 = below[index]
        return values

    async def leaf_keys(self, leaves: I64) -> ScanIndex:
        return ScanIndex.from_bytes(
            await self._ask(("leaf_keys", leaves.astype(np.int64).tobytes()))
        )

    async def select_leaves(self, batches: Sequence[I64]) -> None:
        """The worker gathers the keys of these batches of leaves, in one pass."""
        sizes = np.array([len(batches), *map(len, batches)], np.int64).tobytes()
        leaves = np.concatenate([*batches, np.zeros(0, np.int64)]).astype(np.int64)
        await self._ask(("select", sizes + leaves.tobytes()))

    async def batch_keys(self, batch: int) -> ScanIndex:
        return ScanIndex.from_bytes(await self._ask(("batch", batch)))

    async def _ask(self, message: tuple[Any, ...]) -> Any:
        self._conn.send(message)
        inbox = _Inbox(self._conn, None, name=self.name)
        try:
            kind, body = await inbox.get()
        finally:
            inbox.close()
        if kind == "error":
            raise body
        return body

    def close(self) -> None:
        _stop(self._process, self._conn)


def _update(state: ScanProgress, fields: tuple[bytes, int, float, bool, int | None]) -> None:
    state.cursor, state.keys, state.seconds, state.finished, state.total = fields


def _fields(state: ScanProgress) -> tuple[bytes, int, float, bool, int | None]:
    return state.cursor, state.keys, state.seconds, state.finished, state.total


def _stop(process: Any, conn: Connection) -> None:
    with contextlib.suppress(OSError):
        conn.send(("exit",))
    conn.close()
    process.join(timeout=5)
    if process.is_alive():
        process.kill()
        process.join()


class _Inbox:
    """Messages from a worker, read when its pipe is readable (the loop never blocks on it)."""

    def __init__(self, conn: Connection, endpoint: Endpoint | None, *, name: str = "") -> None:
        self._conn = conn
        self._name = endpoint.name if endpoint is not None else name
        self._queue: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(conn.fileno(), self._readable)
        self._open = True

    def _readable(self) -> None:
        try:
            while self._conn.poll():
                self._queue.put_nowait(self._conn.recv())
        except (EOFError, OSError):
            self.close()
            error = RepairError("its scan process exited unexpectedly", where=self._name)
            self._queue.put_nowait(("error", error))

    async def get(self) -> tuple[Any, ...]:
        return await self._queue.get()

    def close(self) -> None:
        if self._open:
            self._open = False
            self._loop.remove_reader(self._conn.fileno())


# --- in the worker ------------------------------------------------------------------


def _worker(
    conn: Connection,
    parents_end: Connection | None,
    parent: int | None,
    endpoint: Endpoint,
    options: ScanOptions,
    state: ScanProgress,
    depth: int,
    saved: TictacTree | None,
    limits: KeepLimits | None,
) -> None:
    """The forked process: scan, send the tree, answer `leaf_keys` until told to exit."""
    # Ctrl-C reaches the whole process group: the parent decides, and stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The parent's objects are never freed here: out of the collector's sight, its
    # passes stay short and leave the shared pages unwritten.
    gc.freeze()
    if parents_end is not None:  # else our copy would keep the pipe open after the parent died
        parents_end.close()
    # From the fork server: dying with it is dying with the process it serves (it ends
    # when that one does).
    _die_with(parent if parent is not None else os.getppid())
    if options.nice > 0:
        os.nice(options.nice)
    kept = KeptKeys(depth, limits)
    selection: LeafSelection | None = None
    try:
        _scan(conn, endpoint, options, state, saved, kept)
        # Keys read before the checkpoint, or past the spill's limit, are not here: the
        # leaves asked for are read again.
        again = saved is not None or not kept.kept
        while True:
            message = conn.recv()
            if message[0] == "leaf_keys":
                leaves = np.frombuffer(message[1], dtype=np.int64)
                found = _rescan(endpoint, options, leaves, depth) if again else None
                found = kept.in_leaves(leaves) if found is None else found
                conn.send(("keys", found.to_bytes()))
            elif message[0] == "select":
                if selection is not None:
                    selection.close()
                selection = _select(endpoint, options, kept, message[1], again, limits)
                conn.send(("selected", selection.spilled_bytes))
            elif message[0] == "batch" and selection is not None:
                conn.send(("keys", selection.keys(message[1]).to_bytes()))
            else:
                break
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the parent is gone: nothing to report to
    except ReplagError as exc:
        _send(conn, ("error", exc))
    except BaseException as exc:  # a bug: reported, not a silent hang in the parent
        _send(conn, ("error", RepairError(f"scan failed: {exc!r}", where=endpoint.name)))
    finally:
        kept.close()
        if selection is not None:
            selection.close()
        conn.close()
        # Forked: leave without the parent's exit handlers (its store, its temp files).
        os._exit(0)


def _die_with(parent: int) -> None:
    """Be killed when the parent dies (a killed check must not leave scans running): the
    pipe alone does not tell, as other workers forked later hold copies of its end."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the pipe still ends us once no process holds its other end
    if os.getppid() != parent:  # died before that took effect
        os._exit(0)


def _send(conn: Connection, message: tuple[Any, ...]) -> None:
    with contextlib.suppress(OSError):
        conn.send(message)


def _scan(
    conn: Connection,
    endpoint: Endpoint,
    options: ScanOptions,
    state: ScanProgress,
    saved: TictacTree | None,
    kept: KeptKeys,
) -> None:
    if saved is not None:
        kept.tree.leaves[:] = saved.leaves
    last_progress = 0.0

    def progress(now: ScanProgress) -> None:
        nonlocal last_progress
        moment = time.monotonic()
        if moment - last_progress >= _PROGRESS_EVERY_S:
            last_progress = moment
            conn.send(("progress", _fields(now)))

    def checkpoint(now: ScanProgress) -> None:
        # The tree so far, duplicates and all: only a resumed scan uses it, and a key
        # SCAN returned twice costs it a candidate that the verification clears.
        if not now.finished:
            conn.send(("checkpoint", _fields(now), kept.tree.to_bytes()))

    received = 0
    if not state.finished:
        # A resumed scan keeps no keys: its walk reads the differing leaves again.
        def sink(part: ScanIndex) -> None:
            kept.add(part, keep=saved is None)

        scanner = BlockingScan(
            endpoint, options, sink=sink, checkpoint=checkpoint, progress=progress
        )
        scanner.run_parts(state)
        received = scanner.bytes_received
    if saved is None and kept.kept:
        kept.count_duplicates_once()
    conn.send(("done", _fields(state), kept.tree.to_bytes(), received))


def _select(
    endpoint: Endpoint,
    options: ScanOptions,
    kept: KeptKeys,
    sizes: bytes,
    again: bool,
    limits: KeepLimits | None,
) -> LeafSelection:
    """The keys of the walk's batches of leaves (`sizes`: each batch's leaves, sorted, as
    one int64 array after the count of batches and their sizes), from one pass over the
    kept keys or one rescan of the replica."""
    count = int(np.frombuffer(sizes, np.int64, 1)[0])
    lengths = np.frombuffer(sizes, np.int64, count, 8)
    leaves = np.frombuffer(sizes, np.int64, offset=8 * (1 + count))
    batches = np.split(leaves, np.cumsum(lengths)[:-1]) if count else []
    limits = limits if limits is not None else KeepLimits()
    # A quarter of the keys' share: the last chunk of kept keys is held meanwhile.
    selection = LeafSelection(
        batches, kept.depth, memory_bytes=limits.memory_bytes // 4, directory=limits.directory
    )
    if again:
        from dataclasses import replace

        only = replace(options, leaves=LeafFilter.of(leaves, kept.depth), rate=None)
        BlockingScan(endpoint, only, sink=selection.add).run_parts(ScanProgress(endpoint.name))
    else:
        for part in kept.parts_in(selection.wanted):
            selection.add(part)
    return selection


def _rescan(endpoint: Endpoint, options: ScanOptions, leaves: I64, depth: int) -> ScanIndex:
    from dataclasses import replace

    only = replace(options, leaves=LeafFilter.of(leaves, depth), rate=None)
    index = BlockingScan(endpoint, only).run(ScanProgress(endpoint.name))
    return index.deduplicated()
