"""What checking replies before hiredis allocates them costs the scan's hot path.

Builds the byte stream a scan batch gets (an MGET of --keys values of --size bytes,
then one PTTL reply per key), cut in 256 KB reads as a scan process reads it, and
times parsing it with hiredis alone and with the `ReplyGuard` walk first (what
every reader now does). Prints µs per key for both and their ratio; best of
--repeat runs (CPU time of this process, so a busy host inflates both alike).
"""

from __future__ import annotations

import argparse
import os
import time

import hiredis
from _smoke import parse_args  # --smoke: tiny sizes, same path (tests/test_benchmarks.py)

from replag.wire.reply_limits import ReplyGuard

READ = 1 << 18


def stream(keys: int, size: int, batches: int) -> list[bytes]:
    value = b"v" * size
    mget = b"*%d\r\n" % keys + (b"$%d\r\n%s\r\n" % (size, value)) * keys
    pttl = b":-1\r\n" * keys
    data = (mget + pttl) * batches
    return [data[i : i + READ] for i in range(0, len(data), READ)]


def hiredis_only(chunks: list[bytes]) -> int:
    reader, n = hiredis.Reader(), 0
    for chunk in chunks:
        reader.feed(chunk)
        while reader.gets() is not False:
            n += 1
    return n


def guarded(chunks: list[bytes]) -> int:
    reader, guard, n = hiredis.Reader(), ReplyGuard(), 0
    for chunk in chunks:
        guard.feed(chunk)
        reader.feed(chunk)
        while reader.gets() is not False:
            n += 1
    return n


def best(run: object, chunks: list[bytes], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.process_time()
        run(chunks)  # type: ignore[operator]
        times.append(time.process_time() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=1000, help="keys per batch (scan_count)")
    parser.add_argument("--size", type=int, default=1024, help="bytes per value")
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    args = parse_args(parser, batches=3, repeat=1)
    print(f"load average: {os.getloadavg()[0]:.1f} (CPU time of this process is measured)")
    chunks = stream(args.keys, args.size, args.batches)
    keys = args.keys * args.batches
    assert hiredis_only(chunks) == guarded(chunks) == args.batches * (1 + args.keys)
    alone = best(hiredis_only, chunks, args.repeat)
    both = best(guarded, chunks, args.repeat)
    print(f"{keys} keys of {args.size} B, MGET + PTTL per batch of {args.keys}")
    print(f"hiredis alone:        {alone / keys * 1e6:.3f} µs/key")
    print(f"guard then hiredis:   {both / keys * 1e6:.3f} µs/key")
    print(f"guard's cost:         {(both - alone) / keys * 1e6:.3f} µs/key ({both / alone:.2f}x)")


if __name__ == "__main__":
    main()
