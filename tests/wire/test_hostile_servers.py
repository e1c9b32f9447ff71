"""Hostile fake servers (`helpers.hostile`) against every command that talks to Redis: a
reply announcing 10^12 bytes or 2^31 elements, nesting without end, dripping a byte a
second, HTTP, a hang-up mid-reply; alone or behind a proxy that turns hostile on one
command. Each case ends in one line naming the endpoint, exit 2 or 3, no traceback,
and no replag process grows by more than 100 MB (measured from /proc) while it lasts.
The subprocess timeout is only a guard against a hang, not a timing target
(benchmarks/hostile_servers.py prints the times)."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from replag.lab.server import free_port
from tests.helpers.agent import start_agent, stop_agent
from tests.helpers.cli import replag_argv, replag_env
from tests.helpers.hostile import HOSTILE, HostileServer, MemoryWatch, liar_answers
from tests.helpers.redis_servers import RedisFactory
from tests.helpers.scripted import ScriptedServer

TIMEOUT_S = 1.0  # connect_timeout of every run here
GROWTH_MB = 100


def run_replag(args: list[str], server: HostileServer, tmp_path: Path) -> tuple[int, str, float]:
    """Run `python -m replag ARGS` watched; (exit code, output, seconds). Fails the test if
    a replag process grew by more than GROWTH_MB after the hostile bytes began."""
    env = replag_env({"REPLAG_CONNECT_TIMEOUT": f"{TIMEOUT_S}s"})
    started = time.monotonic()
    proc = subprocess.Popen(
        replag_argv(*args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp_path,
        text=True,
    )
    with MemoryWatch(proc.pid, server.started) as watch:
        try:
            output, _ = proc.communicate(timeout=60)  # a hang guard only
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
            pytest.fail(f"replag {args[0]} hung against {server.behaviour}: {output}")
    seconds = time.monotonic() - started
    grown = watch.growth_mb()
    assert server.hits, f"the hostile server was never asked: {output}"
    assert grown and max(grown.values()) < GROWTH_MB, (grown, output)
    return proc.returncode, output, seconds


def one_line_naming(output: str, port: int) -> str:
    """The one line that names the hostile endpoint (no traceback anywhere)."""
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines() if f"127.0.0.1:{port}" in line]
    assert len(lines) == 1, output
    return lines[0]


def group_config(tmp_path: Path, good: str, hostile: str) -> Path:
    config = tmp_path / "t.toml"
    config.write_text(
        f'[settings]\nstore = "{tmp_path / "s.sqlite"}"\n'
        f'[[regions]]\nname = "a"\nwrite = "{good}"\n'
        f'replicas = [{{name = "good", url = "{good}"}}]\n'
        f'[[regions]]\nname = "b"\n'
        f'replicas = [{{name = "odd", url = "{hostile}"}}]\n'
        '[[groups]]\nname = "g"\nmembers = ["good", "odd"]\n'
    )
    return config


# Every behaviour against check (replag's own readers, async and blocking) and discover
# (redis-py's parser); the probe, on the same readers as check, with three of them.
# benchmarks/hostile_servers.py runs the whole matrix and prints the times.
@pytest.mark.parametrize(
    ("command", "behaviour"),
    [
        *(("check", b) for b in HOSTILE),
        *(("discover", b) for b in HOSTILE),
        *(("probe", b) for b in ("array", "drip", "close")),
    ],
)
def test_a_hostile_server_costs_one_line_and_bounded_memory(
    tmp_path: Path, redis_factory: RedisFactory, behaviour: str, command: str
) -> None:
    good = redis_factory("ok")
    with HostileServer(behaviour, stream_s=4 * TIMEOUT_S) as hostile:
        config = group_config(tmp_path, good.url, hostile.url)
        args = {
            "probe": ["probe", "-c", str(config), "--count", "3"],
            "check": ["repair", "check", "-c", str(config)],
            "discover": ["topology", "discover", "--redis", hostile.url],
        }[command]
        code, output, _ = run_replag(args, hostile, tmp_path)
    assert code in (2, 3), output
    line = one_line_naming(output, hostile.port)
    if behaviour == "drip":
        assert "within" in line or "timed out" in line, line
    elif behaviour in ("bulk", "array", "nested"):
        assert "max_reply_" in line, line
        if command == "discover":
            assert "reply to INFO replication" in line, line


@pytest.mark.parametrize(
    ("command", "behaviour"),
    [
        *(("check", b) for b in ("bulk", "nested", "drip", "http")),
        ("run", "array"),
        ("run", "drip"),
    ],
)
def test_a_replica_hostile_only_on_scan_costs_one_line_and_bounded_memory(
    tmp_path: Path, redis_factory: RedisFactory, command: str, behaviour: str
) -> None:
    """Behind a proxy that relays every command but SCAN: the connection, AUTH, INFO and
    DBSIZE go well, then the scan's reply is hostile."""
    good, real = redis_factory("ok"), redis_factory("behind")
    real.client().mset({f"k{i}": "v" for i in range(50)})
    upstream = ("127.0.0.1", real.port)
    with HostileServer(
        behaviour, upstream=upstream, on_command=b"SCAN", stream_s=4 * TIMEOUT_S
    ) as proxy:
        config = group_config(tmp_path, good.url, proxy.url)
        args = ["repair", command, "-c", str(config)]
        code, output, _ = run_replag(args, proxy, tmp_path)
    assert code in (2, 3), output
    line = one_line_naming(output, proxy.port)
    if behaviour in ("bulk", "array", "nested"):
        assert "max_reply_" in line and "SCAN" in line, line


