"""The config file's tables as Structs: `[[regions]]`, `[[groups]]`, endpoints, Sentinels, the file.

An endpoint is written as a URL string or as a table with `url`; a group member
may also be the name of an endpoint declared under a region. The tables check
the shape, each value and the references between them (duplicate names, members
naming no endpoint); `ConfigFile.topology()` then builds the `Topology`, and the
`of` constructors go the other way, for writing a file (`config.render_config`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any, ClassVar
from urllib.parse import urlsplit

import msgspec

from replag.alerts.tables import AlertsTable
from replag.config_security import AccessKeys, ApiTokenTable, EndpointDefaults, TlsKeys
from replag.topology import (
    Endpoint,
    EndpointKind,
    GroupKind,
    Region,
    ReplicaGroup,
    SentinelRef,
    TlsOptions,
    Topology,
    sentinel_endpoint,
)
from replag.validation import AtKey, FileTable, Loc, NonEmptyStr

_SLOTS = 16384


class SlotRange(tuple[int, int]):
    """A Redis Cluster hash slot range, written [start, end] (inclusive)."""

    @classmethod
    def parse(cls, value: Any) -> SlotRange:
        if (
            not isinstance(value, list)
            or len(value) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in value)
            or not 0 <= value[0] <= value[1] < _SLOTS
        ):
            raise ValueError(f"bad slot range {value!r}: expected [start, end] within 0–16383")
        return cls(value)


class AgentUrl(str):
    """Where a region's `replag agent` listens."""

    @classmethod
    def parse(cls, value: Any) -> AgentUrl:
        if not isinstance(value, str) or not value.startswith(("http://", "https://")):
            raise ValueError(f"expected the agent's http:// or https:// URL, got {value!r}")
        return cls(value.rstrip("/"))


class AgentTable(TlsKeys, frozen=True, kw_only=True):
    """`agent = { url = "https://…", tls_ca = …, tls_cert = …, tls_key = …, tls_server_name
    = …, tls_verify = … }`: the region's agent, and how the coordinator reaches it over TLS
    (what it leaves out comes from settings.agent_tls_ca/agent_tls_client_cert/_key)."""

    noun: ClassVar[str] = "agent"
    url: str

    def __post_init__(self) -> None:
        try:
            AgentUrl.parse(self.url)
        except ValueError as exc:
            raise AtKey(("url",), str(exc)) from None
        self.check_tls(tls=self.url.startswith("https://"), plain="http://", secure="https://")

    def tls(self, defaults: EndpointDefaults) -> TlsOptions | None:
        """How the coordinator speaks TLS to it (None for http://)."""
        if not self.url.startswith("https://"):
            return None
        return self.tls_options(defaults.agent_tls)

    @classmethod
    def of(cls, url: str, tls: TlsOptions | None) -> str | AgentTable:
        keys = {f"tls_{k}": v for k, v in tls.changed().items()} if tls is not None else {}
        return cls(url=url, **keys) if keys else url  # type: ignore[arg-type]  # as written


def _agent_table(raw: str | AgentTable) -> AgentTable:
    if isinstance(raw, AgentTable):
        return raw
    try:
        return AgentTable(url=raw)
    except AtKey as exc:
        raise AtKey(("agent",), str(exc)) from None


class SentinelAddress(str):
    """A Sentinel, written `host[:port]` or as a redis:// URL (port 26379 when none is given)."""

    @classmethod
    def parse(cls, value: Any) -> SentinelAddress:
        if not isinstance(value, str):
            raise ValueError("expected a Sentinel's host:port or redis:// URL")
        sentinel_endpoint(value)  # ValueError saying what is wrong, the password hidden
        return cls(value)


