"""Tests of the frame layout (danaus.actors._wire) and of danaus.actors._connection (the
frame reader and handshake at work in a connection), against a real Runtime over real
unix sockets. The reader and the handshake alone, without sockets: test_frames.py.

The peer side is written by hand here (raw asyncio streams, frames built from
``PREFIX``/``PART_LEN``), so these tests check the wire protocol itself, not danaus
talking to danaus.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import msgspec
import numpy as np
import pytest

from danaus.actors._auth import proof, verify
from danaus.actors._connection import Connection
from danaus.actors._frame_writer import State
from danaus.actors._runtime import Runtime
from danaus.actors._serialize import encode_plain
from danaus.actors._wire import (
    CLOSE,
    ERROR,
    MAGIC,
    MAX_HANDSHAKE_HEADER,
    MAX_PARTS,
    NIL,
    OK,
    PART_LEN,
    PREFIX,
    Auth,
    Buffer,
    Call,
    Challenge,
    ErrorInfo,
    Handshake,
    Hello,
    Message,
    Ping,
    Result,
    Spawn,
    StopActor,
    StopProc,
    frame,
)
from danaus.config import config
from danaus.errors import AuthenticationError, SupervisionError

KEY = b"k" * 32
WRONG_KEY = b"w" * 32
#: Generous bound for anything that should happen at once; a hang fails instead of stalling.
TIMEOUT = 5.0

_encode = msgspec.msgpack.Encoder().encode
_decode_message = msgspec.msgpack.Decoder(Message).decode
_decode_handshake = msgspec.msgpack.Decoder(Handshake).decode
_decode_error = msgspec.msgpack.Decoder(ErrorInfo).decode


def wire(msg: object, parts: Sequence[Buffer] = ()) -> bytes:
    """One whole frame as bytes, as a peer would put it on the socket."""
    return b"".join(bytes(b) for b in frame(_encode(msg), parts))


def ghost_call(reply: int, parts: Sequence[Buffer] = ()) -> bytes:
    """A Call to an actor the runtime does not have: it must answer with an error."""
    return wire(Call("ghost", "ping", reply, encode_plain([[], {}]), bool(parts)), parts)


def split_frames(data: bytes) -> list[tuple[bytes, list[bytes]]]:
    """Parse whole frames out of ``data`` (what a fake transport collected)."""
    out = []
    i = 0
    while i < len(data):
        magic, hlen, n = PREFIX.unpack_from(data, i)
        assert magic == MAGIC
        i += PREFIX.size
        lens = [PART_LEN.unpack_from(data, i + 8 * k)[0] for k in range(n)]
        i += 8 * n
        header = data[i : i + hlen]
        i += hlen
        parts = []
        for n_bytes in lens:
            parts.append(data[i : i + n_bytes])
            i += n_bytes
        out.append((header, parts))
    assert i == len(data), "trailing partial frame"
    return out


async def read_frame(reader: asyncio.StreamReader) -> tuple[bytes, list[bytes]]:
    async with asyncio.timeout(TIMEOUT):
        magic, hlen, n = PREFIX.unpack(await reader.readexactly(PREFIX.size))
        assert magic == MAGIC
        lens = [PART_LEN.unpack(await reader.readexactly(PART_LEN.size))[0] for _ in range(n)]
        header = await reader.readexactly(hlen)
        parts = [await reader.readexactly(k) for k in lens]
    return header, parts


async def read_result(reader: asyncio.StreamReader) -> Result:
    header, parts = await read_frame(reader)
    msg = _decode_message(header)
    assert isinstance(msg, Result)
    assert parts == []
    return msg


def assert_ghost_error(result: Result, port: int) -> None:
    assert result.port == port
    assert result.status == ERROR
    info = _decode_error(result.value)
    assert info.kind == "supervision"
    assert "no actor named 'ghost'" in info.message


async def expect_closed(reader: asyncio.StreamReader) -> bytes:
    """Wait for the runtime to close the connection; returns what it still sent."""
    try:
        return await asyncio.wait_for(reader.read(), TIMEOUT)
    except ConnectionResetError:
        return b""


async def expect_open(reader: asyncio.StreamReader, wait: float) -> None:
    """Nothing arrives and the connection is not closed for ``wait`` seconds."""
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.read(1), wait)


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "danaus.connection" and r.levelno >= logging.ERROR
    ]


class RawPeer:
    """A hand-written dialer: raw stream, frames and handshake done by this test."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.addr = f"unix:@danaus-test-peer-{secrets.token_hex(4)}"
        self.nonce = os.urandom(16)

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def hello(self) -> Challenge:
        self.send(wire(Hello(self.nonce, self.addr)))
        header, parts = await read_frame(self.reader)
        assert parts == []
        challenge = _decode_handshake(header)
        assert isinstance(challenge, Challenge)
        return challenge

    async def handshake(self, key: bytes = KEY) -> Challenge:
        challenge = await self.hello()
        # The runtime proves it holds the key before we prove anything.
        assert verify(KEY, b"acceptor", self.nonce, challenge.nonce, challenge.mac)
        self.send(wire(Auth(proof(key, b"dialer", challenge.nonce, self.nonce))))
        return challenge

    async def call_ghost(self, reply: int) -> None:
        self.send(ghost_call(reply))
        assert_ghost_error(await read_result(self.reader), reply)


