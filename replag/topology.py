"""Regions, endpoints and replica groups: what replag probes and repairs.

A `Region` has an optional write endpoint (a Redis primary or a Dynomite
client port) and the replicas to observe there. An endpoint's URL is how the
prober reaches it; `local` is its address inside its own region where that
differs (behind a WAN, a NAT, a load balancer): a region's agent uses it. A
`ReplicaGroup` is a set of Redis servers that should hold the same data; repair
compares them, and its kind (a replication group, Dynomite racks, independent
peers) decides how it repairs them. Endpoints keep their password out of every repr and every dict
meant for output.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from replag.wire.reply_limits import DEFAULT as DEFAULT_LIMITS
from replag.wire.reply_limits import ReplyLimits

EndpointKind = Literal["redis", "dynomite"]
TlsVerify = Literal["full", "ca-only", "none"]


@dataclass(frozen=True, kw_only=True)
class TlsOptions:
    """How a rediss:// endpoint's TLS is set up: every connection to it (the timing and
    scan clients, redis-py's admin clients, scan processes, agents) builds its context
    from these (`replag.wire.connections.tls_context`).

    `ca`: a CA file (PEM) or a directory of hashed CA certificates (None: the system's);
    `cert`/`key`: the client certificate and its key, for `tls-auth-clients yes`;
    `server_name`: sent in SNI and checked against the certificate (None: the host);
    `verify`: full (CA and name), ca-only (CA, any name) or none.
    """

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None
    verify: TlsVerify = "full"
    min_version: Literal["1.2", "1.3"] = "1.2"

    def changed(self) -> dict[str, str]:
        """The options that differ from the defaults, by name (what a file writes)."""
        default = TlsOptions()
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        }


# URL query options read into TlsOptions: replag's names, and redis-py's for the same
# things (a URL copied from a redis-py application keeps working).
_TLS_URL_OPTIONS = {
    "tls_ca": "ca",
    "tls_cert": "cert",
    "tls_key": "key",
    "tls_server_name": "server_name",
    "tls_verify": "verify",
    "tls_min_version": "min_version",
    "ssl_ca_certs": "ca",
    "ssl_ca_path": "ca",
    "ssl_certfile": "cert",
    "ssl_keyfile": "key",
}
_VERIFY = ("full", "ca-only", "none")
_VERSIONS = {"1.2": "1.2", "1.3": "1.3", "TLSv1_2": "1.2", "TLSv1_3": "1.3"}


def tls_from_query(query: str, *, tls: TlsOptions | None, url: str) -> TlsOptions | None:
    """`tls` with the URL's query options applied; ValueError naming an unknown or
    misplaced option (a redis:// URL takes none: TLS options would be silently unused)."""
    if not query:
        return tls
    values: dict[str, str] = {}
    cert_reqs = check_hostname = None
    for name, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        if name in _TLS_URL_OPTIONS:
            values[_TLS_URL_OPTIONS[name]] = value
        elif name == "ssl_cert_reqs":
            cert_reqs = value.lower()
        elif name == "ssl_check_hostname":
            check_hostname = value.lower()
        elif name == "ssl_min_version":
            values["min_version"] = value
        else:
            known = ", ".join([*_TLS_URL_OPTIONS, "ssl_cert_reqs", "ssl_check_hostname"])
            raise ValueError(
                f"unknown URL option {name!r} in {_redact_raw(url)!r} (a URL takes only TLS "
                f"options: {known}; timeouts, users and passwords are settings or table keys)"
            )
    if cert_reqs is not None:
        if cert_reqs not in ("required", "none"):
            raise ValueError(
                f"ssl_cert_reqs={cert_reqs} is not supported in {_redact_raw(url)!r}: "
                "required or none (or tls_verify=full|ca-only|none)"
            )
        values.setdefault("verify", "none" if cert_reqs == "none" else "full")
    if check_hostname is not None:
        if check_hostname not in ("true", "false"):
            raise ValueError(f"ssl_check_hostname must be true or false in {_redact_raw(url)!r}")
        if check_hostname == "false" and values.get("verify", "full") == "full":
            values["verify"] = "ca-only"
    if tls is None:
        raise ValueError(
            f"TLS options on a redis:// URL: {_redact_raw(url)!r} (use rediss:// for TLS)"
        )
    if values.get("verify", tls.verify) not in _VERIFY:
        raise ValueError(f"tls_verify must be one of {', '.join(_VERIFY)} in {_redact_raw(url)!r}")
    if "min_version" in values:
        if values["min_version"] not in _VERSIONS:
            raise ValueError(f"TLS minimum version must be 1.2 or 1.3 in {_redact_raw(url)!r}")
        values["min_version"] = _VERSIONS[values["min_version"]]
    empty = [k for k, v in values.items() if not v]
    if empty:
        raise ValueError(f"URL option for {empty[0]} is empty in {_redact_raw(url)!r}")
    return replace(tls, **values)  # type: ignore[arg-type]  # checked above


# replication: a primary and its replicas (a Cluster shard, a Sentinel master's set): the
# primary is the truth. dynomite: the racks holding one token. peers: independent
# servers kept alike by something else. auto: replication when a member is a replica
# (INFO replication, read when a run starts), else peers.
GroupKind = Literal["auto", "replication", "dynomite", "peers"]
GROUP_KINDS: tuple[GroupKind, ...] = ("auto", "replication", "dynomite", "peers")


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    """One Redis-protocol server. `kind="dynomite"` marks a proxy client port."""

    name: str
    host: str
    port: int
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    # None: plain TCP (redis://); rediss:// endpoints carry how to set TLS up.
    tls: TlsOptions | None = None
    kind: EndpointKind = "redis"
    region: str | None = None
    rack: str | None = None
    # (host, port) of the same server as seen from inside its region, when not the URL's.
    local: tuple[str, int] | None = None
    # A Redis Cluster node (found when a run starts, never configured): connections send
    # READONLY, so a replica serves reads of its primary's slots instead of MOVED.
    cluster: bool = False
    # What a reply from it may hold (settings.max_reply_*): every connection applies them.
    limits: ReplyLimits = field(default=DEFAULT_LIMITS, compare=False, repr=False)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        name: str | None = None,
        kind: EndpointKind = "redis",
        region: str | None = None,
        rack: str | None = None,
    ) -> Endpoint:
        """Parse redis://[user[:password]@]host[:port][/db] or rediss://…[?tls_ca=…];
        ValueError if bad (an unknown query option included)."""
        if not isinstance(url, str):
            raise ValueError(f"expected a Redis URL string, got {type(url).__name__}")
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss"):
            raise ValueError(f"not a Redis URL (want redis:// or rediss://): {_redact_raw(url)!r}")
        if not parts.hostname:
            raise ValueError(f"Redis URL has no host: {_redact_raw(url)!r}")
        try:
            port = parts.port or 6379
        except ValueError:
            raise ValueError(f"Redis URL has a bad port: {_redact_raw(url)!r}") from None
        path = parts.path.strip("/")
        if path and not path.isdigit():
            raise ValueError(f"Redis URL database must be a number: {_redact_raw(url)!r}")
        host = parts.hostname
        tls = TlsOptions() if parts.scheme == "rediss" else None
        tls = tls_from_query(parts.query, tls=tls, url=url)
        return cls(
            name=name or f"{host}:{port}",
            host=host,
            port=port,
            db=int(path) if path else 0,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            tls=tls,
            kind=kind,
            region=region,
            rack=rack,
        )

    @property
    def address(self) -> str:
        """host:port, safe to print."""
        return f"{self.host}:{self.port}"

    def in_region(self) -> Endpoint:
        """The endpoint as a process in its own region reaches it (its `local` address)."""
        if self.local is None:
            return self
        host, port = self.local
        return replace(self, host=host, port=port, local=None)

    def url(self, *, redact: bool = True) -> str:
        """The URL, with the password shown as *** unless redact=False."""
        scheme = "rediss" if self.tls else "redis"
        auth = ""
        if self.username or self.password:
            user = quote(self.username or "", safe="")
            if self.password:
                secret = "***" if redact else quote(self.password, safe="")
                auth = f"{user}:{secret}@"
            else:
                auth = f"{user}@"
        db = f"/{self.db}" if self.db else ""
        return f"{scheme}://{auth}{self.host}:{self.port}{db}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "url": self.url(),
            "kind": self.kind,
            "region": self.region,
            "rack": self.rack,
        }
        if self.local is not None:
            out["local"] = f"{self.local[0]}:{self.local[1]}"
        return out


