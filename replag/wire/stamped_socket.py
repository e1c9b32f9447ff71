"""A TCP connection whose every read carries the kernel's receive timestamp.

asyncio's transports read with `recv` and so can only stamp bytes when the
event loop gets to them: on a busy host that is milliseconds after they
arrived. Here the socket has `SO_TIMESTAMPNS` on and is read with `recvmsg`:
each chunk comes with the moment the kernel received the last packet in it.

Kernel stamps are on CLOCK_REALTIME. A chunk's stamp is moved onto the
connection's own clock (the probe's is CLOCK_MONOTONIC) by the offset
between the two clocks read right after `recvmsg` returns, sandwiched
(clock, realtime, clock) and midpointed, the narrowest of a few sandwiches
when preemption widens one: the stamp and that offset are
microseconds to milliseconds apart, so NTP slewing in between (≤ 0.5 ms/s)
costs nanoseconds. A stamp is believed only inside the window the bytes can
have arrived in (after the previous read that emptied the socket began,
before this one returned); outside it (the realtime clock stepped between
packet and read, or a stamp of another clock base got through) the read's
own moment is used.

TCP merges packets that queue up unread, and a merged packet keeps the last
one's stamp, so of several messages read in one chunk only the one ending
the chunk has an exact arrival; the others arrived after the previous read
(which emptied the socket) and by the stamp. `received` gets that bracket.
Where the option is missing (not Linux, or an architecture whose socket
numbers differ) the stamp is the clock read when the bytes were read.
"""

from __future__ import annotations

import asyncio
import collections
import os
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

# <asm-generic/socket.h>; Python's socket module does not export it. Architectures
# with their own numbering (alpha, mips, parisc, sparc) are left without stamps.
SO_TIMESTAMPNS = 35
_GENERIC_SOCKET_NUMBERS = ("x86_64", "i686", "i386", "aarch64", "armv7l", "riscv64", "s390x")
_TIMESPEC = struct.Struct("@ll")  # struct timespec (time_t and long are native longs)
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size)
READ_SIZE = 1024 * 1024

Clock = Callable[[], int]


class StampedReceiver(Protocol):
    def received(self, data: bytes, arrived: int, since: int) -> None:
        """`data` ended arriving at `arrived`; any of it began arriving after `since`."""

    def connection_lost(self, exc: Exception | None) -> None: ...


def kernel_stamps_possible() -> bool:
    return sys.platform == "linux" and os.uname().machine in _GENERIC_SOCKET_NUMBERS


