"""How long, and at what memory cost, replag takes to give up on a hostile server.

Runs `replag probe`, `repair check`, `repair run` and `topology discover` as real
processes against the fake servers of tests/helpers/hostile.py (a bulk of 10^12
bytes, an array of 2^31 elements, endless nesting, one byte a second, HTTP, a
hang-up mid-reply; alone, or behind a proxy that turns hostile on SCAN only), with
connect_timeout = --timeout. Prints per case the exit code, the seconds from start
to exit and the replag processes' peak RSS growth once the hostile bytes began
(VmHWM from /proc). Target (issue 33): exit 2 or 3 within twice the timeout (plus
the process's start), every process within 100 MB of its size before.

Then the totals of issue 45: `repair check` of `--keys` keys on a server announcing
$10^12 for every MGET (ends at max_reply_refusals; baseline: the same check of a real
server holding those keys), and `replag agent` building against a SCAN that never ends
(seconds from SIGTERM to exit, and its growth).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _smoke import parse_args  # --smoke: tiny sizes, same path (tests/test_benchmarks.py)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from replag.lab.server import RedisServer, free_port  # noqa: E402
from tests.agent.test_hostile_build import _endless  # noqa: E402
from tests.helpers.hostile import (  # noqa: E402
    HOSTILE,
    HostileServer,
    MemoryWatch,
    liar_answers,
)
from tests.helpers.scripted import ScriptedServer  # noqa: E402

COMMANDS = ("probe", "check", "run", "discover")


def config(tmp: Path, good: str, hostile: str) -> Path:
    path = tmp / "t.toml"
    path.write_text(
        f'[settings]\nstore = "{tmp / "s.sqlite"}"\n'
        f'[[regions]]\nname = "a"\nwrite = "{good}"\n'
        f'replicas = [{{name = "good", url = "{good}"}}]\n'
        f'[[regions]]\nname = "b"\nreplicas = [{{name = "odd", url = "{hostile}"}}]\n'
        '[[groups]]\nname = "g"\nmembers = ["good", "odd"]\n'
    )
    return path


def run_case(
    command: str, server: HostileServer, good: str, tmp: Path, timeout_s: float
) -> tuple[int, float, float, str]:
    seconds, code, output, grown = run(command, server.url, good, tmp, timeout_s, server)
    named = [line for line in output.splitlines() if f":{server.port}" in line]
    return code, seconds, grown, (named or ["?"])[0]


def floor_s(command: str, good: str, tmp: Path, timeout_s: float) -> float:
    """Seconds the same command takes against a port nothing listens on (refused at once):
    its start and its work with the good server, on this host now."""
    return run(command, f"redis://127.0.0.1:{free_port()}", good, tmp, timeout_s, None)[0]


def run(
    command: str,
    url: str,
    good: str,
    tmp: Path,
    timeout_s: float,
    server: HostileServer | None,
) -> tuple[float, int, str, float]:
    path = config(tmp, good, url)
    args = {
        "probe": ["probe", "-c", str(path), "--count", "3"],
        "check": ["repair", "check", "-c", str(path)],
        "run": ["repair", "run", "-c", str(path)],
        "discover": ["topology", "discover", "--redis", url],
    }[command]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REPLAG_CONNECT_TIMEOUT": f"{timeout_s}s"}
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "replag", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
        cwd=tmp,
    )
    if server is None:
        output, _ = proc.communicate(timeout=120)
        return time.monotonic() - started, proc.returncode, output, 0.0
    with MemoryWatch(proc.pid, server.started) as watch:
        output, _ = proc.communicate(timeout=120)
    seconds = time.monotonic() - started
    return seconds, proc.returncode, output, max(watch.growth_mb().values(), default=0.0)


def timed_check(
    tmp: Path, good: str, url: str, started: threading.Event
) -> tuple[float, int, float]:
    """`repair check` of the group {good, url}: (seconds, exit code, +MB once `started`)."""
    path = config(tmp, good, url)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REPLAG_CONNECT_TIMEOUT": "2s"}
    begun = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "replag", "repair", "check", "-c", str(path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=tmp,
    )  # fmt: skip
    with MemoryWatch(proc.pid, started) as watch:
        proc.wait(timeout=300)
    return time.monotonic() - begun, proc.returncode, max(watch.growth_mb().values(), default=0.0)


def liar_case(tmp: Path, good: RedisServer, keys: int) -> None:
    real = RedisServer(name="real", port=free_port(), workdir=tmp / "real").start()
    try:
        client = real.client()
        for start in range(0, keys, 10_000):
            client.mset({f"k{i}": "v" for i in range(start, min(keys, start + 10_000))})
        begun = threading.Event()
        begun.set()
        base_s, base_code, base_mb = timed_check(tmp, good.url, real.url, begun)
    finally:
        real.stop()
    started = threading.Event()
    answers = liar_answers(keys)

    def mget(command: list[bytes]) -> bytes:
        started.set()
        return answers["MGET"]  # type: ignore[return-value]

    with ScriptedServer({**answers, "MGET": mget}) as liar:  # type: ignore[dict-item]
        seconds, code, grown = timed_check(tmp, good.url, f"redis://{liar.address}", started)
        mgets = liar.names().count("MGET")
    print(
        f"check, {keys} keys, real server: exit {base_code} {base_s:.2f} s "
        f"(+MB from its start: {base_mb:.1f})"
    )
    print(
        f"check, {keys} keys, every MGET $10^12: exit {code} {seconds:.2f} s "
        f"({seconds / base_s:.1f}x) +{grown:.1f} MB, {mgets} MGETs"
    )


def agent_case(tmp: Path) -> None:
    began = threading.Event()
    port = free_port()
    with ScriptedServer(_endless(began)) as server:  # type: ignore[arg-type]
        url = f"redis://{server.address}"
        path = tmp / "agent.toml"
        path.write_text(
            f'[settings]\napi_token = "{"t" * 32}"\nagent_state_dir = "{tmp / "agent"}"\n'
            f'[[regions]]\nname = "b"\nagent = "http://127.0.0.1:{port}"\n'
            f'replicas = [{{name = "odd", url = "{url}"}}]\n'
            f'[[regions]]\nname = "a"\nreplicas = [{{name = "other", url = "{url}"}}]\n'
            '[[groups]]\nname = "g"\nmembers = ["other", "odd"]\n'
        )
        env = {**os.environ, "PYTHONPATH": str(ROOT), "REPLAG_CONNECT_TIMEOUT": "1s"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "replag", "agent", "-c", str(path), "--region", "b"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
        )  # fmt: skip
        with MemoryWatch(proc.pid, began) as watch:
            deadline = time.monotonic() + 60
            while server.names().count("SCAN") < 300 and time.monotonic() < deadline:
                time.sleep(0.1)
            scans = server.names().count("SCAN")
            stopped = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            seconds = time.monotonic() - stopped
        grown = max(watch.growth_mb().values(), default=0.0)
    print(
        f"agent building (SCAN never ends, {scans} SCANs): exit {code} {seconds:.2f} s "
        f"after SIGTERM (target 5 s), +{grown:.1f} MB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--timeout", type=float, default=2.0, help="connect_timeout, seconds")
    parser.add_argument("--commands", default=",".join(COMMANDS))
    parser.add_argument("--behaviours", default=",".join(HOSTILE))
    parser.add_argument("--proxy", action="store_true", help="also behind a proxy, on SCAN")
    parser.add_argument("--keys", type=int, default=20_000, help="keys of the MGET case")
    args = parse_args(parser, commands="check", behaviours="bulk,drip", timeout=1.0, keys=2000)
    print(f"load average: {os.getloadavg()[0]:.1f} (a shared host: times include waiting)")
    print(f"timeout {args.timeout:g} s; floor = the command against a refused port")
    print(f"{'command':<9} {'server':<14} {'exit':>4} {'seconds':>8} {'2x+floor':>8} {'+MB':>6}")
    worst_ratio, worst_mb, failures = 0.0, 0.0, 0
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        good = RedisServer(name="good", port=free_port(), workdir=tmp / "good").start()
        behind = RedisServer(name="behind", port=free_port(), workdir=tmp / "behind").start()
        try:
            cases = [
                (c, b, False) for c in args.commands.split(",") for b in args.behaviours.split(",")
            ]
            if args.proxy:
                cases += [
                    (c, b, True)
                    for c in args.commands.split(",")
                    if c in ("check", "run")
                    for b in args.behaviours.split(",")
                ]
            floors = {c: floor_s(c, good.url, tmp, args.timeout) for c in {c for c, _, _ in cases}}
            for command, behaviour, proxied in cases:
                options: dict[str, object] = {"stream_s": 4 * args.timeout}
                if proxied:
                    options |= {"upstream": ("127.0.0.1", behind.port), "on_command": b"SCAN"}
                with HostileServer(behaviour, **options) as server:  # type: ignore[arg-type]
                    code, seconds, grown, line = run_case(
                        command, server, good.url, tmp, args.timeout
                    )
                bound = 2 * args.timeout + floors[command]
                ok = code in (2, 3) and seconds <= bound and grown < 100
                failures += not ok
                worst_ratio = max(worst_ratio, seconds / bound)
                worst_mb = max(worst_mb, grown)
                name = f"{behaviour}{' (SCAN)' if proxied else ''}"
                print(
                    f"{command:<9} {name:<14} {code:>4} {seconds:>8.2f} {bound:>8.2f} "
                    f"{grown:>6.1f}{'' if ok else '  MISSED'}"
                )
                print(f"    {line[:160]}")
            liar_case(tmp, good, args.keys)
            agent_case(tmp)
        finally:
            good.stop()
            behind.stop()
    print(
        f"worst: {worst_ratio:.2f} of (2 x timeout + floor), +{worst_mb:.1f} MB; "
        f"{failures} case(s) missed the target"
    )


if __name__ == "__main__":
    main()
