"""One safety run: 3 real replicas, injected divergence, hostile writers, `repair run`, verdict.

    result = await run_once(SafetySpec(policy="quorum", seed=1), workdir)
    result.verdict.counts  # {"clobbered": 0, "resurrected": 0, "lost": 0, "falsely_fixed": 0}

The replicas are independent redis-servers (as a Dynomite rack's backends are:
the writers are the only replication). Every key is loaded at version 1 on
all three, then seeded faults make one replica differ per faulted key
(missing, stale, only there, an extra TTL, another type). The writers start
in a process of their own, favouring the faulted keys; `repair run` works
through the divergence while they write; once it returns the writers stop and
the checker reads every key on every replica.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from replag.config import Config, config_from_dict
from replag.lab.safety.checker import Verdict, check_history
from replag.lab.safety.model import (
    LOADED,
    STALE,
    Held,
    Keyspace,
    decode_held,
    expire_command,
    read_commands,
    state_commands,
)
from replag.lab.safety.monitor import END_MARKER, repair_touches
from replag.lab.safety.workload import Op, WorkloadSpec, read_history
from replag.lab.server import RedisServer, free_port
from replag.repair import repair
from replag.repair.decisions.report import RepairReport
from replag.repair.runs import RunLog
from replag.store import Store
from replag.topology import Endpoint
from replag.wire.resp import RespConnection, pack

FAULTS = ("missing", "stale", "only_here", "ttl", "type")


@dataclass(frozen=True, kw_only=True)
class SafetySpec:
    policy: str = "quorum"
    seed: int = 0
    keys: int = 2000
    faults: int = 600
    writers: int = 8
    hot_extra: int = 0  # unfaulted keys the writers favour too
    drop_share: float = 0.15
    delete_share: float = 0.4
    drop_s: float = 1.0  # how long writes are dropped before the repair starts
    repair_rate: float | None = 100.0
    repair_settle: str = "50ms"
    allow_deletes: bool = False
    max_pause_ms: float = 1.0
    # Faulted keys the writers never touch: work the repair has whenever it starts (on a
    # busy host the writers can overwrite every other fault before the scan reaches it).
    untouched_faults: int = 0


@dataclass
class SafetyRun:
    spec: SafetySpec
    verdict: Verdict
    ops: int
    writes: int  # while the repair ran (after the writers stopped dropping writes)
    max_spread_ms: float
    slow_ops: int  # operations whose fan-out took longer than repair_settle
    # while the repair read or wrote their key (the only ones that can exempt a key)
    slow_during_repair: int
    repair_touched_keys: int  # keys the monitor saw the repair's commands name
    reported_untouched: int  # keys the run reported that the monitor never saw it touch
    report: dict[str, Any]
    seconds: float
    examples: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        r = self.report
        return {
            "spec": asdict(self.spec),
            **self.verdict.counts,
            "left_reported": self.verdict.left_reported,
            "outside_bound": self.verdict.outside_bound,
            "ops": self.ops,
            "writes": self.writes,
            "max_spread_ms": self.max_spread_ms,
            "slow_ops": self.slow_ops,
            "slow_during_repair": self.slow_during_repair,
            "repair_touched_keys": self.repair_touched_keys,
            "reported_untouched": self.reported_untouched,
            "divergent": r["divergent"],
            "repaired": r["repaired"],
            "busy": r["busy"],
            "undone": r["undone"],
            "conflicts": r["conflicts"],
            "kept": r["kept"],
            "status": r["status"],
            "seconds": round(self.seconds, 2),
            "examples": self.verdict.examples,
        }

    @property
    def label(self) -> str:
        return self.spec.policy + (" +deletes" if self.spec.allow_deletes else "")

    def line(self) -> str:
        d = self.to_dict()
        return (
            f"{self.label:<12} seed {self.spec.seed:>3}, repair {self.spec.repair_rate:g}/s: "
            f"writes {d['writes']:>6} "
            f"(ops {d['ops']}, max fan-out {d['max_spread_ms']:.1f} ms, slower than settle "
            f"{d['slow_ops']}, of them during the repair's commands on their key "
            f"{d['slow_during_repair']}); divergent {d['divergent']}, repaired {d['repaired']}, "
            f"busy {d['busy']}, conflicts {d['conflicts']}, kept {d['kept']}, "
            f"undone {d['undone']}; "
            f"clobbered {d['clobbered']}, resurrected {d['resurrected']}, lost {d['lost']}, "
            f"falsely fixed {d['falsely_fixed']}; outside the bound {d['outside_bound']}"
        )


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _protected(policy: str) -> tuple[int, ...]:
    """source:nX trusts nX: a write dropped there would be undone by design, not by a bug."""
    kind, _, name = policy.partition(":")
    return (int(name[1:]),) if kind == "source" else ()


def _settle_ms(text: str) -> float:
    from replag.durations import parse_duration_s

    return parse_duration_s(text) * 1000


def plan_faults(spec: SafetySpec, keyspace: Keyspace) -> list[tuple[int, str, int]]:
    """(key index, fault, replica) for `spec.faults` distinct keys."""
    rng = random.Random(spec.seed)
    chosen = rng.sample(range(spec.keys), min(spec.faults, spec.keys))
    out = []
    for n, index in enumerate(chosen):
        fault = FAULTS[n % len(FAULTS)]
        if fault == "type" and keyspace.type(index) != "string":
            fault = "stale"
        out.append((index, fault, rng.randrange(3)))
    return out


def _fault_commands(key: bytes, kind: str, fault: str, base_ms: int) -> list[bytes]:
    if fault == "missing":
        return [pack(b"DEL", key)]
    if fault == "stale":
        return state_commands(key, kind, STALE)
    if fault == "ttl":
        return [expire_command(key, 0, base_ms)]
    return [pack(b"DEL", key), pack(b"RPUSH", key, b"a", b"list", b"now")]


async def _prepare(
    endpoints: list[Endpoint],
    keyspace: Keyspace,
    faults: list[tuple[int, str, int]],
    base_ms: int,
) -> None:
    for r, endpoint in enumerate(endpoints):
        commands = [
            c
            for i in range(keyspace.keys)
            for c in state_commands(keyspace.name(i), keyspace.type(i), LOADED)
        ]
        for index, fault, replica in faults:
            key, kind = keyspace.name(index), keyspace.type(index)
            if fault == "only_here":
                if replica != r:
                    commands.append(pack(b"DEL", key))
            elif replica == r:
                commands += _fault_commands(key, kind, fault, base_ms)
        conn = await RespConnection.open(endpoint, timeout_s=30.0)
        try:
            conn.check(await conn.request(b"".join(commands), len(commands)))
        finally:
            await conn.close()


async def read_final(endpoint: Endpoint, keys: list[bytes], base_ms: int) -> dict[bytes, Held]:
    conn = await RespConnection.open(endpoint, timeout_s=30.0)
    try:
        out: dict[bytes, Held] = {}
        for start in range(0, len(keys), 500):
            batch = keys[start : start + 500]
            payload = b"".join(c for k in batch for c in read_commands(k))
            replies, arrived_ns = await conn.wait(conn.send(payload, 6 * len(batch)))
            now_ms = arrived_ns // 1_000_000
            for i, key in enumerate(batch):
                out[key] = decode_held(replies[6 * i : 6 * i + 6], now_ms, base_ms)
        return out
    finally:
        await conn.close()


async def _start(module: str, *args: str) -> tuple[asyncio.subprocess.Process, list[str]]:
    """Start `python -m module args`; wait for its `ready` line, return the words after it."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 60)
    words = line.decode(errors="replace").split()
    if words[:1] != ["ready"]:
        process.kill()
        await process.wait()
        raise RuntimeError(f"{module} did not start: {line!r}")
    return process, words[1:]


