"""How long processes on this host wait for a CPU around an arrival, to widen push bars.

A push sample's bar assumes the replica sent its keyspace event within a PING round
trip of applying the write. On a shared host that fails when the replica is
descheduled between the two: the event reaches us late by the time it waited for a
CPU, and the estimate with it (measured against MONITOR on both servers with two
CPU burners: ~1 % of samples 0.1-2.7 ms later than their bars allowed, each read
promptly and stamped by the kernel, so not the prober's delay; part of it the
benchmark's MONITOR readers, woken by the replica, preempting it). The prober cannot
see the replica wait, but it can see its own: the kernel counts the time this
thread spent runnable but not running and how often it was scheduled
(`/proc/thread-self/schedstat`, sampled as events are read and keys written). The
mean wait per scheduling within `WINDOW_NS` either side of an arrival is how long
a process on this host was being held then, and the bar's early end moves back by
it. On a quiet host that is a few µs, below `NOISE_NS`, and not applied.

It is an estimate, not a bound: the kernel gives no wait of another process that
would bound it (`/proc/schedstat`'s run-queue totals are absent from many kernels;
`/proc/pressure/cpu` is averaged over CPUs, and read every few milliseconds it
drops what it had not yet counted, for every reader on the host), and a replica on
another host is not covered.
"""

from __future__ import annotations

import bisect
import os

WINDOW_NS = 10_000_000
NOISE_NS = 20_000
_SCHEDSTAT = "/proc/thread-self/schedstat"


class CpuWait:
    """This thread's CPU waits sampled as reads happen (`note`), asked per arrival."""

    def __init__(self) -> None:
        self._moments: list[int] = []
        self._counts: list[tuple[int, int]] = []  # (ns waited so far, times scheduled)
        try:
            # Opened on the thread that reads: /proc/thread-self names the opener.
            self._fd: int | None = os.open(_SCHEDSTAT, os.O_RDONLY)
        except OSError:
            self._fd = None

    def note(self, moment: int) -> None:
        """Sample the wait so far, at `moment` on the observer's clock."""
        if self._fd is None:
            return
        try:
            fields = os.pread(self._fd, 128, 0).split()
            waited, scheduled = int(fields[1]), int(fields[2])
        except (OSError, IndexError, ValueError):
            self.close()
            return
        self.record(moment, waited, scheduled)

    def record(self, moment: int, waited_ns: int, scheduled: int) -> None:
        """One sample: `waited_ns` runnable but not running so far, `scheduled` times run."""
        if self._moments and moment < self._moments[-1]:
            moment = self._moments[-1]
        self._moments.append(moment)
        self._counts.append((waited_ns, scheduled))

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
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