def _serve_config(tmp_path: Path, good: str, hostile: str, port: int) -> Path:
    config = group_config(tmp_path, good, hostile)
    settings = (
        '[settings]\ncheck_interval = "1h"\nprobe_interval = "1s"\ncount = 5\n'
        f'api_token = "{"t" * 32}"\n'
    )
    config.write_text(config.read_text().replace("[settings]\n", settings, 1))
    return config


def _wait_json(url: str, ok: Any, proc: subprocess.Popen[str], within_s: float = 40) -> Any:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "serve exited"
        try:
            response = httpx.get(url, timeout=5)
            if response.status_code == 200 and ok(response.json()):
                return response.json()
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} never answered as expected")


@pytest.mark.parametrize("behaviour", ["drip"])
def test_serve_releases_the_group_a_scheduled_check_failed_on(
    tmp_path: Path, redis_factory: RedisFactory, behaviour: str
) -> None:
    """The scheduled check (the slot claimed at start; the next one is an hour away) meets
    a replica hostile on SCAN: it fails naming the replica, and the group is free again: a
    check asked for next is accepted (202), not 409."""
    good, real = redis_factory("ok"), redis_factory("behind")
    port = free_port()
    with HostileServer(
        behaviour, upstream=("127.0.0.1", real.port), on_command=b"SCAN", stream_s=4 * TIMEOUT_S
    ) as proxy:
        config = _serve_config(tmp_path, good.url, proxy.url, port)
        env = replag_env({"REPLAG_CONNECT_TIMEOUT": f"{TIMEOUT_S}s"})
        proc = subprocess.Popen(
            replag_argv("serve", "-c", str(config), "--port", str(port)),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True, cwd=tmp_path,
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}/api/v1"
        try:
            with MemoryWatch(proc.pid, proxy.started) as watch:
                failed = _wait_json(
                    f"{base}/repairs",
                    lambda body: any(r["status"] == "failed" for r in body["runs"]),
                    proc,
                )
                run = next(r for r in failed["runs"] if r["status"] == "failed")
                assert f"127.0.0.1:{proxy.port}" in run["error"], run
                asked = httpx.post(
                    f"{base}/repairs",
                    json={"action": "check", "group": "g"},
                    headers={"Authorization": f"Bearer {'t' * 32}"},
                    timeout=10,
                )
                assert asked.status_code == 202, asked.text
                job = asked.json()["job_id"]
                done = _wait_json(
                    f"{base}/repairs/{job}", lambda body: body["job"]["state"] != "running", proc
                )
                assert f"127.0.0.1:{proxy.port}" in done["job"]["error"], done
        finally:
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=30)
        grown = watch.growth_mb()
        assert grown and max(grown.values()) < GROWTH_MB, grown
    assert "Traceback" not in stderr, stderr


