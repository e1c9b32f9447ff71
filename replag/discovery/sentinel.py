"""Discovery through Redis Sentinel: every master it monitors (or those named), their
replicas and the Sentinels watching them.

Each master becomes a region named after it (write = the master, replicas =
what `SENTINEL REPLICAS` lists) carrying `sentinel = { master, sentinels }`,
so the probe follows a failover; and a replica group per master for repair.
The Sentinel's password (from its URL) is the Sentinels'; data nodes are
written without one (add `password_env` to them if they need one).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from replag.discovery.contacts import Contacts, OutsideNetworks
from replag.discovery.deadline import Deadline
from replag.discovery.result import Discovery
from replag.errors import DiscoveryError, EndpointError, UnreachableError, UsageError
from replag.plural import count
from replag.replication import sentinel as ask
from replag.topology import (
    Endpoint,
    Region,
    ReplicaGroup,
    SentinelRef,
    Topology,
    sentinel_endpoint,
)
from replag.wire.reply_limits import DEFAULT as DEFAULT_LIMITS
from replag.wire.reply_limits import ReplyLimits


async def discover_sentinel(
    addresses: list[str],
    *,
    masters: list[str],
    timeout_s: float,
    contacts: Contacts | None = None,
    limits: ReplyLimits = DEFAULT_LIMITS,
) -> Discovery:
    """Ask the first of `addresses` that answers; `masters` narrows to those names. With
    `contacts.networks` (--allow-networks), a master, replica or Sentinel it names outside
    them is not written as an endpoint, only named in the header for the user to approve."""
    contacts = contacts or Contacts()
    try:
        sentinels = [replace(sentinel_endpoint(a), limits=limits) for a in addresses]
    except ValueError as exc:
        raise UsageError(f"--sentinel: {exc}") from None
    # Every Sentinel given is asked at once, under discovery's one deadline; the first
    # in the order given that answered is the one read.
    deadline = Deadline(timeout_s)
    answers = await deadline.each(
        sentinels,
        lambda sentinel: ask.masters(sentinel, timeout_s=timeout_s),
        where=lambda sentinel: sentinel.address,
        errors=(EndpointError,),
    )
    failures: list[str] = []
    for sentinel, monitored in zip(sentinels, answers, strict=True):
        if isinstance(monitored, list):
            return await _discover(sentinel, sentinels, monitored, masters, deadline, contacts)
        failures.append(str(monitored))
    raise UnreachableError("no Sentinel answered: " + "; ".join(failures))


async def _discover(
    sentinel: Endpoint,
    given: list[Endpoint],
    monitored: list[dict[str, str]],
    names: list[str],
    deadline: Deadline,
    contacts: Contacts,
) -> Discovery:
    by_name = {m.get("name", ""): m for m in monitored}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        known = ", ".join(sorted(by_name)) or "none"
        raise UsageError(
            f"--master: {unknown[0]!r} is not monitored by {sentinel.address} "
            f"(it monitors: {known})"
        )
    chosen = [by_name[n] for n in names] if names else [by_name[n] for n in sorted(by_name)]
    if not chosen:
        raise DiscoveryError("this Sentinel monitors no master", where=sentinel.url())
    timeout_s = deadline.timeout_s
    # Each master's replicas and Sentinels: asked of the Sentinel for every master at once.
    listings = await deadline.each(
        chosen,
        lambda master: _listing(sentinel, master.get("name", ""), timeout_s=timeout_s),
        where=lambda master: f"{sentinel.address} (master {master.get('name', '?')})",
        errors=(EndpointError,),
    )
    regions, groups = [], []
    comments: dict[str, str] = {}
    endpoint_comments: dict[str, str] = {}
    unread: list[str] = []
    for master, listing in zip(chosen, listings, strict=True):
        name = master["name"]
        try:
            primary = _node(master["ip"], int(master["port"]), f"{name}-primary", name, sentinel)
        except (KeyError, ValueError):
            raise DiscoveryError(
                f"SENTINEL MASTERS: bad entry {master!r}", where=sentinel.url()
            ) from None
        if not await _inside(contacts, primary):
            continue
        if not isinstance(listing, tuple):
            unread.append(f"{name} ({listing})")
            continue
        listed, others = listing
        watching = tuple(
            [ep for ep in _sentinels(sentinel, given, others) if await _inside(contacts, ep)]
        )
        replicas = []
        for i, entry in enumerate(listed, start=1):
            ep = _node(entry["ip"], int(entry["port"]), f"{name}-{i}", name, sentinel)
            if not await _inside(contacts, ep):
                continue
            replicas.append(ep)
            endpoint_comments[ep.name] = (
                f"Sentinel flags {entry.get('flags', '?')}, link "
                f"{entry.get('master-link-status', '?')}, priority "
                f"{entry.get('slave-priority', '?')}, offset {entry.get('slave-repl-offset', '?')}"
            )
        endpoint_comments[primary.name] = (
            f"primary of {name} per Sentinel (flags {master.get('flags', '?')}, quorum "
            f"{master.get('quorum', '?')}, {len(watching)} Sentinels)"
        )
        regions.append(
            Region(
                name=name,
                write=primary,
                replicas=tuple(replicas),
                sentinel=SentinelRef(master=name, sentinels=watching),
            )
        )
        comments[name] = (
            f"Sentinel master {name} (the probe follows its failovers through the Sentinels)"
        )
        if replicas:
            groups.append(ReplicaGroup(name=name, members=(primary, *replicas), kind="replication"))
    header = (
        f"Discovered from Sentinel {sentinel.address}: {count(len(regions), 'master')}.\n"
        "Data nodes are written without a password: add password_env where they need one."
    )
    if unread:
        header += "\nMasters left out, their replicas or Sentinels not read: " + "; ".join(unread)
    return Discovery(
        topology=Topology(regions=tuple(regions), groups=tuple(groups)),
        header=header,
        comments=comments,
        endpoint_comments=endpoint_comments,
        facts={"masters": [r.name for r in regions], "sentinel": sentinel.address},
    )


async def _listing(
    sentinel: Endpoint, master: str, *, timeout_s: float
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(SENTINEL REPLICAS, SENTINEL SENTINELS) of `master`, asked at once."""
    listed, others = await asyncio.gather(
        ask.replicas(sentinel, master, timeout_s=timeout_s),
        ask.other_sentinels(sentinel, master, timeout_s=timeout_s),
    )
    return listed, others


async def _inside(contacts: Contacts, endpoint: Endpoint) -> bool:
    """Whether `endpoint` may be written (inside --allow-networks); if not, it is recorded
    as refused, for the file's header."""
    try:
        await contacts.reach(endpoint)
    except OutsideNetworks:
        return False
    return True


def _node(host: str, port: int, name: str, region: str, sentinel: Endpoint) -> Endpoint:
    """A data node: TLS (and its options) as the Sentinel asked, as with tls-replication."""
    return Endpoint(name=name, host=host, port=port, region=region, tls=sentinel.tls)


def _sentinels(
    asked: Endpoint, given: list[Endpoint], others: list[dict[str, str]]
) -> tuple[Endpoint, ...]:
    """The Sentinel asked, the others given, then those it knows of (with the asked one's auth)."""
    out: dict[str, Endpoint] = {asked.address: asked}
    for ep in given:
        out.setdefault(ep.address, ep)
    for entry in others:
        try:
            ep = replace(asked, host=entry["ip"], port=int(entry["port"]))
        except (KeyError, ValueError):
            continue
        out.setdefault(ep.address, replace(ep, name=f"sentinel {ep.address}"))
    return tuple(out.values())
