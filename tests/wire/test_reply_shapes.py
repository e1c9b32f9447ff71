"""Typed replies at the door (`replag.wire.shapes`, `replag.wire.scan_end`): a server that
answers TIME, INFO or SCAN with the wrong shape (an integer, nil, an empty array, a map),
or whose SCAN cursor cycles or goes negative, costs one line naming the server, the
command, what was expected and what came: exit 2 or 3, never a traceback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from tests.helpers.cli import run_replag
from tests.helpers.scripted import ScriptedServer, array, bulk

INFO = bulk(
    "# Replication\r\nrole:master\r\nconnected_slaves:0\r\nmaster_replid:"
    + "0" * 40
    + "\r\nmaster_repl_offset:0\r\n"
)
WRONG = {
    "int": b":1\r\n",
    "nil": b"$-1\r\n",
    "empty": b"*0\r\n",
    "map": b"%1\r\n+a\r\n:1\r\n",
    "negative": array(bulk("-5"), array()),
}


def _cycle() -> object:
    """SCAN answers 7, 9, 7, 9, ... with one key each: a cursor that never ends."""
    calls = [0]

    def answer(command: list[bytes]) -> bytes:
        calls[0] += 1
        return array(bulk("7" if calls[0] % 2 else "9"), array(bulk(f"k{calls[0] % 2}")))

    return answer


def _answers(which: str, how: str) -> dict[str, object]:
    answers: dict[str, object] = {
        "PING": b"+PONG\r\n",
        "INFO": INFO,
        "TIME": array(bulk("1700000000"), bulk("5")),
        "DBSIZE": b":2\r\n",
        "SCAN": array(bulk("0"), array(bulk("k1"), bulk("k2")) if which == "MGET" else array()),
        "MGET": lambda c: array(*[b"$-1\r\n"] * (len(c) - 1)),
    }
    answers[which] = _cycle() if how == "cycle" else WRONG[how]
    return answers


@contextmanager
def _servers(which: str, how: str) -> Iterator[tuple[ScriptedServer, ScriptedServer]]:
    with ExitStack() as stack:
        a = stack.enter_context(ScriptedServer(_answers(which, how)))  # type: ignore[arg-type]
        b = stack.enter_context(ScriptedServer(_answers(which, how)))  # type: ignore[arg-type]
        yield a, b


@pytest.mark.parametrize(
    ("command", "which", "how"),
    [
        ("probe", "TIME", "int"),
        ("probe", "TIME", "map"),
        ("check", "SCAN", "int"),
        ("check", "SCAN", "negative"),
        ("check", "SCAN", "cycle"),
        ("discover", "INFO", "int"),
        ("discover", "INFO", "map"),
        # Side reads of a check or run: DBSIZE, INFO keyspace, and a batch's MGET (its
        # reply inside a pipelined batch, checked there).
        ("check", "DBSIZE", "nil"),
        ("check", "INFO", "map"),
        ("check", "MGET", "int"),
        ("run", "MGET", "empty"),
    ],
)
def test_a_reply_of_the_wrong_shape_is_one_line_naming_server_command_and_shapes(
    tmp_path: Path, command: str, which: str, how: str
) -> None:
    with _servers(which, how) as (a, b):
        config = tmp_path / "t.toml"
        config.write_text(
            f'[settings]\nstore = "{tmp_path / "s.sqlite"}"\n'
            f'[[regions]]\nname = "a"\nwrite = "redis://{a.address}"\nreplicas = []\n'
            f'[[regions]]\nname = "b"\nreplicas = [{{name = "rb", url = "redis://{b.address}"}}]\n'
            f'[[groups]]\nname = "g"\n'
            f'members = [{{name = "ra", url = "redis://{a.address}"}}, "rb"]\n'
        )
        args = {
            "probe": ["probe", "-c", str(config), "--count", "2"],
            "check": ["repair", "check", "-c", str(config)],
            "run": ["repair", "run", "-c", str(config)],
            "discover": ["topology", "discover", "--redis", f"redis://{a.address}"],
        }[command]
        done = run_replag(*args, cwd=tmp_path, timeout=60, env={"REPLAG_CONNECT_TIMEOUT": "1s"})
    out = done.stdout + done.stderr
    assert done.returncode in (2, 3), out
    assert "Traceback" not in out, out
    lines = [line for line in out.splitlines() if which in line and "error" in line]
    assert len(lines) == 1, out
    line = lines[0]
    assert a.address in line or b.address in line, line
    if how == "cycle":
        assert "SCAN ended: its cursor came back" in line, line
    else:
        assert "expected" in line and "answered" in line, line
