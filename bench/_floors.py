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
import time

import numpy as np
import uvloop

from ._floor_io import (
    BULK_SOCKBUF,
    CONNECT_TIMEOUT_S,
    IO_TIMEOUT_S,
    Echo,
    PingPong,
    Pipelined,
    abstract_name,
    accept,
    child,
    close,
    make_listener,
    new_runner,
    recv_exact,
    require_no_running_loop,
    set_bufs,
)
from ._stats import Stats, format_table, summarize

__all__ = [
    "memcpy_bandwidth",
    "raw_tcp_bulk",
    "raw_unix_bulk",
    "thread_handover",
    "uvloop_pingpong",
    "uvloop_pipelined",
]

# -- the RPC floors --


def uvloop_pingpong(n: int = 5000, warmup: int = 500) -> Stats:
    """Round-trip latency of a raw uvloop ping-pong between two processes.

    The parent sends a small msgspec-msgpack `Msg` (an int id and 16 bytes), length
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
    require_no_running_loop("uvloop_pingpong")
    total = n + warmup
    name = abstract_name()
    with contextlib.closing(make_listener(socket.AF_UNIX, "\0" + name)) as listener:
        with child("echo", name) as proc:
            conn = accept(listener, proc)
            listener.close()
            with new_runner() as runner:
                samples = runner.run(
                    asyncio.wait_for(_pingpong(conn, total), timeout=30.0 + total * 1e-3)
                )
    return summarize(samples[warmup:])


async def _pingpong(conn: socket.socket, total: int) -> list[float]:
    loop = asyncio.get_running_loop()
    closed: asyncio.Future[None] = loop.create_future()
    conn.setblocking(False)
    transport, proto = await loop.create_unix_connection(lambda: PingPong(closed, total), sock=conn)
    try:
        proto.start()
        await proto.done
    finally:
        await close(transport, closed, proto.done)
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
    require_no_running_loop("uvloop_pipelined")
    warm = min(n, max(inflight, n // 5))
    name = abstract_name()
    with contextlib.closing(make_listener(socket.AF_UNIX, "\0" + name)) as listener:
        with child("echo", name) as proc:
            conn = accept(listener, proc)
            listener.close()
            with new_runner() as runner:
                limit_s = 30.0 + (n + warm) * 1e-4
                return runner.run(
                    asyncio.wait_for(_pipelined(conn, n, warm, inflight), timeout=limit_s)
                )


async def _pipelined(conn: socket.socket, n: int, warm: int, inflight: int) -> float:
    loop = asyncio.get_running_loop()
    closed: asyncio.Future[None] = loop.create_future()
    conn.setblocking(False)
    transport, proto = await loop.create_unix_connection(lambda: Pipelined(closed), sock=conn)
    try:
        await proto.begin(warm, inflight)
        t0 = time.perf_counter()
        t1 = await proto.begin(n, inflight)
    finally:
        await close(transport, closed, proto.done)
    return n / (t1 - t0)


async def _echo_child(name: str) -> None:
    loop = asyncio.get_running_loop()
    closed: asyncio.Future[None] = loop.create_future()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT_S)
    sock.connect("\0" + name)
    sock.setblocking(False)
    await loop.create_unix_connection(lambda: Echo(closed), sock=sock)
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
    name = abstract_name()
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
    with contextlib.closing(make_listener(family, address, BULK_SOCKBUF)) as listener:
        if unix_args is None:
            port = listener.getsockname()[1]
            child_args: tuple[str, ...] = ("tcp", "127.0.0.1", str(port))
        else:
            child_args = unix_args
        with child("bulk", *child_args, str(nbytes), str(iters + 1)) as proc:
            conn = accept(listener, proc)
            listener.close()
            with conn:
                conn.settimeout(IO_TIMEOUT_S)
                samples: list[float] = []
                for i in range(iters + 1):
                    t0 = time.perf_counter()
                    conn.sendall(send)
                    recv_exact(conn, recv)
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
        set_bufs(sock, BULK_SOCKBUF)
        sock.settimeout(IO_TIMEOUT_S)
        sock.connect(address)
        buf = memoryview(bytearray(int(nbytes_s)))
        for _ in range(int(rounds_s)):
            recv_exact(sock, buf)
            sock.sendall(buf)


def _child_main(argv: list[str]) -> None:
    """Entry point of the benchmark child processes started by `child`."""
    kind, *rest = argv
    if kind == "echo":
        (name,) = rest
        with new_runner() as runner:
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
