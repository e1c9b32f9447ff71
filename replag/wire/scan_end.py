"""Every SCAN has an end: a cursor that cycles, or more keys or calls than the keyspace
could hold, ends the scan with one line naming the server.

Redis walks its table once per SCAN iteration, so a cursor never comes back before the
iteration ends at "0" (Brent's cycle check spots a loop in constant memory, within twice
its length), and one iteration returns each key at most a few times (duplicates while
the table is resized): a scan of more than `bound` keys or calls, derived from DBSIZE
when the scan started (`SCAN_BOUND_FACTOR` × DBSIZE + `SCAN_BOUND_SLACK`), is not a
scan of this server's keyspace. A negative or non-numeric cursor is a wrong shape
(`shapes`).
"""

from __future__ import annotations

from typing import Any

from replag.errors import ReplyShapeError
from replag.topology import Endpoint
from replag.wire import shapes

SCAN_BOUND_FACTOR = 4
SCAN_BOUND_SLACK = 100_000


class ScanEnd:
    """Checks each SCAN reply of one iteration; `step(reply)` → (cursor, keys)."""

    def __init__(self, endpoint: Endpoint, dbsize: int | None) -> None:
        self.endpoint = endpoint
        self.bound = SCAN_BOUND_FACTOR * max(dbsize or 0, 0) + SCAN_BOUND_SLACK
        self.keys = 0
        self.calls = 0
        self._mark: bytes | None = None  # Brent: the cursor saved at call 2^k
        self._power = 1
        self._since = 0  # calls since the scan (re)started from a cursor

    def step(self, reply: Any) -> tuple[bytes, list[bytes]]:
        shapes.check(self.endpoint, (b"SCAN",), reply)
        cursor, keys = reply[0], reply[1]
        self.calls += 1
        self.keys += len(keys)
        if cursor != b"0":
            if cursor == self._mark:
                raise self._ended(f"its cursor came back to {cursor.decode()} (a cycle)")
            self._since += 1
            if self._since == self._power:
                self._mark, self._power = cursor, self._power * 2
        if self.keys > self.bound or self.calls > self.bound:
            raise self._ended(
                f"{self.keys} keys in {self.calls} calls, more than the keyspace holds "
                f"({SCAN_BOUND_FACTOR} x DBSIZE + {SCAN_BOUND_SLACK} = {self.bound})"
            )
        return cursor, keys

    def restart(self) -> None:
        """The scan goes on from a cursor it had passed (a batch refused at max_reply_bytes
        is read again and the walk resumes after it): the cursors it sees again are no
        cycle. Its keys and calls still count toward the bound (and the restarts are
        bounded by max_reply_refusals)."""
        self._mark, self._power = None, 1
        self._since = 0

    def _ended(self, why: str) -> ReplyShapeError:
        return ReplyShapeError(
            f"SCAN ended: {why}", where=f"{self.endpoint.name} ({self.endpoint.url()})"
        )
