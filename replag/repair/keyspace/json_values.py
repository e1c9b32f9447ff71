"""Reading a RedisJSON document (`ReJSON-RL`) by a canonical form of its content.

`JSON.GET key` returns the document as JSON text, its object members in the order
they were written: two replicas that hold one document written in another order
serialize it otherwise. The digest is of the document parsed and written again with
sorted keys and no spaces (numbers as Python reads them: 1 and 1.0 stay distinct, as
RedisJSON keeps them). A document is one reply: one whose size in memory
(`JSON.DEBUG MEMORY`) passes a quarter of max_reply_bytes is named, not read.
"""

from __future__ import annotations

import json
from typing import Any

import xxhash

from replag.wire import reply_limits
from replag.wire.reply_limits import ReplyLimits
from replag.wire.resp import error_text, pack

TYPE = "ReJSON-RL"


def canonical_json(text: bytes) -> bytes:
    """`text` parsed and written again with sorted keys and no spaces."""
    value = json.loads(text)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def json_digest(text: bytes) -> int:
    return int(xxhash.xxh3_64_intdigest(b"json\x00" + canonical_json(text)))


class JsonReader:
    """One document being read: its size in memory, then JSON.GET (`values.read_values`
    drives it as any other reader)."""

    replies = 1

    def __init__(self, key: bytes, limits: ReplyLimits) -> None:
        self.key, self.type = key, TYPE
        self.limits = limits
        self.done = False
        self.failed = False
        self.opaque: str | None = None
        self.sized = False
        self.digest = 0

    def command(self) -> bytes:
        if not self.sized:
            return pack(b"JSON.DEBUG", b"MEMORY", self.key)
        return pack(b"JSON.GET", self.key)

    def feed(self, replies: list[Any]) -> None:
        (reply,) = replies
        if error_text(reply) is not None or reply is None:
            self.failed = self.done = True  # WRONGTYPE or gone: changed under us
            return
        if not self.sized:
            self.sized = True
            limit = self.limits.max_bytes
            if isinstance(reply, int) and reply > limit // 4:
                self.opaque = (
                    f"a JSON document of {reply:,} bytes in memory: one JSON.GET of it "
                    f"could pass max_reply_bytes = {reply_limits.size_text(limit)}"
                )
                self.done = True
            return
        try:
            self.digest = json_digest(bytes(reply))
        except ValueError:
            self.opaque = "JSON.GET returned text that is not JSON"
        self.done = True
