"""What a reply can hold where its request says so, far below max_reply_bytes.

max_reply_bytes (512 MB) is what one reply of any command may carry; most of what the
probe and the samplers ask has a size known before it is sent: TIME is two numbers,
PING and AUTH a status, DBSIZE and STRLEN a number, INFO at most max_info_bytes, the
poll's MGET of N probe keys N probe values. A server answering any of them with
hundreds of megabytes (each reply passing max_reply_bytes alone took `replag probe` to
796 MB) is refused once its reply passes this bound, as one over max_reply_bytes is:
the connection closed, one line naming the server, the command and the bound's setting
(`ReplyGuard.bound`; at most one chunk read past it).

`SMALL_REPLY_BYTES` is the bound of a reply that is a number, a status or a few of them,
error replies included (Redis's own errors are one line, under 1 KB).
"""

from __future__ import annotations

from collections.abc import Sequence

from replag.plural import count
from replag.wire.reply_limits import ReplyBound, ReplyLimits, size_text
from replag.wire.shapes import command_key

SMALL_REPLY_BYTES = 64 << 10
# RESP's framing around a value: `$<up to 20 digits>\r\n` before it, `\r\n` after.
_FRAMING = 32

# Commands whose reply is a number, a status or a pair of numbers, whatever the arguments
# (and SET without GET).
SMALL = frozenset(
    {
        "AUTH",
        "SELECT",
        "READONLY",
        "PING",
        "TIME",
        "DBSIZE",
        "STRLEN",
        "HLEN",
        "SCARD",
        "ZCARD",
        "LLEN",
        "XLEN",
        "PTTL",
        "TTL",
        "TYPE",
        "DEL",
        "EXISTS",
        "CONFIG SET",
    }
)
_INFO = frozenset({"INFO", "CLUSTER INFO"})
SMALL_BOUND = ReplyBound(
    SMALL_REPLY_BYTES, f"{SMALL_REPLY_BYTES >> 10} KB, the most a number or a status can hold"
)


def known(args: Sequence[object], limits: ReplyLimits) -> ReplyBound | None:
    """The bound of the reply to command `args`, where its size is known in advance."""
    key = command_key(args)
    if key in SMALL or (key == "SET" and not any(_word(a) == b"GET" for a in args[3:])):
        return SMALL_BOUND
    if key in _INFO:
        return ReplyBound(
            limits.max_info_bytes + _FRAMING,
            f"max_info_bytes = {size_text(limits.max_info_bytes)}",
        )
    if key == "CONFIG GET" and len(args) == 3 and not _glob(args[2]):
        return ReplyBound(SMALL_REPLY_BYTES, f"{SMALL_REPLY_BYTES >> 10} KB (one setting)")
    return None


def probe_values(keys: int, limits: ReplyLimits) -> ReplyBound:
    """The bound of an MGET of `keys` probe keys: that many values of at most
    max_probe_value_bytes, with their framing (and room for an error reply)."""
    value = limits.max_probe_value_bytes
    total = _FRAMING + keys * (value + _FRAMING)  # an error reply (one line) fits too
    return ReplyBound(
        total,
        f"{count(keys, 'probe key')} x max_probe_value_bytes = {size_text(value)}: {total} bytes",
    )


def _word(arg: object) -> bytes:
    return (arg if isinstance(arg, bytes) else str(arg).encode()).upper()


def _glob(arg: object) -> bool:
    return any(c in _word(arg) for c in b"*?[")


__all__ = ["SMALL", "SMALL_BOUND", "SMALL_REPLY_BYTES", "known", "probe_values"]
