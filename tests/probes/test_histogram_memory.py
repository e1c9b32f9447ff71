"""A lag histogram is freed when dropped, and probe rounds start spread over their interval."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from replag.histogram import LagHistogram
from replag.service.scheduler import stagger_offsets


@pytest.fixture
def no_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.usefixtures("no_collector")
def test_a_dropped_histogram_is_freed_without_the_cyclic_collector() -> None:
    recorded = LagHistogram()
    for lag_us in (5, 1_500, 250_000):
        recorded.record_us(lag_us)
    decoded = LagHistogram.decode(recorded.encode(), out_of_range=2)
    assert decoded.count == 3 and decoded.out_of_range == 2
    assert decoded.summary_ms() == recorded.summary_ms()
    decoded.merge(recorded)
    assert decoded.count == 6
    arrays = [weakref.ref(h.hdr.counts) for h in (recorded, decoded)]
    del recorded, decoded
    assert [a() for a in arrays] == [None, None]


@dataclass
class _Unit:
    name: str
    interval_s: float
    staggered: bool = True


def test_staggered_units_sharing_an_interval_start_spread_over_it() -> None:
    units = [_Unit(f"probe:g{i}", 10.0) for i in range(4)]
    units += [_Unit("alerts", 10.0, staggered=False), _Unit("probe:slow", 60.0)]
    assert stagger_offsets(units) == {  # type: ignore[arg-type]
        "probe:g0": 0.0,
        "probe:g1": 2.5,
        "probe:g2": 5.0,
        "probe:g3": 7.5,
        "probe:slow": 0.0,
    }
