"""What each mode of replag may do on a Redis server, as ACL rules, and a check of them.

`acl_line(mode, user, …)` is what `replag acl` prints: `ACL SETUSER NAME <rules>`,
rules only (the operator adds `on` and a password). Per mode, the commands,
key patterns and channel patterns:

- probe: write and delete probe keys (`~<prefix>*`), read them back (MGET) or
  subscribe to their keyspace events (`&__keyspace@<db>__:<prefix>*`, the fixed
  pattern the probe subscribes to), TIME for clock offsets, INFO for replication
  state. Never CONFIG GET (it reads `requirepass` and `masterauth` too): whether a
  replica publishes is learned from its events (`probes.observers`) or declared
  (`settings.notify_keyspace_events`).
- check: read every key (`~*`): SCAN, TYPE, PTTL, OBJECT ENCODING and each type's
  readers; on a Redis Cluster the read-only CLUSTER subcommands that tell which
  slots moved and which keys lie in slots a shard does not serve (NODES, SLOTS,
  COUNTKEYSINSLOT, GETKEYSINSLOT). The probe follows a shard with CLUSTER INFO,
  SHARDS and SLOTS. Cluster subcommands are tried on cluster nodes only.
- repair: check, plus the writes a repair makes (DUMP/RESTORE, WATCH/MULTI/EXEC,
  each type's writers, DEL/UNLINK, PEXPIRE/PEXPIREAT/PERSIST, RENAME).

What only some servers have is granted by `features` (`replag acl --server KIND`,
`SERVERS` says which kind has which), as a server that lacks a command refuses a
rule naming it (`ACL SETUSER` fails): hash-field TTLs (`field_ttls`, Redis 7.4+
and Valkey 9+: HPEXPIRETIME read, HPEXPIREAT written), vector sets (`vector_sets`,
Redis 8: VINFO, VRANDMEMBER, VEMB, VGETATTR, VCARD; copied by DUMP/RESTORE only),
CLUSTER GETSLOTMIGRATIONS (`valkey_9`), CLUSTER SLOT-STATS (`slot_stats`, Valkey
8+ and Redis 8.2+: each slot's key count, primary against replica,
`repair.slot_counts`; refused, a check goes without it, once a run; also
`replag acl --slot-stats`), and RedisJSON's readers (`rejson`, where
the module is loaded: JSON.GET, JSON.DEBUG MEMORY). The default line has none of
them: every supported server (Redis 6.2 on) accepts it.
- serve: probe and repair (the service does both, and samples INFO).
- agent: repair, the probe's observation, and keyspace events of every key.

No default recipe grants CONFIG GET, SCRIPT, EVAL*, or a category (`+@…`): the
user cannot read the server's passwords or run code. Two opt-ins widen it, each
a setting: `allow_config_changes` (CONFIG GET and SET of notify-keyspace-events:
SET alone is already full control of the server) and `allow_scripts` (SCRIPT LOAD
and EVALSHA, for a bulk refill's TTL script: any Lua). Of the commands granted,
Redis files INFO and RESTORE under @dangerous: INFO shows no secret, and a repair
cannot copy a key without RESTORE.

`missing(conn, mode)` finds what a connection's ACL user lacks before a run
starts (`require` does so for endpoints that log in as a named user), without
changing anything: reads run as they are (on a probe key that does not
exist), writes are queued inside MULTI and discarded (Redis checks ACLs when it
queues), so a repair that could not write says so before its scans, not after.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Literal

from replag.errors import PermissionRefused
from replag.topology import Endpoint
from replag.wire.resp import RespConnection, error_text, pack

Mode = Literal["probe", "check", "repair", "serve", "agent"]
MODES: tuple[Mode, ...] = ("probe", "check", "repair", "serve", "agent")
Feature = Literal["field_ttls", "vector_sets", "valkey_9", "slot_stats", "rejson"]
FEATURES: tuple[Feature, ...] = ("field_ttls", "vector_sets", "valkey_9", "slot_stats", "rejson")
# What each server kind has beyond the rules every supported server accepts (RedisJSON
# is a module, loaded or not on any kind: asked for on its own, `rejson`).
SERVERS: dict[str, tuple[Feature, ...]] = {
    "redis-6.2": (),
    "redis-7": (),
    "redis-7.4": ("field_ttls",),
    "redis-8": ("field_ttls", "vector_sets"),
    "redis-8.2": ("field_ttls", "vector_sets", "slot_stats"),
    "valkey-8": ("slot_stats",),
    "valkey-9": ("field_ttls", "valkey_9", "slot_stats"),
}


@dataclass(frozen=True)
class Need:
    """One command a mode uses; `args` is a harmless invocation (KEY: a probe key that
    does not exist), None when it cannot be tried alone (a subscription)."""

    command: str  # as an ACL rule names it: "set", "config|get"
    args: tuple[str, ...] | None
    write: bool = False  # tried inside MULTI … DISCARD, never run
    optional: bool = False  # refused: the mode carries on without it (a note says so)
    cluster: bool = False  # needed (and tried) on Redis Cluster nodes only
    # Granted only where the servers have it (`SERVERS`): others refuse the rule itself.
    feature: Feature | None = None


def _cluster(*args: str, feature: Feature | None = None) -> Need:
    return Need(f"cluster|{args[0].lower()}", ("CLUSTER", *args), cluster=True, feature=feature)


# Read-only, one call a node; refused, the check goes without it (a note says so).
_SLOT_STATS = Need(
    "cluster|slot-stats",
    ("CLUSTER", "SLOT-STATS", "SLOTSRANGE", "0", "0"),
    optional=True,
    cluster=True,
    feature="slot_stats",
)


_PING = Need("ping", ("PING",))
_SELECT = Need("select", None)  # sent on every connection to a db other than 0
_INFO = Need("info", ("INFO", "replication"), optional=True)
_READONLY = Need("readonly", None)  # Redis Cluster replicas only
_PROBE = (
    _PING,
    _SELECT,
    _READONLY,
    _INFO,
    Need("set", ("SET", "KEY", "1", "PX", "1000")),
    Need("del", ("DEL", "KEY")),
    Need("mget", ("MGET", "KEY")),
    Need("time", ("TIME",), optional=True),
    Need("psubscribe", None),
    # Following a shard's primary and slots (`discovery.cluster_follow`).
    _cluster("INFO"),
    _cluster("SHARDS"),
    _cluster("SLOTS"),
)
_CHECK = (
    _PING,
    _SELECT,
    _READONLY,
    Need("info", ("INFO", "replication")),
    Need("dbsize", ("DBSIZE",)),
    Need("scan", ("SCAN", "0", "MATCH", "KEY", "COUNT", "1")),
    Need("type", ("TYPE", "KEY")),
    Need("pttl", ("PTTL", "KEY")),
    Need("mget", ("MGET", "KEY")),
    Need("get", ("GET", "KEY")),
    Need("getrange", ("GETRANGE", "KEY", "0", "1")),
    Need("strlen", ("STRLEN", "KEY")),
    Need("hgetall", ("HGETALL", "KEY")),
    Need("hmget", ("HMGET", "KEY", "f")),
    Need("hlen", ("HLEN", "KEY")),
    Need("hscan", ("HSCAN", "KEY", "0")),
    Need("smembers", ("SMEMBERS", "KEY")),
    Need("scard", ("SCARD", "KEY")),
    Need("sscan", ("SSCAN", "KEY", "0")),
    Need("zrange", ("ZRANGE", "KEY", "0", "-1", "WITHSCORES")),
    Need("zcard", ("ZCARD", "KEY")),
    Need("zscan", ("ZSCAN", "KEY", "0")),
    Need("lrange", ("LRANGE", "KEY", "0", "-1")),
    Need("llen", ("LLEN", "KEY")),
    Need("xrange", ("XRANGE", "KEY", "-", "+", "COUNT", "1")),
    Need("xlen", ("XLEN", "KEY")),
    Need("xinfo|stream", ("XINFO", "STREAM", "KEY")),
    Need("dump", ("DUMP", "KEY")),
    # A hash whose encoding cannot hold field TTLs is read without asking for them.
    Need("object|encoding", ("OBJECT", "ENCODING", "KEY")),
    Need("hpexpiretime", ("HPEXPIRETIME", "KEY", "FIELDS", "1", "f"), feature="field_ttls"),
    *(
        Need(args[0].lower(), args, feature="vector_sets")
        for args in (
            ("VINFO", "KEY"),
            ("VRANDMEMBER", "KEY", "1"),
            ("VEMB", "KEY", "e", "RAW"),
            ("VGETATTR", "KEY", "e"),
            ("VCARD", "KEY"),
        )
    ),
    Need("json.get", ("JSON.GET", "KEY"), feature="rejson"),
    Need("json.debug", ("JSON.DEBUG", "MEMORY", "KEY"), feature="rejson"),
    # Slots that move during a check, stray keys, stuck and stale moves (`keyspace.slots`,
    # `stray_slots`): without them a Cluster check cannot vouch for its verdict.
    _cluster("NODES"),
    _cluster("SLOTS"),
    _cluster("COUNTKEYSINSLOT", "0"),
    _cluster("GETKEYSINSLOT", "0", "1"),
    _cluster("GETSLOTMIGRATIONS", feature="valkey_9"),
    _SLOT_STATS,
)
_WRITES = (
    Need("watch", ("WATCH", "KEY")),
    Need("unwatch", ("UNWATCH",)),
    Need("multi", None),
    Need("discard", None),
    Need("exec", None),
    *(
        Need(name, args, write=True)
        for name, args in (
            ("set", ("SET", "KEY", "1")),
            ("append", ("APPEND", "KEY", "1")),
            ("del", ("DEL", "KEY")),
            ("unlink", ("UNLINK", "KEY")),
            ("pexpire", ("PEXPIRE", "KEY", "1000")),
            ("pexpireat", ("PEXPIREAT", "KEY", "4102444800000")),
            ("persist", ("PERSIST", "KEY")),
            ("rename", ("RENAME", "KEY", "KEY:2")),
            ("restore", ("RESTORE", "KEY", "0", "x", "REPLACE")),
            ("hset", ("HSET", "KEY", "f", "v")),
            ("hdel", ("HDEL", "KEY", "f")),
            ("sadd", ("SADD", "KEY", "m")),
            ("srem", ("SREM", "KEY", "m")),
            ("zadd", ("ZADD", "KEY", "1", "m")),
            ("zrem", ("ZREM", "KEY", "m")),
            ("rpush", ("RPUSH", "KEY", "v")),
            ("xadd", ("XADD", "KEY", "*", "f", "v")),
            ("xsetid", ("XSETID", "KEY", "0-1")),
        )
    ),
    # A hash's field TTLs, in every copy that is not a RESTORE (pages, typed writes).
    Need(
        "hpexpireat",
        ("HPEXPIREAT", "KEY", "4102444800000", "FIELDS", "1", "f"),
        write=True,
        feature="field_ttls",
    ),
)
_AGENT_EXTRA = (
    Need("subscribe", None),
    Need("client|id", ("CLIENT", "ID"), optional=True),
    Need("client|tracking", None, optional=True),
)

NEEDS: dict[Mode, tuple[Need, ...]] = {
    "probe": _PROBE,
    "check": _CHECK,
    "repair": _CHECK + _WRITES,
    "serve": _PROBE + _CHECK + _WRITES,
    "agent": _PROBE + _CHECK + _WRITES + _AGENT_EXTRA,
}


# What the opt-ins add (see the module docstring), and the modes that use them.
CONFIG_CHANGES = ("config|get", "config|set")
SCRIPTS = ("script|load", "evalsha")
SCRIPT_MODES: tuple[Mode, ...] = ("repair", "serve")  # a bulk refill's TTL script
CONFIG_WARNING = (
    "warning: allow_config_changes grants CONFIG GET and SET: this user can read the "
    "server's passwords (requirepass, masterauth) and change any setting"
)
SCRIPT_WARNING = (
    "warning: allow_scripts grants SCRIPT LOAD and EVALSHA: this user can run any Lua "
    "on the server (a loop that blocks it, writes to any key it may write)"
)


def commands(
    mode: Mode,
    *,
    allow_config_changes: bool = False,
    allow_scripts: bool = False,
    features: tuple[Feature, ...] = (),
) -> list[str]:
    """The ACL command names `mode` needs, each once, in the order they are listed: those
    every server has, then those of `features` (`SERVERS`)."""
    needs = NEEDS[mode]
    names = list(dict.fromkeys(n.command for n in needs if n.feature is None))
    if allow_config_changes and mode in ("probe", "serve", "agent"):
        names += CONFIG_CHANGES
    if allow_scripts and mode in SCRIPT_MODES:
        names += SCRIPTS
    names += dict.fromkeys(n.command for n in needs if n.feature in features and n.feature)
    return list(dict.fromkeys(names))


def feature_of(command: str) -> Feature | None:
    """The feature whose servers alone have `command` (an ACL name), None for any server."""
    return next((n.feature for ns in NEEDS.values() for n in ns if n.command == command), None)


def server_kind(info: object) -> str | None:
    """The `SERVERS` kind an INFO server reply is of (the newest at or below its version),
    None where it says no version."""
    if not isinstance(info, bytes):
        return None
    fields = dict(line.partition(b":")[::2] for line in info.splitlines() if b":" in line)
    # Valkey reports a redis_version (7.2.4) too: its own comes first.
    for name, kind in ((b"valkey_version", "valkey"), (b"redis_version", "redis")):
        if name in fields:
            try:
                version = tuple(int(p) for p in fields[name].strip().split(b".")[:2])
            except ValueError:
                return None
            known = [k for k in SERVERS if k.startswith(kind + "-")]
            at_most = [k for k in known if _version(k) <= version]
            return max(at_most, key=_version) if at_most else None
    return None


def _version(kind: str) -> tuple[int, ...]:
    return tuple(int(p) for p in kind.split("-", 1)[1].split("."))


def key_patterns(mode: Mode, prefix: str) -> list[str]:
    return [f"{prefix}*"] if mode == "probe" else ["*"]


def channel_patterns(mode: Mode, prefix: str, dbs: tuple[int, ...] = (0,)) -> list[str]:
    """The probe subscribes to `__keyspace@<db>__:<prefix>*` exactly (Redis compares a
    PSUBSCRIBE pattern with the ACL's literally); an agent follows every key, and
    watches probe keys as the probe does."""
    if mode == "check" or mode == "repair":
        return []
    probe = [f"__keyspace@{db}__:{prefix}*" for db in dbs]
    if mode != "agent":
        return probe
    # The agent's trees follow every key; its lag watches subscribe to the probe's own
    # pattern, which `&__keyspace@0__:*` does not allow (compared literally).
    every = [f"__keyspace@{db}__:*" for db in dbs]
    return [*every, *probe, "__redis__:invalidate"]


def acl_rules(
    mode: Mode,
    *,
    prefix: str,
    dbs: tuple[int, ...] = (0,),
    allow_config_changes: bool = False,
    allow_scripts: bool = False,
    features: tuple[Feature, ...] = (),
) -> str:
    """The rules of `ACL SETUSER`: nothing but what `mode` needs (no `on`, no password;
    `features`: with the rules only servers that have them accept, `SERVERS`)."""
    rules = ["resetkeys", "resetchannels", "-@all"]
    granted = commands(
        mode,
        allow_config_changes=allow_config_changes,
        allow_scripts=allow_scripts,
        features=features,
    )
    rules += [f"+{c}" for c in granted]
    rules += [f"~{p}" for p in key_patterns(mode, prefix)]
    rules += [f"&{p}" for p in channel_patterns(mode, prefix, dbs)]
    return " ".join(rules)


def acl_line(
    mode: Mode,
    user: str,
    *,
    prefix: str,
    dbs: tuple[int, ...] = (0,),
    allow_config_changes: bool = False,
    allow_scripts: bool = False,
    features: tuple[Feature, ...] = (),
) -> str:
    rules = acl_rules(
        mode,
        prefix=prefix,
        dbs=dbs,
        allow_config_changes=allow_config_changes,
        allow_scripts=allow_scripts,
        features=features,
    )
    return f"ACL SETUSER {user} {rules}"


async def missing(conn: RespConnection, mode: Mode, *, prefix: str) -> tuple[list[str], list[str]]:
    """(commands refused that `mode` cannot do without, optional ones refused), as ACL
    names, tried on `conn` without changing any data (see the module docstring)."""
    key = f"{prefix}acl-check:{secrets.token_hex(4)}"
    cluster = conn.endpoint.cluster or await _cluster_enabled(conn)
    needs = [n for n in {n.command: n for n in NEEDS[mode]}.values() if cluster or not n.cluster]
    direct = [n for n in needs if n.args is not None and not n.write]
    refused = await _refused(conn, [_invocation(n, key) for n in direct], direct)
    writes = [n for n in needs if n.write]
    if writes:
        refused += await _refused_writes(conn, writes, key)
    required = [n.command for n in refused if not n.optional]
    optional = [n.command for n in refused if n.optional]
    return required, optional


async def _cluster_enabled(conn: RespConnection) -> bool:
    """A Redis Cluster node (INFO cluster), whose cluster reads are tried too; INFO
    refused: not known (INFO is a need of its own, refused then)."""
    (reply,) = await conn.request(pack("INFO", "cluster"), 1)
    return isinstance(reply, bytes) and b"cluster_enabled:1" in reply


def _invocation(need: Need, key: str) -> bytes:
    assert need.args is not None
    return pack(*(key if a == "KEY" else f"{key}:2" if a == "KEY:2" else a for a in need.args))


async def _refused(conn: RespConnection, payloads: list[bytes], needs: list[Need]) -> list[Need]:
    if not payloads:
        return []
    replies = await conn.request(b"".join(payloads), len(payloads))
    return [n for n, r in zip(needs, replies, strict=True) if _is_noperm(r)]


async def _refused_writes(conn: RespConnection, writes: list[Need], key: str) -> list[Need]:
    """Queued in MULTI and discarded: Redis checks each command's ACL as it queues it
    (a read-only replica answers READONLY then: allowed, only not here). A connection
    left inside a transaction (DISCARD refused) is dropped, so nothing queued can run."""
    by_name = {n.command: n for n in NEEDS["repair"]}
    (reply,) = await conn.request(pack("MULTI"), 1)
    if _is_noperm(reply):
        return [by_name["multi"]]  # without MULTI the writes can be neither tried nor made
    queued = [_invocation(n, key) for n in writes]
    replies = await conn.request(b"".join(queued) + pack("DISCARD"), len(queued) + 1)
    refused = [n for n, r in zip(writes, replies, strict=False) if _is_noperm(r)]
    if _is_noperm(replies[-1]):
        conn.abort()
        return [*refused, by_name["discard"]]
    # An empty transaction runs nothing: EXEC is tried for real.
    replies = await conn.request(pack("MULTI") + pack("EXEC"), 2)
    if _is_noperm(replies[1]):
        conn.abort()  # still inside the transaction
        refused.append(by_name["exec"])
    return refused


def _is_noperm(reply: object) -> bool:
    text = error_text(reply)
    return text is not None and text.startswith("NOPERM")


async def require(
    endpoint: Endpoint,
    mode: Mode,
    *,
    prefix: str,
    timeout_s: float,
    what: str,
    always: bool = False,
    advise: Mode | None = None,
) -> list[str]:
    """PermissionRefused naming every command `mode` lacks on `endpoint` (on a connection
    of its own, before a run starts); the optional ones refused are returned, for a note.
    Only named ACL users are checked (`_checked`), unless `always` (Redis endpoints).
    `advise`: the mode whose recipe the error suggests, when the process runs in a wider
    one than `mode` (serve runs repairs: its user needs serve's rules, not repair's)."""
    if not _checked(endpoint) and not (always and endpoint.kind == "redis"):
        return []
    conn = await RespConnection.open(endpoint, timeout_s=timeout_s)
    try:
        needed, optional = await missing(conn, mode, prefix=prefix)
        kind = None
        if any(feature_of(c) for c in needed):  # the hint names the server's kind
            (info,) = await conn.request(pack("INFO", "server"), 1)
            kind = server_kind(info)
    finally:
        await conn.close()
    _refuse(needed, endpoint, advise or mode, what, kind)
    return optional + await channels_refused(endpoint, mode, prefix=prefix, timeout_s=timeout_s)


async def channels_refused(
    endpoint: Endpoint, mode: Mode, *, prefix: str, timeout_s: float
) -> list[str]:
    """The channel rules (`&pattern`) `mode` lacks on `endpoint`, tried by subscribing on
    a connection of its own, closed after. Optional: without them a probe polls, and an
    agent's tree says it cannot follow the replica."""
    patterns = channel_patterns(mode, prefix, (endpoint.db,))
    if not patterns:
        return []
    refused: list[str] = []
    conn = await RespConnection.open(endpoint, timeout_s=timeout_s)
    try:
        for pattern in patterns:
            verb = "SUBSCRIBE" if pattern == "__redis__:invalidate" else "PSUBSCRIBE"
            (reply,) = await conn.request(pack(verb, pattern), 1)
            if _is_noperm(reply):
                refused.append(f"&{pattern}")
    finally:
        await conn.close()
    return refused


async def require_on(conn: RespConnection, mode: Mode, *, prefix: str, what: str) -> list[str]:
    """`require` on a connection the caller goes on using: only for modes that write
    nothing but probe keys (the probe), whose checks never leave a transaction open."""
    endpoint = conn.endpoint
    if not _checked(endpoint):
        return []
    if any(n.write for n in NEEDS[mode]):
        raise ValueError(f"{mode}: check it on a connection of its own (require)")
    needed, optional = await missing(conn, mode, prefix=prefix)
    _refuse(needed, endpoint, mode, what)
    return optional


def _checked(endpoint: Endpoint) -> bool:
    """Checked: Redis endpoints that log in as a named ACL user. Not the default user
    (trying reads shows in its servers' command statistics, which replag's own users'
    tools may watch) nor Dynomite ports (no ACLs; they close on commands they lack)."""
    return endpoint.kind == "redis" and endpoint.username is not None


def recipe_options(needed: list[str], kind: str | None = None) -> str:
    """What `replag acl` needs beside --mode and --user to grant `needed` on a server of
    `kind` (None: not known, the first kind that has them)."""
    features = {f for c in needed if (f := feature_of(c)) is not None}
    out = ""
    if features - {"rejson"}:
        if kind is None or not features - {"rejson"} <= set(SERVERS.get(kind, ())):
            kind = next((k for k, fs in SERVERS.items() if features - {"rejson"} <= set(fs)), None)
        out += f" --server {kind}" if kind else ""
    return out + (" --rejson" if "rejson" in features else "")


def _refuse(
    needed: list[str], endpoint: Endpoint, mode: Mode, what: str, kind: str | None = None
) -> None:
    """`mode`: the recipe that grants what is needed and everything else the user does;
    `kind`: the server's (`SERVERS`), for the options that grant what only it has."""
    if needed:
        user = endpoint.username or "default"
        names = ", ".join(c.upper() for c in needed)
        raise PermissionRefused(
            f"permission refused: {names} (user {user}): {what} needs "
            f"{'it' if len(needed) == 1 else 'them'}; `replag acl --mode {mode} --user {user}"
            f"{recipe_options(needed, kind)}` "
            "prints every rule it needs",
            where=f"{endpoint.name} ({endpoint.url()})",
        )
