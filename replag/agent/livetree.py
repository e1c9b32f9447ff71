"""One replica's Tictac tree, built by a full scan and then kept current from notifications.

States: `starting` → `building` → `current`; anything that could have let a
change go unseen makes the tree `stale` and starts a new generation
(subscribe, scan, catch up), and `unavailable` says the replica cannot be
tracked (down, or notifications off and CONFIG refused). Only a `current`
tree is ever served.

A generation:
1. turn keyspace notifications on if they are off (CONFIG SET, leaving the
   operator's flags in place), then subscribe (`KeyspaceFeed`);
2. read the replica's identity, and load the saved table if it was taken of
   this very data (see `snapshot`), else scan the replica with the repair's own
   scanner (`ReplicaScanner`: the same digests and entry hashes, so the tree
   equals a direct scan's tree of the same data);
3. re-read every key an event named since the subscription. Events that raced
   with the scan are thereby applied in order: a re-read returns the key's
   state after its latest write, whatever the scan saw;
4. follow: each event marks its key dirty; dirty keys are re-read in
   pipelined batches and each one's old entry hash is XORed out of its leaf
   and the new one in (`KeyTable.apply`).

A generation ends (tree stale, rebuilt) when the notification connection is
lost (the replica, its output-buffer limit, or `CLIENT KILL TYPE pubsub`),
when a flush or full resync empties the database (the null invalidation of
client tracking), when `notify-keyspace-events` no longer covers every change
or the replica's `run_id` changes (both polled every `poll_s`), and, where
client tracking is unavailable, when a replica's link to its primary goes down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
import xxhash

from replag.agent import snapshot
from replag.agent.keyspace import (
    KeyspaceFeed,
    Listener,
    notifications_cover,
    notifications_with_ours,
)
from replag.agent.keytable import KeyTable
from replag.agent.memory import release_freed_memory, release_now_and_then
from replag.agent.tablebuild import TableBuilder
from replag.errors import AgentError, EndpointError, ReplagError, UsageError
from replag.repair.keyspace.observe import KeyState, observe_keys
from replag.repair.scan.scanner import ReplicaScanner, ScanOptions, ScanProgress
from replag.repair.trees.index import ScanIndex
from replag.repair.trees.tictac import DEFAULT_DEPTH, TictacTree
from replag.topology import Endpoint
from replag.wire.resp import RespConnection, error_text, pack

log = logging.getLogger(__name__)

TreeState = Literal["starting", "building", "current", "stale", "unavailable"]
STATES: tuple[TreeState, ...] = ("starting", "building", "current", "stale", "unavailable")


class _Invalidated(Exception):
    """The tree may have missed a change; `kind` labels the rebuild in metrics."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


class _Stopped(Exception):
    """`stop` cut a build short: the tree keeper ends (nothing to save)."""


@dataclass
class LiveTreeStats:
    events: int = 0  # notifications about tracked keys
    keys_applied: int = 0  # keys re-read and applied to the tree
    builds: int = 0  # full scans
    restores: int = 0  # generations started from a snapshot
    rebuilds: dict[str, int] = field(default_factory=dict)  # stale → rebuilt, by cause
    last_build_s: float = 0.0
    last_build_keys: int = 0
    build_replica_cpu_s: float = 0.0  # the replica's used_cpu during the last full scan
    replica_cpu_s: float | None = None  # the replica's used_cpu_user + sys, last poll
    snapshots_saved: int = 0
    names_rewrites: int = 0  # the names file rewritten with the live keys alone


def _cpu(info: dict[str, str]) -> float | None:
    try:
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    except (KeyError, ValueError):
        return None


