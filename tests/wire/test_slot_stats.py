"""CLUSTER SLOT-STATS at the door (`replag.wire.slot_stats`, `replag.wire.shapes`): every
row's slot and key-count typed (RESP2 rows, RESP3 maps, Valkey's extra fields), a
hostile answer is one error naming the server and the command, and a server without
the command (queued then refused at EXEC, as Redis 6.2 does) is `missing`, never an
error."""

from __future__ import annotations

from typing import Any

import pytest

from replag.errors import ReplyShapeError
from replag.topology import Endpoint
from replag.wire import shapes
from replag.wire.resp import RespConnection
from replag.wire.slot_stats import COMMAND, parse_counts, read_counts
from tests.helpers.scripted import ScriptedServer, array, bulk

ENDPOINT = Endpoint(name="n1", host="127.0.0.1", port=1)
INFO = bulk("# Replication\r\nrole:master\r\nmaster_repl_offset:42\r\n")


def _row(slot: int, count: int) -> bytes:
    return array(b":%d\r\n" % slot, array(bulk("key-count"), b":%d\r\n" % count))


@pytest.mark.parametrize(
    "reply",
    [
        [[0, [b"key-count", 3]], [7, [b"key-count", 0]]],
        [[0, {b"key-count": 3}], [7, {b"key-count": 0}]],  # RESP3
        [[0, [b"key-count", 3, b"cpu-usec", 9]], [7, [b"cpu-usec", 1, b"key-count", 0]]],
    ],
)
def test_rows_of_every_form_are_read_as_slot_counts(reply: list[Any]) -> None:
    assert shapes.check(ENDPOINT, COMMAND, reply) is reply
    assert parse_counts(reply) == {0: 3, 7: 0}


@pytest.mark.parametrize(
    "reply",
    [
        5,
        [[16384, [b"key-count", 1]]],
        [[-1, [b"key-count", 1]]],
        [[3, [b"key-count", -1]]],
        [[3, [b"cpu-usec", 1]]],
        [[3, [b"key-count", b"1"]]],
        [[3]],
        [[0, [b"key-count", 0]]] * 16385,
    ],
)
def test_a_wrong_row_is_refused_naming_server_and_command(reply: Any) -> None:
    with pytest.raises(ReplyShapeError) as refused:
        shapes.check(ENDPOINT, COMMAND, reply)
    assert "CLUSTER SLOT-STATS answered" in str(refused.value)
    assert "n1 (" in str(refused.value.where)


async def _read(answers: dict[str, object]) -> Any:
    with ScriptedServer(answers) as server:  # type: ignore[arg-type]
        endpoint = Endpoint(name="n1", host="127.0.0.1", port=server.port, cluster=True)
        conn = await RespConnection.open(endpoint, timeout_s=2)
        try:
            return await read_counts(conn, replica=False)
        finally:
            await conn.close()


async def test_counts_come_with_the_offset_read_in_the_same_transaction() -> None:
    exec_reply = array(INFO, array(_row(1, 5), _row(2, 0)))
    got = await _read({"INFO": b"+QUEUED\r\n", "CLUSTER": b"+QUEUED\r\n", "EXEC": exec_reply})
    assert (got.counts, got.offset, got.missing) == ({1: 5, 2: 0}, 42, None)


async def test_a_server_without_the_command_is_missing_not_an_error() -> None:
    refused = b"-ERR Unknown subcommand or wrong number of arguments for 'SLOT-STATS'.\r\n"
    got = await _read(
        {"INFO": b"+QUEUED\r\n", "CLUSTER": b"+QUEUED\r\n", "EXEC": array(INFO, refused)}
    )
    assert got.missing is not None and "SLOT-STATS" in got.missing and not got.counts


async def test_a_hostile_count_is_one_error_naming_the_server() -> None:
    hostile = array(INFO, array(array(b":1\r\n", array(bulk("key-count"), bulk("many")))))
    with pytest.raises(ReplyShapeError) as refused:
        await _read({"INFO": b"+QUEUED\r\n", "CLUSTER": b"+QUEUED\r\n", "EXEC": hostile})
    assert "CLUSTER SLOT-STATS answered" in str(refused.value)