Dial = Callable[[], Awaitable[RawPeer]]


@pytest.fixture
async def runtime() -> AsyncIterator[Runtime]:
    rt = Runtime(
        asyncio.get_running_loop(), addr=f"unix:@danaus-test-{secrets.token_hex(8)}", key=KEY
    )
    try:
        yield rt
    finally:
        await rt.aclose()


@pytest.fixture
async def dial(runtime: Runtime) -> AsyncIterator[Dial]:
    writers: list[asyncio.StreamWriter] = []
    name = runtime.addr.removeprefix("unix:@")

    async def dial_() -> RawPeer:
        reader, writer = await asyncio.open_unix_connection("\0" + name)
        writers.append(writer)
        return RawPeer(reader, writer)

    yield dial_
    for w in writers:
        w.close()
        with contextlib.suppress(ConnectionError):
            await w.wait_closed()


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.ERROR, logger="danaus.connection")
    return caplog


# ---------------------------------------------------------------- frame layout


def test_frame_without_parts_is_one_buffer_prefix_then_header() -> None:
    bufs = frame(b"hdr")

    assert len(bufs) == 1
    assert (
        bytes(bufs[0]) == b"DNS1" + (3).to_bytes(4, "little") + (0).to_bytes(4, "little") + b"hdr"
    )


def test_frame_with_parts_lists_byte_lengths_and_does_not_copy_parts() -> None:
    a = b"ab"
    b = bytearray(b"cde")
    c = np.zeros(4, dtype=np.uint16).data  # len 4, but 8 bytes
    bufs = frame(b"header", [a, b, c])

    assert len(bufs) == 4
    expected = (
        b"DNS1"
        + (6).to_bytes(4, "little")
        + (3).to_bytes(4, "little")
        + (2).to_bytes(8, "little")
        + (3).to_bytes(8, "little")
        + (8).to_bytes(8, "little")
        + b"header"
    )
    assert bytes(bufs[0]) == expected
    assert bufs[1] is a
    assert bufs[2] is b
    assert bufs[3] is c


def test_frame_parses_back_with_prefix_and_part_len() -> None:
    data = b"".join(bytes(x) for x in frame(b"h" * 10, [b"1" * 5, b"", b"2" * 70000]))

    assert split_frames(data) == [(b"h" * 10, [b"1" * 5, b"", b"2" * 70000])]