class EndpointTable(AccessKeys, frozen=True, kw_only=True):
    """`{ name = …, url = …, local = …, rack = …, kind = …, password_env = …, tls_ca = …, … }`
    (the TLS and credential keys: `replag.config_security.AccessKeys`).

    `local` is the same server's address from inside its region, when `url` is how
    the prober reaches it from elsewhere (a WAN, a NAT): only host and port may differ.
    """

    noun: ClassVar[str] = "endpoint"
    name: NonEmptyStr | None = None
    url: str
    local: str | None = None
    rack: str | None = None
    kind: EndpointKind | None = None  # None: where it is written decides

    def __post_init__(self) -> None:
        try:
            ep = Endpoint.from_url(self.url)
        except ValueError as exc:  # says what is wrong, the password hidden
            raise AtKey((), str(exc)) from None
        self.check_access(tls=ep.tls is not None)
        if self.local is not None:
            _local_address(self.local, ep)

    def endpoint(
        self,
        *,
        name: str,
        region: str | None,
        kind: EndpointKind,
        environ: Mapping[str, str],
        defaults: EndpointDefaults,
    ) -> Endpoint:
        ep = Endpoint.from_url(
            self.url, name=self.name or name, kind=self.kind or kind, region=region, rack=self.rack
        )
        if self.local is not None:
            ep = replace(ep, local=_local_address(self.local, ep))
        # A Dynomite client port has no ACL users: file-wide credentials are for Redis.
        return self.apply(
            ep, url=self.url, defaults=defaults, environ=environ, use_defaults=ep.kind == "redis"
        )

    @classmethod
    def of(cls, ep: Endpoint, *, redact: bool) -> EndpointTable:
        local = None
        if ep.local is not None:
            local = f"{'rediss' if ep.tls else 'redis'}://{ep.local[0]}:{ep.local[1]}"
        kind = ep.kind if ep.kind != "redis" else None
        return cls(
            name=ep.name,
            url=ep.url(redact=redact),
            local=local,
            rack=ep.rack,
            kind=kind,
            **cls.written(ep),
        )


def _local_address(raw: str, ep: Endpoint) -> tuple[str, int]:
    """`local = "redis://host:port"`: the same server (database, credentials, TLS) from
    inside its region; only the address differs. AtKey("local") when it is not."""
    try:
        local = Endpoint.from_url(raw)
    except ValueError as exc:
        raise AtKey(("local",), str(exc)) from None
    if local.username or local.password:
        raise AtKey(("local",), "credentials belong in `url` or `password_env`, not here")
    if (local.tls is None) != (ep.tls is None):
        raise AtKey(("local",), f"scheme differs from the url's ({ep.url()})")
    if local.db != ep.db and urlsplit(raw).path.strip("/"):
        raise AtKey(("local",), f"database {local.db} differs from the url's ({ep.db})")
    return local.host, local.port


def _table(raw: str | EndpointTable, key: Loc) -> EndpointTable:
    """An endpoint written as a bare URL, as a table; AtKey under `key` when it is bad."""
    if isinstance(raw, EndpointTable):
        return raw
    try:
        return EndpointTable(url=raw)
    except AtKey as exc:
        raise exc.under(*key) from None


class SentinelTable(AccessKeys, frozen=True, kw_only=True):
    """`sentinel = { master = NAME, sentinels = ["host:26379", …], password_env = … }`, with
    the TLS and credential keys of an endpoint (file-wide credentials are not used: a
    Sentinel has users of its own)."""

    noun: ClassVar[str] = "Sentinel"
    master: NonEmptyStr
    sentinels: list[SentinelAddress] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        schemes = {sentinel_endpoint(address).tls is not None for address in self.sentinels}
        self.check_access(tls=True in schemes)

    def ref(self, environ: Mapping[str, str], defaults: EndpointDefaults) -> SentinelRef:
        sentinels = (
            self.apply(ep, url=address, defaults=defaults, environ=environ, use_defaults=False)
            for address, ep in ((a, sentinel_endpoint(a)) for a in self.sentinels)
        )
        return SentinelRef(master=self.master, sentinels=tuple(sentinels))

    @classmethod
    def of(cls, ref: SentinelRef, *, redact: bool) -> SentinelTable:
        addresses = [SentinelAddress(s.url(redact=redact)) for s in ref.sentinels]
        tls = cls.written(ref.sentinels[0]) if ref.sentinels else {}
        return cls(master=ref.master, sentinels=addresses, **tls)


