"""How fast, and at what memory cost, `replag serve` and `replag agent` refuse a big upload.

Starts a redis-server, a service and an agent (real processes), then POSTs a body of
--size MB to each, declared (Content-Length) and chunked, without a token and with
one, sending 1 MB blocks until the answer comes. Prints per case the status, the
seconds from the first byte sent to the answer, the MB actually sent, and the
process's peak RSS (VmHWM) before and after. Target (issue 33): 401 or 413 in under
1 s without a token, peak RSS +<= 20 MB.
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import tomli_w
from _smoke import parse_args  # --smoke: tiny sizes, same path (tests/test_benchmarks.py)

from replag.lab.server import RedisServer, free_port

MB = 1 << 20
TOKEN = "upload-benchmark-t0ken"


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def upload(
    port: int, path: str, total: int, *, chunked: bool, token: str | None
) -> tuple[int, float, int]:
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    head.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}")
    if token:
        head.append(f"Authorization: Bearer {token}")
    block = b"x" * MB
    piece = b"%x\r\n%s\r\n" % (len(block), block) if chunked else block
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        started = time.perf_counter()
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        sent = 0
        while sent < total:
            readable, _, _ = select.select([sock], [sock], [], 60)
            if readable:
                break
            try:
                sock.send(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += MB
        answer = b""
        while b"\r\n" not in answer:
            data = sock.recv(4096)
            if not data:
                break
            answer += data
        elapsed = time.perf_counter() - started
    return int(answer.split(b" ", 2)[1]), elapsed, sent // MB


def start(args: list[str], log: Path, health: str) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "replag", *args], stdout=out, stderr=out)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{args[0]} exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(health, timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit(f"{args[0]} did not answer within 120 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=500, help="MB to upload per case")
    args = parse_args(parser, size=30)  # past agent_max_body (16 MiB)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores (a shared host)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        server = RedisServer(
            "upload", free_port(), work / "redis", extra_args=("--notify-keyspace-events", "KA")
        ).start()
        agent_port, serve_port = free_port(), free_port()
        data = {
            "settings": {"store": str(work / "s.sqlite"), "agent_state_dir": str(work / "st"),
                         "api_token": TOKEN, "probe_interval": "1h", "check_interval": "1h",
                         "notify_keyspace_events": "KA"},
            "regions": [
                {"name": "here", "agent": f"http://127.0.0.1:{agent_port}",
                 "replicas": [{"name": "r", "url": server.url}]},
                {"name": "there", "replicas": [{"name": "o", "url": "redis://127.0.0.1:2"}]},
            ],
            "groups": [{"name": "g", "members": ["r", "o"]}],
        }  # fmt: skip
        config = work / "replag.toml"
        config.write_text(tomli_w.dumps(data))
        procs = []
        try:
            procs.append(("serve", start(["serve", "-c", str(config), "--port", str(serve_port)],
                          work / "serve.log", f"http://127.0.0.1:{serve_port}/api/v1/health"),
                          serve_port, "/api/v1/repairs"))  # fmt: skip
            procs.append(("agent", start(["agent", "-c", str(config), "--region", "here"],
                          work / "agent.log", f"http://127.0.0.1:{agent_port}/agent/v1/health"),
                          agent_port, "/agent/v1/replicas/r/keys/observe"))  # fmt: skip
            print(f"{'process':<7} {'case':<22} {'status':>6} {'seconds':>8} {'MB sent':>8} "
                  f"{'peak RSS before':>16} {'after':>8}")  # fmt: skip
            for name, proc, port, path in procs:
                for token in (None, TOKEN):
                    for chunked in (False, True):
                        before = peak_rss(proc.pid)
                        status, seconds, sent = upload(
                            port, path, args.size * MB, chunked=chunked, token=token
                        )
                        after = peak_rss(proc.pid)
                        how = "chunked" if chunked else "declared"
                        case = f"{how}, {'token' if token else 'no token'}"
                        print(f"{name:<7} {case:<22} {status:>6} {seconds:>8.3f} {sent:>8} "
                              f"{before / MB:>13.1f} MB {after / MB:>5.1f} MB")  # fmt: skip
        finally:
            for _, proc, _, _ in procs:
                proc.terminate()
                proc.wait(30)
            server.stop()


if __name__ == "__main__":
    main()