MESSAGES: list[Any] = [
    Call("counter", "incr", 3, encode_plain([[1], {"by": 2}])),
    Call("counter", "incr", 0, msgspec.Raw(_encode(b"pickle bytes")), True),
    Result(9, OK, encode_plain("value"), False, 2),
    Result(9, CLOSE, NIL),
    Spawn("counter", 4, "mesh", 1, {"hosts": 2, "gpus": 4}, msgspec.Raw(_encode(b"p"))),
    StopActor("counter", 5),
    StopProc(6),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_messages_round_trip_and_are_not_handshakes(msg: Any) -> None:
    data = _encode(msg)
    out = _decode_message(data)

    assert type(out) is type(msg)
    for field in msg.__struct_fields__:
        a, b = getattr(out, field), getattr(msg, field)
        if isinstance(a, msgspec.Raw):
            assert bytes(a) == bytes(b)
        else:
            assert a == b
    with pytest.raises(msgspec.ValidationError):
        _decode_handshake(data)


@pytest.mark.parametrize(
    "msg",
    [Hello(b"n" * 16, "unix:@x"), Challenge(b"n" * 16, b"m" * 32), Auth(b"m" * 32)],
    ids=lambda m: type(m).__name__,
)
def test_handshakes_round_trip_and_are_not_messages(msg: Any) -> None:
    data = _encode(msg)

    assert _decode_handshake(data) == msg
    with pytest.raises(msgspec.ValidationError):
        _decode_message(data)


def test_result_from_a_peer_without_the_newer_fields_gets_defaults() -> None:
    """New fields go last with defaults, so an older peer's shorter Result still decodes."""
    out = _decode_message(msgspec.msgpack.encode([17, 7, OK, msgspec.Raw(b"\x05")]))

    assert isinstance(out, Result)
    assert (out.port, out.status, bytes(out.value)) == (7, OK, b"\x05")
    assert out.pickled is False
    assert out.rank == -1


def test_wire_messages_are_frozen() -> None:
    msg = StopProc(1)

    with pytest.raises(AttributeError):
        msg.reply = 2  # type: ignore[misc]


# ---------------------------------------------------------------- refused before the handshake


async def test_bad_magic_closes_connection_and_logs(
    dial: Dial, logs: pytest.LogCaptureFixture
) -> None:
    peer = await dial()
    peer.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")

    assert await expect_closed(peer.reader) == b""
    assert any("bad frame magic b'GET '" in m for m in errors(logs))


async def test_handshake_header_over_the_limit_is_refused(
    dial: Dial, logs: pytest.LogCaptureFixture
) -> None:
    peer = await dial()
    # Only the prefix: the runtime must refuse before waiting for 4 KiB it will not accept.
    peer.send(PREFIX.pack(MAGIC, MAX_HANDSHAKE_HEADER + 1, 0))

    assert await expect_closed(peer.reader) == b""
    assert any(
        f"{MAX_HANDSHAKE_HEADER + 1} bytes exceeds the limit of {MAX_HANDSHAKE_HEADER}" in m
        for m in errors(logs)
    )


async def test_parts_before_authentication_are_refused(
    dial: Dial, logs: pytest.LogCaptureFixture
) -> None:
    peer = await dial()
    peer.send(wire(Hello(peer.nonce, peer.addr), [b"x" * 100]))

    assert await expect_closed(peer.reader) == b""
    assert any("1 parts refused in state handshake" in m for m in errors(logs))


async def test_silent_peer_is_dropped_after_handshake_timeout(
    dial: Dial, logs: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config, "handshake_timeout", 0.3)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    peer = await dial()

    assert await expect_closed(peer.reader) == b""
    assert loop.time() - t0 >= 0.25
    assert any("did not authenticate within 0.3 s" in m for m in errors(logs))


async def test_peer_that_stops_after_hello_is_dropped_after_handshake_timeout(
    dial: Dial, logs: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config, "handshake_timeout", 0.3)
    peer = await dial()
    await peer.hello()

    assert await expect_closed(peer.reader) == b""
    assert any("did not authenticate within 0.3 s" in m for m in errors(logs))


async def test_message_before_handshake_is_refused_not_dispatched(
    dial: Dial, logs: pytest.LogCaptureFixture
) -> None:
    peer = await dial()
    peer.send(ghost_call(7))

    # No Result: the runtime answers nothing to a peer that has not authenticated.
    assert await expect_closed(peer.reader) == b""
    assert any("undecodable handshake" in m for m in errors(logs))


async def test_auth_before_hello_is_refused(dial: Dial, logs: pytest.LogCaptureFixture) -> None:
    peer = await dial()
    peer.send(wire(Auth(b"m" * 32)))

    assert await expect_closed(peer.reader) == b""
    assert any("sent Auth out of turn" in m for m in errors(logs))


async def test_second_hello_is_refused(dial: Dial, logs: pytest.LogCaptureFixture) -> None:
    peer = await dial()
    await peer.hello()
    peer.send(wire(Hello(os.urandom(16), peer.addr)))

    assert await expect_closed(peer.reader) == b""
    assert any("sent Hello out of turn" in m for m in errors(logs))


# ---------------------------------------------------------------- the handshake


async def test_correct_handshake_opens_the_connection(
    runtime: Runtime, dial: Dial, logs: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config, "handshake_timeout", 0.3)
    peer = await dial()
    challenge = await peer.handshake()

    assert challenge.nonce != peer.nonce
    await peer.call_ghost(7)
    # The runtime now routes messages for our announced address over this connection.
    conn = runtime.conns[peer.addr]
    assert conn.state is State.OPEN
    assert repr(conn) == f"<Connection acceptor peer={peer.addr} open>"
    # An authenticated peer is not dropped when the handshake timeout passes.
    await expect_open(peer.reader, 0.6)
    await peer.call_ghost(8)
    assert errors(logs) == []


async def test_call_in_the_same_write_as_auth_is_served(dial: Dial) -> None:
    peer = await dial()
    challenge = await peer.hello()

    peer.send(wire(Auth(proof(KEY, b"dialer", challenge.nonce, peer.nonce))) + ghost_call(7))

    assert_ghost_error(await read_result(peer.reader), 7)


async def test_each_connection_gets_a_fresh_challenge(dial: Dial) -> None:
    a, b = await dial(), await dial()

    assert (await a.hello()).nonce != (await b.hello()).nonce


async def test_wrong_key_is_refused_and_logged(
    runtime: Runtime, dial: Dial, logs: pytest.LogCaptureFixture
) -> None:
    peer = await dial()
    challenge = await peer.handshake(key=WRONG_KEY)

    # A dialer holding the wrong key sees that the runtime's proof does not verify either.
    assert not verify(WRONG_KEY, b"acceptor", peer.nonce, challenge.nonce, challenge.mac)
    assert await expect_closed(peer.reader) == b""
    assert any(
        m.startswith("refused connection") and "failed to prove the job key" in m
        for m in errors(logs)
    )
    assert peer.addr not in runtime.conns


@pytest.mark.parametrize(
    "make_mac",
    [
        lambda ch, mine: ch.mac,  # reflect the runtime's own proof back
        lambda ch, mine: proof(KEY, b"acceptor", ch.nonce, mine),  # wrong side label
        lambda ch, mine: proof(KEY, b"dialer", mine, ch.nonce),  # nonces swapped
        lambda ch, mine: proof(KEY, b"dialer", ch.nonce, os.urandom(16)),  # another nonce
        lambda ch, mine: b"",
    ],
    ids=["reflected", "wrong-side", "swapped-nonces", "other-nonce", "empty"],
)
async def test_invalid_proof_with_the_right_key_is_refused(
    dial: Dial, logs: pytest.LogCaptureFixture, make_mac: Callable[[Challenge, bytes], bytes]
) -> None:
    peer = await dial()
    challenge = await peer.hello()
    peer.send(wire(Auth(make_mac(challenge, peer.nonce))))

    assert await expect_closed(peer.reader) == b""
    assert any("failed to prove the job key" in m for m in errors(logs))


# ---------------------------------------------------------------- after the handshake


@pytest.mark.parametrize(
    "header",
    [
        b"\xc1",  # never valid msgpack
        b"",
        _encode([99, "unknown tag"]),
        _encode(Call("a", "b", 1, NIL))[:-2],  # truncated
        _encode(Hello(b"n" * 16, "unix:@x")),  # a handshake message after the handshake
    ],
    ids=["bad-msgpack", "empty", "unknown-tag", "truncated", "hello"],
)
async def test_undecodable_header_closes_only_that_connection(
    dial: Dial, logs: pytest.LogCaptureFixture, header: bytes
) -> None:
    bad, good = await dial(), await dial()
    await bad.handshake()
    await good.handshake()
    await bad.call_ghost(1)  # both are open

    bad.send(b"".join(bytes(x) for x in frame(header)))

    assert await expect_closed(bad.reader) == b""
    assert any("undecodable message header" in m for m in errors(logs))
    await good.call_ghost(7)


async def test_header_over_max_header_bytes_is_refused(
    dial: Dial, logs: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config, "max_header_bytes", 1024)
    peer = await dial()
    await peer.handshake()
    peer.send(PREFIX.pack(MAGIC, 1025, 0))

    assert await expect_closed(peer.reader) == b""
    assert any("1025 bytes exceeds the limit of 1024" in m for m in errors(logs))


async def test_frame_over_max_frame_bytes_is_refused_before_its_parts_arrive(
    dial: Dial, logs: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config, "max_frame_bytes", 1 << 20)
    peer = await dial()
    await peer.handshake()
    peer.send(PREFIX.pack(MAGIC, 10, 2) + PART_LEN.pack(1 << 19) + PART_LEN.pack(1 << 19))

    assert await expect_closed(peer.reader) == b""
    assert any("exceeds max_frame_bytes" in m for m in errors(logs))


async def test_frame_with_too_many_parts_is_refused(
    dial: Dial, logs: pytest.LogCaptureFixture
) -> None:
    peer = await dial()
    await peer.handshake()
    peer.send(PREFIX.pack(MAGIC, 10, MAX_PARTS + 1))

    assert await expect_closed(peer.reader) == b""
    assert any(f"{MAX_PARTS + 1} parts refused" in m for m in errors(logs))


async def test_eof_in_the_middle_of_a_frame_is_logged_as_truncated(
    dial: Dial, logs: pytest.LogCaptureFixture
) -> None:
    peer = await dial()
    await peer.handshake()
    data = ghost_call(7, [b"x" * 1000])
    peer.send(data[: len(data) - 10])
    peer.writer.write_eof()

    assert await expect_closed(peer.reader) == b""
    assert any("truncated frame" in m for m in errors(logs))


def record_dispatch(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[Any, list[Any]]]:
    """Record each message the runtime dispatches, with its parts as received."""
    seen: list[tuple[Any, list[Any]]] = []
    dispatch = runtime.dispatch

    def recorder(conn: Connection, msg: Any, parts: list[Any]) -> None:
        seen.append((msg, list(parts)))
        dispatch(conn, msg, parts)

    monkeypatch.setattr(runtime, "dispatch", recorder)
    return seen


@pytest.fixture
def seen(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, list[Any]]]:
    """Each message ``runtime`` dispatches, recorded from before the test's connections
    exist (a connection hands messages to the dispatch it found when it was made)."""
    return record_dispatch(runtime, monkeypatch)


