"""A repair write as data: what `writes` makes over a key once it still holds what was
compared, and what an agent is asked to make (`trees.remote`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from replag.wire.resp import pack

WriteOp = Literal["delete", "restore", "expire", "undo", "purge"]


@dataclass(frozen=True)
class Write:
    """A repair write as data: made over a key only once it still holds what was compared.

    `pttl` is the source's remaining TTL (ms, -1 none) when it was read: the copy's TTL
    is computed when the write is made, from the time elapsed since (`commands`).
    """

    op: WriteOp
    payload: bytes | None = None  # the winner's DUMP (restore) or the target's pre-image (undo)
    pttl: int = -1

    def commands(self, key: bytes, elapsed_ms: int) -> list[bytes] | None:
        """The commands to run now; None when nothing valid is left (the source expired)."""
        if self.op == "delete":
            return [pack(b"DEL", key)]
        if self.op == "purge":
            # On a primary lacking the key: a DEL of a missing key is not replicated, a
            # SET then DEL in one transaction is, and removes the key from its replicas.
            return [pack(b"SET", key, b""), pack(b"DEL", key)]
        left = self.pttl - elapsed_ms if self.pttl >= 0 else 0  # 0: no expiry
        if self.op == "undo":
            if self.payload is None or (self.pttl >= 0 and left <= 0):
                return [pack(b"DEL", key)]  # there was no key, or it would have expired
            return [pack(b"RESTORE", key, left, self.payload, b"REPLACE")]
        if self.pttl >= 0 and left <= 0:
            return None
        if self.op == "expire":
            return [pack(b"PEXPIRE", key, left) if left else pack(b"PERSIST", key)]
        assert self.payload is not None
        return [pack(b"RESTORE", key, left, self.payload, b"REPLACE")]
