"""Request bodies are bounded before they are read, in the service and the agent.

In-process (the real apps): a body without a token is refused before the app reads a
byte of it (the ASGI `receive` is never called), a declared length over the limit gets
413 unread, a chunked one is cut off as it passes it, and a JSON body with too many
object members gets 413 before any parser sees it. Then against real `replag serve`
and `replag agent` processes: a 500 MB upload without a token (declared, and chunked)
gets its answer after a few MB at most, and the process's peak RSS (from /proc) does
not move by more than 20 MB. How long it takes is `benchmarks/upload_refusal.py`'s.
Last, hypothesis sends the service's repair request malformed every way: never a 500.
"""

from __future__ import annotations

import json
import select
import socket
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tomli_w

from replag.agent.app import create_agent_app
from replag.agent.region import RegionAgent
from replag.api.app import create_app
from replag.config import config_from_dict
from replag.lab.server import free_port
from tests.helpers.cli import spawn_replag
from tests.helpers.redis_servers import RedisFactory
from tests.helpers.waiting import wait_until

TOKEN = "bodies-t0ken-long-enough"
MB = 1 << 20


def _data(tmp_path: Path, url: str, **settings: Any) -> dict[str, Any]:
    return {
        "settings": {
            "store": str(tmp_path / "s.sqlite"),
            "agent_state_dir": str(tmp_path / "st"),
            "api_token": TOKEN,
            "probe_interval": "1h",
            "check_interval": "1h",
            "notify_keyspace_events": "KA",
            **settings,
        },
        "regions": [
            {"name": "here", "agent": f"http://127.0.0.1:{free_port()}",
             "replicas": [{"name": "r", "url": url}]},
            {"name": "there", "replicas": [{"name": "o", "url": "redis://127.0.0.1:2"}]},
        ],
        "groups": [{"name": "g", "members": ["r", "o"]}],
    }  # fmt: skip