def assert_parts_received(received: list[Any], sent: list[bytes]) -> None:
    assert [bytes(p) for p in received] == sent
    # Writable buffers: numpy arrays and tensors are rebuilt on them without a copy.
    assert all(isinstance(p, bytearray) for p in received)


async def test_call_with_parts_is_parsed_and_the_next_frame_too(
    seen: list[tuple[Any, list[Any]]], dial: Dial
) -> None:
    peer = await dial()
    await peer.handshake()
    parts = [b"a" * (300 << 10), b"b" * 5, b"", bytes(range(256)) * (8 << 10)]
    peer.send(ghost_call(7, parts) + ghost_call(8))

    assert_ghost_error(await read_result(peer.reader), 7)
    assert_ghost_error(await read_result(peer.reader), 8)
    assert [m.reply for m, _ in seen] == [7, 8]
    assert_parts_received(seen[0][1], parts)
    assert seen[1][1] == []


async def test_large_parts_of_one_size_reuse_one_pooled_buffer(
    seen: list[tuple[Any, list[Any]]], dial: Dial
) -> None:
    peer = await dial()
    await peer.handshake()
    part = b"p" * (4 << 20)
    peer.send(ghost_call(1, [part]))
    assert_ghost_error(await read_result(peer.reader), 1)
    first = seen.pop()[1][0]
    first_id = id(first)
    del first
    peer.send(ghost_call(2, [part]))
    assert_ghost_error(await read_result(peer.reader), 2)
    assert id(seen[-1][1][0]) == first_id and bytes(seen[-1][1][0]) == part


