"""Backlog headroom: how many more bytes the primary can write before a replica that
reconnects needs a full resync instead of a partial one.

The arithmetic, from Redis's `masterTryPartialResynchronization` (Valkey's
`primaryTryPartialResynchronization` is the same). Offsets count bytes of the
replication stream; `master_repl_offset` M is the last byte the primary
wrote, a replica's `slave_repl_offset` R the last byte it applied. On
reconnect the replica sends `PSYNC <replid> R+1` (the first byte it lacks),
and the primary answers `+CONTINUE` only when

    repl_backlog_first_byte_offset  ≤  R + 1  ≤  first_byte_offset + repl_backlog_histlen

(the upper bound is M + 1, always true of a replica), otherwise a full
resync (an RDB of the whole dataset). The backlog keeps the last
`repl_backlog_size` bytes S of the stream: byte R+1 leaves it when the
primary's offset passes R + S. So, with B = M − R bytes behind:

    headroom = S − B                 while R + 1 ≥ first_byte_offset
    headroom = (R + 1) − first_byte_offset  (negative: bytes already gone)  otherwise

Redis 6.2 keeps exactly the last S bytes (a ring), so there the figure is
exact. Redis 7+ and Valkey keep the backlog as 16 KiB blocks of the shared
replication buffer and trim whole blocks only while more than S would
remain (and never a block a connected replica still reads), so they may keep
up to a block more: the figure is then a lower bound, and a negative S − B
while the byte is still held means "full resync at the next trim" (reported
as 0). The backlog is freed after `repl-backlog-ttl` (1 h) without any
replica, and a replica with another replication ID always needs a full sync;
both show as `None` (no partial resync possible).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Backlog:
    """A primary's backlog, from INFO replication."""

    active: bool
    size: int | None
    first_byte_offset: int | None
    histlen: int | None

    def headroom(self, *, primary_offset: int, replica_offset: int) -> int | None:
        """Bytes the primary may still write before `replica_offset + 1` leaves the backlog.

        None when there is no backlog to resync from (inactive, or sizes unknown).
        """
        if not self.active or self.size is None or self.first_byte_offset is None:
            return None
        wanted = replica_offset + 1
        if wanted < self.first_byte_offset:
            return wanted - self.first_byte_offset
        return max(0, self.size - (primary_offset - replica_offset))

    def headroom_fraction(self, headroom: int | None) -> float | None:
        """Headroom over the backlog size: 1 = caught up, 0 = a reconnect means a full resync."""
        if headroom is None or not self.size:
            return None
        return max(0.0, headroom / self.size)
