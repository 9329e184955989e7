"""Floors: the fastest the raw machinery goes, measured in the same run.

Benchmarks report each danaus figure as a ratio against one of these, because the
machines they run on (2 shared vCPUs) are too noisy for absolute numbers to compare
across runs. Every floor that involves IPC spawns a real second OS process
(`python -c`), always reaps it, also on error, and bounds every wait with a timeout.

Run `python -m bench._floors` to print all five.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import msgspec
import numpy as np
import uvloop

from ._stats import Stats, format_table, summarize

__all__ = [
    "memcpy_bandwidth",
    "raw_tcp_bulk",
    "raw_unix_bulk",
    "thread_handover",
    "uvloop_pingpong",
    "uvloop_pipelined",
]

# How long a child gets to start up and connect, and to exit after its peer is gone.
_CONNECT_TIMEOUT_S = 30.0
_EXIT_TIMEOUT_S = 10.0
# Bound on any single blocking socket operation in the bulk floors.
_IO_TIMEOUT_S = 60.0
_BULK_SOCKBUF = 4 << 20
# Flush a burst of small frames about every 4 KB so the two processes overlap.
_FLUSH_BYTES = 4096
_PAYLOAD = bytes(range(16))
_HDR = struct.Struct("<I")
_REPO_ROOT = str(Path(__file__).resolve().parents[1])


class _Msg(msgspec.Struct, array_like=True, frozen=True):
    """The small message of the RPC floors: 1 + 1 to 5 + 18 bytes of msgpack."""

    id: int
    payload: bytes


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_Msg)


def _append_frame(out: bytearray, msg: _Msg) -> None:
    """Appends `msg` to `out` as a 4-byte little-endian length and its msgpack."""
    start = len(out)
    _encoder.encode_into(msg, out, start + 4)  # pads the gap for the length
    _HDR.pack_into(out, start, len(out) - start - 4)


# -- the length-prefixed asyncio.Protocol shared by both ends of the RPC floors --


class _Framed(asyncio.Protocol):
    """Splits the byte stream into `_Msg` frames and hands each read's to `on_messages`."""

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

    def on_messages(self, msgs: list[_Msg]) -> None:
        raise NotImplementedError

    def on_lost(self, exc: Exception | None) -> None:
        pass

    def send(self, msgs: Sequence[_Msg]) -> None:
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


def _split(view: memoryview) -> tuple[list[_Msg], int]:
    """Decodes the complete frames at the start of `view`; returns them and the bytes used."""
    msgs: list[_Msg] = []
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


class _Echo(_Framed):
    """The child's end: sends every message back, one burst per read."""

    def on_messages(self, msgs: list[_Msg]) -> None:
        self.send(msgs)


class _PingPong(_Framed):
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
        self.send((_Msg(self._next_id, _PAYLOAD),))

    def on_messages(self, msgs: list[_Msg]) -> None:
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


class _Pipelined(_Framed):
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
        self.send([_Msg(i, _PAYLOAD) for i in range(first, first + count)])

    def on_messages(self, msgs: list[_Msg]) -> None:
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


def _require_no_running_loop(name: str) -> None:
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


def _abstract_name() -> str:
    """A fresh abstract-namespace socket name, without its leading NUL (argv can't hold one)."""
    return f"danaus-bench-{os.getpid()}-{os.urandom(6).hex()}"


@contextlib.contextmanager
def _child(*args: str) -> Iterator[subprocess.Popen[bytes]]:
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


def _listener(
    family: socket.AddressFamily, address: str | tuple[str, int], bufsize: int | None = None
) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if bufsize is not None:
            # Before listen(): accepted sockets inherit it, and TCP picks its window
            # scale from the receive buffer at handshake time.
            _set_bufs(sock, bufsize)
        sock.bind(address)
        sock.listen(1)
    except BaseException:
        sock.close()
        raise
    return sock


