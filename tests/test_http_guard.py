"""`replag.http_guard`: a connection that drips its headers is closed after
http_header_timeout; a normal request is answered (uvicorn in-process, a real socket)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn

from replag.http_guard import server_options
from replag.settings import default_settings


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def test_dripped_headers_are_closed_and_whole_ones_answered() -> None:
    settings = default_settings().replace(http_header_timeout=0.5)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(_app, log_level="error", lifespan="off", **server_options(settings))
    )
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 (uvicorn sets a flag, no event)
        await asyncio.sleep(0.01)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"200" in await reader.readline()
        writer.close()

        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        closed = False
        for byte in b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
            try:
                writer.write(bytes([byte]))
                await writer.drain()
            except ConnectionError:
                closed = True
                break
            if reader.at_eof() or await _eof_within(reader, 0.1):
                closed = True
                break
        assert closed, "a connection dripping its headers for 10 s was not closed"
        writer.close()
    finally:
        server.should_exit = True
        await serving


async def _eof_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), seconds) == b""
    except TimeoutError:
        return False
