"""A fake Redis-protocol server that answers each command from a script and records every
command it receives: a Sentinel or Cluster node that names another host, a server whose
replies have the wrong shape, or a capture server (on 127.0.0.2) proving that nothing,
no AUTH and no write, reached it.

`answers` maps a command's first word (or first two, "SENTINEL GET-MASTER-ADDR-BY-NAME")
to the raw RESP bytes sent back; an unscripted command gets `default`.
"""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Callable, Mapping

import hiredis

Answer = bytes | Callable[[list[bytes]], bytes]


def bulk(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return b"$%d\r\n%s\r\n" % (len(data), data)


def array(*items: bytes) -> bytes:
    return b"*%d\r\n" % len(items) + b"".join(items)


class ScriptedServer:
    """Listening on `host`:`port`; `commands` lists every command received, in order."""

    def __init__(
        self,
        answers: Mapping[str, Answer],
        *,
        host: str = "127.0.0.1",
        default: bytes = b"+OK\r\n",
    ) -> None:
        self.answers = {k.upper(): v for k, v in answers.items()}
        self.default = default
        self.commands: list[list[bytes]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                outer._handle(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server((host, 0), Handler)
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def names(self) -> list[str]:
        """The first word of every command received (upper case)."""
        with self.lock:
            return [c[0].decode("ascii", "replace").upper() for c in self.commands if c]

    def _answer(self, command: list[bytes]) -> bytes:
        words = [c.decode("ascii", "replace").upper() for c in command[:2]]
        for key in (" ".join(words), words[0] if words else ""):
            if key in self.answers:
                found = self.answers[key]
                return found(command) if callable(found) else found
        return self.default

    def _handle(self, client: socket.socket) -> None:
        client.settimeout(30)
        reader = hiredis.Reader()
        try:
            while data := client.recv(1 << 16):
                reader.feed(data)
                while (command := reader.gets()) is not False:
                    with self.lock:
                        self.commands.append(list(command))
                    client.sendall(self._answer(list(command)))
        except OSError:
            pass

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def capture_server() -> ScriptedServer:
    """On 127.0.0.2 (loopback, outside every topology here): answers like a primary."""
    info = "# Replication\r\nrole:master\r\nconnected_slaves:0\r\nmaster_replid:" + "0" * 40
    info += "\r\nmaster_repl_offset:0\r\n"
    return ScriptedServer(
        {"PING": b"+PONG\r\n", "INFO": bulk(info), "TIME": array(bulk("1"), bulk("0"))},
        host="127.0.0.2",
    )
