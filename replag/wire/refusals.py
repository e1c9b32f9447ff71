"""Every scan has an end, refusals included: `max_reply_refusals` per scan and server.

A reply over max_reply_bytes (a batch of big values) does not end a scan: the batch is
read again in smaller pieces, down to each big string in pages, on a new connection each
time (the refused one is unusable). A server announcing `$10^12` for every MGET made each
batch of n keys cost 2n - 1 refused requests: 40,000 for 20,000 keys, 35.7 s against
0.4 s. `Refusals` counts them for one scan; past `max_reply_refusals` the scan ends with
one line naming the server, the command refused and the setting. A keyspace of real big
values costs a few refusals each (the scan lowers its COUNT to what the values weigh).
"""

from __future__ import annotations

from replag.errors import UnreachableError
from replag.topology import Endpoint
from replag.wire.connections import translate_where
from replag.wire.reply_limits import size_text

# Refused batches whose keys, read one by one, prove smaller than the refused reply
# announced (a value shrunk or deleted between the two reads is the only honest way).
LIES_TOLERATED = 3


class Refusals:
    """The replies one scan of `endpoint` refused and read again in pieces."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.count = 0
        self.lies = 0

    def read_back(self, command: str, held: int) -> None:
        """A refused reply to `command` whose keys, read one by one, hold `held` bytes in
        all: under max_reply_bytes, the refusal was a lie; past LIES_TOLERATED, the end."""
        limits = self.endpoint.limits
        if held > limits.max_bytes:
            return
        self.lies += 1
        if self.lies > LIES_TOLERATED:
            raise UnreachableError(
                f"{self.lies} replies to {command} refused at max_reply_bytes = "
                f"{size_text(limits.max_bytes)} while their keys, read one by one, held at "
                f"most {held} bytes (the server announces more than its values hold)",
                where=translate_where(self.endpoint),
            )

    def note(self, command: str) -> None:
        """One more refused reply (to `command`); UnreachableError past the bound."""
        self.count += 1
        limits = self.endpoint.limits
        if self.count > limits.max_reply_refusals:
            raise UnreachableError(
                f"{self.count} replies to {command} refused at max_reply_bytes = "
                f"{size_text(limits.max_bytes)} and read again in pieces, over "
                f"max_reply_refusals = {limits.max_reply_refusals} (the server announces "
                "more than its values hold)",
                where=translate_where(self.endpoint),
            )


__all__ = ["Refusals"]