async def _stop_monitor(process: asyncio.subprocess.Process, endpoints: list[Endpoint]) -> None:
    """Send the end marker to every server: the monitor has every command before it then."""
    for endpoint in endpoints:
        conn = await RespConnection.open(endpoint, timeout_s=30.0)
        try:
            await conn.request(pack(b"ECHO", END_MARKER), 1)
        finally:
            await conn.close()
    assert process.stdout is not None
    tail = await asyncio.wait_for(process.stdout.read(), 120)
    code = await process.wait()
    if code != 0:
        raise RuntimeError(f"the monitor failed (exit {code}): {tail!r}")


async def _stop_writers(process: asyncio.subprocess.Process) -> None:
    assert process.stdin is not None and process.stdout is not None
    process.stdin.close()
    tail = await asyncio.wait_for(process.stdout.read(), 120)
    code = await process.wait()
    if code != 0:
        raise RuntimeError(f"the writers failed (exit {code}): {tail!r}")


async def run_once(spec: SafetySpec, workdir: Path) -> SafetyRun:
    """One seeded run in `workdir` (servers, store and history go there; all stopped after)."""
    keyspace = Keyspace(spec.keys, spec.seed)
    base_ms = time.time_ns() // 1_000_000 + 2 * 3600 * 1000
    servers = [RedisServer(f"s{i}", free_port(), workdir / "redis") for i in range(3)]
    try:
        for server in servers:
            server.start()
        endpoints = [
            Endpoint(name=f"n{i}", host="127.0.0.1", port=s.port) for i, s in enumerate(servers)
        ]
        faults = plan_faults(spec, keyspace)
        await _prepare(endpoints, keyspace, faults, base_ms)
        history_path = workdir / "history.jsonl"
        workload = _workload(spec, faults, servers, base_ms, history_path)
        spec_path = _write(workdir / "workload.json", workload.to_json())
        config = _harness_config(spec, endpoints, workdir)
        store = Store(config.settings.store)
        started = time.perf_counter()
        monitor_path = workdir / "monitor.txt"
        report, writers = await _repair_under_writers(
            spec, config, store, spec_path, endpoints, monitor_path
        )
        seconds = time.perf_counter() - started
        history: list[Op] = read_history(history_path)
        keys = [keyspace.name(i) for i in range(spec.keys)]
        touched = repair_touches(monitor_path, keys, others=writers)
        final = [await read_final(e, keys, base_ms) for e in endpoints]
        outcomes = {key: status for key, _, status, _ in RunLog(store, report.run_id).keys("g")}
        store.close()
        settle_ms = _settle_ms(spec.repair_settle)
        verdict = check_history(
            keyspace,
            keys,
            [e.name for e in endpoints],
            history,
            final,
            outcomes,
            bound_ms=settle_ms,
            repair_touched=touched,
        )
        return SafetyRun(
            spec=spec,
            verdict=verdict,
            ops=len(history),
            writes=sum(len(op.applied) for op in history if op.calm),
            max_spread_ms=max((op.spread_ms for op in history), default=0.0),
            slow_ops=sum(op.spread_ms > settle_ms for op in history),
            slow_during_repair=verdict.slow_during_repair,
            repair_touched_keys=len(touched),
            reported_untouched=len(set(outcomes) - set(touched)),
            report=report.to_dict(),
            seconds=seconds,
        )
    finally:
        for server in servers:
            server.stop()


