"""On TCP without TLS every frame after the handshake is bound to the session: an on-path
relay that forwarded a real handshake cannot inject, replay or alter frames afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from danaus.actors._future import Future
from danaus.actors._handlers import ProcControl, install_actor
from danaus.actors._runtime import Runtime
from danaus.actors._wire import Call, CallSpec, frame

KEY = b"k" * 32
TIMEOUT = 10.0


class _Relay:
    """A TCP man in the middle: forwards both ways, and can write its own bytes into
    the dialer -> acceptor stream."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.upstream: asyncio.StreamWriter | None = None
        self.relayed = asyncio.Event()  # the acceptor answered something
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._on_client, "127.0.0.1", 0)
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def _on_client(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection(*self.target)
        self.upstream = uw
        self._writers += [w, uw]

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, back: bool) -> None:
            while data := await src.read(65536):
                dst.write(data)
                if back:
                    self.relayed.set()
            dst.close()

        for t in (pump(r, uw, False), pump(ur, w, True)):
            task = asyncio.ensure_future(t)
            self._tasks.add(task)

    async def aclose(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for w in self._writers:
            w.close()
            with contextlib.suppress(ConnectionError):
                await w.wait_closed()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Runtime, Runtime, _Relay]]:
    """A dialing and an accepting runtime on TCP, with a relay between them."""
    loop = asyncio.get_running_loop()
    acceptor = Runtime(loop, addr="tcp://127.0.0.1:0", key=KEY)
    install_actor(acceptor, "__proc__", ProcControl())
    host, port = acceptor.addr.removeprefix("tcp://").rsplit(":", 1)
    relay = _Relay((host, int(port)))
    relay_port = await relay.start()
    dialer = Runtime(loop, addr=f"unix:@danaus-test-{secrets.token_hex(8)}", key=KEY)
    try:
        yield dialer, acceptor, relay
    finally:
        await dialer.aclose()
        await acceptor.aclose()
        await relay.aclose()
        del relay_port


async def _pid_through(dialer: Runtime, addr: str) -> Any:
    fut: Future[Any] = Future(loop=dialer.loop)
    port = dialer.open_future_port(fut)
    dialer.send_call(
        addr, 0, port, CallSpec("__proc__", "pid", msgspec.Raw(msgspec.msgpack.encode([[], {}])))
    )
    return await asyncio.wait_for(fut, TIMEOUT)


class _Exploit:
    """Unpickling this runs code: what an injected pickled argument could do."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (Path(self.path),))


async def test_a_relay_cannot_inject_a_frame_after_a_real_handshake(
    pair: tuple[Runtime, Runtime, _Relay], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dialer, acceptor, relay = pair
    assert relay.server is not None
    relay_addr = f"tcp://127.0.0.1:{relay.server.sockets[0].getsockname()[1]}"
    # A real session goes through the relay: the handshake and one call.
    assert await _pid_through(dialer, relay_addr) == os.getpid()
    assert relay.upstream is not None
    # The relay writes its own frame: a call whose pickled argument runs code.
    marker = tmp_path / "injected"
    payload = msgspec.msgpack.encode(pickle.dumps(([_Exploit(str(marker))], {})))
    forged = Call("__proc__", "pid", 0, msgspec.Raw(payload), True, 0)
    caplog.set_level(logging.ERROR, logger="danaus.connection")
    conn = next(c for c in acceptor._all_conns if c.peer == dialer.addr)
    closed = asyncio.get_running_loop().create_future()
    acceptor.on_lost.append(lambda addr: closed.done() or closed.set_result(addr))
    relay.upstream.write(b"".join(bytes(b) for b in frame(msgspec.msgpack.encode(forged))))
    assert await asyncio.wait_for(closed, TIMEOUT) == dialer.addr
    assert not marker.exists(), "the injected pickle ran"
    assert conn.close_reason is not None and "failed authentication" in str(conn.close_reason)
    assert any("failed authentication" in r.getMessage() for r in caplog.records)
    # The acceptor keeps serving: a new session (a runtime that never saw this one
    # fail: a lost peer stays lost for the one that lost it) works.
    other = Runtime(
        asyncio.get_running_loop(), addr=f"unix:@danaus-test-{secrets.token_hex(8)}", key=KEY
    )
    try:
        assert await _pid_through(other, acceptor.addr) == os.getpid()
    finally:
        await other.aclose()


async def test_tagged_frames_with_parts_round_trip(pair: tuple[Runtime, Runtime, _Relay]) -> None:
    from danaus.actors._serialize import dumps_args
    from danaus.errors import ActorError

    dialer, _, relay = pair
    assert relay.server is not None
    relay_addr = f"tcp://127.0.0.1:{relay.server.sockets[0].getsockname()[1]}"
    for _ in range(3):  # sequence numbers advance on both sides
        assert await _pid_through(dialer, relay_addr) == os.getpid()
    # A frame with out-of-band parts (a 1 MiB argument): it passes authentication and
    # reaches the endpoint (which takes no argument, so it answers with an error).
    raw, pickled, parts = dumps_args((b"x" * (1 << 20),), {}, lambda: "args")
    assert parts
    fut: Future[Any] = Future(loop=dialer.loop)
    port = dialer.open_future_port(fut)
    dialer.send_call(relay_addr, 0, port, CallSpec("__proc__", "pid", raw, pickled, parts))
    with pytest.raises(ActorError, match="positional argument"):
        await asyncio.wait_for(fut, TIMEOUT)
    assert await _pid_through(dialer, relay_addr) == os.getpid()
