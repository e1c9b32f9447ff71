"""`INFO replication` and `INFO stats` read into typed values.

Redis 6.2, Redis 7 and Valkey 8/9 print the same `key:value` lines here
(Valkey keeps the `slave*` spellings for compatibility); fields one version
lacks are None. Replica lines (`slaveN:ip=…,port=…,state=…,offset=…,lag=…`)
are the primary's view of each connected replica: its last acknowledged
offset, sent about once a second, and the seconds since that ACK.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replag.errors import DiscoveryError


def parse_info(text: bytes | str) -> dict[str, str]:
    """`key:value` lines of an INFO answer (section headers and blanks skipped)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def keyspace_keys(text: bytes | str) -> dict[int, int]:
    """Database number → keys, from an INFO keyspace answer (`db3:keys=100,expires=0,…`)."""
    out: dict[int, int] = {}
    for name, value in parse_info(text).items():
        if not name.startswith("db") or not name[2:].isdigit():
            continue
        for part in value.split(","):
            key, _, number = part.partition("=")
            if key == "keys" and number.isdigit():
                out[int(name[2:])] = int(number)
    return out


def _int(fields: dict[str, str], key: str) -> int | None:
    value = fields.get(key)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


@dataclass(frozen=True, kw_only=True)
class ListedReplica:
    """One `slaveN` line of a primary: a replica as the primary sees it."""

    host: str
    port: int
    state: str
    ack_offset: int | None
    ack_lag_s: int | None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "state": self.state,
            "ack_offset": self.ack_offset,
            "ack_lag_s": self.ack_lag_s,
        }


@dataclass(frozen=True, kw_only=True)
class ReplicationInfo:
    """One server's replication state, as `INFO replication` (and `INFO stats`) print it."""

    role: str
    replid: str
    replid2: str | None
    # master_repl_offset: the last byte of the replication stream this server holds.
    offset: int
    second_replid_offset: int | None
    backlog_active: bool
    backlog_size: int | None
    backlog_first_byte_offset: int | None
    backlog_histlen: int | None
    listed: tuple[ListedReplica, ...] = ()
    # Replica side (role slave); None on a primary.
    master_address: str | None = None
    link_status: str | None = None
    last_io_s: int | None = None
    link_down_s: int | None = None
    sync_in_progress: bool = False
    applied_offset: int | None = None  # slave_repl_offset: applied to the dataset
    read_offset: int | None = None  # slave_read_repl_offset (Redis 7+): read off the socket
    priority: int | None = None
    # slave_read_only: False on a replica clients may write to (replica-read-only no);
    # None where INFO does not say.
    read_only: bool | None = None
    # INFO stats (the syncs this server served as a primary); None if not read.
    sync_full: int | None = None
    sync_partial_ok: int | None = None
    sync_partial_err: int | None = None

    @property
    def is_primary(self) -> bool:
        return self.role == "master"

    @classmethod
    def parse(
        cls, replication: bytes | str, stats: bytes | str | None = None, *, where: str
    ) -> ReplicationInfo:
        """Read one server's answers; DiscoveryError (naming `where`) if they are not INFO."""
        fields = parse_info(replication)
        role = fields.get("role")
        offset = _int(fields, "master_repl_offset")
        if role not in ("master", "slave") or offset is None or "master_replid" not in fields:
            raise DiscoveryError(
                "INFO replication has no role, master_replid or master_repl_offset", where=where
            )
        stat_fields = parse_info(stats) if stats is not None else {}
        replid2 = fields.get("master_replid2")
        host, port = fields.get("master_host"), fields.get("master_port")
        link_down = _int(fields, "master_link_down_since_seconds")
        last_io = _int(fields, "master_last_io_seconds_ago")
        return cls(
            role=role,
            replid=fields["master_replid"],
            replid2=None if not replid2 or set(replid2) == {"0"} else replid2,
            offset=offset,
            second_replid_offset=_int(fields, "second_repl_offset"),
            backlog_active=fields.get("repl_backlog_active") == "1",
            backlog_size=_int(fields, "repl_backlog_size"),
            backlog_first_byte_offset=_int(fields, "repl_backlog_first_byte_offset"),
            backlog_histlen=_int(fields, "repl_backlog_histlen"),
            listed=_listed(fields),
            master_address=f"{host}:{port}" if host and port else None,
            link_status=fields.get("master_link_status"),
            last_io_s=last_io if last_io is not None and last_io >= 0 else None,
            # -1 means "never connected"; present only while the link is down.
            link_down_s=link_down if link_down is not None and link_down >= 0 else None,
            sync_in_progress=fields.get("master_sync_in_progress") == "1",
            applied_offset=_int(fields, "slave_repl_offset"),
            read_offset=_int(fields, "slave_read_repl_offset"),
            priority=_int(fields, "slave_priority")
            if "slave_priority" in fields
            else _int(fields, "replica_priority"),
            read_only=_flag(fields, "slave_read_only", "replica_read_only"),
            sync_full=_int(stat_fields, "sync_full"),
            sync_partial_ok=_int(stat_fields, "sync_partial_ok"),
            sync_partial_err=_int(stat_fields, "sync_partial_err"),
        )


def _flag(fields: dict[str, str], *names: str) -> bool | None:
    for name in names:
        if name in fields:
            return fields[name] == "1"
    return None


def _listed(fields: dict[str, str]) -> tuple[ListedReplica, ...]:
    out = []
    keys = sorted(
        (k for k in fields if k.startswith("slave") and k[5:].isdigit()), key=lambda k: int(k[5:])
    )
    for key in keys:
        attrs = dict(part.partition("=")[::2] for part in fields[key].split(","))
        try:
            port = int(attrs.get("port", ""))
        except ValueError:
            continue
        offset, lag = attrs.get("offset", ""), attrs.get("lag", "")
        out.append(
            ListedReplica(
                host=attrs.get("ip", ""),
                port=port,
                state=attrs.get("state", "unknown"),
                ack_offset=int(offset) if offset.lstrip("-").isdigit() else None,
                ack_lag_s=int(lag) if lag.lstrip("-").isdigit() else None,
            )
        )
    return tuple(out)
