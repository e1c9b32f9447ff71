"""How close are replag's lag percentiles to the truth?

Runs the lab at one-way delays of 1, 10 and 80 ms, each without jitter, with
uniform jitter of ±1 ms and with a heavy-tailed one (late only: 1 ms × (Pareto(1.5)
− 1), median +0.6 ms, one draw in 100 past +20 ms, capped at +50 ms; the relay never
reorders, so a late chunk holds back the ones behind it), 500 probes per case, in
push and in poll mode.

The truth is the servers' own: `MONITOR` on the writing primary and on the
far replica (each read by a process of its own, outside the measuring process;
`--monitor-nice` lowers their priority: a reader woken by the replica's MONITOR line
can preempt the replica before it sends the keyspace event, delaying what is
measured: before the bars counted the replica's own CPU wait, at a load of 6.5, 20
of 1,500 push samples lay outside their bars with readers at nice 0, 3 at nice 19)
stamps the moment each server executed the probe's SET, on the
host's one clock to the microsecond; a key's true lag is the replica's stamp
minus the primary's. That is what a user means by replication lag (written on
the primary until readable on the replica), and it is independent of every
method replag uses. The delay relay's own log of each key's bytes entering and
leaving it is read too: "hops" is the median of the truth minus the relay's
in→out, the time spent outside the delay link (the primary's propagation and
the replica's read and apply), which an earlier truth from the relay alone
left out. A sample's error is its distance from the truth's bracket (±1 µs,
the stamps' resolution); "truth±p99" is the 99th percentile of that bracket's
width. Prints, per case, measured p50/p99 against truth and the error, plus
the dynomite-seed method's average.

Each lab gets 100 unmeasured probes first (a warm-up: a new lab's replication
link is still settling). Every measured run is `replag probe --samples-out FILE`
in a process of its own, as a user would run it: the samples scored are the
file's lines (`replag schema samples`), the percentiles the `--json` report's.
With `--load N`, every case runs twice: on the machine as it is, then with N
processes burning CPU (at normal priority), started half a second before the
run and stopped after it, and both tables are printed with the 1-minute load
average at each case ("load"). Per-sample errors are also checked against the
uncertainty each sample reports, with no tolerance ("out": |error| > its own
uncertainty at all) and with 0.5 ms ("out>.5"). "chunk" is the share of samples
read in one chunk with later events and so placed inside their bracket by their
chunk-mates' lag (`within_chunks`): exact without jitter by construction, a guess
with it, which the sample's uncertainty must then cover. "hdr p50/p99" are the
percentiles users see (the HdrHistogram of the run), scored against the true ones
like the samples' own. The "out" after "chunk" counts the samples placed by chunk that
lie outside their uncertainty. "wid" is the share of samples whose bar was widened by
the host's wait for a CPU (`stamp` "widened"), "wid50" the median widening (ms).

    python benchmarks/probe_accuracy.py [--probes 500] [--delays 1,10,80] [--rate 200]
        [--jitters none,uniform:1,pareto:1] [--load N] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from _smoke import parse_args

from replag.config import load_config
from replag.lab.cluster import LabSpec, lab_down, lab_up
from replag.lab.relay import read_truth_brackets
from replag.probes.runner import run_probe
from replag.probes.seed_method import run_seed_method

# The targets for samples outside their own bars (push), per load.
OUT_TARGET = {"quiet": 1 / 10_000, "loaded": 1 / 1_500}

EXCESS_MS = 0.5
# A MONITOR line: "1795698143.992190 [0 127.0.0.1:17001] "SET" "key" ..." (as a RESP
# status reply, so with a leading "+").
MONITOR_SET = re.compile(rb'^\+?(\d+)\.(\d{6}) \[\d+ [^\]]*\] "set" "([^"]+)"', re.IGNORECASE)
# A separate process per server, so reading MONITOR costs the measuring process nothing.
MONITOR_READER = r"""
import signal, socket, sys
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
out = open(sys.argv[2], "wb")
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
sock.sendall(b"MONITOR\r\n")
while True:
    data = sock.recv(1 << 20)
    if not data:
        break
    out.write(data)
    out.flush()
"""


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q))


@contextlib.contextmanager
def cpu_burners(n: int) -> Iterator[None]:
    """`n` processes spinning on the CPU until the block ends."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        if procs:
            time.sleep(0.5)  # burning before the run starts
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


