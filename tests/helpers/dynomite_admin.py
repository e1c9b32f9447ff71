"""Real HTTP servers (aiohttp, port 0) answering with captured Dynomite admin output.

The files in tests/fixtures/dynomite (see its README) are what Dynomite v0.6.22
nodes answered; each is served as the node did, with a JSON content type even
for the CRLF plain-text answers.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

from aiohttp import web

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dynomite"

# file name part → URL path a node serves it at
_ENDPOINTS = {
    "cluster_describe": "/cluster_describe",
    "get_consistency": "/get_consistency",
    "get_timeout_factor": "/get_timeout_factor",
    "help": "/help",
    "info": "/info",
    "ping": "/ping",
    "state_get_state": "/state/get_state",
}

Route = bytes | Callable[[web.Request], Awaitable[web.StreamResponse]]


def node_routes(layout: str, node: str) -> dict[str, Route]:
    """Every captured answer of one node, e.g. node_routes("3rack", "node1")."""
    routes: dict[str, Route] = {}
    for path in FIXTURES.glob(f"{layout}_{node}_*"):
        endpoint = path.name.split("_", 3)[3].rsplit(".", 1)[0]
        if endpoint in _ENDPOINTS:
            routes[_ENDPOINTS[endpoint]] = path.read_bytes()
    if not routes:
        raise FileNotFoundError(f"no fixtures for {layout}_{node} in {FIXTURES}")
    return routes


def fixture_bytes(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


@asynccontextmanager
async def admin_server(routes: Mapping[str, Route]) -> AsyncIterator[str]:
    """Serve `routes` on 127.0.0.1:0; yield the base URL (http://127.0.0.1:PORT)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        route = routes.get(request.path)
        if route is None:
            return web.Response(status=404, text="not found")
        if callable(route):
            return await route(request)
        return web.Response(body=route, content_type="application/json")

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


@contextmanager
def admin_server_in_thread(routes: Mapping[str, Route]) -> Iterator[str]:
    """`admin_server` on its own event loop thread, for synchronous callers (the CLI)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = admin_server(routes)
    try:
        url = asyncio.run_coroutine_threadsafe(server.__aenter__(), loop).result(timeout=10)
        try:
            yield url
        finally:
            asyncio.run_coroutine_threadsafe(server.__aexit__(None, None, None), loop).result(
                timeout=10
            )
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
