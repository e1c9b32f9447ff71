"""When the repair under test touched each key, as the servers themselves report it (MONITOR).

The checker exempts an anomaly from its counts only where an operation slower than
`repair_settle` was still fanning out while the repair read or wrote that key: the
instants come from here, not from the repair's own account of what it did.

Run as a process of its own (`python -m replag.lab.safety.monitor OUT PORT...`) so that
reading the stream shares no event loop with the repair: it prints `ready` once every
server is monitored, and stops following a server when the harness's `ECHO` marker
arrives there (every command before it has then been written to OUT).
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Iterable
from pathlib import Path

END_MARKER = b"replag-safety-monitor-end"
_LINE = re.compile(rb"^\+?(\d+)\.(\d+) \[\d+ ([^\]]+)\] (.*)$")
_ARG = re.compile(rb'"((?:[^"\\]|\\.)*)"')


def repair_touches(
    path: Path, keys: Iterable[bytes], *, others: Iterable[str]
) -> dict[bytes, list[int]]:
    """Per key, the instants (epoch ns, microsecond precision) a command naming it ran on
    any server, from any client but `others` (the writers' addresses): the repair's reads
    and writes, including those its Lua scripts made (MONITOR shows them as `lua`)."""
    wanted = set(keys)
    skip = {a.encode() for a in others}
    out: dict[bytes, list[int]] = {}
    with path.open("rb") as fh:
        for raw in fh:
            _, _, line = raw.rstrip(b"\n").partition(b" ")
            match = _LINE.match(line)
            if match is None or match[3] in skip:
                continue
            seconds, micros, _, args = match.groups()
            instant = int(seconds) * 10**9 + int(micros.ljust(6, b"0")[:6]) * 1000
            # Key names are printable ASCII (model.Keyspace): MONITOR quotes them as they are.
            for arg in _ARG.findall(args):
                if arg in wanted:
                    out.setdefault(arg, []).append(instant)
    return out


async def _follow(port: int, out: list[bytes], ready: asyncio.Event, started: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 26)
    try:
        writer.write(b"MONITOR\r\n")
        first = await reader.readline()
        if not first.startswith(b"+OK"):
            raise RuntimeError(f"MONITOR on port {port} answered {first!r}")
        started.append(port)
        ready.set()
        prefix = b"%d " % port
        while line := await reader.readline():
            out.append(prefix + line.rstrip(b"\r\n") + b"\n")
            if END_MARKER in line:
                return
        raise RuntimeError(f"port {port} closed the MONITOR stream before the end marker")
    finally:
        writer.close()


async def _monitor(ports: list[int]) -> list[bytes]:
    lines: list[bytes] = []
    started: list[int] = []
    events = [asyncio.Event() for _ in ports]
    tasks = [
        asyncio.create_task(_follow(port, lines, event, started))
        for port, event in zip(ports, events, strict=True)
    ]
    for event in events:
        await event.wait()
    print("ready", flush=True)
    await asyncio.gather(*tasks)
    return lines


def main(argv: list[str]) -> None:
    lines = asyncio.run(_monitor([int(p) for p in argv[1:]]))
    Path(argv[0]).write_bytes(b"".join(lines))
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
