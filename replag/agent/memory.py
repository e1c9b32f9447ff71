"""The agent process's memory: what it asks of glibc's allocator.

An agent holds its key tables for days (14 bytes a key: a few large numpy
arrays per replica) and now and then a full scan's transient heap (reply
buffers, names, arrays several times the table). glibc raises its mmap
threshold each time a large block is freed, up to 32 MB, so after the first
build the next tables land in the main heap among the scan's small blocks,
and the heap cannot shrink around them: at 1M keys the agent kept ~80 bytes a
key instead of ~38. A fixed threshold (128 kB) keeps every large block in a
mapping of its own, returned to the system when freed; `release_freed_memory`
hands back what the small blocks left free after a scan, and
`release_now_and_then` (called by every tree's once-a-second poll) what
serving checks and re-reading written keys left (values read for digests,
answers): 16 MB at 1M keys after three checks and 2,000 writes, 3.5 MB with
it. Elsewhere than glibc all three do nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import time

M_MMAP_THRESHOLD = -3  # mallopt(3)
MMAP_THRESHOLD = 128 * 1024  # glibc's initial value, kept fixed
RELEASE_EVERY_S = 1.0
_last_release = 0.0


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def fix_mmap_threshold() -> bool:
    """Keep blocks of 128 kB and more in mappings of their own; True where it took."""
    libc = _libc()
    with contextlib.suppress(AttributeError):
        return libc is not None and bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    return False


def release_freed_memory() -> None:
    """Hand the heap a scan freed back to the OS: glibc keeps freed small blocks (the
    scan's names and replies) mapped, which would stay in the agent's RSS for good."""
    libc = _libc()
    with contextlib.suppress(AttributeError):
        if libc is not None:
            libc.malloc_trim(0)


def release_now_and_then() -> None:
    """`release_freed_memory` at most every `RELEASE_EVERY_S` (process-wide: one call
    serves every tree of the agent; a trim of a small heap takes well under 1 ms)."""
    global _last_release
    now = time.monotonic()
    if now - _last_release >= RELEASE_EVERY_S:
        _last_release = now
        release_freed_memory()