async def test_strangers_past_the_cap_are_refused_and_members_still_served(
    runtime: Runtime, dial: Dial, logs: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config, "max_unauthenticated", 3)
    logs.set_level(logging.ERROR, logger="danaus.runtime")
    strangers = [await dial() for _ in range(3)]
    for s in strangers:
        await expect_open(s.reader, 0.05)
    extra = await dial()
    assert await expect_closed(extra.reader) == b""
    assert any(
        "already waiting to authenticate" in r.getMessage()
        for r in logs.records
        if r.name == "danaus.runtime"
    )
    await strangers[0].handshake()  # one of them authenticates: a slot frees up
    await strangers[0].call_ghost(5)
    late = await dial()
    await late.handshake()
    await late.call_ghost(6)


# ---------------------------------------------------------------- the runtime as dialer


@pytest.fixture
async def raw_acceptor() -> AsyncIterator[tuple[str, asyncio.Queue[Any]]]:
    """A listening unix socket that hands each accepted (reader, writer) to the test."""
    accepted: asyncio.Queue[Any] = asyncio.Queue()
    writers: list[asyncio.StreamWriter] = []

    async def on_connect(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        writers.append(w)
        await accepted.put((r, w))

    name = f"danaus-test-acceptor-{secrets.token_hex(6)}"
    server = await asyncio.start_unix_server(on_connect, "\0" + name)
    yield f"unix:@{name}", accepted
    for w in writers:
        w.close()
        with contextlib.suppress(ConnectionError):
            await w.wait_closed()
    server.close()
    await server.wait_closed()


def reply_port(runtime: Runtime) -> tuple[int, asyncio.Future[tuple[int, int, Any]]]:
    fut: asyncio.Future[tuple[int, int, Any]] = asyncio.get_running_loop().create_future()

    def handler(rank: int, status: int, value: Any) -> bool:
        fut.set_result((rank, status, value))
        return True

    return runtime.open_port(handler), fut


async def test_runtime_as_dialer_authenticates_then_sends_queued_calls(
    runtime: Runtime, raw_acceptor: tuple[str, asyncio.Queue[Any]]
) -> None:
    addr, accepted = raw_acceptor
    port, reply = reply_port(runtime)
    # Sent before the connection exists: queued until the handshake is done.
    runtime.send_call(addr, "counter", "value", port, 3, encode_plain([[], {}]), False, [])
    conn = runtime.conns[addr]
    assert repr(conn) == f"<Connection dialer peer={addr} handshake>"
    reader, writer = await asyncio.wait_for(accepted.get(), TIMEOUT)

    hello = _decode_handshake((await read_frame(reader))[0])
    assert isinstance(hello, Hello)
    assert hello.addr == runtime.addr
    nonce = os.urandom(16)
    writer.write(wire(Challenge(nonce, proof(KEY, b"acceptor", hello.nonce, nonce))))
    auth = _decode_handshake((await read_frame(reader))[0])
    assert isinstance(auth, Auth)
    assert verify(KEY, b"dialer", nonce, hello.nonce, auth.mac)
    assert repr(conn) == f"<Connection dialer peer={addr} open>"

    call = _decode_message((await read_frame(reader))[0])
    assert isinstance(call, Call)
    assert (call.actor, call.method, call.reply) == ("counter", "value", port)
    writer.write(wire(Result(port, OK, encode_plain(42), False, 3)))
    assert await asyncio.wait_for(reply, TIMEOUT) == (3, OK, 42)


async def test_runtime_as_dialer_refuses_an_acceptor_without_the_key(
    runtime: Runtime,
    raw_acceptor: tuple[str, asyncio.Queue[Any]],
    logs: pytest.LogCaptureFixture,
) -> None:
    addr, accepted = raw_acceptor
    port, reply = reply_port(runtime)
    runtime.send_call(addr, "counter", "value", port, 3, encode_plain([[], {}]), False, [])
    conn = runtime.conns[addr]
    reader, writer = await asyncio.wait_for(accepted.get(), TIMEOUT)

    hello = _decode_handshake((await read_frame(reader))[0])
    assert isinstance(hello, Hello)
    nonce = os.urandom(16)
    writer.write(wire(Challenge(nonce, proof(WRONG_KEY, b"acceptor", hello.nonce, nonce))))

    # Neither an Auth nor the queued call reaches a peer that did not prove the key.
    assert await expect_closed(reader) == b""
    assert any(
        m.startswith("refused connection") and "failed to prove the job key" in m
        for m in errors(logs)
    )
    rank, status, exc = await asyncio.wait_for(reply, TIMEOUT)
    assert (rank, status) == (3, ERROR)
    assert isinstance(exc, SupervisionError)
    assert addr in str(exc)
    assert isinstance(conn.close_reason, AuthenticationError)
    assert repr(conn) == f"<Connection dialer peer={addr} closed>"
    assert addr not in runtime.conns


# ---------------------------------------------------------------- chunked input, fed directly


class FakeTransport:
    """Collects what the Connection writes; the test feeds it bytes via get_buffer."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.aborted = False
        self.closed = False
        self.paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def write(self, data: Buffer) -> None:
        self.out += data

    def writelines(self, bufs: Sequence[Buffer]) -> None:
        for b in bufs:
            self.out += b

    def abort(self) -> None:
        self.aborted = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def take(self) -> list[tuple[bytes, list[bytes]]]:
        frames = split_frames(bytes(self.out))
        self.out.clear()
        return frames


def feed(conn: Connection, data: bytes, chunk: int) -> None:
    """Deliver ``data`` to ``conn`` the way a transport does, ``chunk`` bytes at a time."""
    i = 0
    while i < len(data):
        buf = conn.get_buffer(-1)
        n = min(chunk, len(buf), len(data) - i)
        assert n > 0
        buf[:n] = data[i : i + n]
        conn.buffer_updated(n)
        i += n


@pytest.fixture
def acceptor(runtime: Runtime, seen: list[tuple[Any, list[Any]]]) -> Any:
    """A real acceptor-side Connection of ``runtime`` on a fake transport."""
    conn = Connection(runtime, dialer=False)
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    yield conn, transport
    conn.connection_lost(None)


def handshake_fed(conn: Connection, transport: FakeTransport, chunk: int) -> None:
    nonce = os.urandom(16)
    feed(conn, wire(Hello(nonce, "unix:@danaus-test-fed")), chunk)
    [(header, _)] = transport.take()
    challenge = _decode_handshake(header)
    assert isinstance(challenge, Challenge)
    feed(conn, wire(Auth(proof(KEY, b"dialer", challenge.nonce, nonce))), chunk)
    assert conn.state is State.OPEN


def fed_results(transport: FakeTransport) -> list[Result]:
    out = []
    for header, parts in transport.take():
        msg = _decode_message(header)
        assert isinstance(msg, Result)
        assert parts == []
        out.append(msg)
    return out


async def test_frames_fed_one_byte_at_a_time_are_parsed(acceptor: Any) -> None:
    conn, transport = acceptor
    handshake_fed(conn, transport, chunk=1)

    feed(conn, ghost_call(7), chunk=1)

    [result] = fed_results(transport)
    assert_ghost_error(result, 7)
    assert not transport.aborted


@pytest.mark.parametrize("chunk", [1, 7, 4093, 1 << 20])
async def test_frames_with_large_parts_and_headers_fed_in_chunks_are_parsed(
    seen: list[tuple[Any, list[Any]]], acceptor: Any, chunk: int
) -> None:
    conn, transport = acceptor
    handshake_fed(conn, transport, chunk=chunk)
    parts = [b"a" * 100, bytes(range(256)) * 280, b"", bytes(range(251)) * 4200]
    huge_header = wire(Call("ghost", "m" * (400 << 10), 9, encode_plain([[], {}])))
    data = ghost_call(7, parts) + huge_header + ghost_call(8)
    if chunk == 1:
        data = ghost_call(7, parts[:2]) + ghost_call(8)  # a 1 MiB byte-by-byte feed is slow

    feed(conn, data, chunk)

    ports = [r.port for r in fed_results(transport)]
    assert ports == ([7, 8] if chunk == 1 else [7, 9, 8])
    assert [m.reply for m, _ in seen] == ports
    assert_parts_received(seen[0][1], parts[:2] if chunk == 1 else parts)
    if chunk != 1:
        assert len(seen[1][0].method) == 400 << 10
    assert not transport.aborted


async def test_a_claimed_huge_part_costs_memory_only_as_its_bytes_arrive(
    seen: list[tuple[Any, list[Any]]], acceptor: Any
) -> None:
    conn, transport = acceptor
    handshake_fed(conn, transport, chunk=4096)
    n = 256 << 20
    header = msgspec.msgpack.encode(Call("ghost", "m", 9, encode_plain([[], {}])))
    # A 30-byte prefix claims a 256 MiB part; then 3 MiB of it come, and the peer stalls.
    feed(conn, PREFIX.pack(MAGIC, len(header), 1) + PART_LEN.pack(n) + header, 4096)
    feed(conn, b"x" * (3 << 20), 1 << 20)
    held = len(conn.get_buffer(-1)) + (3 << 20)  # what is allocated for that part so far
    assert held <= 8 << 20, f"{held >> 20} MiB held for 3 MiB received"
    assert seen == []
    # The rest arrives: the frame is whole and correct.
    rest = n - (3 << 20)
    chunk = b"y" * (16 << 20)
    while rest:
        k = min(rest, len(chunk))
        feed(conn, chunk[:k], 4 << 20)
        rest -= k
    [(msg, parts)] = seen
    assert msg.reply == 9 and len(parts[0]) == n
    assert bytes(parts[0][(3 << 20) - 2 : (3 << 20) + 2]) == b"xxyy"


async def test_bad_frame_fed_directly_aborts_the_transport(
    acceptor: Any, logs: pytest.LogCaptureFixture
) -> None:
    conn, transport = acceptor
    handshake_fed(conn, transport, chunk=3)

    feed(conn, b"XXXX" + b"\x00" * 8, chunk=1)

    assert transport.aborted
    assert conn.state is State.CLOSED
    assert repr(conn) == "<Connection acceptor peer=unix:@danaus-test-fed closed>"
    assert any("bad frame magic b'XXXX'" in m for m in errors(logs))
    # Bytes arriving after the failure are ignored, not dispatched.
    feed(conn, ghost_call(7), chunk=1 << 20)
    assert transport.take() == []


# ---------------------------------------------------------------- liveness, failing, flushing


def sent_messages(transport: FakeTransport) -> list[Any]:
    return [_decode_message(h) for h, _ in transport.take()]


async def test_heartbeat_pings_a_quiet_peer_and_fails_a_silent_one(
    acceptor: Any, logs: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config, "heartbeat_interval", 2.0)
    monkeypatch.setattr(config, "heartbeat_timeout", 10.0)
    conn, transport = acceptor
    handshake_fed(conn, transport, chunk=1 << 20)

    conn.heartbeat(100.0)  # the peer said something since the last look: alive, quiet
    assert sent_messages(transport) == []
    conn.heartbeat(101.0)  # quiet for less than the interval
    assert sent_messages(transport) == []
    conn.heartbeat(102.0)  # quiet for an interval: are you alive?
    assert sent_messages(transport) == [Ping()]
    feed(conn, ghost_call(7), chunk=1 << 20)  # it answers (anything counts)
    transport.take()
    conn.heartbeat(111.0)
    assert sent_messages(transport) == []
    conn.heartbeat(121.5)  # silent past heartbeat_timeout since then
    assert conn.state is State.CLOSED and transport.aborted
    assert isinstance(conn.close_reason, SupervisionError)
    assert "did not answer for 10.0 s" in str(conn.close_reason)
    conn.heartbeat(122.0)  # a closed connection is left alone
    assert sent_messages(transport) == []


async def test_heartbeat_of_a_connection_held_by_a_full_mailbox_says_we_are_alive(
    acceptor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config, "heartbeat_timeout", 10.0)
    conn, transport = acceptor
    handshake_fed(conn, transport, chunk=1 << 20)
    conn.heartbeat(100.0)
    holder = object()
    conn.hold_reading(holder)

    assert transport.paused

    conn.heartbeat(200.0)  # the peer's silence says nothing: we stopped reading

    assert conn.state is State.OPEN
    assert sent_messages(transport) == [Ping()]
    conn.release_reading(holder)
    assert not transport.paused


async def test_heartbeat_leaves_a_connection_still_in_its_handshake_alone(acceptor: Any) -> None:
    conn, transport = acceptor

    conn.heartbeat(1e9)

    assert conn.state is State.HANDSHAKE and not transport.aborted


async def test_fail_closes_logs_and_keeps_the_first_reason(
    acceptor: Any, logs: pytest.LogCaptureFixture
) -> None:
    from danaus.errors import ProtocolError

    conn, transport = acceptor
    handshake_fed(conn, transport, chunk=1 << 20)

    conn.fail(ProtocolError("bad bytes"))
    conn.fail(ProtocolError("later"))

    assert transport.aborted and conn.state is State.CLOSED
    assert str(conn.close_reason) == "bad bytes"
    assert errors(logs) == ["closing connection from unix:@danaus-test-fed: bad bytes"]
    assert not conn.send(StopProc(1))


async def test_flush_writes_what_a_burst_queued_at_once(acceptor: Any) -> None:
    conn, transport = acceptor
    handshake_fed(conn, transport, chunk=1 << 20)
    assert conn.batch_begin()
    for port in (1, 2, 3):
        conn.send(StopProc(port))
    assert transport.out == b""  # queued until the burst ends

    conn.flush()

    assert sent_messages(transport) == [StopProc(1), StopProc(2), StopProc(3)]
    conn.batch_end()
    assert transport.out == b""


async def test_a_connection_to_a_lost_peer_is_closed_from_the_start(runtime: Runtime) -> None:
    reason = ConnectionResetError("gone")

    conn = Connection.lost(runtime, "unix:@danaus-test-gone", reason)

    assert conn.state is State.CLOSED and conn.close_reason is reason
    assert repr(conn) == "<Connection dialer peer=unix:@danaus-test-gone closed>"
    assert not conn.send(StopProc(1))


async def test_a_full_mailbox_holds_the_rest_of_the_buffer_until_it_lets_go(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = object()
    got: list[int] = []
    last = asyncio.get_running_loop().create_future()

    def dispatch(conn: Connection, msg: Any, parts: list[Any]) -> None:
        got.append(msg.reply)
        if msg.reply == 1:
            conn.hold_reading(holder)  # what a mailbox past its limit does
        if msg.reply == 3:
            last.set_result(None)

    monkeypatch.setattr(runtime, "dispatch", dispatch)
    conn = Connection(runtime, dialer=False)
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    try:
        handshake_fed(conn, transport, chunk=1 << 20)

        feed(conn, ghost_call(1) + ghost_call(2, [b"p"]) + ghost_call(3), chunk=1 << 20)

        assert got == [1] and transport.paused
        conn.release_reading(holder)
        assert not transport.paused
        await asyncio.wait_for(last, TIMEOUT)  # the rest, parsed from the buffer, in order
        assert got == [1, 2, 3]
    finally:
        conn.connection_lost(None)


async def test_nothing_more_is_dispatched_once_a_message_closed_the_connection(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    from danaus.errors import ProtocolError

    got: list[int] = []

    def dispatch(conn: Connection, msg: Any, parts: list[Any]) -> None:
        got.append(msg.reply)
        conn.fail(ProtocolError("handler refused it"))

    monkeypatch.setattr(runtime, "dispatch", dispatch)
    conn = Connection(runtime, dialer=False)
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    try:
        handshake_fed(conn, transport, chunk=1 << 20)

        feed(conn, ghost_call(1) + ghost_call(2, [b"p"]) + ghost_call(3), chunk=1 << 20)

        assert got == [1]
        assert transport.aborted and conn.state is State.CLOSED
    finally:
        conn.connection_lost(None)
