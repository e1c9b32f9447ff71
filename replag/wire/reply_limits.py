"""Limits on what a server's reply may announce, checked before hiredis allocates it.

hiredis allocates what a header announces: a list of 2^31 slots for `*2147483648`,
a buffer that grows with the stream for `$1000000000000`, a task per level of
nesting. `ReplyGuard` reads the same bytes first, header by header (skipping bulk
payloads by their length, so it costs one step per element, never per byte), and
raises `ReplyLimitError` when a reply announces or carries more than the
`ReplyLimits` allow: `max_reply_bytes`, `max_reply_elements`, `max_reply_depth`.
Every reader replag has (`resp.RespConnection`, `resp_blocking.BlockingConnection`,
redis-py's parser in `connections`) feeds hiredis only what its guard has passed.

The limits are settings, carried by each `Endpoint` (as its TLS options are: the
config sets them on every endpoint it makes, and an endpoint derived from another keeps
them), so every reader of a connection to it applies them and no process-wide value
exists.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

_MIB = 1 << 20


@dataclass(frozen=True, kw_only=True)
class ReplyLimits:
    """The most one reply may hold. Defaults: what a default Redis can legitimately send
    (proto-max-bulk-len is 512 MB) and far more elements or levels than replag ever asks for."""

    max_bytes: int = 512 * _MIB
    max_elements: int = 1_000_000
    max_depth: int = 16
    # Totals beyond one reply's (`replag.wire.shapes`, `resp`): an INFO's size and lines,
    # the bytes a connection may receive while no request waits, the nodes one topology
    # answer (CLUSTER SHARDS, SENTINEL REPLICAS, INFO's replica lines) may name.
    max_info_bytes: int = 4 * _MIB
    max_info_lines: int = 100_000
    max_unrequested_bytes: int = _MIB
    max_topology_nodes: int = 10_000
    # The most of one string value read in pages (GETRANGE): a server claiming more ends
    # the read there (Redis's own strings stop at proto-max-bulk-len, 512 MB by default).
    max_string_bytes: int = 4 << 30
    # The most replies of one server a run (one scan) refuses at max_bytes and reads again
    # in smaller pieces (`refusals`): past it the run ends, naming the server and command.
    max_reply_refusals: int = 1000
    # The most bytes of replies not yet read whole that one server's connections hold
    # at once, in one process (`held`): each reply may pass max_bytes, not all together.
    max_held_bytes: int = 512 * _MIB
    # The longest value a probe key holds (`replag.probes.keys`): a poll's MGET of N probe
    # keys may carry N of them (`reply_bounds.probe_values`), not max_bytes.
    max_probe_value_bytes: int = 1024


DEFAULT = ReplyLimits()


def from_settings(settings: object) -> ReplyLimits:
    """The limits a `Settings` declares (max_reply_bytes, _elements, _depth)."""
    return ReplyLimits(
        max_bytes=getattr(settings, "max_reply_bytes"),  # noqa: B009  (no import cycle)
        max_elements=getattr(settings, "max_reply_elements"),  # noqa: B009
        max_depth=getattr(settings, "max_reply_depth"),  # noqa: B009
        max_info_bytes=getattr(settings, "max_info_bytes"),  # noqa: B009
        max_info_lines=getattr(settings, "max_info_lines"),  # noqa: B009
        max_unrequested_bytes=getattr(settings, "max_unrequested_bytes"),  # noqa: B009
        max_topology_nodes=getattr(settings, "max_topology_nodes"),  # noqa: B009
        max_string_bytes=getattr(settings, "max_string_bytes"),  # noqa: B009
        max_reply_refusals=getattr(settings, "max_reply_refusals"),  # noqa: B009
        max_held_bytes=getattr(settings, "max_held_bytes"),  # noqa: B009
        max_probe_value_bytes=getattr(settings, "max_probe_value_bytes"),  # noqa: B009
    )


@dataclass(frozen=True)
class ReplyBound:
    """The most one reply may carry where its request says what it can hold (a TIME, the
    MGET of a few probe keys), far below max_reply_bytes; `said` names the bound and its
    setting for the error ("3 probe keys x max_probe_value_bytes = 1 KB: 3120 bytes")."""

    max_bytes: int
    said: str


class ReplyLimitError(Exception):
    """A reply announced or carried more than a limit allows (the message names the limit's
    setting and what the server announced); the connection is unusable after it.
    `command`: the command whose reply it was, where known."""

    def __init__(self, message: str, *, command: str | None = None) -> None:
        super().__init__(message)
        self.command = command


class NotRespHeader(Exception):
    """Bytes where a reply header must be that are no RESP header (`connections.not_resp`)."""


def command_name(request: bytes) -> str:
    """The name of the first command in a packed request (`*N $L NAME …`), for errors."""
    parts = request.split(b"\r\n", 3)
    if len(parts) >= 3 and parts[0].startswith(b"*") and parts[1].startswith(b"$"):
        return parts[2][:32].decode("ascii", "replace").upper()
    return "a command"


def size_text(n: int) -> str:
    if n >= _MIB and n % _MIB == 0:
        return f"{n // _MIB} MB"
    return f"{n} bytes"


def _skip_bulks(
    buf: bytes | bytearray, pos: int, end: int, left: int, max_bytes: int
) -> tuple[int, int]:
    """From `pos`, inside an aggregate with `left` elements to come, step over whole bulk
    strings while the next lies whole before `end` and is not the aggregate's last; stop
    at anything else, for the general path. `(pos, left)` after them. The C extension's
    `skip_bulks` does the same about 15 times faster (the guard's cost per key while
    scanning); this is its twin where the extension was not built."""
    find = buf.find
    while True:
        nl = find(b"\r\n", pos, end)
        if nl < 0:
            break
        length = int(buf[pos + 1 : nl])
        if length > max_bytes or length < -1:
            break  # the general path says why
        after = nl + 4 + length if length >= 0 else nl + 2
        if after >= end or left == 1:
            break
        pos = after
        left -= 1
        if buf[pos] != 36:
            break
    return pos, left


skip_bulks: Callable[[bytes | bytearray, int, int, int, int], tuple[int, int]] = _skip_bulks
try:
    from replag import _scanindex

    skip_bulks = getattr(_scanindex, "skip_bulks", _skip_bulks)  # an older build lacks it
except ImportError:  # built without the C extension
    pass


# Header kinds (the first byte of a reply): one line, a length then a payload, a count.
_LINES = frozenset(b"+-:,#_(")
_BULKS = frozenset(b"$!=")
_AGGREGATES = {ord("*"): 1, ord("~"): 1, ord(">"): 1, ord("%"): 2}
_LINE_RUN = re.compile(rb"(?:[-+:,#_(][^\r\n]*\r\n)+")
_LONGEST_HEADER = 32  # a kind, a 64-bit signed number and CRLF fit in 22


def _after_lines(buf: bytes | bytearray, pos: int, end: int, lines: int) -> int:
    """Where the `lines`-th line from `pos` ends (`buf[pos:end]` holds more than that)."""
    if lines < 64:
        for _ in range(lines):
            pos = buf.find(b"\r\n", pos, end) + 2
        return pos
    import numpy as np  # here, not at the top: `replag --help` and the probe load no numpy

    newlines = np.flatnonzero(np.frombuffer(buf, np.uint8, end - pos, pos) == 10)
    return pos + int(newlines[lines - 1]) + 1


class ReplyGuard:
    """Follows the structure of a stream of replies, chunk by chunk (`feed`), and raises
    `ReplyLimitError` on the first header that breaks a limit, before hiredis sees it.

    State between chunks: the counts of the aggregates still open (`_open`), the bytes of
    a bulk payload still to come (`_skip`), the start of a header line cut by the chunk's
    end (`_partial`), and where the current top-level reply began in the stream.
    """

    __slots__ = (
        "_bounds",
        "_elements",
        "_index",
        "_offset",
        "_open",
        "_partial",
        "_reply_start",
        "_skip",
        "limits",
    )

    def __init__(self, limits: ReplyLimits | None = None) -> None:
        self.limits = limits or DEFAULT
        self._open: list[int] = []
        self._skip = 0
        self._partial: bytes | None = None
        self._offset = 0  # stream bytes before the chunk being fed
        self._reply_start = 0  # stream offset where the current top-level reply began
        self._elements = 0  # elements announced by the current top-level reply
        self._index = 0  # top-level replies finished in the stream so far
        # Reply index → a bound below max_bytes that reply must keep (`bound`).
        self._bounds: dict[int, ReplyBound] = {}

    def bound(self, index: int, bound: ReplyBound) -> None:
        """The `index`-th top-level reply of the stream (from 0) may carry at most
        `bound.max_bytes` (its request says what it can hold: `reply_bounds`). Checked when
        it ends and at the end of every chunk it is still open in, so a reply over it is
        refused once one chunk past it, whatever it announced."""
        if index >= self._index:
            self._bounds[index] = bound

    @property
    def idle(self) -> bool:
        """At a reply boundary: no reply begun and not finished."""
        return not self._open and not self._skip and self._partial is None

    def feed(self, buf: bytes | bytearray, end: int | None = None) -> None:
        """Check `buf[:end]`, the next bytes of the stream (raises before anything is kept)."""
        end = len(buf) if end is None else end
        pos = 0
        if self._partial is not None:
            pos = self._resume_header(buf, end)
            if pos < 0:
                self._offset += end
                self._check_carried()
                return
        if self._skip:
            if self._skip > end - pos:
                self._skip -= end - pos
                self._offset += end
                self._check_carried()
                return
            pos += self._skip
            self._skip = 0
            self._element_done(pos)
        self._walk(buf, pos, end)
        self._offset += end
        self._check_carried()

    def _walk(self, buf: bytes | bytearray, pos: int, end: int) -> None:
        try:
            self._steps(buf, pos, end)
        except ValueError:  # int() of what is no number: hiredis refuses it too
            raise NotRespHeader(bytes(buf[pos : pos + 48])) from None

    def _steps(self, buf: bytes | bytearray, pos: int, end: int) -> None:
        # Hot loop: one iteration per element of every reply (per key while scanning).
        # int() takes forms hiredis refuses (" 5", "5_0"): hiredis then stops there.
        opened = self._open
        find = buf.find
        max_bytes = self.limits.max_bytes
        while pos < end:
            if opened and buf[pos] == 36:
                # The common aggregate: bulk strings (an MGET, a SCAN page), in a tight loop.
                pos, opened[-1] = skip_bulks(buf, pos, end, opened[-1], max_bytes)
            nl = find(b"\r\n", pos, end)
            if nl < 0:
                self._keep_partial(buf, pos, end)
                return
            kind = buf[pos]
            if kind in _BULKS:
                length = int(buf[pos + 1 : nl])
                if length >= 0:
                    if length > max_bytes:
                        raise self._too_big(kind, length, self._offset + pos - self._reply_start)
                    after = nl + 4 + length
                    if after > end:
                        self._skip = after - end
                        return
                    pos = after
                elif length == -1:
                    pos = nl + 2
                else:
                    raise NotRespHeader(bytes(buf[pos:nl]))
            elif kind in _LINES:
                # A run of one-line replies (a batch's PTTLs) or elements, matched in C.
                run = _LINE_RUN.match(buf, pos, end)
                if run is not None and run.end() > nl + 2:
                    lines = buf.count(b"\r\n", pos, run.end())
                    if not opened:
                        pos = run.end()
                        self._reply_done(pos, lines)
                        continue
                    if opened[-1] > lines:
                        opened[-1] -= lines
                        pos = run.end()
                        continue
                    # The run reaches past the aggregate's end (an array of integers, an
                    # HPEXPIRETIME's, then the next reply): all but its last element
                    # skipped here, not one line per pass of the match (quadratic).
                    skip = opened[-1] - 1
                    if skip > 0:
                        pos = _after_lines(buf, pos, run.end(), skip)
                        opened[-1] -= skip
                        continue
                pos = nl + 2
            elif kind in _AGGREGATES:
                count = int(buf[pos + 1 : nl])
                pos = nl + 2
                if count > 0:
                    self._open_aggregate(kind, count * _AGGREGATES[kind])
                    continue
                if count < -1:
                    raise NotRespHeader(b"%c%d" % (kind, count))
            else:
                raise NotRespHeader(bytes(buf[pos : min(nl, pos + 48)]))
            # One element done: close every aggregate it completes.
            while opened:
                left = opened[-1] - 1
                if left:
                    opened[-1] = left
                    break
                opened.pop()
            else:
                self._reply_done(pos)

    def _element_done(self, pos: int) -> None:
        opened = self._open
        while opened:
            left = opened[-1] - 1
            if left:
                opened[-1] = left
                return
            opened.pop()
        self._reply_done(pos)

    def _reply_done(self, pos: int, replies: int = 1) -> None:
        """`replies` top-level replies ended at `pos` of the chunk (more than one: a run
        of one-line replies, each within the chunk): none may have been too big."""
        start, self._reply_start = self._reply_start, self._offset + pos
        self._elements = 0
        carried = self._reply_start - start
        if carried > self.limits.max_bytes:
            raise ReplyLimitError(
                f"the reply carried {carried} bytes, over max_reply_bytes = "
                f"{size_text(self.limits.max_bytes)}"
            )
        index = self._index
        self._index = index + replies
        if self._bounds:
            bound = self._bounds.pop(index, None)
            if replies > 1:
                for late in [i for i in self._bounds if i < self._index]:
                    del self._bounds[late]
            elif bound is not None and carried > bound.max_bytes:
                raise ReplyLimitError(f"the reply carried {carried} bytes, over {bound.said}")

    def _open_aggregate(self, kind: int, count: int) -> None:
        limits = self.limits
        self._elements += count
        if self._elements > limits.max_elements:
            raise ReplyLimitError(
                f"the reply announced {chr(kind)}{count // _AGGREGATES[kind]} "
                f"({self._elements} elements in all), over max_reply_elements = "
                f"{limits.max_elements}"
            )
        if len(self._open) >= limits.max_depth:
            raise ReplyLimitError(
                f"the reply nests aggregates deeper than max_reply_depth = {limits.max_depth}"
            )
        self._open.append(count)

    def _too_big(self, kind: int, length: int, taken: int) -> ReplyLimitError:
        limit = size_text(self.limits.max_bytes)
        if length > self.limits.max_bytes:
            said = f"announced {chr(kind)}{length}"
        else:
            said = f"announced {chr(kind)}{length} after {taken} bytes of the same reply"
        return ReplyLimitError(f"the reply {said}, over max_reply_bytes = {limit}")

    def _keep_partial(self, buf: bytes | bytearray, pos: int, end: int) -> None:
        kind = buf[pos]
        if kind in _LINES:
            # Only its end matters: keep the kind, and a CR that may start the CRLF.
            self._partial = bytes([kind]) + (b"\r" if buf[end - 1] == 13 else b"")
            return
        if end - pos > _LONGEST_HEADER or (kind not in _BULKS and kind not in _AGGREGATES):
            raise NotRespHeader(bytes(buf[pos : min(end, pos + 48)]))
        self._partial = bytes(buf[pos:end])

    def _resume_header(self, buf: bytes | bytearray, end: int) -> int:
        """Finish the header cut by the last chunk's end: where the walk goes on in `buf`
        (after the header; after its payload is handled by `_skip`), -1 if still cut."""
        partial = self._partial
        assert partial is not None
        if partial.endswith(b"\r") and end and buf[0] == 10:
            line, after = partial[:-1], 1
        else:
            nl = buf.find(b"\r\n", 0, end)
            if nl < 0:
                if partial[0] in _LINES:
                    self._partial = partial[:1] + (b"\r" if end and buf[end - 1] == 13 else b"")
                else:
                    joined = partial + bytes(buf[: min(end, _LONGEST_HEADER + 1)])
                    if len(joined) > _LONGEST_HEADER:
                        raise NotRespHeader(joined[:48])
                    self._partial = joined
                return -1
            if partial[0] in _LINES:
                line, after = partial[:1], nl + 2
            else:
                line, after = partial + bytes(buf[:nl]), nl + 2
        self._partial = None
        # Walk the header alone (with its CRLF), at its place in the stream.
        header = line + b"\r\n"
        saved = self._offset
        self._offset = saved + after - len(header)
        try:
            self._walk(header, 0, len(header))
        finally:
            self._offset = saved
        return after

    def _check_carried(self) -> None:
        """A reply still open at the chunk's end may not have carried more than the limit
        (a line that never ends, a bulk announced within the limit and streamed past it)."""
        carried = self._offset - self._reply_start
        if carried > self.limits.max_bytes and not self.idle:
            raise ReplyLimitError(
                f"the reply carried {carried} bytes and is not over, over max_reply_bytes = "
                f"{size_text(self.limits.max_bytes)}"
            )
        if self._bounds and not self.idle:
            bound = self._bounds.get(self._index)
            if bound is not None and carried > bound.max_bytes:
                raise ReplyLimitError(
                    f"the reply carried {carried} bytes and is not over, over {bound.said}"
                )


__all__ = [
    "DEFAULT",
    "NotRespHeader",
    "ReplyBound",
    "ReplyGuard",
    "ReplyLimitError",
    "ReplyLimits",
    "command_name",
    "from_settings",
]
