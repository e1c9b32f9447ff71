"""Sampling replication state: offsets of a primary and its replicas read close together.

Per primary, three steps on already-open connections, each stamped on this
process's monotonic clock: the primary (`INFO replication`), then every
replica at once (`INFO replication`), then the primary again (`INFO
replication` + `INFO stats`, pipelined, so its resync counters are at least as
recent as every replica's state). Each step starts only after the previous one's
answer arrived, so every replica's offset was read between the primary's two
reads: bytes behind lies between (first primary offset − replica offset) and
(second − replica), the bracket reported as estimate ± half-width, and the
read skew (the whole bracket's duration) is reported beside it. Answers are
parsed after the bracket, so it holds round trips only. Cost per primary:
3 + N commands in 3 round trips (N replicas). A replica found syncing, with
its link down or not replicating is also asked `INFO persistence` (after the
bracket), whether it is loading its dataset. Unreachable servers are reported
in the sample, never raised.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from replag.errors import ReplagError, UnreachableError
from replag.replication.backlog import Backlog
from replag.replication.info import ListedReplica, ReplicationInfo, parse_info
from replag.replication.state import (
    PrimaryState,
    ReplicaState,
    ReplicaStatus,
    ReplicationSnapshot,
)
from replag.topology import Endpoint, Region, Topology
from replag.wire.resp import RespConnection, error_text, pack

_INFO_REPLICATION = pack(b"INFO", b"replication")
_INFO_STATS = pack(b"INFO", b"stats")
_INFO_PERSISTENCE = pack(b"INFO", b"persistence")
# The primary's write rate is averaged over this long (or since the previous sample).
RATE_WINDOW_S = 60.0
DYNOMITE_NOTE = (
    "writes through Dynomite: its backends have no replication offsets; "
    "the probe is the only measure"
)


@dataclass(frozen=True, kw_only=True)
class SampleTarget:
    """One primary and the replicas expected to replicate from it."""

    source: str
    primary: Endpoint
    replicas: tuple[tuple[str, Endpoint], ...]  # (region, endpoint)


def replication_targets(
    topology: Topology, *, sources: list[Region] | None = None
) -> tuple[list[SampleTarget], list[str]]:
    """Primaries to sample (regions writing to a Redis primary) and notes on the rest."""
    targets, notes = [], []
    for region in topology.regions if sources is None else sources:
        write = region.write
        if write is None:
            continue
        if write.kind == "dynomite":
            notes.append(f"{region.name} {DYNOMITE_NOTE}")
            continue
        replicas = tuple((r.name, ep) for r, ep in topology.reached_from(region, write)[0])
        targets.append(SampleTarget(source=region.name, primary=write, replicas=replicas))
    return targets, notes


@dataclass
class _Read:
    info: ReplicationInfo | None
    sent_ns: int
    arrived_ns: int
    error: str | None = None
    replies: list[Any] | None = None  # raw, until parsed after the bracket


class ReplicationSampler:
    """Keeps one connection per server between samples, and each primary's last offset
    (for its write rate). `close()` when done."""

    def __init__(self, *, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._conns: dict[tuple[str, int, int], RespConnection] = {}
        # address → [(mono ns, offset, replid)] of the last RATE_WINDOW_S
        self._previous: dict[str, list[tuple[int, int, str]]] = {}
        self._unreachable: dict[str, str] = {}  # endpoint name → why the last connect failed
        # Endpoints the current sample leaves alone (unreachable earlier in the same run),
        # and those it found unreachable: a run asks a server that stalls once, not thrice.
        self._skip: dict[str, str] = {}
        self.down: dict[str, str] = {}

    async def __aenter__(self) -> ReplicationSampler:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        conns, self._conns = self._conns, {}
        for conn in conns.values():
            await conn.close()

    async def sample(
        self, targets: list[SampleTarget], *, skip: dict[str, str] | None = None
    ) -> ReplicationSnapshot:
        """Sample every target at once (each with its own bracket of reads); endpoints
        named in `skip` are not contacted (reported with the error given). `down` then
        holds those this sample found unreachable."""
        self._skip, self.down = dict(skip or {}), {}
        started = time.monotonic_ns()
        results = await asyncio.gather(*(self._sample(t) for t in targets))
        snapshot = ReplicationSnapshot(
            primaries=[state for state, _ in results],
            commands=sum(n for _, n in results),
        )
        snapshot.duration_ns = time.monotonic_ns() - started
        return snapshot

    async def _connection(self, endpoint: Endpoint) -> RespConnection:
        key = (endpoint.host, endpoint.port, endpoint.db)
        conn = self._conns.get(key)
        if conn is None:
            conn = await RespConnection.open(
                endpoint, timeout_s=self._timeout_s, clock=time.monotonic_ns
            )
            self._conns[key] = conn
        return conn

    async def _read(self, endpoint: Endpoint, *, stats: bool) -> _Read:
        """One INFO round trip, unparsed (`_parse` after the bracket); a failure drops the
        connection (reopened next sample)."""
        sent = time.monotonic_ns()
        if endpoint.name in self._skip:
            return _Read(None, sent, sent, error=self._skip[endpoint.name])
        conn = self._conns.get((endpoint.host, endpoint.port, endpoint.db))
        if conn is None:
            return _Read(
                None, sent, sent, error=self._unreachable.get(endpoint.name, "not connected")
            )
        try:
            sent = time.monotonic_ns()
            payload = _INFO_REPLICATION + (_INFO_STATS if stats else b"")
            replies, arrived = await conn.wait(conn.send(payload, 2 if stats else 1))
        except ReplagError as exc:
            await self._drop(endpoint)
            if isinstance(exc, UnreachableError):
                self.down[endpoint.name] = exc.message
            return _Read(None, sent, time.monotonic_ns(), error=exc.message)
        return _Read(None, sent, arrived, replies=list(replies))

    async def _parse(self, endpoint: Endpoint, read: _Read) -> _Read:
        """`read` with its INFO parsed, or with the error that made it unusable."""
        if read.replies is None:
            return read
        replies, read.replies = read.replies, None
        try:
            for reply in replies:
                if (text := error_text(reply)) is not None:
                    raise ReplagError(f"INFO refused: {text}", where=endpoint.name)
            stats = replies[1] if len(replies) > 1 else None
            read.info = ReplicationInfo.parse(replies[0], stats, where=endpoint.name)
        except ReplagError as exc:
            await self._drop(endpoint)
            read.error = exc.message
        return read

    async def _drop(self, endpoint: Endpoint) -> None:
        conn = self._conns.pop((endpoint.host, endpoint.port, endpoint.db), None)
        if conn is not None:
            conn.abort()

    async def _sample(self, target: SampleTarget) -> tuple[PrimaryState, int]:
        primary = target.primary
        # Connect everything first so the bracketed reads are round trips only.
        endpoints = (primary, *(ep for _, ep in target.replicas))
        errors = await asyncio.gather(*(self._warm(ep) for ep in endpoints))
        for ep, error in zip(endpoints, errors, strict=True):
            if error is not None:
                self._unreachable[ep.name] = error
        first = await self._read(primary, stats=False)
        base: dict[str, Any] = {
            "source": target.source,
            "primary": primary.name,
            "address": primary.address,
            "sampled_ns": time.time_ns(),
        }
        if first.error is not None:
            # The primary does not answer (dead, or failed over away from): its replicas
            # are still its set's servers, read for what they say of their link to it;
            # never a primary with no replicas while they are there.
            orphans = await asyncio.gather(
                *(self._read(ep, stats=False) for _, ep in target.replicas)
            )
            parsed = [
                await self._parse(ep, read)
                for (_, ep), read in zip(target.replicas, orphans, strict=True)
            ]
            replicas = tuple(
                _without_primary(region, ep, read)
                for (region, ep), read in zip(target.replicas, parsed, strict=True)
            )
            return PrimaryState(**base, error=first.error, replicas=replicas), 1 + len(replicas)
        reads = await asyncio.gather(*(self._read(ep, stats=False) for _, ep in target.replicas))
        second = await self._read(primary, stats=True)
        commands = 3 + len(target.replicas)
        # Parsed only now: the bracket holds the round trips, not this process's parsing.
        first = await self._parse(primary, first)
        second = await self._parse(primary, second)
        reads = [
            await self._parse(ep, read)
            for (_, ep), read in zip(target.replicas, reads, strict=True)
        ]
        if first.info is None:
            return PrimaryState(**base, error=first.error), commands
        if not first.info.is_primary:
            return PrimaryState(
                **base,
                error=f"role {first.info.role}, not a primary (replicating from "
                f"{first.info.master_address}): a failover?",
            ), commands
        if second.info is None or not second.info.is_primary:
            return PrimaryState(**base, error=second.error or "stopped being a primary"), commands
        before, after = first.info, second.info
        skew = second.arrived_ns - first.sent_ns
        replicas = tuple(
            _replica_state(region, ep, read, before, after)
            for (region, ep), read in zip(target.replicas, reads, strict=True)
        )
        odd = [i for i, r in enumerate(replicas) if r.status in _ASK_IF_LOADING]
        if odd:
            asked = [target.replicas[i][1] for i in odd]
            loading = await asyncio.gather(*(self._loading(ep) for ep in asked))
            commands += len(odd)
            fixed = list(replicas)
            for i, is_loading in zip(odd, loading, strict=True):
                if is_loading:
                    fixed[i] = dataclasses.replace(
                        fixed[i], status="syncing", loading=True, error=None
                    )
            replicas = tuple(fixed)
        middle_ns = (first.sent_ns + second.arrived_ns) // 2
        middle_offset = (before.offset + after.offset) // 2
        state = PrimaryState(
            **base,
            read_skew_ns=skew,
            offset=middle_offset,
            offset_moved=after.offset - before.offset,
            replid=after.replid,
            backlog_size=after.backlog_size,
            backlog_first_byte_offset=after.backlog_first_byte_offset,
            backlog_histlen=after.backlog_histlen,
            sync_full=after.sync_full,
            sync_partial_ok=after.sync_partial_ok,
            sync_partial_err=after.sync_partial_err,
            write_rate_bps=self._rate(primary.address, middle_ns, middle_offset, after.replid),
            replicas=replicas,
        )
        return state, commands

    async def _loading(self, endpoint: Endpoint) -> bool:
        """Whether the replica is loading its dataset (INFO persistence loading:1); False
        when it cannot say."""
        conn = self._conns.get((endpoint.host, endpoint.port, endpoint.db))
        if conn is None:
            return False
        try:
            (reply,), _ = await conn.wait(conn.send(_INFO_PERSISTENCE, 1))
        except ReplagError:
            await self._drop(endpoint)
            return False
        if error_text(reply) is not None or not isinstance(reply, bytes | str):
            return False
        return parse_info(reply).get("loading") == "1"

    async def _warm(self, endpoint: Endpoint) -> str | None:
        """Connect (or reuse); the error text if the endpoint cannot be reached."""
        if endpoint.name in self._skip:
            return self._skip[endpoint.name]
        try:
            await self._connection(endpoint)
        except ReplagError as exc:
            if isinstance(exc, UnreachableError):
                self.down[endpoint.name] = exc.message
            return exc.message
        return None

    def _rate(self, address: str, now_ns: int, offset: int, replid: str) -> float | None:
        """Bytes/s over the samples of the last RATE_WINDOW_S (at least the previous one):
        a pause in writes between two close samples is not a rate of 0 for the minute."""
        kept = [
            p
            for p in self._previous.get(address, [])
            if p[2] == replid and now_ns - p[0] <= RATE_WINDOW_S * 1e9
        ]
        older = self._previous.get(address, [])
        if not kept and older and older[-1][2] == replid:
            kept = [older[-1]]
        self._previous[address] = [*kept, (now_ns, offset, replid)]
        if not kept or now_ns <= kept[0][0]:
            return None
        return (offset - kept[0][1]) * 1e9 / (now_ns - kept[0][0])


def _listed(listed: tuple[ListedReplica, ...], endpoint: Endpoint) -> ListedReplica | None:
    """The primary's line for `endpoint`, which announces itself as its region sees it."""
    endpoint = endpoint.in_region()
    for entry in listed:
        if entry.port == endpoint.port and entry.host in (endpoint.host, "", "?"):
            return entry
    same_port = [e for e in listed if e.port == endpoint.port]
    return same_port[0] if len(same_port) == 1 else None


