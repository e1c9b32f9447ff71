"""`topology discover --redis` says which hosts got the URL's credentials (stderr and the
written file), and with --allow-networks neither contacts nor writes a host outside them.
The seed is a small real server whose INFO replication names a replica on 127.0.0.1 (a
real redis-server) and one at 10.255.255.1, outside the allowed 127.0.0.0/8."""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path

import hiredis
import pytest
from click.testing import CliRunner

from replag.cli import main
from tests.helpers.redis_servers import RedisFactory

OUTSIDE = "10.255.255.1:6379"


@pytest.fixture
def lying_primary(redis_factory: RedisFactory) -> Iterator[tuple[int, int]]:
    """(port of a fake primary, port of the real replica it lists beside OUTSIDE)."""
    replica = redis_factory("inside", password="s3cret")
    host, port = OUTSIDE.split(":")
    info = (
        "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n"
        f"slave0:ip=127.0.0.1,port={replica.port},state=online,offset=1,lag=0\r\n"
        f"slave1:ip={host},port={port},state=online,offset=1,lag=0\r\n"
    ).encode()

    class Primary(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            reader = hiredis.Reader()
            while data := self.request.recv(4096):
                reader.feed(data)
                while (command := reader.gets()) is not False:
                    if command[0].upper() == b"INFO":
                        self.request.sendall(b"$%d\r\n%s\r\n" % (len(info), info))
                    else:
                        self.request.sendall(b"+OK\r\n")

    socketserver.ThreadingTCPServer.daemon_threads = True
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Primary)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1]), replica.port
    server.shutdown()
    server.server_close()
    thread.join()


def test_discovery_names_the_hosts_it_sent_credentials_to_and_stays_in_its_networks(
    tmp_path: Path, lying_primary: tuple[int, int]
) -> None:
    primary, replica = lying_primary
    out = tmp_path / "t.toml"
    result = CliRunner().invoke(
        main,
        [
            "topology", "discover", "--redis", f"redis://:s3cret@127.0.0.1:{primary}",
            "--allow-networks", "127.0.0.0/8", "--out", str(out), "--timeout", "1s",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    sent = f"The URL's credentials were sent to: 127.0.0.1:{primary}, 127.0.0.1:{replica}."
    refused = f"Not contacted (outside --allow-networks): {OUTSIDE}."
    assert f"note: {sent}" in result.output and f"note: {refused}" in result.output
    text = out.read_text()
    assert f"# {sent}" in text and f"# {refused}" in text
    assert "10.255.255.1" not in text.replace(f"# {refused}", "")
    assert "s3cret" not in result.output


def test_allow_networks_is_checked_before_anything_is_contacted(tmp_path: Path) -> None:
    runner = CliRunner()
    bad = runner.invoke(
        main, ["topology", "discover", "--redis", "redis://127.0.0.1:1", "--allow-networks", "x"]
    )
    assert bad.exit_code == 2 and "--allow-networks" in bad.output
    outside = runner.invoke(
        main,
        ["topology", "discover", "--redis", "redis://:pw@10.255.255.1:6379",
         "--allow-networks", "127.0.0.1/32"],
    )  # fmt: skip
    assert outside.exit_code == 2 and "not contacted" in outside.output, outside.output
    assert "Traceback" not in outside.output
