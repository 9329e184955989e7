"""The raw machinery under the floors in ``_floors``: a minimal length-prefixed msgpack
framing on asyncio protocols, and the child processes, listeners and blocking socket
helpers the floors use, each wait bounded by a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import msgspec
import uvloop

# How long a child gets to start up and connect, and to exit after its peer is gone.
CONNECT_TIMEOUT_S = 30.0
_EXIT_TIMEOUT_S = 10.0
# Bound on any single blocking socket operation in the bulk floors.
IO_TIMEOUT_S = 60.0
BULK_SOCKBUF = 4 << 20
# Flush a burst of small frames about every 4 KB so the two processes overlap.
_FLUSH_BYTES = 4096
_PAYLOAD = bytes(range(16))
_HDR = struct.Struct("<I")
_REPO_ROOT = str(Path(__file__).resolve().parents[1])


class Msg(msgspec.Struct, array_like=True, frozen=True):
    """The small message of the RPC floors: 1 + 1 to 5 + 18 bytes of msgpack."""

    id: int
    payload: bytes


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Msg)


def _append_frame(out: bytearray, msg: Msg) -> None:
    """Appends `msg` to `out` as a 4-byte little-endian length and its msgpack."""
    start = len(out)
    _encoder.encode_into(msg, out, start + 4)  # pads the gap for the length
    _HDR.pack_into(out, start, len(out) - start - 4)


# -- the length-prefixed asyncio.Protocol shared by both ends of the RPC floors --


class _Framed(asyncio.Protocol):
    """Splits the byte stream into `Msg` frames and hands each read's to `on_messages`."""

    def __init__(self, closed: asyncio.Future[None]) -> None:
        self._buf = bytearray()
        self._closed = closed
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._closed.done():
            if exc is None:
                self._closed.set_result(None)
            else:
                self._closed.set_exception(exc)
        self.on_lost(exc)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        if buf:
            buf += data
            # Decoded messages copy their bytes, so the view is released before the
            # consumed prefix is deleted (a live export would make `del` fail).
            with memoryview(buf) as view:
                msgs, pos = _split(view)
            del buf[:pos]
        else:
            msgs, pos = _split(memoryview(data))
            if pos < len(data):
                buf += data[pos:]
        if msgs:
            self.on_messages(msgs)

    def on_messages(self, msgs: list[Msg]) -> None:
        raise NotImplementedError

    def on_lost(self, exc: Exception | None) -> None:
        pass

    def send(self, msgs: Sequence[Msg]) -> None:
        """Writes `msgs` as one burst, flushed about every 4 KB."""
        transport = self.transport
        assert transport is not None
        out = bytearray()
        for msg in msgs:
            _append_frame(out, msg)
            if len(out) >= _FLUSH_BYTES:
                transport.write(out)
                out = bytearray()
        if out:
            transport.write(out)


def _split(view: memoryview) -> tuple[list[Msg], int]:
    """Decodes the complete frames at the start of `view`; returns them and the bytes used."""
    msgs: list[Msg] = []
    pos = 0
    end = len(view)
    decode = _decoder.decode
    while end - pos >= 4:
        (size,) = _HDR.unpack_from(view, pos)
        stop = pos + 4 + size
        if stop > end:
            break
        msgs.append(decode(view[pos + 4 : stop]))
        pos = stop
    return msgs, pos


class Echo(_Framed):
    """The child's end: sends every message back, one burst per read."""

    def on_messages(self, msgs: list[Msg]) -> None:
        self.send(msgs)


