"""The shape each command's reply must have, checked at the door before anyone reads it.

A server (or something posing as one) can answer TIME with an integer, INFO with an
empty array, SCAN with a negative cursor. Every reply of a command named in `SHAPES`
is checked here, on replag's RESP connections (`RespConnection.call`/`checked`, and
`request` for requests of a few commands) and on redis-py's clients (their response
callbacks): a wrong shape raises `ReplyShapeError`, one line naming the server, the
command, what it must answer and what it did. Error replies pass: they are the
caller's (`check_replies`). INFO is also bounded in size and lines
(max_info_bytes, max_info_lines): a 1M-line INFO is refused before it is parsed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import hiredis

from replag.errors import ReplyShapeError
from replag.topology import Endpoint

Check = Callable[[Any], bool]


def _is_int_text(value: Any, *, signed: bool = False) -> bool:
    if not isinstance(value, bytes) or not 0 < len(value) <= 20:
        return False
    digits = value[1:] if signed and value[:1] == b"-" else value
    return digits.isdigit()


def _int(reply: Any) -> bool:
    return isinstance(reply, int) and not isinstance(reply, bool)


def _count(reply: Any) -> bool:
    return _int(reply) and reply >= 0


def _text(reply: Any) -> bool:
    return isinstance(reply, bytes)


def _array(reply: Any) -> bool:
    return isinstance(reply, list)


def _bulks(reply: Any) -> bool:
    return isinstance(reply, list) and all(isinstance(x, bytes) for x in reply)


def _bulks_or_nils(reply: Any) -> bool:
    return isinstance(reply, list) and all(x is None or isinstance(x, bytes) for x in reply)


def _time(reply: Any) -> bool:
    return isinstance(reply, list) and len(reply) == 2 and all(map(_is_int_text, reply))


def _scan(reply: Any) -> bool:
    return (
        isinstance(reply, list)
        and len(reply) == 2
        and _is_int_text(reply[0])
        and isinstance(reply[1], list)
    )


def _role(reply: Any) -> bool:
    return (
        isinstance(reply, list)
        and bool(reply)
        and reply[0] in (b"master", b"slave", b"sentinel", b"replica")
    )


def _address(reply: Any) -> bool:
    return reply is None or (
        isinstance(reply, list)
        and len(reply) == 2
        and isinstance(reply[0], bytes)
        and _is_int_text(reply[1])
    )


def _entries(reply: Any) -> bool:
    """An array of flat [field, value, ...] arrays (SENTINEL MASTERS, REPLICAS, ...)."""
    return isinstance(reply, list) and all(isinstance(e, list) and len(e) % 2 == 0 for e in reply)


def _pong(reply: Any) -> bool:
    # PING on a subscribed connection answers [pong, ""] (RESP2).
    return isinstance(reply, bytes) or (isinstance(reply, list) and len(reply) == 2)


def _ttl(reply: Any) -> bool:
    return _int(reply) and reply >= -2


KEY_COUNT = b"key-count"
CLUSTER_SLOTS = 16384


def slot_fields(entry: Any) -> dict[bytes, Any] | None:
    """A CLUSTER SLOT-STATS row's fields: a map (RESP3) or a flat field/value array."""
    if isinstance(entry, dict):
        return {k if isinstance(k, bytes) else str(k).encode(): v for k, v in entry.items()}
    if isinstance(entry, list) and len(entry) % 2 == 0:
        return dict(zip(entry[::2], entry[1::2], strict=True))
    return None


def slot_key_count(fields: Any) -> Any:
    """A CLUSTER SLOT-STATS row's key-count (None when absent): `[b"key-count", N]`, the
    common RESP2 row, without building a map (16,384 rows a call)."""
    if type(fields) is list and len(fields) == 2 and fields[0] == KEY_COUNT:
        return fields[1]
    got = slot_fields(fields)
    return got.get(KEY_COUNT) if got is not None else None


def _slot_stats(reply: Any) -> bool:
    """At most 16384 [slot, fields] pairs, slots in 0..16383, each with a key-count."""
    if type(reply) is not list or len(reply) > CLUSTER_SLOTS:
        return False
    for row in reply:
        if type(row) is not list or len(row) != 2:
            return False
        slot, fields = row
        if type(slot) is not int or not 0 <= slot < CLUSTER_SLOTS:
            return False
        count = slot_key_count(fields)
        if type(count) is not int or count < 0:
            return False
    return True


