"""A user-space delay relay between a replica and its primary (the kernel here has no netem).

Each `Link` listens on a loopback port and forwards every connection to its
upstream, holding the bytes of each direction for that direction's one-way
delay (`delay_ms` upstream → client, `up_delay_ms` client → upstream, the same
unless set: WAN paths are often asymmetric), plus jitter (uniform, or a heavy
tail: `JITTER_SHAPES`), never reordering. Threads and `time.sleep` give
microsecond-accurate release times, which an asyncio loop (millisecond
epoll timeouts) would not. A link can be partitioned (connections cut, new
ones refused) and healed, and its delay changed, through a JSON-lines control
port. Downstream bytes carrying probe keys are logged with the monotonic
times they entered (the kernel's receive timestamp) and left the relay: the
ground truth benchmarks score probes against. CLOCK_MONOTONIC is
system-wide, so other processes on this machine can compare those times
with their own `time.monotonic_ns()`.
"""

from __future__ import annotations

import contextlib
import json
import queue
import random
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from replag.wire.stamped_socket import StampedReader

_CHUNK = 65536
JITTER_SHAPES = ("uniform", "pareto")
_PARETO_ALPHA, _PARETO_CAP = 1.5, 50.0


def jitter_draw(jitter_ms: float, shape: str) -> float:
    """One draw of a link's jitter (ms): uniform in ±jitter_ms, or for "pareto" a heavy
    tail, late only: jitter_ms × (Pareto(1.5) − 1) (median 0.59 ×, one in 100 draws past
    20 ×), capped at 50 × jitter_ms."""
    if not jitter_ms:
        return 0.0
    if shape == "pareto":
        return jitter_ms * min(random.paretovariate(_PARETO_ALPHA) - 1.0, _PARETO_CAP)
    return random.uniform(-jitter_ms, jitter_ms)


RELAY_START_S = 60.0


@dataclass
class Link:
    name: str
    listen_port: int
    upstream_port: int
    delay_ms: float = 0.0  # downstream: upstream → client
    jitter_ms: float = 0.0
    jitter_shape: str = "uniform"  # one of JITTER_SHAPES
    partitioned: bool = False
    up_delay_ms: float | None = None  # client → upstream; None: the same as delay_ms
    truth_path: Path | None = None  # probe keys going downstream
    truth_up_path: Path | None = None  # probe keys going upstream (e.g. writes to a primary)
    truth_prefix: bytes = b"replag:probe:"
    # Bytes forwarded each way (upstream → client, client → upstream): what crossed the
    # link, measured, for benchmarks that count WAN traffic.
    bytes_down: int = 0
    bytes_up: int = 0
    _pipes: list[_Pipe] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _truth: dict[Path, TextIO] = field(default_factory=dict, repr=False)

    def one_way_ns(self, *, downstream: bool = True) -> int:
        base = self.delay_ms if downstream or self.up_delay_ms is None else self.up_delay_ms
        return max(0, int((base + jitter_draw(self.jitter_ms, self.jitter_shape)) * 1e6))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "listen_port": self.listen_port,
            "upstream_port": self.upstream_port,
            "delay_ms": self.delay_ms,
            "up_delay_ms": self.delay_ms if self.up_delay_ms is None else self.up_delay_ms,
            "jitter_ms": self.jitter_ms,
            "jitter_shape": self.jitter_shape,
            "partitioned": self.partitioned,
            "connections": len(self._pipes) // 2,
            "bytes_down": self.bytes_down,
            "bytes_up": self.bytes_up,
        }

    def record(
        self,
        keys: list[bytes],
        t_in: int,
        t_out: int,
        *,
        downstream: bool = True,
        sent_after: int | None = None,
    ) -> None:
        """Log `keys` as in at `t_in`, out by `t_out` (and not before `sent_after`)."""
        path = self.truth_path if downstream else self.truth_up_path
        if path is None:
            return
        with self._lock:
            if path not in self._truth:
                self._truth[path] = open(path, "a", encoding="latin-1")  # noqa: SIM115
            out = self._truth[path]
            after = t_out if sent_after is None else sent_after
            for key in keys:
                out.write(f"{t_in} {t_out} {key.decode('latin-1')} {after}\n")
            out.flush()

    def cut(self) -> None:
        with self._lock:
            pipes, self._pipes = self._pipes, []
        for pipe in pipes:
            pipe.close()