class PingPong(_Framed):
    """The parent's end of the ping-pong: one message in flight, one sample per round trip."""

    def __init__(self, closed: asyncio.Future[None], total: int) -> None:
        super().__init__(closed)
        self._total = total
        self._next_id = 0
        self._t0 = 0.0
        self.samples: list[float] = []
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def start(self) -> None:
        self._send_one()

    def _send_one(self) -> None:
        self._t0 = time.perf_counter()
        self.send((Msg(self._next_id, _PAYLOAD),))

    def on_messages(self, msgs: list[Msg]) -> None:
        t1 = time.perf_counter()
        if len(msgs) != 1 or msgs[0].id != self._next_id:
            self._fail(RuntimeError(f"ping-pong out of step: expected id {self._next_id}"))
            return
        self.samples.append(t1 - self._t0)
        self._next_id += 1
        if self._next_id < self._total:
            self._send_one()
        elif not self.done.done():
            self.done.set_result(None)

    def on_lost(self, exc: Exception | None) -> None:
        self._fail(ConnectionError(f"echo child closed the connection early: {exc!r}"))

    def _fail(self, exc: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(exc)


class Pipelined(_Framed):
    """The parent's end of the pipelined floor: keeps `inflight` messages outstanding."""

    def __init__(self, closed: asyncio.Future[None]) -> None:
        super().__init__(closed)
        self._loop = asyncio.get_running_loop()
        self._total = 0
        self._sent = 0
        self._received = 0
        self.done: asyncio.Future[float] = self._loop.create_future()

    def begin(self, total: int, inflight: int) -> asyncio.Future[float]:
        """Starts a run of `total` messages; the future gives the time the last reply came."""
        self._total = total
        self._sent = 0
        self._received = 0
        self.done = self._loop.create_future()
        self._send_more(min(inflight, total))
        return self.done

    def _send_more(self, count: int) -> None:
        first = self._sent
        self._sent += count
        self.send([Msg(i, _PAYLOAD) for i in range(first, first + count)])

    def on_messages(self, msgs: list[Msg]) -> None:
        self._received += len(msgs)
        more = min(len(msgs), self._total - self._sent)
        if more > 0:
            self._send_more(more)
        if self._received >= self._total and not self.done.done():
            self.done.set_result(time.perf_counter())

    def on_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(
                ConnectionError(f"echo child closed the connection early: {exc!r}")
            )


# -- process and socket plumbing --


def require_no_running_loop(name: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(
        f"{name}() blocks and runs its own event loop; call it from synchronous code "
        "(for example in a thread via asyncio.to_thread), not inside a running loop"
    )


#: When set, the floor's child process is pinned to these CPUs (the caller pins itself),
#: so a floor can be measured in the same placement as the benchmark it is compared with.
CHILD_CPUS: set[int] | None = None


def pin_children(cpus: set[int] | None) -> None:
    """Pin the child process of every floor measured from now on to ``cpus`` (None: no
    pinning)."""
    global CHILD_CPUS
    CHILD_CPUS = cpus


def abstract_name() -> str:
    """A fresh abstract-namespace socket name, without its leading NUL (argv can't hold one)."""
    return f"danaus-bench-{os.getpid()}-{os.urandom(6).hex()}"


@contextlib.contextmanager
def child(*args: str) -> Iterator[subprocess.Popen[bytes]]:
    """Runs `_child_main(args)` in a fresh interpreter and always reaps it.

    On a clean exit from the block the child gets `_EXIT_TIMEOUT_S` to finish on its own
    (it exits when its peer closes the connection); on an error it is killed at once.
    """
    boot = (
        f"import sys; sys.path.insert(0, {_REPO_ROOT!r}); "
        "from bench._floors import _child_main; _child_main(sys.argv[1:])"
    )
    proc = subprocess.Popen([sys.executable, "-c", boot, *args], stdin=subprocess.DEVNULL)
    if CHILD_CPUS:
        os.sched_setaffinity(proc.pid, CHILD_CPUS)
    try:
        yield proc
    except BaseException:
        proc.kill()
        raise
    finally:
        try:
            proc.wait(timeout=_EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=_EXIT_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child {args!r} exited with status {proc.returncode}")


def make_listener(
    family: socket.AddressFamily, address: str | tuple[str, int], bufsize: int | None = None
) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if bufsize is not None:
            # Before listen(): accepted sockets inherit it, and TCP picks its window
            # scale from the receive buffer at handshake time.
            set_bufs(sock, bufsize)
        sock.bind(address)
        sock.listen(1)
    except BaseException:
        sock.close()
        raise
    return sock


def accept(listener: socket.socket, proc: subprocess.Popen[bytes]) -> socket.socket:
    """Accepts the child's connection, failing fast if the child dies first."""
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    listener.settimeout(0.05)
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"benchmark child exited with status {proc.returncode} before connecting"
                ) from None
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"benchmark child did not connect within {CONNECT_TIMEOUT_S:.0f} s"
                ) from None
            continue
        conn.settimeout(None)
        return conn


def set_bufs(sock: socket.socket, size: int) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    """Fills `view` from `sock` in place."""
    pos = 0
    total = len(view)
    while pos < total:
        got = sock.recv_into(view[pos:])
        if got == 0:
            raise ConnectionError(f"peer closed after {pos} of {total} bytes")
        pos += got


def new_runner() -> asyncio.Runner:
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


async def close(
    transport: asyncio.BaseTransport,
    closed: asyncio.Future[None],
    done: asyncio.Future[Any],
) -> None:
    """Closes `transport` and waits (bounded) for `connection_lost`, so nothing leaks.

    `done` is the run's result future; on an error path nobody awaits it, so its
    exception is fetched here to keep asyncio from logging it as never retrieved.
    """
    transport.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(asyncio.shield(closed), _EXIT_TIMEOUT_S)
    if done.done() and not done.cancelled():
        done.exception()