def enable_kernel_stamps(sock: socket.socket) -> bool:
    """Ask the kernel to stamp what `sock` receives; False where it cannot."""
    if not kernel_stamps_possible():
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def kernel_stamp(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    """The receive timestamp in `recvmsg`'s ancillary data: CLOCK_REALTIME ns, or None."""
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            seconds, nanos = _TIMESPEC.unpack_from(payload)
            return int(seconds) * 1_000_000_000 + int(nanos)
    return None


# A sandwich (clock, realtime, clock) this narrow is taken as is; a wider one (the
# process was preempted inside it, and on a saturated host that is a whole time
# slice) is read again, up to _SANDWICHES times, keeping the narrowest.
_TIGHT_NS = 20_000
_SANDWICHES = 4


def clock_offset(clock: Clock) -> int:
    """`clock` minus CLOCK_REALTIME now, from the narrowest of a few sandwiches.

    A sandwich's midpoint is wrong by up to half its width: one taken across a
    preemption would move a stamp by half a scheduler slice (milliseconds on a
    busy host), which is why a wide one is not used when a narrower one can be had.
    """
    return clock_offset_and_width(clock)[0]


def clock_offset_and_width(clock: Clock) -> tuple[int, int]:
    """`clock_offset`, and the width of the sandwich it came from (twice its error bound)."""
    best_width = best_offset = 0
    for attempt in range(_SANDWICHES):
        first = clock()
        wall = time.time_ns()
        second = clock()
        width = second - first
        if attempt == 0 or width < best_width:
            best_width, best_offset = width, (first + second) // 2 - wall
        if width <= _TIGHT_NS:
            break
    return best_offset, best_width


def on_clock(realtime_ns: int, clock: Clock) -> int:
    """A CLOCK_REALTIME moment of the last few milliseconds, on `clock` (see the module)."""
    if clock is time.time_ns:
        return realtime_ns
    return realtime_ns + clock_offset(clock)


@dataclass(frozen=True, slots=True)
class ReadStamp:
    """How one read was stamped: when it returned (`read_at`), the moment before which
    none of its bytes can have arrived (`since`: the previous read that emptied the
    socket began then), whether its arrival is the kernel's receive timestamp (`kernel`;
    else it is `read_at`), and how far that stamp may be off from moving it onto the
    connection's clock (`error_ns`: half the clock sandwich's width, 0 on the wall clock)."""

    read_at: int
    since: int
    kernel: bool
    error_ns: int = 0


def arrival(ancillary: list[tuple[int, int, bytes]], clock: Clock, since: int, read_at: int) -> int:
    """When a read's last byte arrived, on `clock` (`stamped_arrival`'s moment)."""
    return stamped_arrival(ancillary, clock, since, read_at)[0]


def stamped_arrival(
    ancillary: list[tuple[int, int, bytes]], clock: Clock, since: int, read_at: int
) -> tuple[int, ReadStamp]:
    """When a read's last byte arrived, on `clock`, and how that was stamped: the
    kernel's stamp when it is plausible (after `since`, the moment before which the
    bytes cannot have arrived, and not after `read_at`, when the read returned), else
    `read_at`. A stamp outside is not believed: a step of the realtime clock between
    packet and read, or a timestamp on another clock base leaking through a network path."""
    stamp = kernel_stamp(ancillary)
    if stamp is None:
        return read_at, ReadStamp(read_at, since, kernel=False)
    if clock is time.time_ns:
        moment, width = stamp, 0
    else:
        offset, width = clock_offset_and_width(clock)
        moment = stamp + offset
    if since <= moment <= read_at:
        return moment, ReadStamp(read_at, since, kernel=True, error_ns=(width + 1) // 2)
    return read_at, ReadStamp(read_at, since, kernel=False)


class StampedReader:
    """Blocking reads of a connected socket, each with its arrival on `clock`."""

    def __init__(self, sock: socket.socket, clock: Clock) -> None:
        self.sock = sock
        self.clock = clock
        self.kernel_stamps = enable_kernel_stamps(sock)
        self._since = clock()

    def recv(self, size: int) -> tuple[bytes, int]:
        reading = self.clock()
        data, ancillary, _, _ = self.sock.recvmsg(size, _ANCILLARY)
        read_at = self.clock()
        arrived = arrival(ancillary, self.clock, self._since, read_at)
        if len(data) < size:  # took everything there was: what follows arrived later
            self._since = reading
        return data, arrived


class StampedSocket:
    """A minimal transport over a connected non-blocking socket (write, close, abort)."""

    def __init__(
        self, sock: socket.socket, receiver: StampedReceiver, clock: Clock, *, stamped: bool
    ) -> None:
        self._sock = sock
        self._fd = sock.fileno()
        self._receiver = receiver
        self._clock = clock
        self.kernel_stamps = stamped
        # The read being handed to the receiver (or the last one): what a receiver that
        # must know how its bytes were stamped reads while `received` runs.
        self.last_read: ReadStamp | None = None
        self._loop = asyncio.get_running_loop()
        self._pending: collections.deque[memoryview] = collections.deque()
        self._closing = False
        self._closed = False
        # Before the first read nothing was read: bytes may have arrived since connecting.
        self._since = clock()
        self._loop.add_reader(self._fd, self._read_ready)

    def fileno(self) -> int:
        return self._fd

    def _read_ready(self) -> None:
        reading = self._clock()
        try:
            data, ancillary, _, _ = self._sock.recvmsg(READ_SIZE, _ANCILLARY)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._shut(exc)
            return
        read_at = self._clock()
        if not data:
            self._shut(None)
            return
        since = self._since
        arrived, self.last_read = stamped_arrival(ancillary, self._clock, since, read_at)
        # This read took everything there was, so what comes next arrived after it
        # began; one that filled the buffer may have left bytes that arrived earlier.
        if len(data) < READ_SIZE:
            self._since = reading
        self._receiver.received(data, arrived, since)

    def write(self, data: bytes) -> None:
        if self._closing:
            # As asyncio's transports do: the receiver's connection_lost (scheduled, or
            # run) fails whatever waits for a reply.
            return
        view = memoryview(data)
        if not self._pending:
            try:
                sent = self._sock.send(view)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                self._shut(exc)
                return
            view = view[sent:]
            if not view:
                return
            self._loop.add_writer(self._fd, self._write_ready)
        self._pending.append(view)

    def _write_ready(self) -> None:
        while self._pending:
            view = self._pending[0]
            try:
                sent = self._sock.send(view)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._shut(exc)
                return
            if sent < len(view):
                self._pending[0] = view[sent:]
                return
            self._pending.popleft()
        self._loop.remove_writer(self._fd)
        if self._closing:
            self._shut(None)

    def is_closing(self) -> bool:
        return self._closing or self._closed

    def close(self) -> None:
        """Close once everything written so far has been sent."""
        self._closing = True
        if not self._pending:
            self._shut(None)

    def abort(self) -> None:
        self._pending.clear()
        self._shut(None)

    def _shut(self, exc: Exception | None) -> None:
        if self._closed:
            return
        self._closed = self._closing = True
        self._loop.remove_reader(self._fd)
        self._loop.remove_writer(self._fd)
        self._pending.clear()
        self._sock.close()
        self._loop.call_soon(self._receiver.connection_lost, exc)


# Linux stamps received packets only while some socket has asked for stamps, and the
# switch that turns stamping on for the whole host (a static key) is flipped by a
# deferred work item: TCP segments that arrive in between carry no stamp (a datagram
# would be stamped when read, so only TCP shows whether the switch is on), and on a
# busy host "in between" is milliseconds. A loopback TCP pair kept open for the
# process's life holds the switch on; it is checked once, by a byte sent across it.
_keeper: tuple[socket.socket, socket.socket] | None = None
_SWITCH_WAIT_S = 0.5


def _loopback_pair() -> tuple[socket.socket, socket.socket]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        reader = socket.create_connection(listener.getsockname(), timeout=1)
        writer, _ = listener.accept()
    reader.setblocking(False)
    writer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return reader, writer


async def hold_kernel_stamping() -> bool:
    """Turn the host's packet stamping on, and keep it on while this process lives.

    Returns once a byte sent over loopback TCP comes back stamped (True), or after
    half a second without one (False: reads then fall back to the moment of reading).
    """
    global _keeper
    if _keeper is not None:
        return True
    try:
        pair: tuple[socket.socket, socket.socket] | None = _loopback_pair()
    except OSError:
        return False
    assert pair is not None
    reader, writer = pair
    try:
        if not enable_kernel_stamps(reader):
            return False
        deadline = time.monotonic() + _SWITCH_WAIT_S
        while True:
            writer.send(b".")
            await asyncio.sleep(0.001)
            try:
                _, ancillary, _, _ = reader.recvmsg(64, _ANCILLARY)
            except BlockingIOError:
                ancillary = []
            if kernel_stamp(ancillary) is not None:
                if _keeper is None:  # connections racing here each tried: keep one
                    _keeper, pair = pair, None
                return True
            if time.monotonic() > deadline:
                return False
    finally:
        if pair is not None:
            reader.close()
            writer.close()


async def connect_stamped(
    host: str, port: int, receiver: StampedReceiver, clock: Clock
) -> StampedSocket:
    """Connect to host:port (each address in turn) and start reading with stamps."""
    loop = asyncio.get_running_loop()
    last: OSError | None = None
    for family, kind, proto, _, address in await loop.getaddrinfo(
        host, port, type=socket.SOCK_STREAM
    ):
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            last = exc
            continue
        except BaseException:
            sock.close()
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stamped = enable_kernel_stamps(sock)
        if stamped:
            await hold_kernel_stamping()
        return StampedSocket(sock, receiver, clock, stamped=stamped)
    raise last or OSError(f"cannot resolve {host}:{port}")