# command (upper case; with its subcommand where the subcommand decides) → (what it must
# answer, the check).
SHAPES: dict[str, tuple[str, Check]] = {
    "TIME": ("an array of two integers (seconds, microseconds)", _time),
    "INFO": ("a bulk string of key:value lines", _text),
    "PING": ("PONG", _pong),
    "DBSIZE": ("a non-negative integer", _count),
    "SCAN": ("an array of a cursor (a non-negative integer) and an array of keys", _scan),
    "MGET": ("an array of bulk strings and nils, one per key", _bulks_or_nils),
    "ROLE": ("an array starting with master, slave or sentinel", _role),
    "STRLEN": ("a non-negative integer", _count),
    "HLEN": ("a non-negative integer", _count),
    "SCARD": ("a non-negative integer", _count),
    "ZCARD": ("a non-negative integer", _count),
    "LLEN": ("a non-negative integer", _count),
    "XLEN": ("a non-negative integer", _count),
    "PTTL": ("an integer of at least -2", _ttl),
    "TTL": ("an integer of at least -2", _ttl),
    "TYPE": ("a type name", _text),
    "GETRANGE": ("a bulk string", _text),
    "CLUSTER SHARDS": ("an array of shards, each an array of fields", _entries),
    "CLUSTER SLOTS": ("an array of slot ranges", _array),
    "CLUSTER NODES": ("a bulk string of node lines", _text),
    "CLUSTER INFO": ("a bulk string of key:value lines", _text),
    "CLUSTER SLOT-STATS": (
        "an array of at most 16384 [slot, fields] pairs, each with a non-negative key-count",
        _slot_stats,
    ),
    "CONFIG GET": ("an array of names and values", _bulks),
    "SENTINEL GET-MASTER-ADDR-BY-NAME": ("nil or an array of a host and a port", _address),
    "SENTINEL MASTERS": ("an array of masters, each an array of fields", _entries),
    "SENTINEL REPLICAS": ("an array of replicas, each an array of fields", _entries),
    "SENTINEL SLAVES": ("an array of replicas, each an array of fields", _entries),
    "SENTINEL SENTINELS": ("an array of Sentinels, each an array of fields", _entries),
}
_TWO_WORDS = frozenset(name.split()[0] for name in SHAPES if " " in name)


def described(reply: Any) -> str:
    """What a reply is, for an error: `the integer 1`, `nil`, `an empty array`, ..."""
    if reply is None:
        return "nil"
    if isinstance(reply, bool):
        return f"the boolean {reply}"
    if isinstance(reply, int):
        return f"the integer {reply}"
    if isinstance(reply, float):
        return f"the number {reply}"
    if isinstance(reply, bytes):
        return f"a string of {len(reply)} bytes ({reply[:24]!r})" if reply else "an empty string"
    if isinstance(reply, dict):
        return f"a map of {len(reply)} entries"
    if isinstance(reply, list):
        if not reply:
            return "an empty array"
        kinds = sorted({described(x).split(" (")[0].split(" of ")[0] for x in reply[:8]})
        return f"an array of {len(reply)} ({', '.join(kinds)})"
    return type(reply).__name__


def command_key(args: Sequence[Any]) -> str:
    """The SHAPES key of a command: its name, with its subcommand where that decides."""
    if not args:
        return ""
    first = args[0]
    name = (first.decode("ascii", "replace") if isinstance(first, bytes) else str(first)).upper()
    if name in _TWO_WORDS and len(args) > 1:
        sub = args[1]
        sub_text = sub.decode("ascii", "replace") if isinstance(sub, bytes) else str(sub)
        return f"{name} {sub_text.upper()}"
    return name


def check(endpoint: Endpoint, args: Sequence[Any], reply: Any) -> Any:
    """`reply`, if it has the shape command `args` must answer with (or is an error
    reply); else ReplyShapeError naming the server, the command, expected and got."""
    if isinstance(reply, hiredis.ReplyError | Exception) or reply == b"QUEUED":
        return reply  # an error is the caller's; inside MULTI, EXEC answers later
    key = command_key(args)
    shape = SHAPES.get(key)
    if shape is not None:
        expected, fits = shape
        if not fits(reply):
            raise wrong(endpoint, key, expected, reply)
        if key == "MGET" and len(reply) != len(args) - 1:
            raise wrong(endpoint, key, f"{len(args) - 1} values, one per key", reply)
        if key == "SCAN" and reply[0].startswith(b"-"):
            raise wrong(endpoint, key, SHAPES["SCAN"][0], reply)
    if key == "INFO" or key == "CLUSTER NODES":
        bounded_text(endpoint, key, reply)
        nodes = reply.count(b"\nslave") if key == "INFO" else reply.count(b"\n")
        _bounded_nodes(endpoint, key, nodes)
    elif key in _TOPOLOGY:
        nodes = len(reply)
        if key == "CLUSTER SHARDS":
            nodes = sum(_shard_nodes(shard) for shard in reply)
        _bounded_nodes(endpoint, key, nodes)
    return reply


_TOPOLOGY = frozenset(
    {
        "CLUSTER SHARDS",
        "CLUSTER SLOTS",
        "SENTINEL MASTERS",
        "SENTINEL REPLICAS",
        "SENTINEL SLAVES",
        "SENTINEL SENTINELS",
    }
)


