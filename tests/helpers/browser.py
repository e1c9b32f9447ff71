"""Headless Chromium, when the machine has it: a page's DOM after its scripts ran, or a PNG."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

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