# A primary's states of a replica it is sending a snapshot to (or about to): the replica
# itself may still say only "link down" (e.g. while a diskless sync waits for its delay).
_SYNC_STATES = ("wait_bgsave", "send_bulk")
# Replica states that may hide a replica loading its dataset (asked INFO persistence).
_ASK_IF_LOADING = ("syncing", "link-down", "not-replicating")


def _syncing_as_the_primary_sees_it(listed: ListedReplica | None) -> bool:
    return listed is not None and listed.state in _SYNC_STATES


def _without_primary(region: str, endpoint: Endpoint, read: _Read) -> ReplicaState:
    """A replica of a primary that could not be read: its link as it says (no offsets to
    compare, so no bytes behind)."""
    base: dict[str, Any] = {"replica": endpoint.name, "region": region, "address": endpoint.address}
    info = read.info
    if info is None:
        return ReplicaState(**base, status="unreachable", error=read.error)
    if info.is_primary:
        return ReplicaState(
            **base,
            status="not-replicating",
            error="role master: not a replica of the unreadable primary (promoted?)",
        )
    # Its primary unread, nothing it receives is confirmed: "link-down" (link_up false) even
    # where it still reports its link up (a paused primary, until repl-timeout).
    status: ReplicaStatus = "syncing" if info.sync_in_progress else "link-down"
    return ReplicaState(
        **base,
        status=status,
        error=f"its primary could not be read; it reports its link {info.link_status}"
        if info.link_status == "up"
        else None,
        link_status=info.link_status,
        last_io_s=info.last_io_s,
        link_down_s=info.link_down_s,
        sync_in_progress=info.sync_in_progress,
        offset=info.applied_offset,
        read_offset=info.read_offset,
        priority=info.priority,
        read_only=info.read_only,
    )


