"""What one replication sample found: per primary, per replica; JSON and table lines.

`bytes_behind` is the primary's offset minus the replica's applied offset,
with the primary read once before and once after the replica: the estimate
is taken against the midpoint of the two primary offsets and
`bytes_uncertainty` is half the bytes the primary wrote between them (the
read skew expressed in bytes), as lag samples carry half their bracket.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

ReplicaStatus = Literal["ok", "link-down", "syncing", "unreachable", "not-replicating"]


@dataclass(frozen=True, kw_only=True)
class ReplicaState:
    """One replica of one primary at one sample."""

    replica: str
    region: str
    address: str
    status: ReplicaStatus
    link_status: str | None = None
    last_io_s: int | None = None
    link_down_s: int | None = None
    sync_in_progress: bool = False
    offset: int | None = None
    read_offset: int | None = None
    ack_offset: int | None = None
    ack_lag_s: int | None = None
    bytes_behind: int | None = None
    bytes_uncertainty: int | None = None
    backlog_headroom: int | None = None
    headroom_fraction: float | None = None
    priority: int | None = None
    # False: replica-read-only no, so clients may have written to it (None: not known).
    read_only: bool | None = None
    error: str | None = None
    # Loading its dataset into memory (INFO persistence loading:1): a full resync's
    # snapshot after the transfer, or its own file after a restart. Status "syncing":
    # it refuses reads (LOADING) and applies nothing until loaded.
    loading: bool = False

    @property
    def link_up(self) -> bool:
        return self.status == "ok"

    @property
    def bytes_behind_max(self) -> int | None:
        """The bytes behind's upper bound (what a safety check compares)."""
        if self.bytes_behind is None:
            return None
        return self.bytes_behind + (self.bytes_uncertainty or 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "region": self.region,
            "address": self.address,
            "status": self.status,
            "link_up": self.link_up,
            "link_status": self.link_status,
            "last_io_s": self.last_io_s,
            "link_down_s": self.link_down_s,
            "sync_in_progress": self.sync_in_progress,
            "offset": self.offset,
            "read_offset": self.read_offset,
            "ack_offset": self.ack_offset,
            "ack_lag_s": self.ack_lag_s,
            "bytes_behind": self.bytes_behind,
            "bytes_uncertainty": self.bytes_uncertainty,
            "backlog_headroom": self.backlog_headroom,
            "headroom_fraction": _round(self.headroom_fraction, 4),
            "priority": self.priority,
            "read_only": self.read_only,
            "loading": self.loading,
            "error": self.error,
        }


@dataclass(frozen=True, kw_only=True)
class PrimaryState:
    """One primary (a region's write endpoint, or a Redis Cluster shard's) and its replicas."""

    source: str
    primary: str
    address: str
    sampled_ns: int  # UTC epoch ns of the read (for the store and series)
    read_skew_ns: int = 0  # the primary's two reads and every replica's fall within this
    offset: int | None = None
    offset_moved: int = 0  # bytes the primary wrote between its two reads
    replid: str | None = None
    backlog_size: int | None = None
    backlog_first_byte_offset: int | None = None
    backlog_histlen: int | None = None
    sync_full: int | None = None
    sync_partial_ok: int | None = None
    sync_partial_err: int | None = None
    write_rate_bps: float | None = None
    replicas: tuple[ReplicaState, ...] = ()
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "primary": self.primary,
            "address": self.address,
            "offset": self.offset,
            "offset_moved_during_read": self.offset_moved,
            "read_skew_ms": round(self.read_skew_ns / 1e6, 3),
            "replid": self.replid,
            "backlog": {
                "size": self.backlog_size,
                "first_byte_offset": self.backlog_first_byte_offset,
                "histlen": self.backlog_histlen,
            },
            "resyncs": {
                "full": self.sync_full,
                "partial_ok": self.sync_partial_ok,
                "partial_err": self.sync_partial_err,
            },
            "write_rate_bps": _round(self.write_rate_bps, 1),
            "replicas": [r.to_dict() for r in self.replicas],
            "error": self.error,
        }


@dataclass(kw_only=True)
class ReplicationSnapshot:
    """Every primary sampled at once, plus what the sampling cost."""

    primaries: list[PrimaryState] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    commands: int = 0
    duration_ns: int = 0

    def replica(self, name: str) -> ReplicaState | None:
        for primary in self.primaries:
            for state in primary.replicas:
                if state.replica == name:
                    return state
        return None

    def merge(self, other: ReplicationSnapshot) -> None:
        self.primaries += other.primaries
        self.notes += [n for n in other.notes if n not in self.notes]
        self.commands += other.commands
        self.duration_ns += other.duration_ns

    def to_dict(self) -> dict[str, Any]:
        return {
            "primaries": [p.to_dict() for p in self.primaries],
            "notes": self.notes,
            "commands": self.commands,
            "duration_ms": round(self.duration_ns / 1e6, 3),
        }

    def render(self) -> list[str]:
        """Table lines: one per replica, under a line per primary."""
        lines = []
        for p in self.primaries:
            if p.error:
                lines.append(f"replication of {p.source} ({p.primary}): ERROR {p.error}")
                continue
            rate = "-" if p.write_rate_bps is None else human_bytes(p.write_rate_bps) + "/s"
            lines.append(
                f"replication of {p.source} ({p.primary}, offset {p.offset}): "
                f"writes {rate}, backlog {human_bytes(p.backlog_size)}, resyncs since its "
                f"start: full {_dash(p.sync_full)}, partial {_dash(p.sync_partial_ok)} "
                f"({_dash(p.sync_partial_err)} refused), read skew {p.read_skew_ns / 1e6:.3f} ms"
            )
            lines.append(f"  {'replica':<18} {'link':<16} {'behind':>12} {'±':>8} {'headroom':>10}")
            for r in p.replicas:
                status: str = r.status if r.status != "ok" else "up"
                if r.link_down_s is not None:
                    status += f" {r.link_down_s} s"
                elif r.last_io_s is not None:
                    status += f" (io {r.last_io_s} s)"
                lines.append(
                    f"  {r.replica:<18} {status:<16} {human_bytes(r.bytes_behind):>12} "
                    f"{human_bytes(r.bytes_uncertainty):>8} {_headroom(r):>10}"
                    + (f"  {r.error}" if r.error else "")
                )
        lines += [f"note: {n}" for n in self.notes]
        return lines


def _headroom(r: ReplicaState) -> str:
    if r.backlog_headroom is None:
        return "-"
    if r.backlog_headroom < 0:
        return "FULL SYNC"
    return f"{(r.headroom_fraction or 0) * 100:.1f}%"  # 99.9 %, not a rounded 100 %


def human_bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B"


def _dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
