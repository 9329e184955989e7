"""Tests of the frame layout (danaus.actors._wire) and of danaus.actors._connection (the
frame reader and handshake at work in a connection), against a real Runtime over real
unix sockets. The reader alone, without sockets: test_frames.py; the handshake alone:
test_handshake.py; a connection fed bytes directly, and the runtime as dialer:
test_connection.py.

The peer side is written by hand here (raw asyncio streams, frames built from
``PREFIX``/``PART_LEN``), so these tests check the wire protocol itself, not danaus
talking to danaus.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import pytest

from danaus._auth import proof, verify
from danaus.actors._connection import State
from danaus.actors._runtime import Runtime
from danaus.actors._serialize import encode_plain
from danaus.actors._wire import (
    CLOSE,
    MAGIC,
    MAX_HANDSHAKE_HEADER,
    MAX_PARTS,
    NIL,
    OK,
    PART_LEN,
    PREFIX,
    Auth,
    Call,
    Challenge,
    Hello,
    Result,
    Spawn,
    StopActor,
    StopProc,
    frame,
)
from danaus.config import config

from .wire_kit import (
    KEY,
    WRONG_KEY,
    Dial,
    _decode_handshake,
    _decode_message,
    _encode,
    assert_ghost_error,
    assert_parts_received,
    errors,
    expect_closed,
    expect_open,
    ghost_call,
    read_result,
    split_frames,
    wire,
)

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


async def test_past_the_cap_the_stranger_that_waited_longest_makes_room_for_a_newcomer(
    runtime: Runtime, dial: Dial, logs: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config, "max_unauthenticated", 3)
    strangers = [await dial() for _ in range(3)]
    for s in strangers:
        await expect_open(s.reader, 0.05)
    # The newcomer may be the job's own peer dialing for the first time: it stays, and
    # the connection that waited longest goes.
    newcomer = await dial()
    assert await expect_closed(strangers[0].reader) == b""
    for s in strangers[1:]:
        await expect_open(s.reader, 0.05)
    assert any(
        m.startswith("refused connection(s) before they authenticated: 1 since")
        and "this one waited longest" in m
        for m in errors(logs)
    )
    await newcomer.handshake()
    await newcomer.call_ghost(5)
    await strangers[1].handshake()  # the others that stayed may still authenticate
    await strangers[1].call_ghost(6)