@pytest.mark.parametrize("behaviour", ["drip"])
def test_an_agent_whose_replica_turns_hostile_stays_bounded_and_says_so(
    tmp_path: Path, redis_factory: RedisFactory, behaviour: str
) -> None:
    """`replag agent` keeps region b's tree from a replica hostile on SCAN: the agent stays
    up and bounded, and a check through it ends in one line naming the replica."""
    good, real = redis_factory("ok"), redis_factory("behind")
    real.client().mset({f"k{i}": "v" for i in range(50)})
    port = free_port()
    with HostileServer(
        behaviour, upstream=("127.0.0.1", real.port), on_command=b"SCAN", stream_s=4 * TIMEOUT_S
    ) as proxy:
        config = group_config(tmp_path, good.url, f"redis://127.0.0.1:{free_port()}")
        text = config.read_text().replace(
            'replicas = [{name = "odd", url = "redis://127.0.0.1:',
            f'agent = "http://127.0.0.1:{port}"\nreplicas = [{{name = "odd", '
            f'local = "{proxy.url}", url = "redis://127.0.0.1:',
        )
        settings = (
            f'[settings]\napi_token = "{"t" * 32}"\nagent_wait = "5s"\n'
            "allow_config_changes = true\n"
            f'agent_state_dir = "{tmp_path / "agent"}"\n'
        )
        config.write_text(text.replace("[settings]\n", settings, 1))
        env = {"REPLAG_CONNECT_TIMEOUT": f"{TIMEOUT_S}s"}
        agent = start_agent(config, "b", port, tmp_path / "agent.log", env=env)
        try:
            with MemoryWatch(agent.pid, proxy.started) as watch:
                code, output, _ = run_replag(
                    ["repair", "check", "-c", str(config)], proxy, tmp_path
                )
            assert agent.poll() is None, (tmp_path / "agent.log").read_text()
        finally:
            stop_agent(agent)
        grown = watch.growth_mb()
        assert grown and max(grown.values()) < GROWTH_MB, grown
    assert code in (2, 3), output
    assert "Traceback" not in output + (tmp_path / "agent.log").read_text()
    line = one_line_naming(output, proxy.port)
    assert "odd" in line, line


class _Liar:
    """A scripted server announcing $10^12 for every MGET (`liar_answers`), watched as
    `run_replag` watches a HostileServer: `started` once the first MGET came."""

    behaviour = "mget-liar"

    def __init__(self, keys: int) -> None:
        self.started = threading.Event()
        answers = liar_answers(keys)
        refused = answers["MGET"]

        def mget(command: list[bytes]) -> bytes:
            self.started.set()
            return refused  # type: ignore[return-value]

        self.server = ScriptedServer({**answers, "MGET": mget})  # type: ignore[dict-item]
        self.port = self.server.port
        self.url = f"redis://{self.server.address}"

    @property
    def hits(self) -> int:
        return self.server.names().count("MGET")


def test_a_server_refused_on_every_mget_ends_the_check_at_max_reply_refusals(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    """20,000 keys whose every MGET announces $10^12 (it cost 40,000 refused MGETs and
    35.7 s): the check ends at max_reply_refusals, one line naming the server, MGET and
    the setting, within +100 MB."""
    good = redis_factory("ok")
    liar = _Liar(20_000)
    with liar.server:
        config = group_config(tmp_path, good.url, liar.url)
        code, output, _ = run_replag(
            ["repair", "check", "-c", str(config)],
            liar,  # type: ignore[arg-type]
            tmp_path,
        )
    assert code in (2, 3), output
    line = one_line_naming(output, liar.port)
    assert "MGET" in line and "max_reply_refusals = 1000" in line, line
    assert liar.hits <= 1000 + 10, liar.hits


@pytest.mark.parametrize("mode", ["poll", "auto"])
def test_a_replica_answering_the_poll_with_400_mb_fails_its_probe_in_one_line(
    tmp_path: Path, redis_factory: RedisFactory, mode: str
) -> None:
    """A replica relaying everything but MGET, which it answers with a 400 MB bulk (under
    max_reply_bytes: it took `replag probe` to 796 MB): the poll's MGET of N probe keys may
    carry N probe values (max_probe_value_bytes), so it is refused at once, one line naming
    the server, MGET and the setting; that replica's probe fails (exit 3), within +100 MB."""
    good, real = redis_factory("ok"), redis_factory("behind")
    upstream = ("127.0.0.1", real.port)
    with HostileServer("fat", upstream=upstream, on_command=b"MGET", stream_s=8.0) as proxy:
        config = group_config(tmp_path, good.url, proxy.url)
        args = ["probe", "-c", str(config), "--count", "3", "--mode", mode]
        code, output, _ = run_replag(args, proxy, tmp_path)
    assert code == 3, output
    line = one_line_naming(output, proxy.port)
    assert line.startswith("UNREACHABLE: odd"), line
    assert "reply to MGET refused" in line and "max_probe_value_bytes = 1024 bytes" in line, line