@contextlib.contextmanager
def monitored(ports: dict[str, int], out_dir: Path, nice: int = 0) -> Iterator[dict[str, Path]]:
    """MONITOR on each named server's port, into a file each, while the block runs; the
    readers at `nice` (see `--monitor-nice`)."""
    paths = {name: out_dir / f"monitor-{name}.log" for name in ports}
    for path in paths.values():  # an earlier case's file would read as started
        path.unlink(missing_ok=True)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", MONITOR_READER, str(port), str(paths[name])],
            preexec_fn=(lambda: os.nice(nice)) if nice else None,
        )
        for name, port in ports.items()
    ]
    try:
        deadline = time.monotonic() + 10
        while not all(p.exists() and p.read_bytes().startswith(b"+OK") for p in paths.values()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"MONITOR did not start on {ports}")
            time.sleep(0.01)
        yield paths
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait()


def executed_at(path: Path, prefix: bytes) -> dict[str, int]:
    """Key → the wall-clock µs its server first executed a SET of it (from MONITOR)."""
    out: dict[str, int] = {}
    for line in path.read_bytes().splitlines():
        match = MONITOR_SET.match(line)
        if match and match[3].startswith(prefix):
            key = match[3].decode("latin-1")
            out.setdefault(key, int(match[1]) * 1_000_000 + int(match[2]))
    return out


def server_ports(lab_dir: Path) -> dict[str, int]:
    """The writing primary's and the far replica's ports, from the lab's record."""
    procs = {p["name"]: p for p in json.loads((lab_dir / "lab.json").read_text())["processes"]}
    return {"primary": procs["near-primary"]["port"], "replica": procs["far-1"]["port"]}


def probe_cli(lab_dir: Path, mode: str, probes: int, rate: float) -> tuple[dict, list[dict]]:
    """`replag probe --json --samples-out` in a process of its own: the report, the samples."""
    samples = lab_dir / f"samples-{mode}.jsonl"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "replag",
            "probe",
            "-c",
            str(lab_dir / "topology.toml"),
            "--count",
            str(probes),
            "--rate",
            f"{rate:g}",
            "--mode",
            mode,
            "--timeout",
            "5s",
            "--no-store",
            "--json",
            "--samples-out",
            str(samples),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode not in (0, 1):
        raise RuntimeError(f"replag probe exited {done.returncode}: {done.stderr.strip()}")
    lines = [json.loads(line) for line in samples.read_text().splitlines()]
    return json.loads(done.stdout), lines


