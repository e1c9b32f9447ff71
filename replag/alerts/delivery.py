"""Delivering alert events to sinks: HTTP over aiohttp or a local command, with retries.

An `alertmanager` sink posts to every Alertmanager of its cluster at once, as
Prometheus does (each keeps the alerts, they dedup by labels); a delivery succeeds
when one of them took it. Alerts still firing are posted to it again every
`resend`, with an `endsAt` a few resends ahead, so Alertmanager keeps
them active while replag runs and lets them lapse if it stops.

Each attempt that fails with a connection error, a timeout, HTTP 429 or 5xx
(or a command that fails or times out) is retried after an exponential
backoff with jitter. Failures are logged, counted and stored per sink
(`/api/v1/alerts` shows them); they never propagate to the caller. A redirect is
followed only within the sink's own origin and only when it keeps the POST (307,
308); any other is a failed delivery that says where it pointed. In the
service every sink has its own queue and worker task, so a slow sink delays
neither the other sinks nor probing.

Where several instances share the store, a notification is sent only while the
sender's `Fence` (its lease on alert evaluation) is valid, checked before each
request, and, with an outbox (`AlertBook`), each request's rows are claimed in
the store under that lease right before it is made (`AlertBook.claim_outbox`):
one adopted by another owner meanwhile is not sent here. A batch every sink took
(or gave up on) is marked delivered in the outbox at once. One the fence stopped
stays undelivered, for the next owner to send once its claim ran out: delivery is
at least once, and a notification is sent twice only by an owner that sent it and
died (or stalled past its claim) before marking it; both copies carry the same
`notificationId` (the alert's fingerprint and when it was decided). The sender
knows which events it holds (queued, in flight, or sent but not yet marked because
the store was busy), so an owner never adopts from the outbox, and sends again, a
notification it is still sending or has sent.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import logging
import math
import random
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
from yarl import URL

from replag.alerts import payloads
from replag.alerts.config import AlertSink
from replag.alerts.state import AlertBook, AlertEvent
from replag.errors import LeaseLost, StoreError
from replag.store import Row, Store, Transaction

log = logging.getLogger(__name__)

_QUEUE_SIZE = 1000
MAX_REDIRECTS = 3  # same-origin 307/308 only (`redirect_target`)
# An outbox row is claimed for a request's timeout plus this: time to mark it delivered
# after the answer, before another owner may adopt it.
CLAIM_MARGIN_S = 5.0


class Fence(Protocol):
    """A lease as the sender sees it (`replag.service.leasing.Fence`)."""

    @property
    def epoch(self) -> int: ...

    def valid(self) -> bool: ...

    def guard(self, tx: Transaction) -> None: ...


class FenceLost(Exception):
    """The sender's lease ended before a request, or another owner adopted the rows: the
    notification stays in the outbox (for the owner of the lease)."""


@dataclass(eq=False)
class _Batch:
    """Events queued for every sink; `remaining` sinks still to finish with it."""

    events: Sequence[AlertEvent]
    fence: Fence | None
    remaining: int
    abandoned: bool = False  # a sink's fence check failed: left to the outbox


class DeliveryFailed(Exception):
    """One attempt failed; `retry` says whether another attempt may succeed."""

    def __init__(self, message: str, *, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


@dataclass(frozen=True, kw_only=True)
class DeliveryResult:
    sink: str
    ok: bool
    attempts: int
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"sink": self.sink, "ok": self.ok, "attempts": self.attempts, "error": self.error}


class AlertSender:
    """Owns the HTTP session and the per-sink workers; `close()` ends both."""

    def __init__(
        self,
        sinks: Sequence[AlertSink],
        store: Store,
        *,
        external_url: str = "",
        on_result: Callable[[DeliveryResult], None] | None = None,
        on_delivered: Callable[[Sequence[AlertEvent]], bool] | None = None,
        outbox: AlertBook | None = None,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.sinks = tuple(sinks)
        self.store = store
        # Where the submitted events' rows are claimed before each request (the service).
        self.outbox = outbox
        self.external_url = external_url
        self._on_result = on_result
        self._on_delivered = on_delivered
        self._rng = rng
        self._session: aiohttp.ClientSession | None = None
        self._queues: dict[str, asyncio.Queue[_Batch]] = {}
        self._workers: list[asyncio.Task[None]] = []
        # (fingerprint, decided_ns) of each event queued, in flight, or sent and not yet
        # marked delivered; `unmarked` are those sent, waiting for the store.
        self._holding: set[tuple[str, int]] = set()
        self._unmarked: list[AlertEvent] = []
        # alertmanager sinks: when each last posted its firing alerts again, the resends
        # under way, and the TLS context of each sink that has one.
        self._resent_s: dict[str, float] = {}
        self._resends: set[asyncio.Task[list[DeliveryResult]]] = set()
        self._ssl: dict[tuple[str | None, ...], ssl.SSLContext] = {}
        # An alert's endsAt is at least this far ahead (4 evaluation intervals: the
        # service sets it), so one is not let lapse between two evaluations.
        self.min_valid_s = 0.0

    @property
    def claim_s(self) -> float:
        """How long a request's outbox rows stay this sender's: the longest sink timeout
        plus the time to mark them delivered."""
        return max((s.timeout_s for s in self.sinks), default=0.0) + CLAIM_MARGIN_S

    def holds(self, event: AlertEvent) -> bool:
        """Whether this sender still has `event` (queued, sending, or sent and not yet
        marked delivered): the outbox's copy is not an orphan."""
        return _key(event) in self._holding

    def retry_marks(self) -> None:
        """Mark delivered what was sent while the store could not take the mark."""
        if self._unmarked and self._on_delivered is not None:
            sent, self._unmarked = self._unmarked, []
            self._finish(sent)

    async def deliver(self, events: Sequence[AlertEvent]) -> list[DeliveryResult]:
        """Send `events` to every sink concurrently and wait for the outcomes."""
        if not events:
            return []
        results = await asyncio.gather(*(self._deliver(s, events) for s in self.sinks))
        for sink, result in zip(self.sinks, results, strict=True):
            self._record(sink, result)
        return list(results)

    def submit(self, events: Sequence[AlertEvent], *, fence: Fence | None = None) -> None:
        """Queue `events` for every sink and return at once (the service's path); sent
        only while `fence` is valid."""
        if not events:
            return
        batch = _Batch(events, fence, len(self.sinks))
        self._holding.update(_key(e) for e in events)
        for sink in self.sinks:
            queue = self._queues.get(sink.name)
            if queue is None:
                queue = self._queues[sink.name] = asyncio.Queue(_QUEUE_SIZE)
                self._workers.append(
                    asyncio.create_task(self._work(sink, queue), name=f"alert-sink-{sink.name}")
                )
            try:
                queue.put_nowait(batch)
            except asyncio.QueueFull:
                self._finished(batch)
                log.error(
                    "alert sink %s: %d notifications queued, dropping this one",
                    sink.name,
                    _QUEUE_SIZE,
                )
                self._record(
                    sink,
                    DeliveryResult(
                        sink=sink.name,
                        ok=False,
                        attempts=0,
                        error="queue full: notification dropped",
                    ),
                )

    async def resend(
        self,
        firing: Sequence[AlertEvent],
        *,
        fence: Fence | None = None,
        now_s: float | None = None,
    ) -> list[DeliveryResult]:
        """Post `firing` (every alert firing now) again to each alertmanager sink whose
        `resend` interval has passed, and wait for the outcomes. Not a notification: the
        outbox is not involved, and nothing is sent once `fence` is no longer valid."""
        now_s = time.monotonic() if now_s is None else now_s
        due = [
            s
            for s in self.sinks
            if s.kind == "alertmanager"
            and now_s - self._resent_s.get(s.name, -math.inf) >= s.resend_s
        ]
        if not firing or not due:
            return []
        for sink in due:
            self._resent_s[sink.name] = now_s
        results = await asyncio.gather(
            *(self._deliver(s, firing, fence=fence) for s in due), return_exceptions=True
        )
        for sink, result in zip(due, results, strict=True):
            if isinstance(result, DeliveryResult):
                self._record(sink, result)
        return [r for r in results if isinstance(r, DeliveryResult)]

    def resend_soon(self, firing: Sequence[AlertEvent], *, fence: Fence | None = None) -> None:
        """`resend` in a task of its own (the service's path: evaluation does not wait)."""
        if not firing or not any(s.kind == "alertmanager" for s in self.sinks):
            return
        task = asyncio.create_task(self.resend(firing, fence=fence), name="alert-resend")
        self._resends.add(task)
        task.add_done_callback(self._resends.discard)

    async def close(self) -> None:
        for task in (*self._workers, *self._resends):
            task.cancel()
        await asyncio.gather(*self._workers, *self._resends, return_exceptions=True)
        self._workers.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def statuses(self) -> list[dict[str, Any]]:
        rows = {
            r.sink: r
            for r in self.store.execute(
                "SELECT sink, kind, last_attempt_ns, last_ok_ns, last_status, last_error, "
                "delivered, failed FROM alert_deliveries",
                last_known=True,
            )
        }
        return [delivery_status(sink, rows.get(sink.name)) for sink in self.sinks]

    # --- one sink ------------------------------------------------------------

    async def _work(self, sink: AlertSink, queue: asyncio.Queue[_Batch]) -> None:
        while True:
            batch = await queue.get()
            if batch.abandoned:
                continue
            try:
                result = await self._deliver(sink, batch.events, fence=batch.fence, claim=True)
            except FenceLost as exc:
                log.warning(
                    "alert sink %s: %d notifications not sent: %s (the owner of alert "
                    "evaluation sends them)",
                    sink.name,
                    len(batch.events),
                    exc,
                )
                # Every sink leaves it to the outbox: the owner of the lease (maybe this
                # instance again) adopts it, once.
                batch.abandoned = True
                self._holding.difference_update(_key(e) for e in batch.events)
                continue
            # Marked delivered first: the shorter the time between the answer and the
            # mark, the smaller the window where a crash makes the next owner send again.
            self._finished(batch)
            self._record(sink, result)

    def _finished(self, batch: _Batch) -> None:
        batch.remaining -= 1
        if batch.remaining == 0 and not batch.abandoned:
            self._finish(batch.events)

    def _finish(self, events: Sequence[AlertEvent]) -> None:
        """Every sink took `events` (or gave up): marked delivered, then let go; kept
        (and marked at the next `retry_marks`) while the store cannot take the mark."""
        if self._on_delivered is not None and not self._on_delivered(events):
            self._unmarked.extend(events)
            return
        self._holding.difference_update(_key(e) for e in events)

    async def _deliver(
        self,
        sink: AlertSink,
        events: Sequence[AlertEvent],
        *,
        fence: Fence | None = None,
        claim: bool = False,
    ) -> DeliveryResult:
        """Send `events` to `sink`, retrying; with `claim` (a submitted batch), each
        request only after its outbox rows were claimed (`_claim`). The caller records
        the result."""
        attempts, error = 0, None
        for attempt in range(sink.retries + 1):
            attempts += 1
            try:
                sent = 0
                for part in _parts(sink, events):
                    if fence is not None and not fence.valid():
                        raise FenceLost("this instance no longer owns alert evaluation")
                    if claim:
                        part = await self._claim(part, fence)
                        if not part:
                            continue
                    await self._request(sink, part)()
                    sent += 1
                if claim and not sent:
                    raise FenceLost("another owner adopted them, or they were delivered")
                error = None
                break
            except DeliveryFailed as exc:
                error = _redact(str(exc), sink)
                if not exc.retry or attempt == sink.retries:
                    break
                delay = min(sink.max_backoff_s, sink.backoff_s * 2**attempt) * (0.5 + self._rng())
                log.warning(
                    "alert sink %s: %s; %d tries left, next in %.2f s",
                    sink.name,
                    error,
                    sink.retries - attempt,
                    delay,
                )
                await asyncio.sleep(delay)
        result = DeliveryResult(sink=sink.name, ok=error is None, attempts=attempts, error=error)
        if error:
            log.error("alert sink %s: giving up after %d attempts: %s", sink.name, attempts, error)
        return result

    async def _claim(
        self, events: Sequence[AlertEvent], fence: Fence | None
    ) -> Sequence[AlertEvent]:
        """The events of `events` this sender may send now: their outbox rows claimed
        under its lease (see `AlertBook.claim_outbox`). FenceLost if the lease is gone."""
        if self.outbox is None:
            return events
        try:
            return await asyncio.to_thread(
                self.outbox.claim_outbox,
                events,
                epoch=0 if fence is None else fence.epoch,
                claim_s=self.claim_s,
                guard=None if fence is None else fence.guard,
            )
        except LeaseLost as exc:
            raise FenceLost(str(exc)) from None
        except StoreError as exc:
            # The store cannot answer: nobody can take the lease, nor adopt, while it is
            # away, so the fence (which says whether it was surely held then) decides.
            if fence is not None and not fence.valid():
                raise FenceLost(f"its lease cannot be confirmed ({exc})") from None
            log.debug("alert outbox: rows not claimed (%s); sending under the fence", exc)
            return events

    def _request(
        self, sink: AlertSink, events: Sequence[AlertEvent]
    ) -> Callable[[], Awaitable[None]]:
        """The call that sends `events` (one of `_parts`) to `sink`."""
        if sink.kind == "pagerduty":
            assert sink.routing_key is not None  # checked by the config
            key = sink.routing_key
            [event] = events
            return functools.partial(self._post, sink, payloads.pagerduty(event, routing_key=key))
        if sink.kind == "slack":
            return lambda: self._post(sink, payloads.slack(events))
        if sink.kind == "alertmanager":
            return lambda: self._post_alertmanagers(sink, events)
        body = payloads.alertmanager(events, receiver=sink.name, external_url=self.external_url)
        if sink.kind == "command":
            return lambda: _run_command(sink, body)
        return lambda: self._post(sink, body)

    async def _post_alertmanagers(self, sink: AlertSink, events: Sequence[AlertEvent]) -> None:
        """Every Alertmanager of the sink at once; fails only when none took the alerts."""
        body = payloads.alertmanager_api(
            events,
            labels=sink.labels,
            external_url=self.external_url,
            now_ns=time.time_ns(),
            valid_s=max(4 * sink.resend_s, self.min_valid_s),
        )
        urls = [f"{u.rstrip('/')}/api/v2/alerts" for u in sink.urls]
        outcomes = await asyncio.gather(
            *(self._post(sink, body, url=u) for u in urls), return_exceptions=True
        )
        failed = [(u, o) for u, o in zip(urls, outcomes, strict=True) if o is not None]
        for _, outcome in failed:
            if not isinstance(outcome, DeliveryFailed):
                raise outcome
        if len(failed) == len(urls):
            raise DeliveryFailed(
                "; ".join(f"{_host(u)}: {o}" for u, o in failed),
                retry=any(isinstance(o, DeliveryFailed) and o.retry for _, o in failed),
            )
        for url, outcome in failed:
            log.warning(
                "alert sink %s: Alertmanager %s: %s (%d of %d took the alerts)",
                sink.name,
                _host(url),
                _redact(str(outcome), sink),
                len(urls) - len(failed),
                len(urls),
            )

    def _tls(self, sink: AlertSink) -> ssl.SSLContext | None:
        if not (sink.ca_file or sink.cert_file):
            return None
        # By file, not by sink name: a reloaded configuration may name other files.
        files = (sink.ca_file, sink.cert_file, sink.key_file)
        context = self._ssl.get(files)
        if context is None:
            try:
                context = ssl.create_default_context(cafile=sink.ca_file)
                if sink.cert_file:
                    context.load_cert_chain(sink.cert_file, sink.key_file)
            except (OSError, ssl.SSLError) as exc:
                raise DeliveryFailed(f"TLS files: {exc}", retry=False) from None
            self._ssl[files] = context
        return context

    async def _post(self, sink: AlertSink, body: Any, *, url: str | None = None) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "replag"}
        if sink.secret:
            headers[payloads.SIGNATURE_HEADER] = payloads.signature(sink.secret, data)
        if sink.bearer_token:
            headers["Authorization"] = f"Bearer {sink.bearer_token}"
        elif sink.basic_user:
            pair = f"{sink.basic_user}:{sink.basic_password or ''}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
        if self._session is None:
            self._session = aiohttp.ClientSession()
        assert (url or sink.url) is not None
        origin = URL(url or sink.url or "")
        target = origin
        try:
            async with asyncio.timeout(sink.timeout_s):
                for _ in range(MAX_REDIRECTS + 1):
                    # Redirects are never followed by aiohttp: one could carry the body and
                    # its signature to another host, or turn the POST into an empty GET.
                    async with self._session.post(
                        target,
                        data=data,
                        headers=headers,
                        allow_redirects=False,
                        ssl=self._tls(sink) or True,
                    ) as response:
                        if 300 <= response.status < 400:
                            target = redirect_target(origin, response)
                            continue
                        # The start of the answer only: a sink cannot make us hold its body.
                        head = await response.content.read(200)
                        text = head.decode("utf-8", "replace")
                        if response.status < 300:
                            return
                        raise DeliveryFailed(
                            f"HTTP {response.status}: {text}",
                            retry=response.status == 429 or response.status >= 500,
                        )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise DeliveryFailed(f"{type(exc).__name__}: {exc}", retry=True) from None
        raise DeliveryFailed(f"more than {MAX_REDIRECTS} redirects (last to {target})", retry=False)

    def _record(self, sink: AlertSink, result: DeliveryResult) -> None:
        now = time.time_ns()
        self.store.execute(
            """INSERT INTO alert_deliveries (sink, kind, last_attempt_ns, last_ok_ns,
                   last_status, last_error, delivered, failed) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
               ON CONFLICT (sink) DO UPDATE SET kind = excluded.kind,
                 last_attempt_ns = excluded.last_attempt_ns,
                 last_ok_ns = COALESCE(excluded.last_ok_ns, alert_deliveries.last_ok_ns),
                 last_status = excluded.last_status, last_error = excluded.last_error,
                 delivered = alert_deliveries.delivered + excluded.delivered,
                 failed = alert_deliveries.failed + excluded.failed""",
            (
                sink.name,
                sink.kind,
                now,
                now if result.ok else None,
                "ok" if result.ok else "failed",
                result.error,
                int(result.ok),
                int(not result.ok),
            ),
        )
        if self._on_result is not None:
            self._on_result(result)


