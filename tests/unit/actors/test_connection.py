"""Tests of danaus.actors._connection fed bytes directly (any chunking, huge claimed
parts, bad frames), of its liveness, failing and flushing, and of the runtime as the
dialer of a hand-written acceptor. The same peer kit as test_wire.py (wire_kit.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgspec
import pytest

from danaus._auth import proof, verify
from danaus.actors._connection import Connection, State
from danaus.actors._runtime import Runtime
from danaus.actors._serialize import encode_plain
from danaus.actors._wire import (
    ERROR,
    MAGIC,
    OK,
    PART_LEN,
    PREFIX,
    Auth,
    Buffer,
    Call,
    CallSpec,
    Challenge,
    Hello,
    Ping,
    Result,
    StopProc,
)
from danaus.config import config
from danaus.errors import AuthenticationError, SupervisionError

from .wire_kit import (
    KEY,
    TIMEOUT,
    WRONG_KEY,
    _decode_handshake,
    _decode_message,
    assert_ghost_error,
    assert_parts_received,
    errors,
    expect_closed,
    ghost_call,
    read_frame,
    split_frames,
    wire,
)

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
    runtime.send_call(addr, 3, port, CallSpec("counter", "value", encode_plain([[], {}])))
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


async def test_a_dial_reset_before_a_word_dials_again_and_keeps_the_queued_call(
    runtime: Runtime, raw_acceptor: tuple[str, asyncio.Queue[Any]]
) -> None:
    # A listener shedding strangers resets the newest connection before saying anything:
    # the peer is not lost; the dial is tried again with what was queued on it.
    addr, accepted = raw_acceptor
    port, reply = reply_port(runtime)
    runtime.send_call(addr, 3, port, CallSpec("counter", "value", encode_plain([[], {}])))
    first = runtime.conns[addr]
    _, writer = await asyncio.wait_for(accepted.get(), TIMEOUT)
    writer.transport.abort()  # reset, not a byte sent
    reader, writer = await asyncio.wait_for(accepted.get(), TIMEOUT)
    assert addr not in runtime.lost
    again = runtime.conns[addr]
    assert again is not first and again.redials == 1

    hello = _decode_handshake((await read_frame(reader))[0])
    assert isinstance(hello, Hello)
    nonce = os.urandom(16)
    writer.write(wire(Challenge(nonce, proof(KEY, b"acceptor", hello.nonce, nonce))))
    assert isinstance(_decode_handshake((await read_frame(reader))[0]), Auth)
    call = _decode_message((await read_frame(reader))[0])
    assert isinstance(call, Call) and call.reply == port
    writer.write(wire(Result(port, OK, encode_plain(42), False, 3)))
    assert await asyncio.wait_for(reply, TIMEOUT) == (3, OK, 42)


async def test_a_dial_reset_on_every_try_fails_once_the_connect_timeout_passed(
    runtime: Runtime, raw_acceptor: tuple[str, asyncio.Queue[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config, "connect_timeout", 0.3)
    addr, accepted = raw_acceptor
    port, reply = reply_port(runtime)
    runtime.send_call(addr, 3, port, CallSpec("counter", "value", encode_plain([[], {}])))
    tries = 0

    async def reset_all() -> None:
        nonlocal tries
        while True:
            _, writer = await accepted.get()
            tries += 1
            writer.transport.abort()

    resetter = asyncio.ensure_future(reset_all())
    try:
        _, status, error = await asyncio.wait_for(reply, TIMEOUT)
    finally:
        resetter.cancel()
    assert status == ERROR and isinstance(error, SupervisionError), error
    assert "connection lost" in str(error)
    assert tries > 1 and addr in runtime.lost


async def test_runtime_as_dialer_refuses_an_acceptor_without_the_key(
    runtime: Runtime,
    raw_acceptor: tuple[str, asyncio.Queue[Any]],
    logs: pytest.LogCaptureFixture,
) -> None:
    addr, accepted = raw_acceptor
    port, reply = reply_port(runtime)
    runtime.send_call(addr, 3, port, CallSpec("counter", "value", encode_plain([[], {}])))
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
