"""How long processes on this host waited for a CPU around an arrival, to widen push bars.

A push sample's bar assumes the replica sent its keyspace event within a PING round
trip of applying the write. On a shared host that fails when the replica is
descheduled between the two: the event reaches us late by the time it waited for a
CPU, and the estimate with it (measured against MONITOR on both servers with two
CPU burners: ~1 % of samples 0.1-2.7 ms later than their bars allowed, each read
promptly and stamped by the kernel, so not the prober's delay). The prober cannot
see the replica wait, but the kernel counts, host-wide, the time during which at
least one runnable task waited for a CPU (`/proc/pressure/cpu`, "some" total, in
µs): a replica on this host cannot have waited longer than that in the time before
its event arrived, so the bar's early end moves back by the stall counted in the
`WINDOW_NS` before the arrival (from the last sample before it to the first after).
On a quiet host that is 0. Without pressure accounting (an old kernel, or not
Linux) the fallback is this thread's own mean wait per wakeup
(`/proc/thread-self/schedstat`) in that window: a proxy, not a bound. A replica on
another host, or held longer than the window, is not covered by either.
"""

from __future__ import annotations

import bisect
import os

WINDOW_NS = 10_000_000
_PRESSURE = "/proc/pressure/cpu"
_SCHEDSTAT = "/proc/thread-self/schedstat"


def _open(path: str) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        os.pread(fd, 256, 0)
    except OSError:  # present but not readable (pressure accounting off: EOPNOTSUPP)
        os.close(fd)
        return None
    return fd


class CpuWait:
    """CPU waits sampled as reads happen (`note`), asked per arrival (`before`)."""

    def __init__(self) -> None:
        self._moments: list[int] = []
        self._counts: list[tuple[int, int]] = []  # (ns waited so far, wakeups; 0 for pressure)
        # Opened on the thread that reads: /proc/thread-self names the opener.
        self._fd = _open(_PRESSURE)
        self.source = "pressure"
        if self._fd is None:
            self._fd = _open(_SCHEDSTAT)
            self.source = "own" if self._fd is not None else "none"

    def note(self, moment: int) -> None:
        """Sample the waits so far, at `moment` on the observer's clock."""
        if self._fd is None:
            return
        try:
            text = os.pread(self._fd, 256, 0)
            if self.source == "pressure":
                total = text.split(b"\n", 1)[0].rsplit(b"total=", 1)[1]
                counts = (int(total) * 1000, 0)
            else:
                fields = text.split()
                counts = (int(fields[1]), int(fields[2]))
        except (OSError, IndexError, ValueError):
            self.close()
            return
        if self._moments and moment < self._moments[-1]:
            moment = self._moments[-1]
        self._moments.append(moment)
        self._counts.append(counts)

    def before(self, arrival: int) -> int:
        """How long a process may have waited for a CPU in the `WINDOW_NS` before `arrival`
        (ns, 0 when unknown): the host's stall then, or (fallback) our mean wait per wakeup."""
        moments = self._moments
        first = bisect.bisect_right(moments, arrival - WINDOW_NS) - 1
        last = bisect.bisect_left(moments, arrival)
        if first < 0 or last >= len(moments) or last <= first:
            return 0
        waited = self._counts[last][0] - self._counts[first][0]
        if self.source == "pressure":
            return max(0, min(waited, moments[last] - moments[first]))
        wakeups = self._counts[last][1] - self._counts[first][1]
        return max(0, waited // max(1, wakeups))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
