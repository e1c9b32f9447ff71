"""The reply guard (`replag.wire.reply_limits`) and the RESP readers that use it, fuzzed with
hypothesis: valid replies cut anywhere are read exactly as hiredis alone reads them;
random, truncated or over-limit bytes end in an EndpointError naming the endpoint (or
a reply), never another exception, a hang, or an allocation beyond the limits."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading
import tracemalloc
from typing import Any

import hiredis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replag.errors import EndpointError, UnreachableError
from replag.topology import Endpoint
from replag.wire import reply_limits
from replag.wire.reply_limits import NotRespHeader, ReplyGuard, ReplyLimitError, ReplyLimits
from replag.wire.resp import RespConnection
from replag.wire.resp_blocking import BlockingConnection

SMALL = ReplyLimits(max_bytes=4096, max_elements=64, max_depth=4)


def _bulk(data: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(data), data)


_scalars = st.one_of(
    st.binary(max_size=40).map(_bulk),
    st.integers(-(2**63), 2**63 - 1).map(lambda n: b":%d\r\n" % n),
    st.sampled_from([b"$-1\r\n", b"*-1\r\n", b"+OK\r\n", b"-ERR no\r\n", b"_\r\n", b"#t\r\n"]),
    st.text(alphabet="ab *$:", max_size=20).map(lambda t: b"+" + t.encode() + b"\r\n"),
)
replies = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=6).map(
        lambda items: b"*%d\r\n" % len(items) + b"".join(items)
    ),
    max_leaves=30,
)


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@settings(max_examples=300, deadline=None)
@given(st.lists(replies, min_size=1, max_size=5), st.lists(st.integers(0, 2000), max_size=8))
def test_valid_replies_cut_anywhere_pass_the_guard_in_step_with_hiredis(
    stream: list[bytes], cuts: list[int]
) -> None:
    guard = ReplyGuard(ReplyLimits())
    reader = hiredis.Reader()
    got = 0
    for chunk in _cut(b"".join(stream), cuts):
        # As a blocking reader feeds it: a reused buffer, with old bytes past the end.
        guard.feed(bytearray(chunk) + b"*9\r\n$7\r\n", len(chunk))
        reader.feed(chunk)
        while reader.gets() is not False:
            got += 1
    assert got == len(stream)
    assert guard.idle


@pytest.mark.parametrize("cut", [0, 7, 20_000, 44_444])
def test_a_long_array_of_integers_then_more_replies_is_followed_exactly(cut: int) -> None:
    # HPEXPIRETIME of a page of fields: thousands of one-line elements, and the next
    # replies right behind them in the same run of lines (walked once, not per line).
    stream = b"*5000\r\n" + b":1796172442799\r\n" * 5000 + b":-1\r\n:-2\r\n*2\r\n:1\r\n:2\r\n"
    guard = ReplyGuard(ReplyLimits())
    reader = hiredis.Reader()
    got = []
    for chunk in _cut(stream, [cut]):
        guard.feed(bytearray(chunk) + b":9\r\n", len(chunk))
        reader.feed(chunk)
        while (reply := reader.gets()) is not False:
            got.append(reply)
    assert guard.idle and len(got) == 4 and got[1:] == [-1, -2, [1, 2]]


@pytest.mark.parametrize(
    ("hostile", "setting"),
    [
        (b"$1000000000000\r\n", "max_reply_bytes"),
        (b"*2147483648\r\n", "max_reply_elements"),
        (b"%1073741824\r\n", "max_reply_elements"),
        (b"*1\r\n" * 10, "max_reply_depth"),
        (b"*3\r\n" + _bulk(b"x" * 3000) + _bulk(b"y" * 3000), "max_reply_bytes"),
        (b"+" + b"z" * 5000, "max_reply_bytes"),
    ],
)
def test_what_breaks_a_limit_is_refused_naming_the_setting(hostile: bytes, setting: str) -> None:
    guard = ReplyGuard(SMALL)
    with pytest.raises(ReplyLimitError, match=setting):
        for i in range(0, len(hostile), 5):
            guard.feed(hostile[i : i + 5])


# --- the readers, over a real socket ----------------------------------------------


def _endpoint() -> Endpoint:
    return Endpoint(name="fuzzed", host="127.0.0.1", port=1)


def _blocking_read(data: bytes, count: int) -> list[Any] | EndpointError:
    ours, theirs = socket.socketpair()
    conn = BlockingConnection(dataclasses.replace(_endpoint(), limits=SMALL), ours, 0.5)
    try:
        theirs.sendall(data)
        theirs.shutdown(socket.SHUT_WR)
        return conn.replies(count)
    except EndpointError as exc:
        return exc
    finally:
        conn.close()
        theirs.close()


hostile_bytes = st.one_of(
    st.binary(max_size=200),
    st.lists(replies, min_size=1, max_size=3)
    .map(b"".join)
    .flatmap(
        lambda s: st.integers(0, len(s)).map(lambda n: s[:n])  # truncated
    ),
    st.sampled_from([b"$1000000000000\r\n", b"*2147483648\r\n:1\r\n", b"*1\r\n" * 50]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_bytes, st.integers(1, 4))
def test_the_blocking_reader_ends_random_and_truncated_replies_as_endpoint_errors(
    data: bytes, count: int
) -> None:
    tracemalloc.start()
    try:
        out = _blocking_read(data, count)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(out, list | EndpointError)
    if isinstance(out, EndpointError):
        assert "fuzzed" in str(out)
    # Nothing the server announced was allocated: what is held stays near the limit.
    assert peak < 4 * SMALL.max_bytes + 256 * 1024


def _serve_once(data: bytes) -> tuple[socket.socket, int]:
    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        sock, _ = listener.accept()
        with sock:
            sock.recv(1024)
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            sock.recv(1024)  # until the client closes

    threading.Thread(target=answer, daemon=True).start()
    return listener, listener.getsockname()[1]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_bytes)
def test_the_async_reader_ends_random_and_truncated_replies_as_endpoint_errors(
    data: bytes,
) -> None:
    async def read() -> Any:
        listener, port = _serve_once(data)
        with listener:
            endpoint = Endpoint(name="fuzzed", host="127.0.0.1", port=port, limits=SMALL)
            conn = await RespConnection.open(endpoint, timeout_s=0.5)
            try:
                return await conn.request(b"*1\r\n$4\r\nPING\r\n", 1)
            except EndpointError as exc:
                return exc
            finally:
                await conn.close()

    out = asyncio.run(read())
    assert isinstance(out, list | EndpointError)


def test_a_dripping_server_fails_the_blocking_reader_within_its_timeout() -> None:
    ours, theirs = socket.socketpair()
    conn = BlockingConnection(_endpoint(), ours, 0.3)
    stop = threading.Event()

    def drip() -> None:
        for byte in b"$100\r\n" + b"d" * 100:
            if stop.wait(0.05):
                return
            theirs.sendall(bytes([byte]))

    dripper = threading.Thread(target=drip, daemon=True)
    dripper.start()
    try:
        with pytest.raises(UnreachableError, match="no whole reply"):
            conn.replies(1)
    finally:
        stop.set()
        dripper.join()
        conn.close()
        theirs.close()


def test_a_header_that_is_no_resp_is_refused_before_hiredis() -> None:
    guard = ReplyGuard()
    with pytest.raises(NotRespHeader):
        guard.feed(b"HTTP/1.1 200 OK\r\n")


_needs_c_twin = pytest.mark.skipif(
    reply_limits.skip_bulks is reply_limits._skip_bulks,
    reason="replag._scanindex (with skip_bulks) was not built: the Python twin runs alone",
)


@_needs_c_twin
@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(st.binary(max_size=30).map(_bulk), st.just(b"$-1\r\n")), max_size=12),
    st.integers(0, 400),
    st.integers(1, 14),
    st.sampled_from([4096, 10, 0]),
)
def test_the_c_step_over_bulks_is_its_python_twin(
    bulks: list[bytes], cut: int, left: int, max_bytes: int
) -> None:
    data = b"".join(bulks) + b":1\r\n"
    end = min(cut, len(data))
    for buf in (data, bytearray(data)):
        assert reply_limits.skip_bulks(buf, 0, end, left, max_bytes) == reply_limits._skip_bulks(
            buf, 0, end, left, max_bytes
        )


@_needs_c_twin
@pytest.mark.parametrize(
    "header", [b"$+3\r\nabc\r\n", b"$ 3\r\nabc\r\n", b"$3_0\r\n", b"$99999999999999999999\r\n"]
)
def test_the_c_step_leaves_what_is_not_plain_to_the_general_path(
    header: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    buf = _bulk(b"ok") + header + _bulk(b"later")
    pos, left = reply_limits.skip_bulks(buf, 0, len(buf), 5, 4096)
    assert (pos, left) == (len(_bulk(b"ok")), 4)

    def outcome() -> str:
        try:
            ReplyGuard(ReplyLimits()).feed(b"*3\r\n" + buf)
        except (NotRespHeader, ReplyLimitError) as exc:
            return type(exc).__name__
        return "passed"

    with_c = outcome()
    monkeypatch.setattr(reply_limits, "skip_bulks", reply_limits._skip_bulks)
    assert outcome() == with_c  # the general path decides, as with the Python step
