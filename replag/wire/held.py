"""Bytes held from one server at once, all its connections together: `max_held_bytes`.

Each reply passes `ReplyGuard` alone (max_reply_bytes), so before this a server could
answer every connection replag holds to it (a probe's, a check's, serve's samplers')
with a 400 MB reply at once: `serve` reached 2.1 GB. Every reader of a connection counts
here, per server (host and port), the bytes of replies it has received and not yet
handed over whole; a connection whose bytes would take the server's total past the
limit is refused, as a reply over max_reply_bytes is (closed, naming the server, the
command and the setting). Only bytes in flight count, so nothing piles up across runs.
"""

from __future__ import annotations

import os

from replag.topology import Endpoint
from replag.wire.reply_limits import ReplyLimitError, size_text


class Held:
    """The bytes one server's connections in this process hold in replies not handed over."""

    __slots__ = ("total",)

    def __init__(self) -> None:
        self.total = 0


_HELD: dict[tuple[str, int], Held] = {}
# A forked scan process counts its own connections from nothing (what the parent's hold
# is the parent's; their inherited objects keep the parent's accounts).
os.register_at_fork(after_in_child=_HELD.clear)


def held_from(endpoint: Endpoint) -> Held:
    """The account of `endpoint`'s server (one per host and port, made when first asked)."""
    key = (endpoint.host, endpoint.port)
    account = _HELD.get(key)
    if account is None:
        account = _HELD[key] = Held()
    return account


class HeldBytes:
    """One connection's share of its server's account."""

    __slots__ = ("account", "limit", "mine")

    def __init__(self, endpoint: Endpoint) -> None:
        self.account = held_from(endpoint)
        self.limit = endpoint.limits.max_held_bytes
        self.mine = 0

    def add(self, n: int) -> None:
        """`n` more bytes received toward a reply; ReplyLimitError past the limit (they
        are not counted then: the connection is closed)."""
        total = self.account.total + n
        if total > self.limit:
            raise ReplyLimitError(
                f"{total} bytes held from this server at once (its connections' replies "
                f"not yet read whole), over max_held_bytes = {size_text(self.limit)}"
            )
        self.account.total = total
        self.mine += n

    def release(self) -> None:
        """The replies received so far were handed over (or the connection closed)."""
        self.account.total -= self.mine
        self.mine = 0

    def __del__(self) -> None:
        self.release()  # a connection dropped unclosed holds nothing any more


__all__ = ["Held", "HeldBytes", "held_from"]
