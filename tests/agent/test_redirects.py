"""The coordinator never follows a redirect from an agent: a real HTTP server in an
agent's place answers 307 to another, which must receive nothing (neither the body,
key names and values, nor the token), and the error says why."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from replag.errors import AgentError
from replag.repair.trees.agent_http import AgentLink


async def _serve(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


@pytest.fixture
async def elsewhere() -> AsyncIterator[tuple[str, list[web.Request]]]:
    seen: list[web.Request] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(request)
        return web.json_response({"written": True})

    runner, url = await _serve(record)
    yield url, seen
    await runner.cleanup()


async def test_a_redirecting_agent_is_an_error_and_nothing_goes_elsewhere(
    elsewhere: tuple[str, list[web.Request]],
) -> None:
    target, seen = elsewhere

    async def redirect(request: web.Request) -> web.Response:
        return web.Response(status=307, headers={"Location": target + request.path})

    runner, url = await _serve(redirect)
    link = AgentLink(url, token="coordinator-t0ken-long", timeout_s=5)
    try:
        with pytest.raises(AgentError, match="agent answered 307, a redirect: not followed"):
            await link.request("POST", "/replicas/r/keys/write", {"key": "aw==", "write": {}})
    finally:
        await link.close()
        await runner.cleanup()
    assert seen == []