def _same_server(a: Endpoint, b: Endpoint) -> bool:
    return (a.host, a.port, a.db) == (b.host, b.port, b.db)


def _redact_raw(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        return url.replace(f":{parts.password}@", ":***@", 1)
    return url


@dataclass(frozen=True, kw_only=True)
class SentinelRef:
    """The Sentinel master a region belongs to, and the Sentinels that know where it is.

    A region with `sentinel` has its write endpoint re-resolved through these
    Sentinels when it stops being the primary (the probe follows a failover);
    regions naming the same master share one replication tree.
    """

    master: str
    sentinels: tuple[Endpoint, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"master": self.master, "sentinels": [s.url() for s in self.sentinels]}


def sentinel_endpoint(text: str) -> Endpoint:
    """A Sentinel given as `host[:port]` or a redis:// URL (port 26379 when none is given)."""
    url = text if "://" in text else f"redis://{text}"
    ep = Endpoint.from_url(url)
    if urlsplit(url).port is None:
        ep = replace(ep, port=26379)
    return replace(ep, name=f"sentinel {ep.host}:{ep.port}")


@dataclass(frozen=True, kw_only=True)
class Region:
    """A region (or a Redis Cluster shard): where probes write, and the replicas observed.

    `slots` is set for a Redis Cluster shard: probe keys are then chosen to hash
    into those slots so the primary accepts them. `write_fallbacks` are written
    through, in order, when `write` does not answer (another rack's Dynomite
    client port of the same DC).
    """

    name: str
    write: Endpoint | None
    replicas: tuple[Endpoint, ...]
    write_fallbacks: tuple[Endpoint, ...] = ()
    slots: tuple[tuple[int, int], ...] = ()
    # A Redis Cluster shard's identity (its shard id, or a node id of it): how the probe
    # finds the shard again after a failover or a reshard.
    shard: str | None = None
    sentinel: SentinelRef | None = None
    # URL of the region's `replag agent` (http:// or https://), if one runs there, and for
    # https:// how the coordinator verifies it and which client certificate it presents.
    agent: str | None = None
    agent_tls: TlsOptions | None = None
    # The cluster the region belongs to, where one service watches many (None: the only one).
    cluster: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "write": self.write.to_dict() if self.write else None,
            "replicas": [r.to_dict() for r in self.replicas],
        }
        if self.write_fallbacks:
            out["write_fallbacks"] = [ep.to_dict() for ep in self.write_fallbacks]
        if self.slots:
            out["slots"] = [list(r) for r in self.slots]
        if self.shard:
            out["shard"] = self.shard
        if self.sentinel:
            out["sentinel"] = self.sentinel.to_dict()
        if self.agent:
            out["agent"] = self.agent
        if self.agent_tls is not None and self.agent_tls.changed():
            out["agent_tls"] = self.agent_tls.changed()
        if self.cluster:
            out["cluster"] = self.cluster
        return out