class RegionTable(FileTable, frozen=True, kw_only=True):
    """`[[regions]]`: a write endpoint (a primary or a Dynomite client port) and replicas,
    optionally the region's agent and the Sentinel master it belongs to."""

    noun: ClassVar[str] = "region"
    name: NonEmptyStr
    agent: str | AgentTable | None = None
    write: str | EndpointTable | None = None
    write_kind: EndpointKind = "redis"
    # Written through in order when `write` does not answer (each rack's Dynomite client
    # port of the DC); of `write_kind` unless a table says otherwise.
    write_fallbacks: list[str | EndpointTable] = msgspec.field(default_factory=list)
    replicas: list[str | EndpointTable] = msgspec.field(default_factory=list)
    slots: list[SlotRange] = msgspec.field(default_factory=list)
    # A Redis Cluster shard's identity (shard id or node id), written by discovery.
    shard: NonEmptyStr | None = None
    sentinel: SentinelTable | None = None
    # The cluster (replication tree, estate member) the region belongs to: a probe from it
    # is observed only on regions of the same cluster. Unset: the file is one cluster.
    cluster: NonEmptyStr | None = None

    def __post_init__(self) -> None:
        if self.agent is not None:
            _agent_table(self.agent)
        if not list(self.endpoints()):  # bare URLs are checked as they are read
            raise ValueError("a region needs a write endpoint or replicas")
        if self.sentinel is not None and self.write is not None:
            if (_table(self.write, ("write",)).kind or self.write_kind) != "redis":
                raise AtKey(
                    ("sentinel",),
                    "a Sentinel master's write endpoint is a Redis primary, not a proxy port",
                )
            if not self.sentinel.sentinels:
                raise AtKey(
                    ("sentinel", "sentinels"),
                    'list the Sentinels (sentinels = ["redis://host:26379", …]) to follow '
                    "the write endpoint through a failover",
                )
        if self.write_fallbacks and self.write is None:
            raise AtKey(("write_fallbacks",), "fallbacks of a write endpoint need `write`")
        if self.write_fallbacks and self.sentinel is not None:
            raise AtKey(
                ("write_fallbacks",), "a Sentinel region's write endpoint moves with Sentinel"
            )

    def endpoints(self) -> Iterator[tuple[Loc, EndpointTable, str, EndpointKind]]:
        """(key, table, default name, default kind) of each endpoint, in file order."""
        if self.write is not None:
            yield ("write",), _table(self.write, ("write",)), f"{self.name}-write", self.write_kind
        for j, raw in enumerate(self.write_fallbacks):
            key: Loc = ("write_fallbacks", j)
            yield key, _table(raw, key), f"{self.name}-write-{j + 2}", self.write_kind
        for j, raw in enumerate(self.replicas):
            yield ("replicas", j), _table(raw, ("replicas", j)), f"{self.name}-{j + 1}", "redis"

    def region(self, environ: Mapping[str, str], defaults: EndpointDefaults) -> Region:
        endpoints = {
            key: table.endpoint(
                name=name, region=self.name, kind=kind, environ=environ, defaults=defaults
            )
            for key, table, name, kind in self.endpoints()
        }
        return Region(
            name=self.name,
            write=endpoints.get(("write",)),
            write_fallbacks=tuple(
                ep for key, ep in endpoints.items() if key[0] == "write_fallbacks"
            ),
            replicas=tuple(ep for key, ep in endpoints.items() if key[0] == "replicas"),
            slots=tuple((start, end) for start, end in self.slots),
            shard=self.shard,
            sentinel=self.sentinel.ref(environ, defaults) if self.sentinel else None,
            agent=str(AgentUrl.parse(_agent_table(self.agent).url)) if self.agent else None,
            agent_tls=_agent_table(self.agent).tls(defaults) if self.agent else None,
            cluster=self.cluster,
        )

    @classmethod
    def of(cls, region: Region, *, redact: bool) -> RegionTable:
        write = region.write
        return cls(
            name=region.name,
            agent=AgentTable.of(region.agent, region.agent_tls) if region.agent else None,
            write=EndpointTable.of(write, redact=redact) if write else None,
            write_kind=write.kind if write else "redis",
            write_fallbacks=[EndpointTable.of(ep, redact=redact) for ep in region.write_fallbacks],
            replicas=[EndpointTable.of(ep, redact=redact) for ep in region.replicas],
            slots=[SlotRange(s) for s in region.slots],
            shard=region.shard,
            sentinel=SentinelTable.of(region.sentinel, redact=redact) if region.sentinel else None,
            cluster=region.cluster,
        )