async def one_case(
    lab_dir: Path,
    delay_ms: float,
    jitter: str,
    mode: str,
    probes: int,
    rate: float,
    load: int,
    *,
    seed: bool = True,
    monitor_nice: int = 0,
) -> dict:
    config = load_config(lab_dir / "topology.toml")
    ports = server_ports(lab_dir)
    with monitored(ports, lab_dir, monitor_nice) as monitor, cpu_burners(load):
        report, samples = await asyncio.to_thread(probe_cli, lab_dir, mode, probes, rate)
        system_load = os.getloadavg()[0]
        seed_rows = await run_seed_method(config, source="near", repeats=5) if seed else []
    prefix = config.settings.prefix.encode()
    on_primary = executed_at(monitor["primary"], prefix)
    on_replica = executed_at(monitor["replica"], prefix)
    relay = read_truth_brackets(lab_dir / "truth-far-1.log")
    measured, true, errors, excess, brackets, hops = [], [], [], [], [], []
    write_rtts, by_chunk, out_by_chunk, untruthed, widened = [], 0, 0, 0, []
    for sample in samples:
        if sample["replica"] != "far-1" or sample["lag_ms"] is None:
            continue
        key = sample["key"]
        if key not in on_primary or key not in on_replica:
            untruthed += 1
            continue
        # The true lag lies in [earliest, latest]: the servers' MONITOR stamps are whole
        # microseconds, each truncated, so their difference is known to ±1 µs.
        truth_us = on_replica[key] - on_primary[key]
        earliest, latest = (truth_us - 1) / 1e3, (truth_us + 1) / 1e3
        if key in relay:
            t_in, out_from, out_by = relay[key]
            hops.append(truth_us / 1e3 - (out_from + out_by - 2 * t_in) / 2e6)
        lag = sample["lag_ms"]
        measured.append(lag)
        chunk = sample["stamp"] == "chunk-placed"
        by_chunk += chunk
        if sample["stamp"] == "widened":
            widened.append(sample["widened_ms"])
        true.append((earliest + latest) / 2)
        write_rtts.append(sample["write_rtt_ms"])
        brackets.append(latest - earliest)
        errors.append(max(earliest - lag, lag - latest, 0))
        excess.append(errors[-1] - sample["uncertainty_ms"])
        out_by_chunk += chunk and excess[-1] > 0
    # What the worst samples are made of: their writes' round trips against everyone's.
    worst = np.argsort(errors)[-max(1, len(errors) // 100) :]
    seed_avg = (
        statistics.mean(r["avg_ms"] for r in seed_rows if r["replica"] == "far-1")
        if seed_rows
        else float("nan")
    )
    pair = next(p for p in report["pairs"] if p["replica"] == "far-1")
    return {
        "delay": delay_ms,
        "jitter": jitter,
        "mode": mode,
        "load": system_load,
        "n": len(measured),
        "lost": pair["lost"],
        "m50": pct(measured, 50),
        "t50": pct(true, 50),
        "m99": pct(measured, 99),
        "t99": pct(true, 99),
        "untruthed": untruthed,
        "hops": statistics.median(hops) if hops else float("nan"),
        "hdr50": pair["lag_ms"]["p50"],
        "hdr99": pair["lag_ms"]["p99"],
        "abs_err_p50": pct(errors, 50),
        "abs_err_p99": pct(errors, 99),
        "over_unc": sum(1 for e in excess if e > EXCESS_MS),
        "out": sum(1 for e in excess if e > 0),
        "max_excess": max(excess),
        "chunk_share": by_chunk / len(measured),
        "out_chunk": out_by_chunk,
        "widened_share": len(widened) / len(measured),
        "widened50": statistics.median(widened) if widened else 0.0,
        "seed": seed_avg,
        "unc50": pair["uncertainty_ms"]["p50"],
        "truth99": pct(brackets, 99),
        "write50": pct(write_rtts, 50),
        "worst_write50": pct([write_rtts[i] for i in worst], 50),
    }


def renice_lab(lab_dir: Path, nice: int) -> None:
    """Every thread of the lab's servers and relay at `nice`."""
    for proc in json.loads((lab_dir / "lab.json").read_text())["processes"]:
        for task in Path(f"/proc/{proc['pid']}/task").iterdir():
            os.setpriority(os.PRIO_PROCESS, int(task.name), nice)


def table(rows: list[dict], title: str, *, burners: int) -> None:
    print(title)
    print(
        f"{'delay':>5} {'jitter':<8} {'mode':<4} {'load':>5} {'n':>4} {'lost':>4} | "
        f"{'p50 meas':>8} {'p50 true':>8} {'err':>7} | "
        f"{'p99 meas':>8} {'p99 true':>8} {'err':>7} | "
        f"{'hdr p50':>7} {'err':>7} {'hdr p99':>7} {'err':>7} | "
        f"{'|err| med':>9} {'|err| p99':>9} {'±unc p50':>8} {'out':>4} {'out>.5':>6} "
        f"{'worst':>7} {'chunk':>5} {'out':>3} {'wid':>4} {'wid50':>5} {'truth±p99':>9} "
        f"{'hops':>6} {'no truth':>8} | "
        f"{'seed err':>8}"
    )
    for r in rows:
        print(
            f"{r['delay']:>5g} {r['jitter']:<8} {r['mode']:<4} {r['load']:>5.1f} {r['n']:>4} "
            f"{r['lost']:>4} | "
            f"{r['m50']:>8.3f} {r['t50']:>8.3f} {r['m50'] - r['t50']:>+7.3f} | "
            f"{r['m99']:>8.3f} {r['t99']:>8.3f} {r['m99'] - r['t99']:>+7.3f} | "
            f"{r['hdr50']:>7.3f} {r['hdr50'] - r['t50']:>+7.3f} "
            f"{r['hdr99']:>7.3f} {r['hdr99'] - r['t99']:>+7.3f} | "
            f"{r['abs_err_p50']:>9.3f} {r['abs_err_p99']:>9.3f} {r['unc50']:>8.3f} "
            f"{r['out']:>4} {r['over_unc']:>6} {r['max_excess']:>+7.3f} "
            f"{r['chunk_share']:>5.0%} {r['out_chunk']:>3} {r['widened_share']:>4.0%} "
            f"{r['widened50']:>5.2f} {r['truth99']:>9.3f} "
            f"{r['hops']:>6.3f} {r['untruthed']:>8} | {r['seed'] - r['t50']:>+8.3f}"
        )
    push = [r for r in rows if r["mode"] == "push"]

    def met(ok: bool) -> str:
        return "met" if ok else "MISSED"

    for what, p50, p99 in (("samples", "m50", "m99"), ("HDR", "hdr50", "hdr99")):
        ok50 = all(abs(r[p50] - r["t50"]) <= 0.2 for r in push)
        ok99 = all(abs(r[p99] - r["t99"]) <= 0.5 for r in push)
        print(
            f"targets (push, every case), percentiles of the {what}: p50 error ≤ 0.2 ms: "
            f"{met(ok50)}; p99 error ≤ 0.5 ms: {met(ok99)}"
        )
    out = sum(r["out"] for r in rows)
    tolerant = sum(r["over_unc"] for r in rows)
    samples = sum(r["n"] for r in rows)
    worst = max(r["max_excess"] for r in rows)
    print(
        f"error bars (push and poll, every case): samples outside their own uncertainty "
        f"{out} of {samples} (0 wanted: {met(out == 0)}); by more than {EXCESS_MS} ms "
        f"{tolerant}; worst {worst:+.3f} ms; placed by chunk "
        f"{sum(r['chunk_share'] * r['n'] for r in rows) / samples:.0%} of samples, "
        f"{sum(r['out_chunk'] for r in rows)} of them outside their uncertainty; "
        f"{sum(r['untruthed'] for r in rows)} samples without a MONITOR truth (left out)"
    )
    push_rows = [r for r in rows if r["mode"] == "push"]
    push_out = sum(r["out"] for r in push_rows)
    push_n = sum(r["n"] for r in push_rows)
    target = OUT_TARGET["loaded" if burners else "quiet"]
    wanted = f"≤ 1 in {round(1 / target):,}"
    if push_n:
        enough = push_n * target >= 1  # fewer samples cannot show the ratio either way
        verdict = met(push_out <= push_n * target) if enough else "too few samples to tell"
        print(
            f"push samples outside their own bars: {push_out} of {push_n} "
            f"({push_out / push_n:.2e}; {wanted} wanted with {burners} burners: {verdict}); "
            f"median bar {statistics.median(r['unc50'] for r in push_rows):.3f} ms, "
            f"widened {sum(r['widened_share'] * r['n'] for r in push_rows) / push_n:.0%} of "
            f"samples (median by {statistics.median(r['widened50'] for r in push_rows):.3f} ms)"
        )
    print(
        "  the worst 1% of samples by error, per case (delay/jitter/mode): their writes' "
        "median round trip against all samples' (ms): "
        + "; ".join(
            f"{r['delay']:g}/{r['jitter']}/{r['mode']} {r['worst_write50']:.3f} vs "
            f"{r['write50']:.3f}"
            for r in rows
        )
    )


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probes", type=int, default=500)
    parser.add_argument("--delays", default="1,10,80")
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument(
        "--jitters",
        default="none,uniform:1,pareto:1",
        help="jitter cases per delay: none, uniform:MS (±MS) or pareto:MS (heavy tail)",
    )
    parser.add_argument(
        "--load", type=int, default=0, help="also run every case beside N CPU-burning processes"
    )
    parser.add_argument(
        "--servers-nice",
        type=int,
        default=None,
        help="run the lab's servers and relay at this nice value (the prober keeps its own)",
    )
    parser.add_argument(
        "--monitor-nice",
        type=int,
        default=0,
        help="the MONITOR readers' nice value: a reader woken by the replica's MONITOR line "
        "can preempt the replica before it sends the keyspace event, delaying the very "
        "thing measured (19 to keep them out of its way)",
    )
    # Smoke: one small case, and neither the seed method nor a long warm-up.
    args = parse_args(parser, probes=30, delays="1", jitters="none")
    warmup = 20 if args.smoke else 100
    loads = [0, args.load] if args.load else [0]
    rows: dict[int, list[dict]] = {n: [] for n in loads}
    system_load: dict[int, list[float]] = {n: [] for n in loads}
    cases = [
        (float(d), jitter) for d in args.delays.split(",") for jitter in args.jitters.split(",")
    ]
    for delay, jitter in cases:
        shape, _, jitter_ms = jitter.partition(":")
        with tempfile.TemporaryDirectory(prefix="replag-bench-") as tmp:
            lab_dir = Path(tmp) / "lab"
            spec = LabSpec(
                regions=("near", "far"),
                delays_ms={"far": delay},
                jitter_ms=float(jitter_ms or 0),
                jitter_shape=shape if shape != "none" else "uniform",
            )
            lab_up(lab_dir, spec)
            try:
                if args.servers_nice is not None:
                    renice_lab(lab_dir, args.servers_nice)
                # Unmeasured: a new lab's first writes can leave the primary together (its
                # replication link still settling), which the relay's truth, stamped per read,
                # cannot place apart.
                config = load_config(lab_dir / "topology.toml")
                await run_probe(config, count=warmup, mode="push", rate=args.rate, timeout_s=5)
                for mode in ("push", "poll"):
                    for n in loads:
                        case = await one_case(
                            lab_dir,
                            delay,
                            jitter,
                            mode,
                            args.probes,
                            args.rate,
                            n,
                            seed=not args.smoke,
                            monitor_nice=args.monitor_nice,
                        )
                        rows[n].append(case)
                        system_load[n].append(case["load"])
            finally:
                lab_down(lab_dir)
    for n in loads:
        table(
            rows[n],
            f"probe accuracy, {n} CPU burners on {os.cpu_count()} cores, MONITOR readers at "
            f"nice {args.monitor_nice} (1-min load "
            f"{min(system_load[n]):.1f}–{max(system_load[n]):.1f}): {args.probes} probes per "
            f"case at {args.rate:g}/s; truth = MONITOR per key; errors in ms",
            burners=n,
        )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