def _replica_state(
    region: str,
    endpoint: Endpoint,
    read: _Read,
    before: ReplicationInfo,
    after: ReplicationInfo,
) -> ReplicaState:
    base: dict[str, Any] = {
        "replica": endpoint.name,
        "region": region,
        "address": endpoint.address,
    }
    info = read.info
    if info is None:
        return ReplicaState(**base, status="unreachable", error=read.error)
    if info.is_primary:
        return ReplicaState(
            **base, status="not-replicating", error="role master: not a replica (a failover?)"
        )
    listed = _listed(after.listed, endpoint)
    link: dict[str, Any] = {
        "link_status": info.link_status,
        "last_io_s": info.last_io_s,
        "link_down_s": info.link_down_s,
        "sync_in_progress": info.sync_in_progress,
        "offset": info.applied_offset,
        "read_offset": info.read_offset,
        "ack_offset": listed.ack_offset if listed else None,
        "ack_lag_s": listed.ack_lag_s if listed else None,
        "priority": info.priority,
        "read_only": info.read_only,
    }
    # After a failover a replica keeps the old ID until it resyncs; offsets carry on.
    if info.replid not in (after.replid, after.replid2):
        if info.sync_in_progress or _syncing_as_the_primary_sees_it(listed):
            return ReplicaState(**base, **link, status="syncing")
        return ReplicaState(
            **base,
            **link,
            status="not-replicating",
            error=f"replication ID {info.replid[:8]}… is not the primary's "
            f"{after.replid[:8]}…: replicating from elsewhere, or a full resync is due",
        )
    replica_offset = info.applied_offset if info.applied_offset is not None else info.offset
    low = max(0, before.offset - replica_offset)
    high = max(0, after.offset - replica_offset)
    behind = (low + high) // 2
    backlog = Backlog(
        active=after.backlog_active,
        size=after.backlog_size,
        first_byte_offset=after.backlog_first_byte_offset,
        histlen=after.backlog_histlen,
    )
    headroom = backlog.headroom(primary_offset=after.offset, replica_offset=replica_offset)
    status: ReplicaStatus
    if info.sync_in_progress:
        status = "syncing"
    elif info.link_status == "up":
        status = "ok"
    else:
        status = "link-down"
    return ReplicaState(
        **base,
        **link,
        status=status,
        bytes_behind=behind,
        bytes_uncertainty=high - behind,
        backlog_headroom=headroom,
        headroom_fraction=backlog.headroom_fraction(headroom),
    )