class Asgi:
    """One request through an app as its server would pass it, counting the body reads."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(
        self, method: str, path: str, headers: dict[str, str], chunks: list[bytes]
    ) -> tuple[int, dict[str, Any], int]:
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
            "root_path": "", "scheme": "http", "server": ("agent", 80),
            "client": ("127.0.0.1", 4000),
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        }  # fmt: skip
        reads = 0
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            nonlocal reads
            reads += 1
            if reads <= len(chunks):
                return {"type": "http.request", "body": chunks[reads - 1],
                        "more_body": reads < len(chunks)}  # fmt: skip
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await self.app(scope, receive, send)
        status = sent[0]["status"]
        body = b"".join(m.get("body", b"") for m in sent[1:])
        return status, json.loads(body), reads


@pytest.fixture
def agent_asgi(redis_factory: RedisFactory, tmp_path: Path) -> Iterator[Asgi]:
    server = redis_factory("bodies", extra_args=("--notify-keyspace-events", "KA"))
    data = _data(tmp_path, server.url, agent_max_body=4096, max_json_keys=50)
    agent = RegionAgent(config_from_dict(data, where="t", environ={}), "here")
    yield Asgi(create_agent_app(agent, run=False))


@pytest.fixture
def service_asgi(redis_factory: RedisFactory, tmp_path: Path) -> Iterator[Asgi]:
    server = redis_factory("bodies-svc")
    data = _data(tmp_path, server.url, api_max_body=4096, max_json_keys=50)
    yield Asgi(create_app(config_from_dict(data, where="t", environ={}), run_schedulers=False))


@pytest.mark.parametrize(
    ("which", "path"),
    [("agent", "/agent/v1/replicas/r/keys/observe"), ("service", "/api/v1/repairs")],
)
async def test_the_token_comes_before_the_body_and_the_body_is_bounded(
    which: str, path: str, request: pytest.FixtureRequest
) -> None:
    call: Asgi = request.getfixturevalue(f"{which}_asgi")
    setting = "agent_max_body" if which == "agent" else "api_max_body"
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    huge = {"Content-Length": str(500 * MB), "Content-Type": "application/json"}
    # No token, or a wrong one: 401 before a byte of the body is read.
    status, body, reads = await call("POST", path, huge, [b"x" * 1024])
    assert (status, reads) == (401, 0) and "missing bearer token" in body["detail"]
    wrong = {**huge, "Authorization": "Bearer not-the-token-at-all"}
    status, body, reads = await call("POST", path, wrong, [b"x" * 1024])
    assert (status, reads) == (401, 0) and body["detail"] == "wrong bearer token"
    chunked = {"Transfer-Encoding": "chunked"}
    assert (await call("POST", path, chunked, [b"x" * 1024] * 8))[::2] == (401, 0)
    # A token, and a declared length past the limit: 413, still unread.
    status, body, reads = await call("POST", path, {**huge, **auth}, [b"x" * 1024])
    assert (status, reads) == (413, 0)
    assert body["detail"] == f"request body of {500 * MB} bytes: more than {setting} (4096 bytes)"
    # Chunked: cut off once past the limit, the rest never read.
    status, body, reads = await call("POST", path, {**chunked, **auth}, [b"x" * 1024] * 100)
    assert (status, reads) == (413, 5) and "(chunked)" in body["detail"]
    # Too many object members: 413 before any JSON parser builds them.
    many = json.dumps({f"k{i}": 1 for i in range(60)}).encode()
    status, body, _ = await call("POST", path, {**auth, "Content-Length": str(len(many))}, [many])
    assert status == 413 and "more than 50 JSON object members (max_json_keys)" in body["detail"]
    if which == "agent":  # a repair's write, from a token that may write, may be larger
        write = "/agent/v1/replicas/r/keys/write"
        bigger = {**auth, "Content-Length": str(600 * MB)}
        status, body, reads = await call("POST", write, bigger, [b"x"])
        assert (status, reads) == (413, 0)
        assert "more than agent_max_write_body (536870912 bytes)" in body["detail"]


async def test_bodies_within_bounds_reach_the_routes(service_asgi: Asgi) -> None:
    ok = json.dumps({"group": "nope", "action": "check"}).encode()
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    status, body, reads = await service_asgi(
        "POST", "/api/v1/repairs", {**auth, "Content-Length": str(len(ok))}, [ok[:10], ok[10:]]
    )
    # The route read it, whole, in two chunks, and answered on what it says.
    assert reads == 2 and status == 404 and "nope" in body["detail"]
    status, _, _ = await service_asgi("GET", "/api/v1/health", {}, [])
    assert status == 200


def _peak_and_rss(pid: int) -> tuple[int, int]:
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmHWM"].split()[0]) * 1024, int(fields["VmRSS"].split()[0]) * 1024


def upload(port: int, path: str, total: int, *, chunked: bool, token: str | None = None) -> int:
    """POST `total` bytes (declared, or chunked) until the server answers; its status."""
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    head.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}")
    if token:
        head.append(f"Authorization: Bearer {token}")
    block = b"x" * MB
    piece = b"%x\r\n%s\r\n" % (len(block), block) if chunked else block
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        sent = 0
        while sent < total:
            readable, _, _ = select.select([sock], [sock], [], 30)
            if readable:
                break  # answered: the rest is not wanted
            try:
                sock.send(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += MB
        answer = b""
        while b"\r\n" not in answer:
            data = sock.recv(4096)
            if not data:
                break
            answer += data
    return int(answer.split(b" ", 2)[1])


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    return spawn_replag(*args, log=log)


def _wait_up(proc: subprocess.Popen[bytes], health: str, log: Path) -> None:
    def up() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            return httpx.get(health, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, f"{health} answering", timeout_s=120)


def test_a_500_mb_upload_without_a_token_costs_the_service_and_agent_nothing(
    redis_factory: RedisFactory, tmp_path: Path
) -> None:
    server = redis_factory("upload", extra_args=("--notify-keyspace-events", "KA"))
    data = _data(tmp_path, server.url)
    agent_port = int(data["regions"][0]["agent"].rsplit(":", 1)[1])
    config = tmp_path / "replag.toml"
    config.write_text(tomli_w.dumps(data))
    serve_port = free_port()
    # Both start at once (each takes seconds to import on a busy host).
    procs = [
        (_start(["serve", "-c", str(config), "--port", str(serve_port)], tmp_path / "serve.log"),
         serve_port, "/api/v1/repairs", f"http://127.0.0.1:{serve_port}/api/v1/health",
         tmp_path / "serve.log"),
        (_start(["agent", "-c", str(config), "--region", "here"], tmp_path / "agent.log"),
         agent_port, "/agent/v1/replicas/r/keys/observe",
         f"http://127.0.0.1:{agent_port}/agent/v1/health", tmp_path / "agent.log"),
    ]  # fmt: skip
    try:
        for proc, _, _, health, log in procs:
            _wait_up(proc, health, log)
        for proc, port, path, _, _ in procs:
            peak, rss = _peak_and_rss(proc.pid)
            assert upload(port, path, 500 * MB, chunked=False) == 401
            assert upload(port, path, 500 * MB, chunked=True) == 401
            assert upload(port, path, 500 * MB, chunked=False, token=TOKEN) == 413
            peak_after, _ = _peak_and_rss(proc.pid)
            assert peak_after <= max(peak, rss + 20 * MB), (path, peak, rss, peak_after)
            # With a token, a chunked body is read up to the limit (64 MiB for an agent).
            assert upload(port, path, 500 * MB, chunked=True, token=TOKEN) == 413
    finally:
        for proc, *_ in procs:
            proc.terminate()
            proc.wait(30)


def test_every_malformed_repair_request_is_a_client_error(
    redis_factory: RedisFactory, tmp_path: Path
) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from tests.helpers.agent import LoopThread

    server = redis_factory("fuzz-svc")
    data = _data(tmp_path, server.url)
    del data["groups"]  # nothing a well-formed request could start
    app = create_app(config_from_dict(data, where="t", environ={}), run_schedulers=False)
    loop = LoopThread()
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://replag")
    junk = st.recursive(
        st.sampled_from([None, True, 0, -1, 2**70, 1e308, "", "x" * 300, "quorum",
                         "source:", "newest:f", "check", "repair", "compare"]),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                     max_size=3),
        max_leaves=5,
    )  # fmt: skip
    fields = ("action", "group", "policy", "dry_run", "allow_deletes", "ttls", "extra")
    seen: set[int] = set()
    bodies = st.dictionaries(st.sampled_from(fields), junk, max_size=7) | junk

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(bodies)
    def check(body: Any) -> None:
        answer = loop.run(
            http.post("/api/v1/repairs", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
        )
        # A well-formed one is accepted (202: a check of no groups, failing harmlessly).
        assert answer.status_code < 500, (body, answer.status_code, answer.text)
        seen.add(answer.status_code)

    try:
        check()
    finally:
        loop.run(http.aclose())
        loop.close()
    assert 422 in seen