@dataclass(frozen=True, kw_only=True)
class ReplicaGroup:
    """Redis servers that should hold the same data (a shard's copies, one per rack)."""

    name: str
    members: tuple[Endpoint, ...]
    slots: tuple[tuple[int, int], ...] = ()
    kind: GroupKind = "auto"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "members": [m.to_dict() for m in self.members],
        }
        if self.slots:
            out["slots"] = [list(r) for r in self.slots]
        return out


@dataclass(frozen=True, kw_only=True)
class Topology:
    regions: tuple[Region, ...]
    groups: tuple[ReplicaGroup, ...] = ()
    source_note: str = ""
    # CIDRs beyond the named endpoints where a server's answer may lead (settings.allow_networks).
    allow_networks: tuple[str, ...] = ()

    def region(self, name: str) -> Region:
        for region in self.regions:
            if region.name == name:
                return region
        known = ", ".join(r.name for r in self.regions)
        from replag.errors import UsageError

        raise UsageError(f"unknown region {name!r} (known: {known})")

    def group(self, name: str) -> ReplicaGroup:
        for group in self.groups:
            if group.name == name:
                return group
        known = ", ".join(g.name for g in self.groups) or "none"
        from replag.errors import NotFound

        raise NotFound(f"unknown replica group {name!r} (known: {known})")

    def observed_from(self, source: Region) -> list[Region]:
        """Regions whose replicas receive what is written in `source`.

        A Redis Cluster shard's keys reach only its own replicas, a Sentinel master's
        only the regions naming that master, a cluster's only its own regions; elsewhere
        every region's replicas (the source's own racks included) should receive them.
        """
        if source.slots:
            return [source]
        regions = [r for r in self.regions if r.cluster == source.cluster]
        if source.sentinel is not None:
            master = source.sentinel.master
            return [r for r in regions if r.sentinel and r.sentinel.master == master]
        return regions

    def reached_from(
        self, source: Region, write: Endpoint
    ) -> tuple[list[tuple[Region, Endpoint]], list[Endpoint]]:
        """(region, server) pairs a write through `write` in `source` should reach, and the
        configured replicas left out because they are `write` itself.

        Under Sentinel and in a Redis Cluster shard the configured write endpoint is one
        server of the set like the others: once demoted by a failover it is a replica, and
        observed as one.
        """
        out: list[tuple[Region, Endpoint]] = []
        skipped: list[Endpoint] = []
        for region in self.observed_from(source):
            servers = list(region.replicas)
            if (region.sentinel is not None or region.slots) and region.write is not None:
                servers.append(region.write)
            for ep in servers:
                if any(_same_server(ep, seen) for _, seen in out):
                    continue
                if _same_server(ep, write):
                    if ep in region.replicas:
                        skipped.append(ep)
                    continue
                out.append((region, ep))
        return out, skipped

    def with_limits(self, limits: ReplyLimits) -> Topology:
        """This topology with `limits` on every endpoint (Sentinels included)."""

        def each(eps: tuple[Endpoint, ...]) -> tuple[Endpoint, ...]:
            return tuple(replace(ep, limits=limits) for ep in eps)

        regions = []
        for r in self.regions:
            sentinel = r.sentinel
            if sentinel is not None:
                sentinel = replace(sentinel, sentinels=each(sentinel.sentinels))
            regions.append(
                replace(
                    r,
                    write=replace(r.write, limits=limits) if r.write else None,
                    replicas=each(r.replicas),
                    write_fallbacks=each(r.write_fallbacks),
                    sentinel=sentinel,
                )
            )
        groups = tuple(replace(g, members=each(g.members)) for g in self.groups)
        return replace(self, regions=tuple(regions), groups=groups)

    def endpoints(self) -> list[Endpoint]:
        """Every distinct endpoint, write endpoints first."""
        seen: dict[tuple[str, int, int], Endpoint] = {}
        for region in self.regions:
            writes = ((region.write,) if region.write else ()) + region.write_fallbacks
            for ep in writes + region.replicas:
                seen.setdefault((ep.host, ep.port, ep.db), ep)
        for group in self.groups:
            for ep in group.members:
                seen.setdefault((ep.host, ep.port, ep.db), ep)
        return list(seen.values())

    def agent_of(self, endpoint: Endpoint) -> str | None:
        """URL of the agent of `endpoint`'s region, if that region has one."""
        for region in self.regions:
            if region.name == endpoint.region:
                return region.agent
        return None

    def default_source(self) -> Region:
        for region in self.regions:
            if region.write is not None:
                return region
        from replag.errors import ConfigError

        raise ConfigError("no region has a write endpoint to probe from")

    def to_dict(self) -> dict[str, Any]:
        return {
            "regions": [r.to_dict() for r in self.regions],
            "groups": [g.to_dict() for g in self.groups],
        }
