"""Alert delivery to real HTTP servers (aiohttp on port 0) and a real command hook."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from replag.alerts import payloads
from replag.alerts.config import AlertSink
from replag.alerts.evaluate import AlertSender, sample_events
from replag.alerts.payloads import SIGNATURE_HEADER, signature
from replag.alerts.state import AlertEvent
from replag.store import Store
from tests.helpers.waiting import until


@dataclass
class Receiver:
    """A webhook receiver answering with `statuses` in turn (then 200)."""

    statuses: list[int] = field(default_factory=list)
    requests: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append((dict(request.headers), await request.read()))
        status = self.statuses.pop(0) if self.statuses else 200
        return web.Response(status=status, text="boom" if status >= 500 else "ok")


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    rec = Receiver()
    app = web.Application()
    app.router.add_post("/{tail:.*}", rec.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    rec.url = f"http://127.0.0.1:{port}"
    yield rec
    await runner.cleanup()


def sink(**kw: Any) -> AlertSink:
    kw.setdefault("backoff_s", 0.001)
    kw.setdefault("max_backoff_s", 0.01)
    return AlertSink(**kw)


def event(status: str = "firing") -> AlertEvent:
    resolved = status == "resolved"
    return AlertEvent(
        fingerprint="fp1", rule="lag", status=status,  # type: ignore[arg-type]
        labels={"alertname": "lag", "severity": "critical", "source": "us-east",
                "target": "eu-west", "kind": "lag_p99"},
        value=21.5 if resolved else 250.0,
        summary="resolved after 10m00s of firing (since 2023-11-14 22:13:20Z): us-east→eu-west: "
        "p99 lag 21.5 ms" if resolved else "us-east→eu-west: p99 lag 250 ms",
        starts_ns=1_700_000_000 * 10**9, ends_ns=1_700_000_600 * 10**9 if resolved else None,
    )  # fmt: skip


async def test_webhook_retries_after_500s_and_signs_every_attempt(
    receiver: Receiver, tmp_path: Path
) -> None:
    receiver.statuses = [500, 503]
    hook = sink(name="ops", kind="webhook", url=receiver.url + "/hook", secret="s3cret", retries=3)
    sender = AlertSender([hook], Store(tmp_path / "s.sqlite"), rng=lambda: 0.5)
    [result] = await sender.deliver([event()])
    await sender.close()
    assert result.ok and result.attempts == 3
    assert len(receiver.requests) == 3
    for headers, body in receiver.requests:
        assert headers[SIGNATURE_HEADER] == signature("s3cret", body)
    payload = json.loads(receiver.requests[-1][1])
    assert payload["version"] == "4" and payload["status"] == "firing"
    assert payload["alerts"][0]["labels"]["alertname"] == "lag"
    assert payload["alerts"][0]["endsAt"] == "0001-01-01T00:00:00Z"
    [status] = sender.statuses()
    assert status["last_status"] == "ok" and status["delivered"] == 1
    assert "s3cret" not in json.dumps(status)


async def test_resolved_message_and_unsigned_without_secret(
    receiver: Receiver, tmp_path: Path
) -> None:
    sender = AlertSender([sink(name="ops", kind="webhook", url=receiver.url)],
                         Store(tmp_path / "s.sqlite"))  # fmt: skip
    await sender.deliver([event("resolved")])
    await sender.close()
    headers, body = receiver.requests[0]
    assert SIGNATURE_HEADER not in headers
    payload = json.loads(body)
    assert payload["status"] == "resolved"
    assert payload["alerts"][0]["endsAt"].startswith("2023-11-14T22:23:20")


async def test_failures_are_recorded_not_raised(receiver: Receiver, tmp_path: Path) -> None:
    receiver.statuses = [500] * 10
    store = Store(tmp_path / "s.sqlite")
    seen: list[bool] = []
    sender = AlertSender(
        [sink(name="bad", kind="webhook", url=receiver.url, retries=2),
         sink(name="gone", kind="webhook", url="http://127.0.0.1:9", retries=1)],
        store, on_result=lambda r: seen.append(r.ok),
    )  # fmt: skip
    results = await sender.deliver([event()])
    await sender.close()
    assert [(r.ok, r.attempts) for r in results] == [(False, 3), (False, 2)]
    assert "HTTP 500" in (results[0].error or "")
    statuses = {s["name"]: s for s in sender.statuses()}
    assert statuses["bad"]["last_status"] == "failed" and statuses["bad"]["failed"] == 1
    assert seen == [False, False]


async def test_client_errors_are_not_retried(receiver: Receiver, tmp_path: Path) -> None:
    receiver.statuses = [400]
    sender = AlertSender([sink(name="x", kind="webhook", url=receiver.url, retries=5)],
                         Store(tmp_path / "s.sqlite"))  # fmt: skip
    [result] = await sender.deliver([event()])
    await sender.close()
    assert not result.ok and result.attempts == 1


async def test_slack_and_pagerduty_bodies(receiver: Receiver, tmp_path: Path) -> None:
    sinks = [
        sink(name="chat", kind="slack", url=receiver.url + "/slack"),
        sink(name="pd", kind="pagerduty", url=receiver.url + "/pd", routing_key="rk-123"),
    ]
    sender = AlertSender(sinks, Store(tmp_path / "s.sqlite"))
    await sender.deliver([event("firing")])
    await sender.deliver([event("resolved")])
    await sender.close()
    bodies = [json.loads(body) for _, body in receiver.requests]
    slack = [b for b in bodies if "attachments" in b]
    pager = [b for b in bodies if "routing_key" in b]
    assert slack[0]["attachments"][0]["title"] == "[FIRING] lag"
    assert slack[0]["attachments"][0]["ts"] == 1_700_000_000  # when it fired
    assert slack[1]["text"] == "replag: 1 resolved"
    [resolved] = slack[1]["attachments"]
    assert resolved["title"] == "[RESOLVED] lag" and resolved["ts"] == 1_700_000_600
    assert resolved["text"].startswith("resolved after 10m00s of firing")
    assert [p["event_action"] for p in pager] == ["trigger", "resolve"]
    assert pager[0]["dedup_key"] == pager[1]["dedup_key"] == "replag-fp1"
    assert pager[0]["payload"]["severity"] == "critical"


def test_nodata_and_resolved_bodies_say_so() -> None:
    nodata = replace(event(), nodata=True, value=None, summary="no data: all probes lost")
    body = payloads.alertmanager([nodata, event("resolved")], receiver="ops")
    firing, resolved = body["alerts"]
    # Alertmanager knows firing and resolved only: no data is firing, with its state said.
    assert firing["status"] == "firing" and firing["annotations"]["state"] == "nodata"
    assert "value" not in firing["annotations"]
    assert resolved["annotations"] == {
        "summary": resolved["annotations"]["summary"],
        "state": "resolved",
        "value": "21.5",
        "duration": "600s",
    }
    assert resolved["startsAt"] == "2023-11-14T22:13:20.000Z"
    assert resolved["endsAt"] == "2023-11-14T22:23:20.000Z"
    slack = payloads.slack([nodata])
    assert slack["text"] == "replag: 1 without data"
    assert slack["attachments"][0]["title"] == "[NO DATA] lag"
    pager = payloads.pagerduty(nodata, routing_key="rk")
    assert pager["event_action"] == "trigger"
    assert pager["payload"]["summary"] == "no data: all probes lost"
    assert pager["payload"]["custom_details"]["state"] == "nodata"


async def test_command_hook_gets_json_on_stdin_and_times_out(tmp_path: Path) -> None:
    out = tmp_path / "alert.json"
    script = f"import sys; open({str(out)!r}, 'w').write(sys.stdin.read())"
    copy = sink(name="cmd", kind="command", timeout_s=10, command=(sys.executable, "-c", script))
    slow = sink(name="slow", kind="command", timeout_s=0.2, retries=1,
                command=(sys.executable, "-c", "import time; time.sleep(30)"))  # fmt: skip
    fail = "import sys; sys.exit('no pager today')"
    failing = sink(name="fail", kind="command", retries=0, command=(sys.executable, "-c", fail))
    sender = AlertSender([copy, slow, failing], Store(tmp_path / "s.sqlite"))
    results = await sender.deliver(sample_events())
    await sender.close()
    assert [r.ok for r in results] == [True, False, False]
    assert json.loads(out.read_text())["alerts"][0]["labels"]["alertname"] == "ReplagTestAlert"
    assert "timed out" in (results[1].error or "") and results[1].attempts == 2
    assert "no pager today" in (results[2].error or "")


async def test_submit_queues_per_sink_and_returns_at_once(
    receiver: Receiver, tmp_path: Path
) -> None:
    import asyncio

    release = asyncio.Event()
    arrived = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        arrived.set()
        await release.wait()
        return web.Response(text="late")

    app = web.Application()
    app.router.add_post("/", slow)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    slow_url = f"http://127.0.0.1:{runner.addresses[0][1]}/"
    sender = AlertSender(
        [sink(name="slow", kind="webhook", url=slow_url, timeout_s=30),
         sink(name="fast", kind="webhook", url=receiver.url)],
        Store(tmp_path / "s.sqlite"),
    )  # fmt: skip
    sender.submit([event()])  # returns while the slow sink holds its request
    await arrived.wait()
    await until(lambda: sender.statuses()[1]["last_status"] == "ok")
    assert sender.statuses()[0]["last_status"] == "never"  # still held by the slow receiver
    release.set()
    await until(lambda: sender.statuses()[0]["last_status"] == "ok")
    await sender.close()
    await runner.cleanup()


@dataclass
class Redirector:
    """A real HTTP server answering every request with `status` and `location`, and
    keeping what it was sent (method, headers, body)."""

    status: int = 307
    location: str = ""
    requests: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append(
            (request.method, request.path, dict(request.headers), await request.read())
        )
        if request.path.startswith("/final"):
            return web.Response(text="ok")
        return web.Response(status=self.status, headers={"Location": self.location})


@pytest.fixture
async def redirector() -> AsyncIterator[tuple[Redirector, str]]:
    red = Redirector()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", red.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield red, f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


async def test_webhook_redirects_never_leave_the_origin_nor_become_a_get(
    redirector: tuple[Redirector, str], receiver: Receiver, tmp_path: Path
) -> None:
    red, base = redirector
    store = Store(tmp_path / "s.sqlite")

    async def deliver() -> Any:
        hook = sink(name="ops", kind="webhook", url=base + "/hook", secret="s3cret", retries=2)
        sender = AlertSender([hook], store)
        [result] = await sender.deliver([event()])
        await sender.close()
        return result

    # A 307 to another origin: neither the body nor the signature goes there.
    red.status, red.location = 307, receiver.url + "/stolen"
    result = await deliver()
    assert not result.ok and result.attempts == 1
    assert "HTTP 307 redirect to " + receiver.url + "/stolen" in (result.error or "")
    assert "another origin" in (result.error or "")
    assert receiver.requests == []
    # A 302 (and 301, 303) within the origin would turn the POST into an empty GET.
    for status in (301, 302, 303):
        red.requests.clear()
        red.status, red.location = status, "/final"
        result = await deliver()
        assert not result.ok and f"a {status} turns the POST into a GET" in (result.error or "")
        assert [m for m, *_ in red.requests] == ["POST"]
    # A 307/308 within the origin keeps the POST, its body and signature: delivered.
    for status in (307, 308):
        red.requests.clear()
        red.status, red.location = status, "/final"
        result = await deliver()
        assert result.ok, result.error
        (m1, p1, _, body1), (m2, p2, headers2, body2) = red.requests
        assert (m1, p1, m2, p2) == ("POST", "/hook", "POST", "/final") and body1 == body2
        assert headers2[SIGNATURE_HEADER] == signature("s3cret", body2)
    # A loop within the origin ends, and says so.
    red.status, red.location = 308, "/again"
    result = await deliver()
    assert not result.ok and "redirects" in (result.error or "")
    [status_row] = AlertSender([sink(name="ops", kind="webhook", url=base)], store).statuses()
    assert status_row["last_status"] == "failed"