class GroupTable(FileTable, frozen=True, kw_only=True):
    """`[[groups]]`: Redis servers that should hold the same data. A member is an
    endpoint (URL or table) or the name of one declared under a region."""

    noun: ClassVar[str] = "group"
    name: NonEmptyStr
    # How repair treats the members (docs/repair/kinds.md): replication, dynomite, peers,
    # or auto (replication when the roles say so at the run's start, else peers).
    kind: GroupKind = "auto"
    members: list[str | EndpointTable]
    slots: list[SlotRange] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.members) < 2:
            raise AtKey(("members",), "a group needs at least 2 members")
        list(self.written_members())  # bare URLs are checked as they are read

    def written_members(self) -> Iterator[tuple[int, str | EndpointTable]]:
        """(index, member): a declared endpoint's name, or the member's own table."""
        for j, raw in enumerate(self.members):
            named = isinstance(raw, str) and "://" not in raw
            yield j, raw if named else _table(raw, ("members", j))

    def group(
        self,
        declared: Mapping[str, Endpoint],
        environ: Mapping[str, str],
        defaults: EndpointDefaults,
    ) -> ReplicaGroup:
        members = tuple(
            declared[member]
            if isinstance(member, str)
            else member.endpoint(name=f"{self.name}-{j + 1}", region=None, kind="redis",
                                 environ=environ, defaults=defaults)
            for j, member in self.written_members()
        )  # fmt: skip
        slots = tuple((start, end) for start, end in self.slots)
        return ReplicaGroup(name=self.name, members=members, slots=slots, kind=self.kind)

    @classmethod
    def of(cls, group: ReplicaGroup, *, declared: set[str], redact: bool) -> GroupTable:
        """Members declared under a region are written by name."""
        members: list[str | EndpointTable] = [
            m.name if m.name in declared else EndpointTable.of(m, redact=redact)
            for m in group.members
        ]
        return cls(
            name=group.name,
            kind=group.kind,
            members=members,
            slots=[SlotRange(s) for s in group.slots],
        )


class ConfigFile(FileTable, frozen=True, kw_only=True):
    """The whole file. `[settings]` is resolved by `replag.settings` (with REPLAG_*)."""

    settings: dict[str, Any] = msgspec.field(default_factory=dict)
    regions: list[RegionTable] = msgspec.field(default_factory=list)
    groups: list[GroupTable] = msgspec.field(default_factory=list)
    alerts: AlertsTable = msgspec.field(default_factory=AlertsTable)
    api_tokens: list[ApiTokenTable] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.regions and not self.groups:
            raise ValueError("no [[regions]] and no [[groups]]: nothing to probe or repair")
        kinds = self._declared_kinds()
        for i, group in enumerate(self.groups):
            for j, member in group.written_members():
                if isinstance(member, str) and member not in kinds:
                    raise AtKey(("groups", i, "members", j), f"no endpoint named {member!r}")
                kind = kinds[member] if isinstance(member, str) else member.kind or "redis"
                if kind != "redis":
                    raise AtKey(
                        ("groups", i), "group members must be Redis servers, not proxy ports"
                    )

    def _declared_kinds(self) -> dict[str, EndpointKind]:
        """Endpoint name → kind of every endpoint under a region; AtKey on a duplicate."""
        kinds: dict[str, EndpointKind] = {}
        regions: set[str] = set()
        for i, region in enumerate(self.regions):
            if region.name in regions:
                raise AtKey(("regions", i, "name"), f"duplicate region {region.name!r}")
            regions.add(region.name)
            for key, table, default_name, kind in region.endpoints():
                name = table.name or default_name
                if name in kinds:
                    raise AtKey(("regions", i, *key), f"duplicate endpoint name {name!r}")
                kinds[name] = table.kind or kind
        return kinds

    def topology(
        self, environ: Mapping[str, str], defaults: EndpointDefaults | None = None
    ) -> Topology:
        defaults = defaults or EndpointDefaults()
        regions = tuple(table.region(environ, defaults) for table in self.regions)
        declared = {ep.name: ep for r in regions for ep in (r.write, *r.replicas) if ep}
        groups = tuple(table.group(declared, environ, defaults) for table in self.groups)
        return Topology(regions=regions, groups=groups)
