"""A port that is not Redis (an HTTP listener, something answering garbage): named, never a
traceback; a probe reports it per replica (exit 3), a check stops on it (exit 2)."""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from replag.cli import main
from replag.errors import EXIT_UNREACHABLE
from tests.helpers.redis_servers import RedisFactory


class _Garbage(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.recv(1024)
        self.request.sendall(b"\x00\x17\xfegarbage that is not RESP\r\n" * 4)


class _Http(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # keep pytest's output clean
        pass


def _serve(server: socketserver.BaseServer) -> Iterator[int]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture(params=["http", "garbage"])
def not_redis(request: pytest.FixtureRequest) -> Iterator[int]:
    """The port of a real socket server that answers HTTP, or garbage."""
    if request.param == "http":
        yield from _serve(ThreadingHTTPServer(("127.0.0.1", 0), _Http))
    else:
        socketserver.ThreadingTCPServer.daemon_threads = True
        yield from _serve(socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Garbage))


def _one_line_naming(output: str, port: int) -> None:
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert f"127.0.0.1:{port}" in lines[0] and "not a Redis server" in lines[0]
    assert "Traceback" not in output


def test_probe_names_the_endpoint_that_is_not_redis(
    tmp_path: Path, redis_factory: RedisFactory, not_redis: int
) -> None:
    good = redis_factory("ok")
    config = tmp_path / "t.toml"
    config.write_text(
        f'[settings]\nstore = "{tmp_path / "s.sqlite"}"\n'
        f'[[regions]]\nname = "a"\nwrite = "{good.url}"\n'
        f'replicas = ["redis://127.0.0.1:{not_redis}"]\n'
    )
    result = CliRunner().invoke(main, ["probe", "-c", str(config), "--count", "5"])
    # Reported per replica, like one that is down: the rest of the run is measured.
    assert result.exit_code == EXIT_UNREACHABLE, result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("UNREACHABLE:")]
    assert f"127.0.0.1:{not_redis}" in line and "not a Redis server" in line
    assert "Traceback" not in result.output


def test_repair_check_names_the_member_that_is_not_redis(
    tmp_path: Path, redis_factory: RedisFactory, not_redis: int
) -> None:
    good = redis_factory("ok")
    config = tmp_path / "t.toml"
    config.write_text(
        f'[settings]\nstore = "{tmp_path / "s.sqlite"}"\n'
        f'[[regions]]\nname = "a"\nreplicas = [{{name = "good", url = "{good.url}"}}]\n'
        f'[[regions]]\nname = "b"\n'
        f'replicas = [{{name = "odd", url = "redis://127.0.0.1:{not_redis}"}}]\n'
        '[[groups]]\nname = "g"\nmembers = ["good", "odd"]\n'
    )
    result = CliRunner().invoke(main, ["repair", "check", "-c", str(config)])
    assert result.exit_code == 2
    _one_line_naming(result.output, not_redis)
    assert "odd" in result.output
