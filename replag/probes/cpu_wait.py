"""How long the replica waited for a CPU before sending an event, to widen push bars.

A push sample's bar assumes the replica sent its keyspace event within a PING round
trip of applying the write. On a shared host that fails when the replica is
descheduled between the two: the event reaches us late by the time it waited for a
CPU, and the estimate with it (measured against MONITOR on both servers with two
CPU burners: ~1 % of samples 0.1-2.7 ms later than their bars allowed, each read
promptly and stamped by the kernel, so not the prober's delay; part of it the
benchmark's MONITOR readers, woken by the replica, preempting it).

Where the replica runs on this host (the lab, an agent beside its replicas) the
kernel says how long it waited: `/proc/<pid>/schedstat` counts the time its main
thread spent runnable but not running, added in full when it gets a CPU again. The
replica got the CPU back after applying and before sending, so at most a PING round
trip before the event arrived: the growth of that count between a sample taken
before then and one after the arrival bounds the wait (`replica_waited`). The pid is
the server's own (`INFO server`), believed only where `/proc/<pid>` is a
redis-server or valkey-server whose title names the endpoint's port.

Elsewhere the prober sees only its own wait (`/proc/thread-self/schedstat`): the
mean wait per scheduling within `WINDOW_NS` either side of an arrival is taken as
how long a process on this host was being held then (`around`; on a quiet host a
few µs, below `NOISE_NS`, not applied). That is an estimate, not a bound: the kernel
gives no other process's wait to bound it with (`/proc/schedstat`'s run-queue totals
are absent from many kernels; `/proc/pressure/cpu` is averaged over CPUs, and read
every few milliseconds it drops what it had not yet counted, for every reader on
the host), and a replica on another host is not covered.
"""

from __future__ import annotations

import bisect
import os

WINDOW_NS = 10_000_000
NOISE_NS = 20_000
_SCHEDSTAT = "/proc/thread-self/schedstat"


def local_server(pid: int, port: int) -> str | None:
    """`/proc/<pid>/schedstat` when that pid is a Redis (or Valkey) server on this host
    whose process title names `port`, else None."""
    try:
        with open(f"/proc/{pid}/comm", "rb") as comm, open(f"/proc/{pid}/cmdline", "rb") as cmd:
            name, title = comm.read().strip(), cmd.read()
    except OSError:
        return None
    if not name.startswith((b"redis-server", b"valkey-server")):
        return None
    return f"/proc/{pid}/schedstat" if b":%d" % port in title else None


def _read(fd: int) -> tuple[int, int]:
    fields = os.pread(fd, 128, 0).split()
    return int(fields[1]), int(fields[2])


class CpuWait:
    """CPU waits sampled as reads happen (`note`): this thread's, and the replica's where
    it runs here (`replica_schedstat`); asked per arrival."""

    def __init__(self, replica_schedstat: str | None = None) -> None:
        self._moments: list[int] = []
        self._counts: list[tuple[int, int]] = []  # (ns waited so far, times scheduled)
        self._replica: list[int] = []  # the replica's ns waited so far, at the same moments
        # Opened on the thread that reads: /proc/thread-self names the opener.
        self._fd = _open(_SCHEDSTAT)
        self._replica_fd = _open(replica_schedstat) if replica_schedstat else None
        # Its samples stay good after the file is closed (at the end of the run).
        self.sees_replica = self._replica_fd is not None

    def note(self, moment: int) -> None:
        """Sample the waits so far, at `moment` on the observer's clock."""
        try:
            own = _read(self._fd) if self._fd is not None else (0, 0)
            replica = _read(self._replica_fd)[0] if self._replica_fd is not None else 0
        except (OSError, IndexError, ValueError):  # the replica exited: stop sampling
            self.close()
            self.sees_replica = False
            return
        self.record(moment, *own, replica_waited_ns=replica)

    def record(
        self, moment: int, waited_ns: int, scheduled: int, *, replica_waited_ns: int = 0
    ) -> None:
        """One sample: `waited_ns` runnable but not running so far, `scheduled` times run
        (this thread), and the replica's `replica_waited_ns`."""
        if self._moments and moment < self._moments[-1]:
            moment = self._moments[-1]
        self._moments.append(moment)
        self._counts.append((waited_ns, scheduled))
        self._replica.append(replica_waited_ns)

    def replica_waited(self, since: int, arrival: int) -> int | None:
        """How long the replica waited for a CPU between a sample at or before `since` and
        the first at or after `arrival` (ns); None when that is not known."""
        if not self.sees_replica:
            return None
        moments = self._moments
        first = bisect.bisect_right(moments, since) - 1
        last = bisect.bisect_left(moments, arrival)
        if first < 0 or last >= len(moments):
            return None
        return max(0, self._replica[last] - self._replica[first])

    def around(self, arrival: int) -> int:
        """Mean wait per scheduling within `WINDOW_NS` of `arrival` (ns; 0 when unknown or
        below `NOISE_NS`), from the last sample before the window to the first after."""
        moments, counts = self._moments, self._counts
        if len(moments) < 2:
            return 0
        first = max(0, bisect.bisect_right(moments, arrival - WINDOW_NS) - 1)
        last = min(len(moments) - 1, bisect.bisect_left(moments, arrival + WINDOW_NS))
        if last <= first:
            return 0
        waited = counts[last][0] - counts[first][0]
        mean = waited // max(1, counts[last][1] - counts[first][1])
        return mean if mean >= NOISE_NS else 0

    def close(self) -> None:
        for fd in (self._fd, self._replica_fd):
            if fd is not None:
                os.close(fd)
        self._fd = self._replica_fd = None


def _open(path: str) -> int | None:
    try:
        return os.open(path, os.O_RDONLY)
    except OSError:
        return None