class _Pipe:
    """One direction of one connection: a reader thread stamps, a writer thread releases."""

    def __init__(self, link: Link, src: socket.socket, dst: socket.socket, *, downstream: bool):
        self.link, self.src, self.dst, self.downstream = link, src, dst, downstream
        self.queue: queue.Queue[tuple[int, int, bytes] | None] = queue.Queue()
        self.closed = False
        self._keys = re.compile(re.escape(link.truth_prefix) + rb"[^\r\n]{0,200}(?=\r\n)")
        self._carry = b""

    def start(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._write, daemon=True).start()

    def _read(self) -> None:
        # Bytes are "in" when the kernel received them, not when this thread got to run:
        # on a busy host the difference is real lag the truth would otherwise leave out.
        reader = StampedReader(self.src, time.monotonic_ns)
        last_due = 0
        while True:
            try:
                data, t_in = reader.recv(_CHUNK)
            except OSError:
                data, t_in = b"", 0
            if not data:
                self.queue.put(None)
                return
            last_due = max(last_due, t_in + self.link.one_way_ns(downstream=self.downstream))
            self.queue.put((last_due, t_in, data))

    def _write(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                break
            due, t_in, data = item
            wait_ns = due - time.monotonic_ns()
            if wait_ns > 0:
                time.sleep(wait_ns / 1e9)
            # The bytes leave inside `sendall` (on loopback, the receiver has them when it
            # returns): [before, after] brackets that moment, however late this thread runs.
            before = time.monotonic_ns()
            try:
                self.dst.sendall(data)
            except OSError:
                break
            t_out = time.monotonic_ns()
            with self.link._lock:  # a link's connections forward from threads of their own
                if self.downstream:
                    self.link.bytes_down += len(data)
                else:
                    self.link.bytes_up += len(data)
            path = self.link.truth_path if self.downstream else self.link.truth_up_path
            if path is not None:
                self._note_keys(data, t_in, before, t_out)
        self.close()

    def _note_keys(self, data: bytes, t_in: int, before: int, t_out: int) -> None:
        buf = self._carry + data
        keys = [m.group(0) for m in self._keys.finditer(buf) if m.end() > len(self._carry)]
        self._carry = buf[-256:]
        if keys:
            self.link.record(keys, t_in, t_out, downstream=self.downstream, sent_after=before)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for sock in (self.src, self.dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


class DelayRelay:
    """All links of one lab plus a JSON-lines control port; runs in threads."""

    def __init__(self, links: list[Link], *, control_port: int = 0) -> None:
        self.links = {link.name: link for link in links}
        self._listeners: list[socket.socket] = []
        self._control = socket.create_server(("127.0.0.1", control_port))
        self.control_port = int(self._control.getsockname()[1])
        self._stopping = threading.Event()

    def start(self) -> DelayRelay:
        for link in self.links.values():
            listener = socket.create_server(("127.0.0.1", link.listen_port))
            link.listen_port = int(listener.getsockname()[1])
            self._listeners.append(listener)
            threading.Thread(target=self._accept, args=(link, listener), daemon=True).start()
        threading.Thread(target=self._serve_control, daemon=True).start()
        return self

    def _accept(self, link: Link, listener: socket.socket) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            if link.partitioned:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", link.upstream_port), timeout=5)
            except OSError:
                client.close()
                continue
            for sock in (client, upstream):
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            down = _Pipe(link, upstream, client, downstream=True)
            up = _Pipe(link, client, upstream, downstream=False)
            with link._lock:
                link._pipes += [down, up]
            down.start()
            up.start()

    def command(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "status":
            return {"ok": True, "links": [link.to_dict() for link in self.links.values()]}
        name = request.get("link")
        if name not in self.links:
            return {"ok": False, "error": f"unknown link {name!r}"}
        link = self.links[name]
        if op == "partition":
            link.partitioned = True
            link.cut()
        elif op == "heal":
            link.partitioned = False
        elif op == "upstream":
            # The primary moved (a failover): new connections go to it, old ones are cut.
            link.upstream_port = int(request["port"])
            link.cut()
        elif op == "delay":
            link.delay_ms = float(request["delay_ms"])
            link.up_delay_ms = (
                float(request["up_delay_ms"]) if request.get("up_delay_ms") is not None else None
            )
            if "jitter_ms" in request:
                link.jitter_ms = float(request["jitter_ms"])
            if request.get("jitter_shape") in JITTER_SHAPES:
                link.jitter_shape = str(request["jitter_shape"])
        else:
            return {"ok": False, "error": f"unknown op {op!r}"}
        return {"ok": True, "link": link.to_dict()}

    def _serve_control(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._control.accept()
            except OSError:
                return
            with conn, conn.makefile("rwb") as fh:
                for line in fh:
                    try:
                        reply = self.command(json.loads(line))
                    except (ValueError, KeyError, TypeError) as exc:
                        reply = {"ok": False, "error": str(exc)}
                    fh.write(json.dumps(reply).encode() + b"\n")
                    fh.flush()

    def stop(self) -> None:
        self._stopping.set()
        for sock in [*self._listeners, self._control]:
            with contextlib.suppress(OSError):
                sock.close()
        for link in self.links.values():
            link.cut()


def spawn_relay(lab_dir: Path, name: str, links: list[dict[str, Any]]) -> tuple[int, int]:
    """Start `python -m replag.lab.relay` for `links` (writes DIR/NAME.json, logs to
    DIR/NAME.log); return (pid, control port) once it listens. LabError if it does not start."""
    import subprocess

    from replag.errors import LabError

    ready = lab_dir / f"{name}.ready"
    ready.unlink(missing_ok=True)
    spec_path = lab_dir / f"{name}.json"
    spec_path.write_text(json.dumps({"links": links, "ready_path": str(ready)}))
    with open(lab_dir / f"{name}.log", "ab") as log:
        relay = subprocess.Popen(
            [sys.executable, "-m", "replag.lab.relay", str(spec_path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    # Generous: a Python process importing replag on a starved machine (the lab under
    # tests, nice'd) took over 10 s; the wait ends as soon as the relay listens.
    deadline = time.monotonic() + RELAY_START_S
    while not ready.exists():
        if relay.poll() is not None or time.monotonic() > deadline:
            if relay.poll() is None:
                relay.kill()
                relay.wait()
            raise LabError(
                f"the delay relay did not start within {RELAY_START_S:g} s; see "
                f"{lab_dir / f'{name}.log'}"
            )
        time.sleep(0.02)
    return relay.pid, int(json.loads(ready.read_text())["control_port"])


def fill_listen_ports(control_port: int, links: list[dict[str, Any]]) -> None:
    """Set each of `links`' `listen_port` to the port the relay bound for it."""
    status = relay_command(control_port, {"op": "status"})
    ports = {link["name"]: link["listen_port"] for link in status["links"]}
    for link in links:
        link["listen_port"] = ports[link["name"]]


def relay_command(control_port: int, request: dict[str, Any], *, timeout_s: float = 5.0) -> Any:
    """Send one control request to a running relay and return its answer."""
    with socket.create_connection(("127.0.0.1", control_port), timeout=timeout_s) as sock:
        sock.sendall(json.dumps(request).encode() + b"\n")
        with sock.makefile("rb") as fh:
            return json.loads(fh.readline())


def read_truth(path: Path) -> dict[str, tuple[int, int]]:
    """First (t_in_ns, t_out_ns) seen for each probe key on a link's truth log."""
    return {key: (t_in, t_out) for key, (t_in, _, t_out) in read_truth_brackets(path).items()}


def read_truth_brackets(path: Path) -> dict[str, tuple[int, int, int]]:
    """First (t_in_ns, earliest out, t_out_ns) for each probe key on a link's truth log:
    the bytes left the relay between the last two (its clock reads around the send)."""
    truth: dict[str, tuple[int, int, int]] = {}
    if not path.exists():
        return truth
    with open(path, encoding="latin-1") as fh:
        for line in fh:
            t_in, t_out, rest = line.rstrip("\n").split(" ", 2)
            key, _, after = rest.partition(" ")
            truth.setdefault(key, (int(t_in), int(after or t_out), int(t_out)))
    return truth


def main(argv: list[str]) -> None:
    """`python -m replag.lab.relay SPEC.json`: run the links in SPEC until SIGTERM."""
    import signal

    spec = json.loads(Path(argv[0]).read_text())
    links = [
        Link(
            name=raw["name"],
            listen_port=raw["listen_port"],
            upstream_port=raw["upstream_port"],
            delay_ms=raw.get("delay_ms", 0.0),
            jitter_ms=raw.get("jitter_ms", 0.0),
            jitter_shape=raw.get("jitter_shape", "uniform"),
            up_delay_ms=raw.get("up_delay_ms"),
            truth_path=Path(raw["truth_path"]) if raw.get("truth_path") else None,
            truth_up_path=Path(raw["truth_up_path"]) if raw.get("truth_up_path") else None,
            truth_prefix=raw.get("truth_prefix", "replag:probe:").encode(),
        )
        for raw in spec["links"]
    ]
    relay = DelayRelay(links, control_port=spec.get("control_port", 0)).start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    ready = Path(spec["ready_path"])
    # Written then renamed: the lab polls for the file and must never read it half-written.
    tmp = ready.with_name(ready.name + ".tmp")
    tmp.write_text(json.dumps({"control_port": relay.control_port}))
    tmp.replace(ready)
    done.wait()
    relay.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
