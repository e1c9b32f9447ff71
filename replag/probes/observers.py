"""Watching probe keys arrive on one replica: push (keyspace notifications) or poll (MGET).

Each observer fills `arrivals[key] = Arrival(...)`: the estimated moment the
replica applied the key, on this process's monotonic clock, with the bracket
[lo_ns, hi_ns] that surely contains it.

Push subscribes on a `RespConnection` of its own (`on_push`), which stamps each
event with the kernel's receive time (`replag.wire.stamped_socket`): a busy event
loop reading it late does not make it late. The replica publishes the event when it
applies the write and sends it at the end of that event-loop pass, as it does a PING's
reply, so the apply moment lies within the largest of a few PING round trips before
the arrival; the estimate subtracts half the smallest. Where that cannot be trusted
the bar says so: a read without a kernel stamp is bracketed from the previous read
(`stamp` "loop"), and where this prober waited for a CPU around the arrival, the
replica may have waited as long between applying and sending, so the bar's early
end reaches back by that wait (`replag.probes.cpu_wait`, `stamp` "widened").

Poll sends one MGET of every outstanding key per tick; a key was applied after
the last round that missed it was evaluated and before the round that found it: a
bracket that holds whatever the host does (sent before, answered after). For
POLL_BURST_S after each write the rounds go back to back (the next sent as soon as
one is answered), then every `poll_interval`: a lag well under the interval (a local
Dynomite rack's, 0.15-0.35 ms) is bracketed by a round trip instead of by the
interval, whose quarter the estimate otherwise carried (`benchmarks/dynomite_poll.py`
measures both against a reference poller, with the MGETs and server CPU they cost).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from replag.background import cancel_and_wait
from replag.errors import EndpointError, PermissionRefused, ReplagError
from replag.probes.cpu_wait import CpuWait, local_server
from replag.topology import Endpoint
from replag.wire.reply_bounds import probe_values
from replag.wire.resp import RespConnection, error_text
from replag.wire.stamped_socket import ReadStamp

# A chunk read within this of its last packet's arrival was read by a reader that was
# not behind: an idle event loop wakes and reads in 0.05-0.3 ms, and one that fell
# behind by a write interval (5 ms at 200 probes/s) reads far later.
PROMPT_READ_NS = 1_000_000


# The least an event's trip from the replica is bounded by, whatever the PINGs said: a
# few back-to-back PINGs at the start of a run see an idle path, while an event can wait
# for the replica to be scheduled again on a shared host (measured against MONITOR on
# both servers, `benchmarks/probe_accuracy.py`: with the largest PING alone, 0.013-0.041
# ms, events came up to 0.05 ms later than it allowed; with this floor, 5 in 9000 still
# did, by at most 0.031 ms, and one by 0.8 ms in a stall of the whole host).
ONE_WAY_FLOOR_NS = 100_000


@dataclass(frozen=True, slots=True)
class Arrival:
    estimate_ns: int
    lo_ns: int
    hi_ns: int
    # Read in one chunk with later events and so only bracketed: TCP merges packets
    # queued unread, and the chunk's stamp is its last packet's (`hi_ns`).
    merged: bool = False
    # Merged, but read at once after the chunk's last packet arrived (`PROMPT_READ_NS`):
    # the reader was not behind, so the chunk's events arrived together
    # (a late packet held back the ones behind it) and the estimate is the chunk's own
    # arrival, not a chunk-mate's lag (`within_chunks`).
    prompt: bool = False
    # The arrival is the kernel's receive timestamp of the bytes (False: the moment they
    # were read, and the bracket reaches back to the read before).
    kernel: bool = True
    # How far the bracket's early end was moved back by this host's wait for a CPU around
    # the arrival (`replag.probes.cpu_wait`): the replica may have waited as long.
    widened_ns: int = 0

    @property
    def stamp(self) -> str:
        """How the arrival was stamped: "widened" (the bar moved back by the host's
        measured wait), "chunk-placed" (read with later events: bracketed, placed by
        `within_chunks`), "kernel" (the kernel's receive stamp), or "loop" (when read)."""
        if self.widened_ns:
            return "widened"
        if self.merged:
            return "chunk-placed"
        return "kernel" if self.kernel else "loop"

    @property
    def half_width_ns(self) -> int:
        return (self.hi_ns - self.lo_ns) // 2

    @property
    def error_bound_ns(self) -> int:
        """How far the true arrival can lie from the estimate: to the bracket's farther
        end (its half width where the estimate is the middle; more where the estimate was
        placed elsewhere in it, as `within_chunks` does)."""
        return max(self.estimate_ns - self.lo_ns, self.hi_ns - self.estimate_ns)


class Observer:
    """Base: what the runner needs from either mode."""

    mode = "none"

    def __init__(self, replica: Endpoint) -> None:
        self.replica = replica
        self.arrivals: dict[bytes, Arrival] = {}
        self.error: str | None = None
        # The replica refused reads with LOADING (it is loading its dataset): not an
        # error, it applies the keys once loaded; the run keeps its samples out.
        self.loading = False

    def expect(self, key: bytes, written_lo_ns: int) -> None:
        """A write of `key` was sent at `written_lo_ns`."""

    def sending(self, key: bytes, lo_ns: int) -> None:
        """A write of `key` is about to be sent (not before `lo_ns`): `expect` follows once
        it is acknowledged, `withdraw` if it fails."""

    def withdraw(self, key: bytes) -> None:
        """The write `sending` announced failed: `key` is not expected."""

    def seen(self) -> int:
        """How many probe keys it has seen so far (what a progress line counts)."""
        return len(self.arrivals)

    def settle(self) -> None:
        """Bring the arrivals so far to their final bars (push widens them; see there)."""

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError


class PushObserver(Observer):
    mode = "push"

    def __init__(
        self,
        replica: Endpoint,
        *,
        pattern: bytes,
        rtt_ns: int,
        timeout_s: float,
        subscribe: bytes | None = None,
        rtt_max_ns: int | None = None,
        replica_pid: int | None = None,
    ) -> None:
        """`pattern`: the run's keys (a glob ending in *); `subscribe`: the key glob
        subscribed to, the probe prefix's (fixed, so an ACL user can be granted exactly
        that channel pattern: Redis compares PSUBSCRIBE patterns with ACL ones literally).
        `rtt_ns` is the smallest PING round trip to the replica, `rtt_max_ns` the largest
        seen (default the smallest): an event's trip from the replica to us is taken as half
        the first and bounded by the second (or `ONE_WAY_FLOOR_NS`, whichever is more).
        `replica_pid`: the server's process id (`INFO server`), to read how long it waited
        for a CPU where it runs on this host (`replag.probes.cpu_wait`)."""
        super().__init__(replica)
        self.channel_prefix = f"__keyspace@{replica.db}__:".encode()
        self.pattern = self.channel_prefix + (subscribe or pattern)
        self.keys_prefix = pattern.rstrip(b"*")  # other runs' keys publish here too
        self.rtt_ns = rtt_ns
        self.rtt_max_ns = max(rtt_ns, rtt_max_ns or 0, ONE_WAY_FLOOR_NS)
        # The connection's clock, read when an event is handled (while its chunk is read).
        self.clock: Callable[[], int] = time.monotonic_ns
        self.timeout_s = timeout_s
        self.conn: RespConnection | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._stopping = False
        local = local_server(replica_pid, replica.port) if replica_pid else None
        self.cpu_wait = CpuWait(local)
        self._settled: set[bytes] = set()
        self._tls_chunk = self._tls_since = self.clock()

    def expect(self, key: bytes, written_lo_ns: int) -> None:
        # Each write is a moment to sample the host's CPU stall too (`settle`).
        self.cpu_wait.note(self.clock())

    def on_message(self, message: list[Any], arrived_ns: int, earliest_ns: int) -> None:
        """A pushed `pmessage pattern channel event`; only `set` events mark an arrival."""
        if len(message) == 4 and message[0] == b"pmessage" and message[3] == b"set":
            read = self.conn.last_read if self.conn is not None else None
            if read is None and self.conn is not None and not self.conn.kernel_stamps:
                # TLS (asyncio reads it): stamped when read; the socket was emptied by the
                # read before, whose bytes reached us when that one was handed over.
                if arrived_ns != self._tls_chunk:
                    self._tls_since, self._tls_chunk = self._tls_chunk, arrived_ns
                read = ReadStamp(arrived_ns, self._tls_since, kernel=False)
            self.on_event(message[2], arrived_ns, earliest_ns, read)

    def on_event(
        self, channel: bytes, arrived_ns: int, earliest_ns: int, read: ReadStamp | None = None
    ) -> None:
        """The event reached us at `arrived_ns`, or between `earliest_ns` and then when it
        was read together with later events (see `replag.wire.stamped_socket`). `read`: how
        its read was stamped (None: by the kernel, read now)."""
        now = self.clock()
        self.cpu_wait.note(now)
        key = channel[len(self.channel_prefix) :]
        if key in self.arrivals or not key.startswith(self.keys_prefix):
            return
        if read is not None and not read.kernel:
            # Stamped when read: it arrived after the read before began, and by this one.
            self.arrivals[key] = Arrival(
                estimate_ns=arrived_ns - self.rtt_ns // 2,
                lo_ns=min(read.since, arrived_ns) - self.rtt_max_ns,
                hi_ns=arrived_ns,
                kernel=False,
            )
            return
        slack = read.error_ns if read is not None else 0
        earliest = min(earliest_ns, arrived_ns)
        merged = earliest < arrived_ns
        # Called while the chunk is read, so `now` is about when it was read.
        prompt = merged and now - arrived_ns <= PROMPT_READ_NS
        middle = arrived_ns if prompt else (earliest + arrived_ns) // 2
        # The replica published when it applied the write, a one-way trip before the
        # event reached us: likeliest half the smallest round trip, at most the largest
        # (the event waits for the end of the replica's event-loop pass, as a PING's
        # reply does, and a pass can be slow).
        self.arrivals[key] = Arrival(
            estimate_ns=middle - self.rtt_ns // 2,
            lo_ns=earliest - self.rtt_max_ns - slack,
            hi_ns=arrived_ns + slack,
            merged=merged,
            prompt=prompt,
        )

    def settle(self) -> None:
        """Widen every arrival's early end by how long processes on this host waited for a
        CPU around it (`replag.probes.cpu_wait`): the replica may have waited as long
        between applying and sending (once each: `stop` settles, an agent before it reports)."""
        for key, arrival in self.arrivals.items():
            if key in self._settled:
                continue
            # The replica's own wait where it runs here (a bound); else this prober's.
            wait = self.cpu_wait.replica_waited(arrival.lo_ns, arrival.hi_ns)
            if wait is None:
                wait = self.cpu_wait.around(arrival.hi_ns)
            if wait:
                self.arrivals[key] = dataclasses.replace(
                    arrival, lo_ns=arrival.lo_ns - wait, widened_ns=wait
                )
            self._settled.add(key)

    async def start(self) -> None:
        """Subscribe (once: the runner starts every observer, push ones already are).

        Raises an EndpointError naming the replica, "push subscription failed: …"."""
        if self.conn is not None:
            return
        try:
            self.conn = await RespConnection.open(
                self.replica,
                timeout_s=self.timeout_s,
                clock=self.clock,
                on_push=self.on_message,
            )
            reply = await self.conn.checked(b"PSUBSCRIBE", self.pattern)
            if not (isinstance(reply, list) and reply and reply[0] == b"psubscribe"):
                where = f"{self.replica.name} ({self.replica.url()})"
                raise EndpointError(f"PSUBSCRIBE refused: {reply!r}", where=where)
        except ReplagError as exc:
            await self.stop()
            raise type(exc)(f"push subscription failed: {exc.message}", where=exc.where) from exc
        except BaseException:
            await self.stop()
            raise
        self._watcher = asyncio.get_running_loop().create_task(self._watch_close(self.conn))

    async def _watch_close(self, conn: RespConnection) -> None:
        exc = await conn.wait_closed()
        if not self._stopping:
            self.error = f"push connection closed: {exc or 'by the server'}"

    async def stop(self) -> None:
        self._stopping = True
        if self.conn is not None:
            await self.conn.close()
        self.cpu_wait.note(self.clock())
        self.settle()
        self.cpu_wait.close()
        if self._watcher is not None:
            await cancel_and_wait(self._watcher)
            self._watcher = None


# How long after each probe write the poll's rounds go back to back (see the module
# docstring): at most this much of back-to-back MGETs per write, then the interval.
POLL_BURST_S = 0.001


class PollObserver(Observer):
    mode = "poll"

    def __init__(
        self,
        replica: Endpoint,
        conn: RespConnection,
        *,
        interval_s: float,
        burst_s: float | None = None,
    ) -> None:
        super().__init__(replica)
        self.conn = conn
        self.interval_s = interval_s
        self.burst_ns = int((POLL_BURST_S if burst_s is None else burst_s) * 1e9)
        self._newest_write_ns: int | None = None  # the latest key's written_lo_ns
        self._answered_ns = 0  # when the last round was answered (the connection's clock)
        self._wake = asyncio.Event()
        # key -> (lo_ns, lo_mid_ns): the latest moment the key was surely not applied yet.
        self._outstanding: dict[bytes, tuple[int, int]] = {}
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.rounds = 0

    def sending(self, key: bytes, lo_ns: int) -> None:
        """With the burst on, the poll starts with the write, not after its acknowledgement:
        a round that misses the key while the write is in flight brings the bracket's low
        end past the send."""
        if self.burst_ns:
            self.expect(key, lo_ns)

    def withdraw(self, key: bytes) -> None:
        self._outstanding.pop(key, None)
        self.arrivals.pop(key, None)

    def expect(self, key: bytes, written_lo_ns: int) -> None:
        if key in self.arrivals:
            return  # found while its write was in flight (`sending`)
        known = self._outstanding.get(key)
        if known is None or known[0] < written_lo_ns:
            self._outstanding[key] = (written_lo_ns, written_lo_ns)
        if self._newest_write_ns is None or written_lo_ns > self._newest_write_ns:
            self._newest_write_ns = written_lo_ns
        if self.burst_ns:
            self._wake.set()  # a round now, not at the end of the interval's sleep

    def _bursting(self) -> bool:
        """Keys outstanding, the newest written within burst_s of the last answer."""
        newest = self._newest_write_ns
        return (
            bool(self._outstanding)
            and newest is not None
            and self._answered_ns - newest < self.burst_ns
        )

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            started = loop.time()
            keys = list(self._outstanding)
            if keys:
                try:
                    # Probe values only: a replica answering hundreds of MB is refused.
                    bound = probe_values(len(keys), self.conn.endpoint.limits)
                    values, t_a, t_b = await self.conn.call("MGET", *keys, within=bound)
                except ReplagError as exc:
                    self.error = f"poll failed: {exc.message}"
                    return
                text = error_text(values)
                if text is not None and text.startswith("LOADING"):
                    self.loading = True  # nothing read this round; asked again next
                elif text is not None:
                    self.error = f"poll failed: {values}"
                    return
                else:
                    read = self.conn.last_read
                    kernel = read.kernel if read is not None else False
                    self._record(keys, values, t_a, t_b, kernel=kernel)
                self._answered_ns = t_b
            delay = 0.0 if self._bursting() else self.interval_s - (loop.time() - started)
            if delay <= 0:
                await asyncio.sleep(0)
                continue
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()

    def _record(
        self, keys: list[bytes], values: list[Any], t_a: int, t_b: int, *, kernel: bool = True
    ) -> None:
        """One MGET round's answer: a key found arrived since the last round that missed it.
        `kernel`: the answer's arrival `t_b` is the kernel's stamp (else when it was read:
        later, so the bracket still holds)."""
        self.rounds += 1
        mid = (t_a + t_b) // 2
        for key, value in zip(keys, values, strict=True):
            if key not in self._outstanding:
                continue  # withdrawn (its write failed) while this round was asked
            if value is None:
                self._outstanding[key] = (t_a, mid)
            else:
                lo, lo_mid = self._outstanding.pop(key)
                self.arrivals[key] = Arrival(
                    estimate_ns=(lo_mid + mid) // 2, lo_ns=lo, hi_ns=t_b, kernel=kernel
                )

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            await cancel_and_wait(self._task)


class LearningObserver(Observer):
    """Push where the replica turns out to publish, else poll: whether it does is learned
    from the run's own keys, never from CONFIG GET (which reads the server's passwords
    too). Both watch until one decides: the first keyspace event of a run key makes it
    push (the poll stops); a key the poll found whose event has not come `grace_s`
    later makes it poll (notifications off there; the subscription ends). With `insist`
    (--mode push) a replica found not publishing is an error instead."""

    def __init__(
        self,
        push: PushObserver,
        poll: PollObserver,
        notes: list[str],
        *,
        insist: bool = False,
        grace_s: float = 1.0,
    ) -> None:
        super().__init__(push.replica)
        self.push, self.poll, self.notes = push, poll, notes
        self.insist = insist
        self.grace_s = max(grace_s, 2 * poll.interval_s)
        self.mode = "poll"  # what the arrivals come from once decided ("push" or "poll")
        self.decided = False
        self._task: asyncio.Task[None] | None = None

    def expect(self, key: bytes, written_lo_ns: int) -> None:
        self.push.expect(key, written_lo_ns)
        self.poll.expect(key, written_lo_ns)

    def sending(self, key: bytes, lo_ns: int) -> None:
        self.poll.sending(key, lo_ns)

    def withdraw(self, key: bytes) -> None:
        self.poll.withdraw(key)

    def settle(self) -> None:
        if self.mode == "push":
            self.push.settle()  # the arrivals are the push observer's own

    def seen(self) -> int:
        # Before it decides (events or polls), its arrivals are empty: what either has seen.
        if self.decided:
            return len(self.arrivals)
        return max(len(self.push.arrivals), len(self.poll.arrivals))

    async def start(self) -> None:
        if self._task is None:
            await self.push.start()
            await self.poll.start()
            self._task = asyncio.create_task(self._learn())

    async def _learn(self) -> None:
        loop = asyncio.get_running_loop()
        found_at: float | None = None
        while not self.decided:
            await asyncio.sleep(min(self.poll.interval_s, 0.05))
            if self.push.arrivals:
                self.decided, self.mode, self.arrivals = True, "push", self.push.arrivals
                await self.poll.stop()
            elif self.poll.arrivals and found_at is None:
                found_at = loop.time()
            elif found_at is not None and loop.time() - found_at >= self.grace_s:
                await self._not_publishing()
            self.loading = self.poll.loading
            if self.poll.error is not None and not self.decided:
                self.error = self.poll.error
                return
        chosen: Observer = self.push if self.mode == "push" else self.poll
        while self.error is None:  # errors of the observer kept (a push connection lost)
            self.error = chosen.error
            self.loading = self.loading or chosen.loading
            await asyncio.sleep(0.05)

    async def _not_publishing(self) -> None:
        self.decided = True
        await self.push.stop()
        said = (
            f"no keyspace event for a probe key the poll found {self.grace_s:g} s earlier: "
            "notifications are off there (or cover no `set`)"
        )
        if self.insist:
            self.error = f"push mode: {said} (use --mode auto or poll)"
            await self.poll.stop()
            return
        self.mode, self.arrivals = "poll", self.poll.arrivals
        self.notes.append(
            f"{self.replica.name}: {said}; polled (turn on K$ there, or set "
            "allow_config_changes = true to let replag do it; declare them in "
            "settings.notify_keyspace_events to decide up front)"
        )

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        if not self.decided and (self.push.arrivals or not self.insist):
            # The run ended before a decision (a short --timeout): what either saw is
            # still an observation; the events win where there are any.
            self.decided = True
            self.mode = "push" if self.push.arrivals else "poll"
            self.arrivals = self.push.arrivals or self.poll.arrivals
        await self.push.stop()
        await self.poll.stop()


async def open_observer(
    replica: Endpoint,
    conn: RespConnection,
    *,
    pattern: bytes,
    mode: str,
    poll_interval_s: float,
    timeout_s: float,
    notes: list[str],
    subscribe: bytes | None = None,
    may_configure: bool = False,
    declared: str | None = None,
) -> Observer:
    """Push where `mode` allows it and the replica publishes, else poll on `conn`.

    Whether it publishes is `declared` (settings.notify_keyspace_events), read and
    turned on where `may_configure` (settings.allow_config_changes: CONFIG GET and
    SET), else learned during the run (`LearningObserver`). The push observer is
    started (subscribed to `subscribe`, default `pattern`); a poll observer starts
    with the run. What was decided and why goes to `notes`. EndpointError when `mode`
    is push and the replica is known not to publish (--mode push insists rather than
    quietly polling); in auto mode a refused subscription (an ACL user without the
    channel) polls, as refused notifications do.
    """
    rtt, rtt_max = await conn.rtt_range_ns()
    # Not through a Dynomite port: it closes the connection on commands it does not proxy.
    pid = await server_pid(conn) if replica.kind == "redis" else None
    publishes = await notifications_on(
        conn, replica, mode, notes, may_configure=may_configure, declared=declared
    )
    if publishes is not False:
        push = PushObserver(
            replica,
            pattern=pattern,
            rtt_ns=rtt,
            rtt_max_ns=rtt_max,
            timeout_s=timeout_s,
            subscribe=subscribe,
            replica_pid=pid,
        )
        try:
            await push.start()
        except PermissionRefused as exc:
            if mode == "push":
                raise
            notes.append(f"{replica.name}: subscription refused ({exc.message}); polling")
        else:
            if publishes:
                return push
            poll = PollObserver(replica, conn, interval_s=poll_interval_s)
            return LearningObserver(push, poll, notes, insist=mode == "push")
    elif mode == "push":
        raise EndpointError(
            "push mode: keyspace notifications are off and cannot be turned on "
            "(use --mode auto or poll)",
            where=f"{replica.name} ({replica.url()})",
        )
    return PollObserver(replica, conn, interval_s=poll_interval_s)


async def server_pid(conn: RespConnection) -> int | None:
    """The server's process id (`INFO server`), None where INFO is refused or lacks it."""
    try:
        reply = (await conn.call("INFO", "server"))[0]
    except ReplagError:
        return None
    if not isinstance(reply, bytes):
        return None
    for line in reply.splitlines():
        if line.startswith(b"process_id:"):
            value = line.partition(b":")[2].strip()
            return int(value) if value.isdigit() else None
    return None


def publishes_probe_events(flags: str) -> bool:
    """Do `notify-keyspace-events` flags publish a probe key's `set` on its keyspace
    channel?"""
    return "K" in flags and ("$" in flags or "A" in flags)


async def notifications_on(
    conn: RespConnection,
    replica: Endpoint,
    mode: str,
    notes: list[str],
    *,
    may_configure: bool = False,
    declared: str | None = None,
) -> bool | None:
    """Whether the replica publishes probe keys' events: declared, or (only where
    `may_configure`, settings.allow_config_changes) read and turned on; None: not known
    (learned from the run's keys). False in poll mode.

    Once turned on they are left on: restoring them at the end of a run would cut
    off another probe (cron beside the service) still watching the same replica,
    and its keys would be counted lost. Publishing to a channel nobody subscribes
    to costs the server a dictionary lookup per write.
    """
    if mode == "poll":
        return False
    if declared is not None:
        if publishes_probe_events(declared):
            return True
        notes.append(
            f"{replica.name}: keyspace notifications declared {declared!r} "
            "(settings.notify_keyspace_events): no `set` events; polling"
        )
        return False
    if not may_configure:
        return None
    answer = (await conn.call("CONFIG", "GET", "notify-keyspace-events"))[0]
    if error_text(answer) is not None or not isinstance(answer, list) or len(answer) < 2:
        notes.append(
            f"{replica.name}: cannot read notify-keyspace-events ({answer}); learned from "
            "the run's keys"
        )
        return None
    flags = answer[1].decode()
    if publishes_probe_events(flags):
        return True
    reply = (await conn.call("CONFIG", "SET", "notify-keyspace-events", flags + "K$"))[0]
    if error_text(reply) is not None:
        notes.append(
            f"{replica.name}: keyspace notifications off and cannot be turned on ({reply}); polling"
        )
        return False
    notes.append(
        f"{replica.name}: keyspace notifications turned on (notify-keyspace-events "
        f"{flags!r} → {flags + 'K$'!r}) for push observation; left on"
    )
    return True
