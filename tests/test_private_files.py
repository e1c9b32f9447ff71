"""Every file replag writes is 0600 in 0700 directories it creates, under umask 022: the
store and its -wal/-shm, an agent's audit.jsonl and tree files, --keys-out,
--samples-out, a written topology; a file an older version left 0644 is narrowed."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from replag.agent.auth import AgentAudit, Caller
from replag.agent.snapshot import ReplicaIdentity, TableShape, save
from replag.commands.probe import write_samples
from replag.commands.repair import _KeysOut
from replag.config import write_config_atomic
from replag.private_files import open_private, private_dir
from replag.store import Store
from replag.tokens import ApiToken


@pytest.fixture(autouse=True)
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_directories_made_0700_and_existing_ones_kept(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    made = private_dir(tmp_path / "a" / "b")
    assert [mode(p) for p in (tmp_path, tmp_path / "a", made)] == [0o755, 0o700, 0o700]
    old = tmp_path / "old.txt"
    old.write_text("x")
    assert mode(old) == 0o644
    with open_private(old, "a") as out:
        out.write("y")
    assert mode(old) == 0o600 and old.read_text() == "xy"


def test_every_file_replag_writes_is_its_owners_only(tmp_path: Path) -> None:
    state = tmp_path / "state"
    store = Store(state / "store" / "s.sqlite")
    store.execute("CREATE TABLE t (x)")
    store.execute("INSERT INTO t VALUES (1)")
    files = [state / "store" / f"s.sqlite{end}" for end in ("", "-wal", "-shm")]
    assert all(p.exists() for p in files)
    assert [mode(p) for p in files] == [0o600] * 3
    store.close()

    audit = AgentAudit(state / "agent" / "eu")
    caller = Caller(
        token=ApiToken(name="t", scopes=frozenset({"repair"}), secret="s" * 16), client="1.2.3.4:5"
    )
    audit.write(caller, replica="r", key=b"k", op="restore", outcome="written")
    tree = state / "agent" / "eu" / "r.tree"
    save(
        tree,
        lambda out: out.write(b"\0" * 8),
        0,
        ReplicaIdentity("a", "b", "c", "d"),
        TableShape(16, 2000, "p:"),
    )

    keys = _KeysOut(state / "out" / "keys.jsonl")
    keys("g", b"k", {"kind": "missing", "replicas": {}})
    keys.close()
    write_samples(state / "samples.jsonl", SimpleNamespace(samples=[]))  # type: ignore[arg-type]
    write_config_atomic(state / "topo" / "replag.toml", "[settings]\n")

    for path in (
        state / "agent" / "eu" / "audit.jsonl",
        tree,
        state / "out" / "keys.jsonl",
        state / "samples.jsonl",
        state / "topo" / "replag.toml",
    ):
        assert mode(path) == 0o600, path
    for directory in (state, state / "store", state / "agent", state / "agent" / "eu",
                      state / "out", state / "topo"):  # fmt: skip
        assert mode(directory) == 0o700, directory
    # Nothing else appeared that is readable by others (a temporary file left behind).
    loose = [p for p in state.rglob("*") if mode(p) & 0o077]
    assert loose == []
