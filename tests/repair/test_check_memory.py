"""A full check's memory is bounded by `check_memory_mb`, not by the keyspace, and it is
still exact.

Two independent replicas hold 2M keys (DEBUG POPULATE, a second each), then 1,000
injected divergences. `replag repair check` runs as a process of its own with
`check_memory_mb = 64`; its process tree's memory is sampled from /proc every 20 ms
(PSS: a page a forked scan process shares with the check counts half to each, so
the sum counts nothing twice). Keeping every key in memory, as the check did before,
peaked at ~56 MB + ~50 bytes a key for the two replicas (~150 MB here), past the
budget; bounded, the check peaks near 55 MB at any count (benchmarks/check_memory.py).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading
from pathlib import Path

from replag.config import load_config, render_config, write_config_atomic
from replag.lab.diverge import DivergeSpec, lab_diverge
from replag.lab.load import LoadSpec, lab_load
from replag.repair.keyspace.observe import key_from_json
from replag.repair.runs import RunLog
from replag.store import Store
from tests.helpers.cli import replag_argv
from tests.helpers.lab import LabFactory
from tests.helpers.redis_servers import RedisFactory

KEYS = 2_000_000
BUDGET_MB = 64


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo += map(int, Path(f"/proc/{p}/task/{task}/children").read_text().split())
        except OSError:
            continue
    return out


def _pss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _run_sampled(argv: list[str]) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run `argv`; its result and its process tree's peak PSS in bytes."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.02):
            peak = max(peak, sum(_pss(p) for p in _tree(proc.pid)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    done.set()
    sampler.join()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err), peak


def _lab(
    lab_factory: LabFactory, keys: int, spec: DivergeSpec, **settings: object
) -> tuple[Path, set[bytes]]:
    """A lab of 2 independent replicas with `keys` keys and `spec` injected; the path of
    a config with `settings`, and the injected keys."""
    state = lab_factory(regions=("a", "b"), engine="independent")
    lab_dir = state["dir"]
    lab_load(lab_dir, LoadSpec(keys=keys, value_size=16))
    truth = {key_from_json(d) for d in lab_diverge(lab_dir, spec, None)["divergent"]}
    config = load_config(lab_dir / "topology.toml")
    path = lab_dir / "budget.toml"
    every = {
        "store": str(lab_dir / "replag.sqlite"),
        "prefix": "replag:probe:",
        "scan_nice": 0,
        **settings,
    }
    write_config_atomic(path, render_config(config.topology, settings=every))
    return path, truth


def _found(path: Path, done: subprocess.CompletedProcess[str], group: str = "lab") -> set[bytes]:
    assert done.returncode == 1, done.stderr[-2000:]
    store = Store(path.parent / "replag.sqlite")
    try:
        run = RunLog(store, json.loads(done.stdout)["run_id"])
        return {k for k, _, _, _ in run.keys(group)}
    finally:
        store.close()


def _populated(redis_factory: RedisFactory, tmp_path: Path) -> tuple[Path, set[bytes]]:
    """Two replicas of `KEYS` keys (`key:N`, 16-byte values) and 1,000 divergences of
    every kind; the path of a config naming them, and the divergent keys."""
    a, b = (redis_factory(n, extra_args=("--enable-debug-command", "yes")) for n in "ab")
    for server in (a, b):
        with server.client() as c:
            c.execute_command("DEBUG", "POPULATE", KEYS, "key", 16)
    picked = [f"key:{i}".encode() for i in random.Random(3).sample(range(KEYS), 750)]
    missing, changed, typed, ttl = picked[:250], picked[250:500], picked[500:625], picked[625:]
    extra = [f"extra:{i}".encode() for i in range(250)]
    with a.client() as ca, b.client() as cb:
        pa, pb = ca.pipeline(transaction=False), cb.pipeline(transaction=False)
        for key in missing:
            pb.delete(key)
        for key in changed:
            pb.set(key, b"changed")
        for key in typed:
            pb.delete(key)
            pb.rpush(key, b"a list now")
        for key in ttl:
            pb.pexpire(key, 3_600_000)
        for key in extra:
            pa.set(key, b"only in a")
        pa.execute()
        pb.execute()
    path = tmp_path / "replag.toml"
    path.write_text(
        "\n".join(
            [
                "[settings]",
                f'store = "{tmp_path / "replag.sqlite"}"',
                f"check_memory_mb = {BUDGET_MB}",
                "scan_nice = 0",
                *(
                    f'[[regions]]\nname = "{r}"\nreplicas = [{{ name = "{r}-1", url = "{s.url}" }}]'
                    for r, s in (("a", a), ("b", b))
                ),
                '[[groups]]\nname = "g"\nmembers = ["a-1", "b-1"]',
            ]
        )
        + "\n"
    )
    return path, {*picked, *extra}


def test_a_check_stays_inside_its_memory_budget_and_finds_every_difference(
    redis_factory: RedisFactory, tmp_path: Path
) -> None:
    path, truth = _populated(redis_factory, tmp_path)
    assert len(truth) == 1000

    argv = replag_argv("repair", "check", "-c", str(path), "--json")
    done, peak = _run_sampled(argv)

    print(f"check of {KEYS:,} keys: peak {peak / 2**20:.1f} MiB (budget {BUDGET_MB} MB)")
    assert peak <= BUDGET_MB << 20, f"peak {peak / 2**20:.1f} MiB"
    assert _found(path, done, "g") == truth


def test_keys_past_the_spill_limit_are_read_again_and_still_found_exactly(
    lab_factory: LabFactory,
) -> None:
    # 1 MB of spill for 100,000 keys (~3 MB a replica): the scans keep no keys, and the
    # walk reads the differing leaves from each replica again.
    spec = DivergeSpec(missing=25, changed=25, extra=25, type=10, ttl=15, seed=4)
    path, truth = _lab(lab_factory, 100_000, spec, check_memory_mb=40, check_spill_mb=1)
    argv = replag_argv("repair", "check", "-c", str(path), "--json")
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert _found(path, done) == truth
