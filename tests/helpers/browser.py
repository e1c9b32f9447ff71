"""Headless Chromium, when the machine has it: a page's DOM after its scripts ran, or a PNG."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp

from replag.lab.server import free_port

CHROMIUM = next(
    (p for p in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser"))
     if p and os.path.exists(p)),
    None,
)  # fmt: skip


def chromium(tmp_path: Path, *args: str, height: int = 1500) -> str:
    """Run Chromium headless on `args` (e.g. --dump-dom URL); its stdout. No network besides
    the URL: background networking, sync and updates are off."""
    assert CHROMIUM is not None
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'chromium'}",
        "--virtual-time-budget=8000", f"--window-size=1400,{height}", "--hide-scrollbars",
    ]  # fmt: skip
    done = subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=90)
    return done.stdout


async def evaluate_when_loaded(
    tmp_path: Path, url: str, script: str, *, width: int, height: int = 844
) -> Any:
    """Open `url` in headless Chromium with a phone's viewport (`width` CSS px, touch,
    device scale 2), wait until the dashboard says it loaded (body[data-loaded]), then
    return what the JavaScript expression `script` evaluates to. Talks the DevTools
    protocol over a WebSocket (aiohttp's client), so the page really lays out."""
    assert CHROMIUM is not None
    port = free_port()
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'chromium-cdp'}",
        f"--remote-debugging-port={port}", f"--window-size={width},{height}", "about:blank",
    ]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        CHROMIUM, *flags, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        async with aiohttp.ClientSession() as http:
            target = await _page_target(http, port, proc)
            async with http.ws_connect(target, max_msg_size=0) as ws:
                cdp = _Cdp(ws)
                await cdp.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                               deviceScaleFactor=2, mobile=True)  # fmt: skip
                await cdp.call("Emulation.setTouchEmulationEnabled", enabled=True)
                await cdp.call("Page.navigate", url=url)
                loaded = "document.body && document.body.dataset.loaded === 'true'"
                deadline = time.monotonic() + 90
                while not await cdp.value(loaded):
                    assert time.monotonic() < deadline, f"{url} never said it loaded"
                    await asyncio.sleep(0.2)
                await asyncio.sleep(0.5)  # the resize handler's debounced redraw
                return await cdp.value(script)
    finally:
        proc.kill()
        await proc.wait()


async def _page_target(
    http: aiohttp.ClientSession, port: int, proc: asyncio.subprocess.Process
) -> str:
    deadline = time.monotonic() + 60
    while True:
        assert proc.returncode is None, f"Chromium exited {proc.returncode}"
        try:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
                pages = [t for t in await response.json() if t["type"] == "page"]
                if pages:
                    return str(pages[0]["webSocketDebuggerUrl"])
        except aiohttp.ClientError:
            pass
        assert time.monotonic() < deadline, "Chromium's DevTools endpoint never answered"
        await asyncio.sleep(0.2)


class _Cdp:
    """Calls over one DevTools WebSocket, answers matched by id (events are skipped)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.next_id = 0

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        await self.ws.send_json({"id": self.next_id, "method": method, "params": params})
        while True:
            message = json.loads((await self.ws.receive()).data)
            if message.get("id") == self.next_id:
                assert "error" not in message, message
                return dict(message["result"])

    async def value(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")