def _workload(
    spec: SafetySpec,
    faults: list[tuple[int, str, int]],
    servers: list[RedisServer],
    base_ms: int,
    history_path: Path,
) -> WorkloadSpec:
    """The writers' brief: the faulted keys and `hot_extra` others are the ones written."""
    rng = random.Random(spec.seed + 1)
    faulted = {index for index, _, _ in faults}
    others = [i for i in range(spec.keys) if i not in faulted]
    hot = sorted(faulted | set(rng.sample(others, min(spec.hot_extra, len(others)))))
    untouched = tuple(index for index, _, _ in faults[: spec.untouched_faults])
    return WorkloadSpec(
        ports=tuple(s.port for s in servers),
        keys=spec.keys,
        keyspace_seed=spec.seed,
        hot=tuple(hot),
        seed=spec.seed,
        base_ms=base_ms,
        history=str(history_path),
        writers=spec.writers,
        max_pause_ms=spec.max_pause_ms,
        drop_share=spec.drop_share,
        delete_share=spec.delete_share,
        protected=_protected(spec.policy),
        untouched=untouched,
    )


def _harness_config(spec: SafetySpec, endpoints: list[Endpoint], workdir: Path) -> Config:
    """One region per server, the three in one group."""
    return config_from_dict(
        {
            "settings": {
                "store": str(workdir / "replag.sqlite"),
                "repair_settle": spec.repair_settle,
            },
            "regions": [
                {"name": f"r{i}", "replicas": [{"name": e.name, "url": e.url(redact=False)}]}
                for i, e in enumerate(endpoints)
            ],
            "groups": [{"name": "g", "members": [e.name for e in endpoints]}],
        },
        where="safety harness",
    )


async def _repair_under_writers(
    spec: SafetySpec,
    config: Config,
    store: Store,
    spec_path: Path,
    endpoints: list[Endpoint],
    monitor_path: Path,
) -> tuple[RepairReport, list[str]]:
    """Start the writers, let them drop writes for `drop_s`, then repair while they write
    on (calm: nothing dropped any more), every server's commands monitored meanwhile; the
    writers are stopped however the repair ends. Returns the report and the writers'
    addresses (every other client the monitor saw is the repair)."""
    writers, addresses = await _start("replag.lab.safety.workload", str(spec_path))
    try:
        await asyncio.sleep(spec.drop_s)
        assert writers.stdin is not None
        writers.stdin.write(b"calm\n")
        await writers.stdin.drain()
        ports = [str(e.port) for e in endpoints]
        monitor, _ = await _start("replag.lab.safety.monitor", str(monitor_path), *ports)
        try:
            report = await repair(
                config,
                policy=spec.policy,
                rate=spec.repair_rate,
                allow_deletes=spec.allow_deletes,
                store=store,
            )
        finally:
            await _stop_monitor(monitor, endpoints)
        return report, addresses
    finally:
        await _stop_writers(writers)


def dump(runs: list[SafetyRun], path: Path) -> None:
    path.write_text(json.dumps([r.to_dict() for r in runs], indent=2), encoding="utf-8")
