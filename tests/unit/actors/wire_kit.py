"""What the wire tests share: a hand-written peer (raw asyncio streams, frames built
from ``PREFIX``/``PART_LEN``, the handshake done by the test) and helpers that read and
check what the runtime sends back."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec
import pytest

from danaus._auth import proof, verify
from danaus.actors._connection import Connection
from danaus.actors._runtime import Runtime
from danaus.actors._serialize import encode_plain
from danaus.actors._wire import (
    ERROR,
    MAGIC,
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
    Result,
    frame,
)

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


def assert_parts_received(received: list[Any], sent: list[bytes]) -> None:
    assert [bytes(p) for p in received] == sent
    # Writable buffers: numpy arrays and tensors are rebuilt on them without a copy.
    assert all(isinstance(p, bytearray) for p in received)
