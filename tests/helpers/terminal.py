"""Run a command with stderr on a real pseudo-terminal, as a person at a shell would."""

from __future__ import annotations

import os
import pty
import subprocess
from collections.abc import Sequence


def run_on_terminal(args: Sequence[str], *, timeout_s: float = 120.0) -> tuple[int, str, str]:
    """(exit code, stdout, what reached the terminal on stderr); stdout is a pipe."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(
            list(args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave
        )
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal has closed it
                break
            if not data:
                break
            chunks.append(data)
        stdout = proc.stdout.read() if proc.stdout else b""
        code = proc.wait(timeout=timeout_s)
    finally:
        os.close(master)
    return code, stdout.decode(), b"".join(chunks).decode(errors="replace")
