"""Replies whose size the request says (`replag.wire.reply_bounds`): a TIME, a PING, an INFO,
the poll's MGET of N probe keys may not carry what max_reply_bytes allows any reply. Each
refusal is one error naming the server, the command and the bound's setting; a bound
applies to its own reply only, whatever else shares the chunk."""

from __future__ import annotations

import dataclasses
import re

import pytest

from replag.errors import EndpointError
from replag.topology import Endpoint
from replag.wire.reply_bounds import SMALL_BOUND, probe_values
from replag.wire.reply_limits import ReplyBound, ReplyGuard, ReplyLimitError, ReplyLimits
from replag.wire.resp import RespConnection, pack
from tests.helpers.scripted import ScriptedServer, array, bulk

BIG = bulk(b"x" * (3 << 20))  # 3 MB: within max_reply_bytes, over every bound here


def test_a_bound_applies_to_its_own_reply_only() -> None:
    tight = ReplyBound(16, "16 bytes (the test's)")
    guard = ReplyGuard()
    guard.bound(1, tight)
    guard.feed(BIG + b"+OK\r\n" + BIG)  # reply 0 and 2 unbounded, reply 1 small: passes
    guard.bound(4, tight)
    with pytest.raises(ReplyLimitError, match=f"carried {len(BIG)} bytes, over 16 bytes"):
        guard.feed(b":1\r\n" + BIG)


def test_a_bounded_reply_still_streaming_is_refused_at_the_chunk_past_its_bound() -> None:
    guard = ReplyGuard()
    guard.bound(0, ReplyBound(1000, "1000 bytes (the test's)"))
    guard.feed(b"*1\r\n$400000000\r\n" + b"x" * 500)  # under the bound so far
    with pytest.raises(ReplyLimitError, match="is not over, over 1000 bytes"):
        guard.feed(b"x" * 600)


def test_a_run_of_one_line_replies_passes_its_bounds() -> None:
    guard = ReplyGuard()
    for index in range(3):
        guard.bound(index, SMALL_BOUND)
    guard.feed(b"+OK\r\n:1\r\n:2\r\n" + BIG)
    assert guard.idle


def _endpoint(server: ScriptedServer, **limits: int) -> Endpoint:
    endpoint = Endpoint.from_url(f"redis://{server.address}", name="fat")
    return dataclasses.replace(endpoint, limits=ReplyLimits(**limits))


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (("TIME",), "64 KB, the most a number or a status can hold"),
        (("PING",), "64 KB, the most a number or a status can hold"),
        (("INFO", "replication"), "max_info_bytes = 1 MB"),
        (("CONFIG", "GET", "notify-keyspace-events"), "64 KB (one setting)"),
    ],
)
async def test_a_command_of_known_size_answered_with_megabytes_is_refused(
    command: tuple[str, ...], said: str
) -> None:
    with ScriptedServer({command[0]: BIG}) as server:
        conn = await RespConnection.open(_endpoint(server, max_info_bytes=1 << 20), timeout_s=5)
        try:
            with pytest.raises(EndpointError, match=re.escape(f"over {said}")) as err:
                await conn.call(*command)
        finally:
            await conn.close()
    text = str(err.value)
    assert f"reply to {command[0]} refused" in text and server.address in text, text


async def test_the_poll_mget_is_bounded_by_its_keys_times_max_probe_value_bytes() -> None:
    keys = [b"replag:probe:run:%d" % i for i in range(3)]
    legit = array(*(bulk(b"v" * 200) for _ in keys))
    with ScriptedServer({"MGET": legit, "GET": BIG}) as server:
        endpoint = _endpoint(server, max_probe_value_bytes=256)
        bound = probe_values(len(keys), endpoint.limits)
        assert bound.said == "3 probe keys x max_probe_value_bytes = 256 bytes: 896 bytes"
        conn = await RespConnection.open(endpoint, timeout_s=5)
        try:
            values, _, _ = await conn.call("MGET", *keys, within=bound)
            assert values == [b"v" * 200] * 3
            # A bounded MGET pipelined behind a big unbounded GET: each reply its own bound.
            big = conn.send(pack("GET", "big"), 1)
            small = conn.send(pack("MGET", *keys), 1, within=bound)
            assert len((await conn.wait(big))[0][0]) == 3 << 20
            assert (await conn.wait(small))[0][0] == [b"v" * 200] * 3
        finally:
            await conn.close()
    fat = array(bulk(b"x" * 257), bulk(b"x" * 1000), bulk(b"y"))
    with ScriptedServer({"MGET": fat}) as server:
        endpoint = _endpoint(server, max_probe_value_bytes=256)
        conn = await RespConnection.open(endpoint, timeout_s=5)
        try:
            with pytest.raises(EndpointError, match="max_probe_value_bytes = 256 bytes") as err:
                await conn.call("MGET", *keys, within=probe_values(3, endpoint.limits))
        finally:
            await conn.close()
    assert "reply to MGET refused" in str(err.value) and server.address in str(err.value)