def _accept(listener: socket.socket, proc: subprocess.Popen[bytes]) -> socket.socket:
    """Accepts the child's connection, failing fast if the child dies first."""
    deadline = time.monotonic() + _CONNECT_TIMEOUT_S
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
                    f"benchmark child did not connect within {_CONNECT_TIMEOUT_S:.0f} s"
                ) from None
            continue
        conn.settimeout(None)
        return conn


def _set_bufs(sock: socket.socket, size: int) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    """Fills `view` from `sock` in place."""
    pos = 0
    total = len(view)
    while pos < total:
        got = sock.recv_into(view[pos:])
        if got == 0:
            raise ConnectionError(f"peer closed after {pos} of {total} bytes")
        pos += got


def _new_runner() -> asyncio.Runner:
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


async def _close(
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


# -- the RPC floors --


def uvloop_pingpong(n: int = 5000, warmup: int = 500) -> Stats:
    """Round-trip latency of a raw uvloop ping-pong between two processes.

    The parent sends a small msgspec-msgpack `_Msg` (an int id and 16 bytes), length
    prefixed, over an abstract Unix-domain socket; the child decodes it, re-encodes it
    and sends it back. One message is in flight at a time, and both ends are plain
    `asyncio.Protocol`s on uvloop. Each sample runs from before the encode to after the
    reply is decoded.

    Args:
        n: Round trips measured.
        warmup: Round trips run first and discarded.

    Returns:
        Per-round-trip statistics over the `n` measured round trips.
    """
    if n < 1 or warmup < 0:
        raise ValueError(f"need n >= 1 and warmup >= 0, got n={n}, warmup={warmup}")
    _require_no_running_loop("uvloop_pingpong")
    total = n + warmup
    name = _abstract_name()
    with contextlib.closing(_listener(socket.AF_UNIX, "\0" + name)) as listener:
        with _child("echo", name) as proc:
            conn = _accept(listener, proc)
            listener.close()
            with _new_runner() as runner:
                samples = runner.run(
                    asyncio.wait_for(_pingpong(conn, total), timeout=30.0 + total * 1e-3)
                )
    return summarize(samples[warmup:])


async def _pingpong(conn: socket.socket, total: int) -> list[float]:
    loop = asyncio.get_running_loop()
    closed: asyncio.Future[None] = loop.create_future()
    conn.setblocking(False)
    transport, proto = await loop.create_unix_connection(
        lambda: _PingPong(closed, total), sock=conn
    )
    try:
        proto.start()
        await proto.done
    finally:
        await _close(transport, closed, proto.done)
    return proto.samples


def uvloop_pipelined(n: int = 50000, inflight: int = 1000) -> float:
    """Throughput of the `uvloop_pingpong` socket and message with many messages in flight.

    The parent keeps `inflight` messages outstanding: it sends that many in one burst,
    then, for every read's worth of replies, as many new ones in one burst. Both ends
    write each burst as few `write` calls of about 4 KB. This is the ceiling for an RPC
    layer on this machine. A warm-up run of `max(inflight, n // 5)` messages (at most
    `n`) comes first.

    Args:
        n: Messages measured.
        inflight: Messages outstanding at once.

    Returns:
        Round trips (messages echoed back) per second.
    """
    if n < 1 or inflight < 1:
        raise ValueError(f"need n >= 1 and inflight >= 1, got n={n}, inflight={inflight}")
    _require_no_running_loop("uvloop_pipelined")
    warm = min(n, max(inflight, n // 5))
    name = _abstract_name()
    with contextlib.closing(_listener(socket.AF_UNIX, "\0" + name)) as listener:
        with _child("echo", name) as proc:
            conn = _accept(listener, proc)
            listener.close()
            with _new_runner() as runner:
                limit_s = 30.0 + (n + warm) * 1e-4
                return runner.run(
                    asyncio.wait_for(_pipelined(conn, n, warm, inflight), timeout=limit_s)
                )


async def _pipelined(conn: socket.socket, n: int, warm: int, inflight: int) -> float:
    loop = asyncio.get_running_loop()
    closed: asyncio.Future[None] = loop.create_future()
    conn.setblocking(False)
    transport, proto = await loop.create_unix_connection(lambda: _Pipelined(closed), sock=conn)
    try:
        await proto.begin(warm, inflight)
        t0 = time.perf_counter()
        t1 = await proto.begin(n, inflight)
    finally:
        await _close(transport, closed, proto.done)
    return n / (t1 - t0)


async def _echo_child(name: str) -> None:
    loop = asyncio.get_running_loop()
    closed: asyncio.Future[None] = loop.create_future()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(_CONNECT_TIMEOUT_S)
    sock.connect("\0" + name)
    sock.setblocking(False)
    await loop.create_unix_connection(lambda: _Echo(closed), sock=sock)
    # The parent closes the connection when it is done; a parent that dies does too.
    await closed


# -- the bulk floors --


def raw_unix_bulk(nbytes: int = 64 << 20, iters: int = 5) -> float:
    """Round-trip bulk throughput over a Unix-domain socket between two processes.

    The parent sends `nbytes` with blocking `sendall`; the child reads them all with
    `recv_into` straight into a preallocated, reused buffer and sends them back the
    same way, into the parent's preallocated buffer. Both ends use 4 MiB
    SO_SNDBUF/SO_RCVBUF. One warm-up round trip is not timed.

    Args:
        nbytes: Size of the buffer sent each way.
        iters: Timed round trips.

    Returns:
        `2 * nbytes / seconds` (bytes moved, both directions, per second of round
        trip), the median over the `iters` round trips.
    """
    name = _abstract_name()
    return _bulk(socket.AF_UNIX, "\0" + name, ("unix", name), nbytes, iters)


def raw_tcp_bulk(nbytes: int = 64 << 20, iters: int = 5) -> float:
    """Round-trip bulk throughput over TCP loopback (127.0.0.1, an ephemeral port).

    Exactly the definition of `raw_unix_bulk` (same buffers, 4 MiB socket buffers,
    one warm-up round trip), over TCP instead of a Unix socket.

    Args:
        nbytes: Size of the buffer sent each way.
        iters: Timed round trips.

    Returns:
        `2 * nbytes / seconds`, the median over the `iters` round trips.
    """
    return _bulk(socket.AF_INET, ("127.0.0.1", 0), None, nbytes, iters)


def _bulk(
    family: socket.AddressFamily,
    address: str | tuple[str, int],
    unix_args: tuple[str, str] | None,
    nbytes: int,
    iters: int,
) -> float:
    if nbytes < 1 or iters < 1:
        raise ValueError(f"need nbytes >= 1 and iters >= 1, got {nbytes}, {iters}")
    send = memoryview(bytearray(b"\xa5") * nbytes)
    recv = memoryview(bytearray(nbytes))  # zero-filled, so already touched
    with contextlib.closing(_listener(family, address, _BULK_SOCKBUF)) as listener:
        if unix_args is None:
            port = listener.getsockname()[1]
            child_args: tuple[str, ...] = ("tcp", "127.0.0.1", str(port))
        else:
            child_args = unix_args
        with _child("bulk", *child_args, str(nbytes), str(iters + 1)) as proc:
            conn = _accept(listener, proc)
            listener.close()
            with conn:
                conn.settimeout(_IO_TIMEOUT_S)
                samples: list[float] = []
                for i in range(iters + 1):
                    t0 = time.perf_counter()
                    conn.sendall(send)
                    _recv_exact(conn, recv)
                    elapsed = time.perf_counter() - t0
                    if i > 0:
                        samples.append(elapsed)
                if recv[:16] != send[:16] or recv[-16:] != send[-16:]:
                    raise RuntimeError("bulk echo returned different bytes")
    return 2 * nbytes / statistics.median(samples)


def _bulk_child(argv: list[str]) -> None:
    kind, *rest = argv
    sock: socket.socket
    if kind == "unix":
        name, nbytes_s, rounds_s = rest
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address: str | tuple[str, int] = "\0" + name
    else:
        host, port_s, nbytes_s, rounds_s = rest
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        address = (host, int(port_s))
    with sock:
        _set_bufs(sock, _BULK_SOCKBUF)
        sock.settimeout(_IO_TIMEOUT_S)
        sock.connect(address)
        buf = memoryview(bytearray(int(nbytes_s)))
        for _ in range(int(rounds_s)):
            _recv_exact(sock, buf)
            sock.sendall(buf)


def _child_main(argv: list[str]) -> None:
    """Entry point of the benchmark child processes started by `_child`."""
    kind, *rest = argv
    if kind == "echo":
        (name,) = rest
        with _new_runner() as runner:
            runner.run(_echo_child(name))
    elif kind == "bulk":
        _bulk_child(rest)
    else:
        raise SystemExit(f"unknown benchmark child kind {kind!r}")


# -- memory --


def thread_handover(n: int = 5000, warmup: int = 500) -> Stats:
    """One event loop hands a job to a thread, which hands the result back
    (``SimpleQueue.put`` there, ``call_soon_threadsafe`` back): what a sync endpoint pays
    over an async one, without any danaus code."""
    import queue
    import threading

    async def run() -> list[float]:
        loop = asyncio.get_running_loop()
        jobs: queue.SimpleQueue[asyncio.Future[None] | None] = queue.SimpleQueue()

        def worker() -> None:
            while (fut := jobs.get()) is not None:
                loop.call_soon_threadsafe(fut.set_result, None)

        t = threading.Thread(target=worker, daemon=True)
        t.start()
        samples = []
        for i in range(warmup + n):
            fut = loop.create_future()
            start = time.perf_counter()
            jobs.put(fut)
            await fut
            if i >= warmup:
                samples.append(time.perf_counter() - start)
        jobs.put(None)
        t.join(10)
        return samples

    return summarize(uvloop.run(run()))


def memcpy_bandwidth(nbytes: int = 64 << 20, iters: int = 10) -> float:
    """Copy bandwidth of warm, preallocated numpy buffers (`np.copyto`), in one process.

    Args:
        nbytes: Bytes copied per iteration.
        iters: Timed copies, after one untimed warm-up copy.

    Returns:
        `nbytes / seconds` (bytes copied, not read plus written), the median over
        the `iters` copies.
    """
    if nbytes < 1 or iters < 1:
        raise ValueError(f"need nbytes >= 1 and iters >= 1, got {nbytes}, {iters}")
    src = np.full(nbytes, 0xA5, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)
    dst.fill(0)  # np.zeros may hand back untouched pages
    np.copyto(dst, src)
    samples: list[float] = []
    for _ in range(iters):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        samples.append(time.perf_counter() - t0)
    return nbytes / statistics.median(samples)


def main() -> None:
    """Measures and prints all five floors, with the seconds each took."""
    start = time.perf_counter()
    rows: list[dict[str, object]] = []

    def add(floor: str, value: float, unit: str, detail: str, t0: float) -> None:
        rows.append(
            {
                "floor": floor,
                "value": value,
                "unit": unit,
                "detail": detail,
                "seconds": time.perf_counter() - t0,
            }
        )

    t0 = time.perf_counter()
    pp = uvloop_pingpong()
    add(
        "uvloop_pingpong",
        pp.median_us,
        "us (median RTT)",
        f"p99 {pp.p99_us:.1f} us, min {pp.min_us:.1f} us, n={pp.n}",
        t0,
    )
    t0 = time.perf_counter()
    add("uvloop_pipelined", uvloop_pipelined(), "msg/s", "50,000 msgs, 1,000 in flight", t0)
    t0 = time.perf_counter()
    add("raw_unix_bulk", raw_unix_bulk() / 1e9, "GB/s", "64 MiB round trip, 2*n/s, median", t0)
    t0 = time.perf_counter()
    add("raw_tcp_bulk", raw_tcp_bulk() / 1e9, "GB/s", "64 MiB round trip, 2*n/s, median", t0)
    t0 = time.perf_counter()
    add("memcpy_bandwidth", memcpy_bandwidth() / 1e9, "GB/s", "np.copyto 64 MiB, median", t0)

    print(format_table(rows, ["floor", "value", "unit", "detail", "seconds"]))
    print(f"total {time.perf_counter() - start:.1f} s on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
