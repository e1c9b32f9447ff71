"""An agent's half of lag through agents, on a real WAN lab: probe keys watched on a region's
replicas at their local addresses, reported on a (shifted) wall clock, and brought back onto
the prober's clock with the clock bound in every bracket.

The relay's truth for a key: its bytes entered the replication link at t_in and were held
there at least the link's 10 ms, so the replica applied the write after t_in + 10 ms and
every bracket's upper end must be at or after that, on any machine load. Nothing asserts
how soon.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from replag.clockbound import OffsetInterval, WallClock
from replag.config import load_config
from replag.errors import UsageError
from replag.lab.cluster import lab_status
from replag.lab.relay import read_truth
from replag.probes.remote import ProberMapping, RemoteObserver
from replag.probes.watch import WatchBook, WatchSpec
from replag.topology import Endpoint
from replag.wire.resp import RespConnection
from tests.helpers.lab import LabFactory
from tests.helpers.waiting import until

PREFIX = "replag:probe:"
OUT_NS = 10_000_000


async def _write(primary: Endpoint, stem: bytes, count: int) -> None:
    conn = await RespConnection.open(primary.in_region(), timeout_s=10, clock=time.monotonic_ns)
    try:
        for seq in range(count):
            await conn.checked("SET", stem + str(seq).encode(), b"v", "PX", 60_000)
    finally:
        await conn.close()


@pytest.mark.parametrize("mode", ["push", "poll"])
async def test_arrivals_are_watched_locally_on_a_shifted_clock(
    lab_factory: LabFactory, mode: str
) -> None:
    state = lab_factory(
        regions=("home", "far"), delays_ms={"far": 10}, back_ms={"far": 60}, wan=True
    )
    lab_dir = Path(state["dir"])
    config = load_config(lab_dir / "topology.toml")
    far = config.topology.region("far").replicas
    primary = config.topology.region("home").write
    assert primary is not None
    offset_ns = 3_000_000
    book = WatchBook(far, config.settings, clock=WallClock(offset_ns=offset_ns))
    stem = f"{PREFIX}run{mode}:".encode()
    spec = WatchSpec(
        run_id=f"run{mode}", stem=stem, count=20, pattern=stem + b"*", mode=mode, timeout_s=30
    )
    watch = await book.open(spec)
    try:
        await _write(primary, stem, 20)
        await watch.wait(20)
        done_ns = time.monotonic_ns()  # after every arrival: an upper bound for each
        report = watch.report()
        # The agent never crossed the WAN: the prober's view of far-1 has had no connection.
        links = {link["name"]: link for link in lab_status(lab_dir)["links"]}
        assert links["view-far-1"]["connections"] == 0
    finally:
        await book.close_all()
    assert report["complete"] and report["run_id"] == f"run{mode}"
    (row,) = report["replicas"]
    assert (row["name"], row["observed_by"], row["error"]) == ("far-1", mode, None)
    assert [r[0] for r in row["arrivals"]] == list(range(20))
    truth = read_truth(lab_dir / "truth-far-1.log")
    mapping, _ = WallClock().wall_minus_monotonic()
    for seq, _estimate, lo, hi in row["arrivals"]:
        t_in, _t_out = truth[(stem + str(seq).encode()).decode()]
        # On the agent's clock (3 ms ahead), the replica applied the key after t_in + 10 ms.
        assert report["base_ns"] + hi >= t_in + OUT_NS + mapping + offset_ns
        assert lo <= _estimate <= hi

    # Back on the prober's clock: a round trip told us the agent runs 3 ms ahead (± 0.5).
    observer = RemoteObserver(far[0], stem=stem, agent="http://agent")
    observer.absorb(
        row,
        base_ns=report["base_ns"],
        offset=OffsetInterval(offset_ns - 500_000, offset_ns + 500_000),
        prober=ProberMapping(wall_minus_mono_ns=mapping, uncertainty_ns=1000),
    )
    assert observer.mode == f"agent/{mode}" and len(observer.arrivals) == 20
    # Which arrivals were read together with later ones travels too (within_chunks).
    merged = {seq for seq in range(20) if observer.arrivals[stem + str(seq).encode()].merged}
    assert merged == set(row["merged"]) <= set(range(20))
    # And which of those were read at once (their chunk's arrival is theirs).
    prompt = {seq for seq in range(20) if observer.arrivals[stem + str(seq).encode()].prompt}
    assert prompt == set(row["prompt"]) <= merged
    for seq in range(20):
        arrival = observer.arrivals[stem + str(seq).encode()]
        t_in, _t_out = truth[(stem + str(seq).encode()).decode()]
        # Prober-monotonic now, like the truth: between the write's release and completion.
        assert arrival.hi_ns >= t_in + OUT_NS
        assert arrival.lo_ns <= done_ns
        assert arrival.half_width_ns >= 500_000  # the clock bound is in every bracket


async def test_a_dead_replica_is_reported_and_the_rest_still_watched(
    lab_factory: LabFactory,
) -> None:
    state = lab_factory(regions=("home", "far"), delays_ms={"far": 5}, replicas=2, wan=True)
    config = load_config(Path(state["dir"]) / "topology.toml")
    far = list(config.topology.region("far").replicas)
    dead = Endpoint.from_url("redis://127.0.0.1:1", name="far-gone", region="far")
    book = WatchBook([*far, dead], config.settings, clock=WallClock())
    stem = f"{PREFIX}dead:".encode()
    watch = await book.open(WatchSpec(run_id="dead", stem=stem, count=5, pattern=stem + b"*"))
    try:
        assert config.topology.region("home").write is not None
        await _write(config.topology.region("home").write, stem, 5)
        await watch.wait(20)
        rows = {r["name"]: r for r in watch.report()["replicas"]}
    finally:
        await book.close_all()
    assert watch.complete()
    assert len(rows["far-1"]["arrivals"]) == len(rows["far-2"]["arrivals"]) == 5
    assert rows["far-gone"]["arrivals"] == [] and "127.0.0.1:1" in rows["far-gone"]["error"]


async def test_watches_end_by_their_timeout_and_only_watch_probe_keys(
    lab_factory: LabFactory,
) -> None:
    state = lab_factory(regions=("home", "far"), wan=True)
    config = load_config(Path(state["dir"]) / "topology.toml")
    book = WatchBook(config.topology.region("far").replicas, config.settings, clock=WallClock())
    with pytest.raises(UsageError, match="probe prefix"):
        await book.open(WatchSpec(run_id="x", stem=b"user:", count=1, pattern=b"user:*"))
    stem = f"{PREFIX}short:".encode()
    watch = await book.open(
        WatchSpec(run_id="short", stem=stem, count=3, pattern=stem + b"*", timeout_s=0.2)
    )
    await until(lambda: not book.watches, "the watch ended by its timeout")
    assert book.expired == 1
    with pytest.raises(UsageError, match="no watch"):
        book.get(watch.id)
    await asyncio.sleep(0)


def test_an_agent_row_says_which_arrivals_were_merged_and_which_read_at_once() -> None:
    """`merged` and `prompt` in an agent's row reach the prober's arrivals, so
    `within_chunks` places each as the agent's own observer would have; a row from an
    agent that predates `prompt` reads as no arrival read at once."""
    stem = b"replag:probe:r:"
    row = {
        "name": "far-1",
        "observed_by": "push",
        "arrivals": [[0, 900, 800, 1000], [1, 1000, 600, 1000], [2, 1000, 600, 1000]],
        "merged": [1, 2],
        "prompt": [2],
    }
    observer = RemoteObserver(
        Endpoint.from_url("redis://127.0.0.1:1", name="far-1"), stem=stem, agent="http://a"
    )
    observer.absorb(
        row,
        base_ns=0,
        offset=OffsetInterval(0, 0),
        prober=ProberMapping(wall_minus_mono_ns=0, uncertainty_ns=0),
    )
    arrivals = [observer.arrivals[stem + str(seq).encode()] for seq in range(3)]
    flags = {seq: (a.merged, a.prompt) for seq, a in enumerate(arrivals)}
    assert flags == {0: (False, False), 1: (True, False), 2: (True, True)}
    older = {key: value for key, value in row.items() if key != "prompt"}
    observer.absorb(
        older,
        base_ns=0,
        offset=OffsetInterval(0, 0),
        prober=ProberMapping(wall_minus_mono_ns=0, uncertainty_ns=0),
    )
    assert not any(arrival.prompt for arrival in observer.arrivals.values())