def _shard_nodes(shard: Any) -> int:
    if isinstance(shard, dict):
        nodes = shard.get(b"nodes", shard.get("nodes"))
        return max(1, len(nodes)) if isinstance(nodes, list) else 1
    if isinstance(shard, list):
        for name, value in zip(shard[::2], shard[1::2], strict=False):
            if name in (b"nodes", "nodes") and isinstance(value, list):
                return max(1, len(value))
    return 1


def topology_nodes(endpoint: Endpoint, command: str, reply: Any) -> None:
    """CLUSTER SHARDS or SLOTS (as redis-py hands it on) within max_topology_nodes."""
    if isinstance(reply, list | dict):
        count = sum(_shard_nodes(s) for s in reply) if command == "CLUSTER SHARDS" else len(reply)
        _bounded_nodes(endpoint, command, count)


def _bounded_nodes(endpoint: Endpoint, command: str, nodes: int) -> None:
    """A topology answer naming at most max_topology_nodes nodes."""
    limit = endpoint.limits.max_topology_nodes
    if nodes > limit:
        raise ReplyShapeError(
            f"{command} named {nodes} nodes, over max_topology_nodes = {limit}",
            where=_where(endpoint),
        )


def bounded_text(endpoint: Endpoint, command: str, reply: bytes) -> None:
    """INFO (and CLUSTER NODES) within max_info_bytes and max_info_lines."""
    limits = endpoint.limits
    if len(reply) > limits.max_info_bytes:
        raise ReplyShapeError(
            f"{command} answered {len(reply)} bytes, over max_info_bytes = {limits.max_info_bytes}",
            where=_where(endpoint),
        )
    lines = reply.count(b"\n")
    if lines > limits.max_info_lines:
        raise ReplyShapeError(
            f"{command} answered {lines} lines, over max_info_lines = {limits.max_info_lines}",
            where=_where(endpoint),
        )


def wrong(endpoint: Endpoint, command: str, expected: str, reply: Any) -> ReplyShapeError:
    return ReplyShapeError(
        f"{command} answered {described(reply)}, expected {expected}", where=_where(endpoint)
    )


def _where(endpoint: Endpoint) -> str:
    return f"{endpoint.name} ({endpoint.url()})"


# A request of at most this many bytes is read back into its commands, so that each reply
# of a `request` is checked too (scan batches, far larger, check their own replies).
READ_BACK_BYTES = 4096


def check_request(endpoint: Endpoint, payload: bytes, replies: Sequence[Any]) -> None:
    """Check each reply of a small pipelined request against its command's shape."""
    if len(payload) > READ_BACK_BYTES:
        return
    reader = hiredis.Reader()
    reader.feed(payload)
    for reply in replies:
        command = reader.gets()
        if command is False:
            return
        check(endpoint, command, reply)


def check_values(endpoint: Endpoint, reply: Any, keys: int) -> None:
    """An MGET's reply in a pipelined batch: bulk strings and nils, one per key."""
    if not _bulks_or_nils(reply):
        raise wrong(endpoint, "MGET", SHAPES["MGET"][0], reply)
    if len(reply) != keys:
        raise wrong(endpoint, "MGET", f"{keys} values, one per key", reply)


def check_each(endpoint: Endpoint, command: str, replies: Sequence[Any]) -> bool:
    """The replies of a run of one command per key in a large pipeline (a batch's PTTLs),
    each of its shape: integers checked together (the usual case), one by one only where
    something else came (an error reply passes, as `check` lets it: False then)."""
    expected, fits = SHAPES[command]
    if all(type(r) is int for r in replies):
        if fits in (_ttl, _count) and replies:
            low = min(replies)
            if not fits(low):
                raise wrong(endpoint, command, expected, low)
        return True
    for reply in replies:
        check(endpoint, (command,), reply)
    return False


def check_int_pairs(endpoint: Endpoint, command: str, reply: Any) -> None:
    """A script's flat array of integer pairs (the TTL script's key index and PTTL)."""
    if not (isinstance(reply, list) and len(reply) % 2 == 0 and all(_int(x) for x in reply)):
        raise wrong(endpoint, command, "an array of integer pairs", reply)


def check_indexes(endpoint: Endpoint, command: str, low: int, high: int, n: int) -> None:
    """Indexes a script answered (1-based; their least and greatest) within its `n` keys."""
    if low < 1 or high > n:
        raise wrong(endpoint, command, f"key indexes from 1 to {n}", [low, high])


def redis_py_callback(
    endpoint: Endpoint, command: str, then: Callable[..., Any]
) -> Callable[..., Any]:
    """A redis-py response callback checking `command`'s shape before redis-py's own."""

    def callback(response: Any, **options: Any) -> Any:
        check(endpoint, command.split(), response)
        return then(response, **options)

    return callback
