"""Clock error bounds: the kernel's (adjtimex), a stated one, a round trip's, and their meet."""

from __future__ import annotations

import ctypes
import sys
import time

import pytest

from replag.clockbound import (
    HostClock,
    OffsetInterval,
    WallClock,
    _Timex,
    compare_clocks,
    host_clock,
    kernel_interval,
    read_kernel_clock,
    round_trip_interval,
)


@pytest.mark.skipif(
    sys.platform != "linux" or ctypes.sizeof(ctypes.c_long) != 8, reason="64-bit Linux layout"
)
def test_the_kernel_is_read_with_its_own_struct_layout() -> None:
    assert ctypes.sizeof(_Timex) == 208  # sizeof(struct timex) on x86-64 and arm64 Linux
    clock = read_kernel_clock()
    assert clock.source == "adjtimex"
    assert clock.maxerror_ns is not None and clock.maxerror_ns >= 0
    assert clock.maxerror_ns % 1000 == 0  # the kernel keeps microseconds
    # Synchronised or not, the bound is what the kernel promises: nothing when unsynchronised.
    assert clock.bound_ns == (clock.maxerror_ns if clock.synchronised else None)


def test_a_stated_bound_replaces_the_kernels() -> None:
    stated = host_clock(0.002)
    assert (stated.source, stated.synchronised, stated.bound_ns) == ("setting", True, 2_000_000)
    assert host_clock(None).source in ("adjtimex", "unavailable")
    again = HostClock.from_dict(stated.to_dict())
    assert again == stated


def test_kernel_bounds_add_and_an_unsynchronised_clock_bounds_nothing() -> None:
    a = HostClock(synchronised=True, maxerror_ns=1_000_000, esterror_ns=10, source="adjtimex")
    b = HostClock(synchronised=True, maxerror_ns=3_000_000, esterror_ns=10, source="adjtimex")
    loose = HostClock(
        synchronised=False, maxerror_ns=16_000_000_000, esterror_ns=0, source="adjtimex"
    )
    assert kernel_interval(a, b) == OffsetInterval(-4_000_000, 4_000_000)
    assert kernel_interval(a, loose) is None


def test_a_round_trip_brackets_a_shifted_clock() -> None:
    other = WallClock(offset_ns=3_000_000)
    sent = time.time_ns()
    theirs = other.now_ns()
    received = time.time_ns()
    interval = round_trip_interval(theirs, sent, received)
    assert interval.lo_ns <= 3_000_000 <= interval.hi_ns
    assert interval.hi_ns - interval.lo_ns == received - sent


def test_compare_clocks_takes_the_tighter_and_says_when_they_disagree() -> None:
    synced = HostClock(synchronised=True, maxerror_ns=2_000_000, esterror_ns=0, source="setting")
    unsynced = HostClock(
        synchronised=False, maxerror_ns=None, esterror_ns=None, source="unavailable"
    )
    wan = OffsetInterval(-60_000_000, 100_000_000)  # a 160 ms round trip
    near = OffsetInterval(2_900_000, 3_100_000)
    assert compare_clocks(synced, synced, wan).source == "kernel"
    assert compare_clocks(synced, synced, wan).interval == OffsetInterval(-4_000_000, 4_000_000)
    both = compare_clocks(synced, synced, near)
    assert (both.source, both.interval, both.note) == ("round trip", near, None)
    only = compare_clocks(unsynced, synced, wan)
    assert (only.source, only.interval) == ("round trip", wan)
    assert compare_clocks(unsynced, synced, None).interval is None
    lied = compare_clocks(synced, synced, OffsetInterval(9_000_000, 9_200_000))
    assert lied.interval == OffsetInterval(9_000_000, 9_200_000)
    assert lied.note is not None and "a maxerror is wrong" in lied.note
    partial = compare_clocks(synced, synced, OffsetInterval(3_000_000, 50_000_000))
    assert (partial.source, partial.interval) == (
        "kernel ∩ round trip",
        OffsetInterval(3_000_000, 4_000_000),
    )