async def _run_command(sink: AlertSink, body: dict[str, Any]) -> None:
    """Run the hook with the alert JSON on stdin; a non-zero exit or a timeout fails it."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *sink.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        raise DeliveryFailed(f"cannot run {sink.command[0]}: {exc}", retry=False) from None
    try:
        _, stderr = await asyncio.wait_for(
            proc.communicate(json.dumps(body).encode()), sink.timeout_s
        )
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise DeliveryFailed(
            f"{sink.command[0]} timed out after {sink.timeout_s:g} s", retry=True
        ) from None
    if proc.returncode != 0:
        tail = stderr.decode(errors="replace").strip()[-200:]
        raise DeliveryFailed(f"{sink.command[0]} exited {proc.returncode}: {tail}", retry=True)


def redirect_target(configured: URL, response: aiohttp.ClientResponse) -> URL:
    """Where a redirect of a webhook POST may be followed: only a 307 or 308 (which keep
    the method and body) to the configured URL's own origin (scheme, host, port). Any
    other redirect is a failed delivery that says where it pointed: the body and its
    signature never go to another origin, and a POST turned into a GET is not a delivery."""
    location = response.headers.get("Location", "")
    target = response.url.join(URL(location)) if location else None
    where = f"HTTP {response.status} redirect to {target or '(no Location)'}"
    if target is None:
        raise DeliveryFailed(f"{where}: not followed", retry=False)
    if target.origin() != configured.origin():
        raise DeliveryFailed(
            f"{where}: not followed (another origin than {configured.origin()}; "
            "alerts and their signature go only where the sink's url says)",
            retry=False,
        )
    if response.status not in (307, 308):
        raise DeliveryFailed(
            f"{where}: not followed (a {response.status} turns the POST into a GET; "
            "set the sink's url to where it points)",
            retry=False,
        )
    return target


def _parts(sink: AlertSink, events: Sequence[AlertEvent]) -> list[Sequence[AlertEvent]]:
    """The requests one delivery makes, by the events each carries (PagerDuty takes one
    event per request, the others a batch)."""
    if sink.kind == "pagerduty":
        return [[e] for e in events]
    return [events]


def _key(event: AlertEvent) -> tuple[str, int]:
    """An event's outbox row: its fingerprint and when it was decided."""
    return (event.fingerprint, event.decided_ns)


def _host(url: str) -> str:
    """scheme://host[:port] of `url`, without credentials."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def _redact(text: str, sink: AlertSink) -> str:
    for secret in sink.secrets:
        text = text.replace(secret, "***")
    return text


def delivery_status(sink: AlertSink, row: Row | None) -> dict[str, Any]:
    out = sink.to_dict()
    if row is None:
        return {
            **out,
            "last_status": "never",
            "last_attempt_ns": None,
            "last_ok_ns": None,
            "last_error": None,
            "delivered": 0,
            "failed": 0,
        }
    return {
        **out,
        "last_attempt_ns": row.last_attempt_ns,
        "last_ok_ns": row.last_ok_ns,
        "last_status": row.last_status,
        "last_error": row.last_error,
        "delivered": row.delivered,
        "failed": row.failed,
    }
