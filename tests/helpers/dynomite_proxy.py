"""A stand-in for a Dynomite client port, for tests (no Dynomite binary can run here).

It behaves as tests/fixtures/dynomite/README.md and command_matrix_8102.json
say a real node does, at the one seam replag talks to: RESP on the client
port. Commands Dynomite rejects close the connection without an answer;
`dyno_config:conn_consistency` is accepted; everything else runs on the local
rack's Redis, and writes are sent on to the other racks asynchronously (DC_ONE:
a rack that is down simply misses the write, as with Dynomite's "Swallowing
cross rack error").
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import hiredis
import redis.asyncio as aioredis

REJECTED = {
    b"TIME",
    b"MULTI",
    b"EXEC",
    b"WATCH",
    b"UNWATCH",
    b"SUBSCRIBE",
    b"PSUBSCRIBE",
    b"PUBLISH",
    b"DBSIZE",
    b"SELECT",
    b"AUTH",
    b"OBJECT",
    b"CLIENT",
    b"COMMAND",
    b"FLUSHDB",
    b"FLUSHALL",
    b"WAIT",
    b"ECHO",
    b"UNLINK",
    b"RANDOMKEY",
    b"HELLO",
}
WRITES = {b"SET", b"DEL", b"EXPIRE", b"PEXPIRE", b"HSET", b"SADD", b"ZADD", b"RPUSH", b"MSET"}


def encode_reply(reply: object) -> bytes:
    if isinstance(reply, hiredis.ReplyError):
        return b"-" + str(reply).encode() + b"\r\n"
    if reply is None:
        return b"$-1\r\n"
    if isinstance(reply, int):
        return b":%d\r\n" % reply
    if isinstance(reply, bytes):
        return b"$%d\r\n%s\r\n" % (len(reply), reply)
    if isinstance(reply, list):
        return b"*%d\r\n" % len(reply) + b"".join(encode_reply(r) for r in reply)
    raise TypeError(type(reply))


@dataclass
class DynomiteProxy:
    """Client port in front of `local` (this rack's Redis), replicating writes to `remotes`."""

    local_port: int
    remote_ports: list[int]
    port: int = 0
    commands: list[bytes] = field(default_factory=list)
    consistency: list[bytes] = field(default_factory=list)
    _pending: set[asyncio.Future[None]] = field(default_factory=set)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        parser = hiredis.Reader()
        local = await asyncio.open_connection("127.0.0.1", self.local_port)
        remotes = [aioredis.Redis(port=p, socket_timeout=1) for p in self.remote_ports]
        try:
            while data := await reader.read(65536):
                parser.feed(data)
                while (command := parser.gets()) is not False:
                    assert isinstance(command, list)
                    name = command[0].upper()
                    self.commands.append(name)
                    if name in REJECTED or (name == b"CONFIG" and command[1].upper() == b"SET"):
                        return  # Dynomite closes the connection, no answer
                    if name == b"DYNO_CONFIG:CONN_CONSISTENCY":
                        self.consistency.append(command[1])
                        writer.write(b"+OK\r\n")
                        continue
                    reply = await self._forward(local, command)
                    writer.write(encode_reply(reply))
                    if name in WRITES:
                        for remote in remotes:
                            task = asyncio.ensure_future(self._replicate(remote, command))
                            self._pending.add(task)
                            task.add_done_callback(self._pending.discard)
                await writer.drain()
        finally:
            local[1].close()
            writer.close()
            for remote in remotes:
                await remote.aclose()

    @staticmethod
    async def _forward(
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], command: list[bytes]
    ) -> object:
        reader, writer = conn
        writer.write(
            b"*%d\r\n" % len(command) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in command)
        )
        parser = hiredis.Reader()
        while True:
            parser.feed(await reader.read(65536))
            reply = parser.gets()
            if reply is not False:
                return reply

    @staticmethod
    async def _replicate(remote: aioredis.Redis, command: list[bytes]) -> None:
        with contextlib.suppress(Exception):  # DC_ONE swallows cross-rack errors
            await remote.execute_command(*command)


@contextlib.contextmanager
def running_proxy(local_port: int, remote_ports: list[int]) -> Iterator[DynomiteProxy]:
    """Run a DynomiteProxy on a free port in a background thread; stop it cleanly after."""
    proxy = DynomiteProxy(local_port=local_port, remote_ports=remote_ports)
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def main() -> None:
        server = await asyncio.start_server(proxy._handle, "127.0.0.1", 0)
        proxy.port = server.sockets[0].getsockname()[1]
        ready.set()
        await stop.wait()
        server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()

    thread = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    thread.start()
    ready.wait(5)
    try:
        yield proxy
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(5)
        loop.close()