class LiveTree:
    """The Tictac tree of one local replica, current to within the notifications in flight."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        options: ScanOptions,
        depth: int = DEFAULT_DEPTH,
        state_dir: Path | None = None,
        poll_s: float = 1.0,
        save_every_s: float = 600.0,
        batch: int = 1000,
        manage_notifications: bool = True,
        merge_every: int = 4096,
        declared_notifications: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.options = options
        self.depth = depth
        self.timeout_s = options.timeout_s
        self._last_failure: str | None = None  # why the last generation failed, until a build
        self.poll_s = poll_s
        self.save_every_s = save_every_s
        self.batch = batch
        self.manage_notifications = manage_notifications
        # settings.notify_keyspace_events: trusted, never read with CONFIG GET (which a
        # least-privilege user is not granted: it reads the server's passwords too).
        self.declared_notifications = declared_notifications
        self.merge_every = merge_every
        self.snapshot_path = snapshot.snapshot_path(state_dir, endpoint.name) if state_dir else None
        self.names_dir = state_dir  # where the table's unlinked names file lives (else TMPDIR)
        self.shape = snapshot.TableShape(
            depth, options.ttl_bucket_ms, (options.exclude_prefix or b"").decode("latin-1")
        )
        self.state: TreeState = "starting"
        self.reason = "not started"
        self.stats = LiveTreeStats()
        self.table: KeyTable | None = None
        self.tree: TictacTree | None = None
        self.build_progress: ScanProgress | None = None
        self.feed: KeyspaceFeed | None = None
        self.listeners: list[Listener] = []  # other parts sharing this replica's notifications
        self._exclude = options.exclude_prefix or None
        self._scanner = ReplicaScanner(endpoint, options)
        self._dirty: set[bytes] = set()
        self._seen = 0  # events counted so far
        self._applied = 0  # every event up to this count is in the tree
        self._flushed = False
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()  # pulsed on every state change and applied batch
        self._version = 0
        self._levels: tuple[int, list[npt.NDArray[np.uint64]]] | None = None
        self._query: RespConnection | None = None
        self._stopping = False
        # The full scan under way, if any: `stop` cancels it (a build has nothing to save,
        # and one against a server that stalls or cycles must not hold the agent's exit).
        self._scan: asyncio.Task[list[ScanIndex]] | None = None
        self._saved_version = -1

    # --- what the agent's API reads --------------------------------------------

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "replica": self.endpoint.name,
            "address": self.endpoint.address,
            "state": self.state,
            "reason": self.reason,
            "depth": self.depth,
            "ttl_bucket_ms": self.options.ttl_bucket_ms,
            "keys": len(self.table) if self.table is not None else None,
            "root": f"{self.tree.root:016x}" if self.tree is not None else None,
            "bytes_per_key": round(self.table.bytes_per_key(), 1) if self.table else None,
            "pending_keys": len(self._dirty),
            "events": self.stats.events,
            "keys_applied": self.stats.keys_applied,
            "builds": self.stats.builds,
            "last_build_s": round(self.stats.last_build_s, 3),
            "restores": self.stats.restores,
            "snapshots_saved": self.stats.snapshots_saved,
            "names_rewrites": self.stats.names_rewrites,
            "rebuilds": dict(self.stats.rebuilds),
            "tracks_flushes": self.feed.tracks_flushes if self.feed else None,
        }
        if self.state == "building" and self.build_progress is not None:
            out["scanned"] = self.build_progress.keys
            out["scan_total"] = self.build_progress.total
        return out

    async def fresh(self, wait_s: float) -> None:
        """Return once the tree holds every write the replica applied before this call;
        AgentError (503) if it is not current within `wait_s`."""
        deadline = time.monotonic() + wait_s
        while self.state != "current":
            await self._await_change(deadline)
        feed = self.feed
        assert feed is not None
        try:
            await feed.fence()
        except EndpointError as exc:
            raise self._not_current(f"notification connection lost: {exc.message}") from None
        target = self._seen
        while self._applied < target or self.state != "current":
            await self._await_change(deadline)

    def _not_current(self, reason: str | None = None) -> AgentError:
        detail = reason or self.reason
        if self.state == "building" and self.build_progress is not None:
            p = self.build_progress
            total = f"/{p.total:,}" if p.total else ""
            detail = f"{detail}; scanned {p.keys:,}{total} keys"
        return AgentError(
            f"tree of {self.endpoint.name} is {self.state}: {detail}", where=self.endpoint.name
        )

    async def _await_change(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise self._not_current()
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(left):
                await self._changed.wait()

    def _current_tree(self) -> TictacTree:
        if self.state != "current" or self.tree is None:
            raise self._not_current()
        return self.tree

    def levels(self) -> list[npt.NDArray[np.uint64]]:
        tree = self._current_tree()
        if self._levels is None or self._levels[0] != self._version:
            self._levels = (self._version, tree.levels())
        return self._levels[1]

    def descendants(self, level: int, nodes: Sequence[int], down: int) -> npt.NDArray[np.uint64]:
        """For each node of `level`, its 2**down descendants `down` levels below, in order."""
        levels = self.levels()
        if level < 0 or down < 0 or level + down > self.depth:
            raise UsageError(f"levels {level}+{down} outside a tree of depth {self.depth}")
        index = np.asarray(nodes, np.int64)
        if len(index) and (index.min() < 0 or index.max() >= (1 << level)):
            raise UsageError(f"node numbers outside level {level}")
        width = 1 << down
        below = (index[:, None] * width + np.arange(width, dtype=np.int64)[None, :]).ravel()
        values: npt.NDArray[np.uint64] = levels[level + down][below]
        return values

    def leaf_keys(self, leaves: Sequence[int]) -> ScanIndex:
        self._current_tree()
        assert self.table is not None
        if leaves and (min(leaves) < 0 or max(leaves) >= (1 << self.depth)):
            raise UsageError(f"leaf numbers outside a tree of depth {self.depth}")
        return self.table.keys_in_leaves(leaves, self.depth)

    async def observe(
        self, keys: Sequence[bytes], *, keep: bool = False, fields: Sequence[bytes] = ()
    ) -> dict[bytes, KeyState]:
        """Each key's state now (`keep`: with string values; `fields`: those hash fields)."""
        conn = await self._query_connection()
        return await observe_keys(
            conn, keys, chunk=self.options.count, keep=keep, fields=tuple(fields)
        )

    async def observe_twice(
        self,
        keys: Sequence[bytes],
        settle_s: float,
        *,
        keep: bool = False,
        fields: Sequence[bytes] = (),
    ) -> tuple[dict[bytes, KeyState], dict[bytes, KeyState]]:
        """Every key read, `settle_s` apart, twice: what the repair's verification compares."""
        first = await self.observe(keys, keep=keep, fields=fields)
        await asyncio.sleep(settle_s)
        return first, await self.observe(keys, keep=keep, fields=fields)

    async def _query_connection(self) -> RespConnection:
        if self._query is None:
            self._query = await RespConnection.open(self.endpoint, timeout_s=self.timeout_s)
        return self._query

    # --- the generations ------------------------------------------------------

    async def run(self) -> None:
        """Keep the tree current until `stop()`; never raises for a replica's failures."""
        backoff = 0.2
        while not self._stopping:
            try:
                await self._generation()
                backoff = 0.2
            except _Stopped:
                break
            except _Invalidated as exc:
                self.stats.rebuilds[exc.kind] = self.stats.rebuilds.get(exc.kind, 0) + 1
                log.warning("%s: tree stale, rebuilding: %s", self.endpoint.name, exc.reason)
                self._set_state("stale", exc.reason)
            except (ReplagError, Exception) as exc:
                if self._stopping:
                    break
                if isinstance(exc, ReplagError):
                    log.warning("%s: %s; retrying in %.1fs", self.endpoint.name, exc, backoff)
                else:  # a bug: say so loudly, but keep the agent (and other replicas) going
                    log.exception("%s: tree keeper failed; retrying", self.endpoint.name)
                self._set_state("unavailable", str(exc))
                self._last_failure = str(exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, max(self.poll_s * 5, 1.0))
        self._set_state("stale", "agent stopped")

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._scan is not None and not self._scan.done():
            self._scan.cancel()

    def _set_state(self, state: TreeState, reason: str) -> None:
        self.state, self.reason = state, reason
        self._changed.set()

    def _on_event(self, key: bytes, event: bytes, arrived_ns: int, since_ns: int) -> None:
        if self._exclude is not None and key.startswith(self._exclude):
            return
        self._seen += 1
        self.stats.events += 1
        self._dirty.add(key)
        self._wake.set()

    def _on_flush(self) -> None:
        self._flushed = True
        self._wake.set()

    async def _generation(self) -> None:
        self._dirty.clear()
        self._flushed = False
        self._applied = self._seen
        if self.table is not None:
            self.table.close()
        self.table = self.tree = None
        conn = await RespConnection.open(self.endpoint, timeout_s=self.timeout_s)
        feed: KeyspaceFeed | None = None
        try:
            await self._ensure_notifications(conn)
            feed = KeyspaceFeed(self.endpoint, timeout_s=self.timeout_s)
            feed.add_listener(self._on_event)
            for listener in self.listeners:
                feed.add_listener(listener)
            feed.on_flush(self._on_flush)
            feed.closed.add_done_callback(lambda _: self._wake.set())
            await feed.open()
            self.feed = feed
            # Read after subscribing: any write after this read arrives as an event.
            info = await self._info(conn)
            table = self._restore(snapshot.ReplicaIdentity.from_info(info))
            built = table is None
            if table is None:
                table = await self._build(conn, info)
            self.table, self.tree = table, table.tree(self.depth)
            self._version += 1
            await self._apply_dirty(conn)
            self._check(feed)
            self._set_state("current", "built by a full scan" if built else "restored")
            if built:
                await self._save(conn, feed)
            await self._follow(conn, feed, info)
        finally:
            if feed is not None:
                feed.close()
            self.feed = None
            await conn.close()
            if self._query is not None:
                self._query.abort()
                self._query = None

    async def _ensure_notifications(self, conn: RespConnection) -> None:
        declared = self.declared_notifications
        if declared is not None:
            if notifications_cover(declared):
                return
            raise AgentError(
                f"settings.notify_keyspace_events declares {declared!r}: the agent needs K "
                "and g$lshzxet (or KA) to keep a tree (turn them on, and declare them)",
                where=self.endpoint.name,
            )
        reply = await conn.request(pack(b"CONFIG", b"GET", b"notify-keyspace-events"), 1)
        if error_text(reply[0]) is not None:
            raise AgentError(
                f"cannot read notify-keyspace-events ({error_text(reply[0])}); the agent needs "
                "notifications with K and g$lshzxet (or KA) to keep a tree: declare them in "
                "settings.notify_keyspace_events (a least-privilege user may not read them)",
                where=self.endpoint.name,
            )
        flags = reply[0][1].decode() if len(reply[0]) > 1 else ""
        if notifications_cover(flags):
            return
        if not self.manage_notifications:
            raise AgentError(
                f"notify-keyspace-events is {flags!r}: needs K and g$lshzxet (or KA), and "
                "replag may not change server configuration (turn them on, or set "
                "allow_config_changes = true)",
                where=self.endpoint.name,
            )
        wanted = notifications_with_ours(flags)
        (answer,) = await conn.request(
            pack(b"CONFIG", b"SET", b"notify-keyspace-events", wanted), 1
        )
        if error_text(answer) is not None:
            raise AgentError(
                f"notify-keyspace-events is {flags!r} and CONFIG SET was refused "
                f"({error_text(answer)}): turn on K and g$lshzxet (or KA)",
                where=self.endpoint.name,
            )
        log.warning(
            "%s: turned keyspace notifications on (%r → %r) and left them on",
            self.endpoint.name,
            flags,
            wanted,
        )

    async def _info(self, conn: RespConnection) -> dict[str, str]:
        (reply,) = await conn.request(pack(b"INFO"), 1)
        conn.check([reply])
        info = snapshot.parse_info(reply.decode("utf-8", "replace"))
        self.stats.replica_cpu_s = _cpu(info)
        return info

    def _restore(self, identity: snapshot.ReplicaIdentity) -> KeyTable | None:
        if self.snapshot_path is None:
            return None
        table, why = snapshot.load(
            self.snapshot_path,
            identity,
            self.shape,
            merge_every=self.merge_every,
            directory=self.names_dir,
        )
        if table is None:
            log.info("%s: full scan (%s)", self.endpoint.name, why)
            return None
        self.stats.restores += 1
        log.info(
            "%s: tree restored from %s (%d keys)",
            self.endpoint.name,
            self.snapshot_path,
            len(table),
        )
        return table

    async def _build(self, conn: RespConnection, info: dict[str, str]) -> KeyTable:
        # A build after a failed one says why that failed: whoever asks meanwhile (a check
        # waiting for the tree) learns which server is at fault, not just "building".
        failed = f" (the last attempt failed: {self._last_failure})" if self._last_failure else ""
        self._set_state("building", "full scan" + failed)
        cpu_before = _cpu(info)
        started = time.perf_counter()
        progress = ScanProgress(self.endpoint.name)
        self.build_progress = progress
        # The table is made as the scan goes (names spilled to disk), never a whole index.
        with self._names_disk():
            builder = TableBuilder(merge_every=self.merge_every, directory=self.names_dir)

        def add(part: ScanIndex) -> None:
            with self._names_disk():
                builder.add(part)

        scanner = ReplicaScanner(self.endpoint, self.options, sink=add)
        self._scan = asyncio.ensure_future(scanner.run_parts(progress))
        try:
            try:
                await self._scan
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if self._stopping and not (current is not None and current.cancelling()):
                    raise _Stopped from None  # `stop` cut the build short
                raise
            with self._names_disk():
                table = builder.finish()
        finally:
            if not self._scan.done():
                self._scan.cancel()  # this task cancelled: the scan with it
            self._scan = None
            builder.close()
        self._last_failure = None
        release_freed_memory()
        self.stats.builds += 1
        self.stats.last_build_s = time.perf_counter() - started
        self.stats.last_build_keys = len(table)
        cpu_after = _cpu(await self._info(conn))
        if cpu_before is not None and cpu_after is not None:
            self.stats.build_replica_cpu_s = cpu_after - cpu_before
        self.build_progress = None
        log.info(
            "%s: tree built: %d keys in %.2fs, %.1f bytes per key",
            self.endpoint.name,
            len(table),
            self.stats.last_build_s,
            table.bytes_per_key(),
        )
        return table

    @contextlib.contextmanager
    def _names_disk(self) -> Iterator[None]:
        """The key names' file failing (a full disk, a missing directory) as one line that
        names the directory; the generation ends and is retried like any other failure."""
        try:
            yield
        except OSError as exc:
            where = self.names_dir or Path(tempfile.gettempdir())
            raise AgentError(
                f"cannot keep the key names of {self.endpoint.name} in {where}: "
                f"{exc.strerror or exc}",
                where=self.endpoint.name,
            ) from exc

    def _check(self, feed: KeyspaceFeed) -> None:
        if feed.closed.done():
            raise _Invalidated("lost", f"notification connection lost: {feed.closed.result()}")
        if self._flushed:
            raise _Invalidated(
                "flush", "the database was emptied (FLUSHDB/FLUSHALL or a full resync)"
            )

    async def _apply_dirty(self, conn: RespConnection) -> None:
        """Re-read the keys dirty now and XOR their changes into the tree; afterwards every
        event counted before the call is applied (`_applied`)."""
        assert self.table is not None and self.tree is not None
        if self._dirty:
            keys, self._dirty = list(self._dirty), set()
            covered = self._seen
            for start in range(0, len(keys), self.batch):
                chunk = keys[start : start + self.batch]
                index = await self._scanner.index_keys(conn, chunk)
                now = dict(zip(index.key_hashes.tolist(), index.entries.tolist(), strict=True))
                hashes = np.fromiter(
                    map(xxhash.xxh3_64_intdigest, chunk), np.uint64, count=len(chunk)
                )
                entries = np.fromiter(
                    (now.get(h, 0) for h in hashes.tolist()), np.uint64, count=len(chunk)
                )
                present = np.fromiter((h in now for h in hashes.tolist()), bool, count=len(chunk))
                with self._names_disk():
                    self.table.apply(hashes, entries, present, chunk, tree=self.tree)
                self.stats.keys_applied += len(chunk)
                self._version += 1
            self._applied = covered
            self._changed.set()
            if self.table.rewrite_due:
                # Cooperative: requests are answered meanwhile, changes wait in `_dirty`.
                with self._names_disk():
                    await self.table.rewrite_names_async()
                self.stats.names_rewrites += 1

    async def _follow(self, conn: RespConnection, feed: KeyspaceFeed, info: dict[str, str]) -> None:
        next_poll = time.monotonic() + self.poll_s
        next_save = time.monotonic() + self.save_every_s
        while True:
            self._check(feed)
            if self._stopping:
                await self._save(conn, feed)
                return
            if self._dirty:
                await self._apply_dirty(conn)
            else:
                self._wake.clear()
                left = next_poll - time.monotonic()
                if left > 0:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(left):
                            await self._wake.wait()
            now = time.monotonic()
            if now >= next_poll:
                await self._poll(conn, feed, info)
                next_poll = now + self.poll_s
            if now >= next_save:
                await self._save(conn, feed)
                next_save = now + self.save_every_s

    async def _poll(self, conn: RespConnection, feed: KeyspaceFeed, first: dict[str, str]) -> None:
        release_now_and_then()
        info = await self._info(conn)
        if info.get("run_id") != first.get("run_id"):
            raise _Invalidated("restart", "the replica restarted (run_id changed)")
        if not feed.tracks_flushes and info.get("role") == "slave":
            link = info.get("master_link_status")
            if link != "up" or info.get("master_sync_in_progress") == "1":
                raise _Invalidated(
                    "resync", f"replication link {link}: a full resync would go unseen"
                )
        if self.declared_notifications is not None:
            return  # declared: trusted (see __init__)
        reply = await conn.request(pack(b"CONFIG", b"GET", b"notify-keyspace-events"), 1)
        flags = reply[0][1].decode() if error_text(reply[0]) is None and len(reply[0]) > 1 else ""
        if not notifications_cover(flags):
            raise _Invalidated(
                "notifications", f"keyspace notifications were turned off ({flags!r})"
            )

    async def _save(self, conn: RespConnection, feed: KeyspaceFeed) -> None:
        """Snapshot the table with the identity read first, after catching up to it."""
        path = self.snapshot_path
        if path is None or self.table is None or self._saved_version == self._version:
            return
        identity = snapshot.ReplicaIdentity.from_info(await self._info(conn))
        await feed.fence()
        await self._apply_dirty(conn)
        self._check(feed)
        if not self.table.names_exact:
            with self._names_disk():
                await self.table.rewrite_names_async()  # a save holds the live names only
            self.stats.names_rewrites += 1
        image = self.table.image()
        version = self._version
        try:
            await asyncio.to_thread(
                snapshot.save, path, image.write, len(image), identity, self.shape
            )
        except OSError as exc:
            log.warning("%s: cannot save the tree to %s: %s", self.endpoint.name, path, exc)
            return
        finally:
            image.close()
        self._saved_version = version
        self.stats.snapshots_saved += 1
