"""What binding TCP frames to their session costs: the same runtime pair over a Unix
socket (untagged: the kernel carries it) and over TCP loopback (every frame tagged),
in one run, next to a raw TCP round trip of the same size.

Both runtimes live in this process, on one loop, so each figure includes both ends'
work: a small round trip is two frames tagged and two verified.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

import msgspec
import uvloop

from danaus.actors._future import Future
from danaus.actors._handlers import ProcControl, install_actor
from danaus.actors._runtime import Runtime
from danaus.actors._serialize import dumps_args
from danaus.actors._wire import CallSpec

from . import _floors
from ._stats import format_table, summarize

KEY = secrets.token_bytes(32)


async def _call(d: Runtime, addr: str, enc: tuple[Any, bool, list[Any]]) -> Any:
    fut: Future[Any] = Future(loop=d.loop)
    port = d.open_future_port(fut)
    d.send_call(addr, 0, port, CallSpec("__proc__", "pid", *enc))
    try:
        return await fut
    except Exception as e:  # the 64 MiB call is refused by pid(): its reply is an error
        return e


async def _timed(
    d: Runtime, addr: str, enc: tuple[Any, bool, list[Any]], warmup: int, n: int
) -> list[float]:
    """Seconds of each of ``n`` calls, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        await _call(d, addr, enc)
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        await _call(d, addr, enc)
        samples.append(time.perf_counter() - t)
    return samples


async def _pair(listen: str) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    acceptor = Runtime(loop, addr=listen, key=KEY)
    install_actor(acceptor, "__proc__", ProcControl())
    dialer = Runtime(loop, addr=f"unix:@danaus-bench-{secrets.token_hex(8)}", key=KEY)
    try:
        small: tuple[msgspec.Raw, bool, list[Any]] = (
            msgspec.Raw(msgspec.msgpack.encode([[], {}])),
            False,
            [],
        )
        big = dumps_args((bytes(64 << 20),), {}, lambda: "a 64 MiB argument")
        times = await _timed(dialer, acceptor.addr, big, 2, 5)
        return {
            "small": summarize(await _timed(dialer, acceptor.addr, small, 500, 5000)),
            "bulk": (64 << 20) / sorted(times)[len(times) // 2],
        }
    finally:
        await dialer.aclose()
        await acceptor.aclose()


def main() -> None:
    unix = uvloop.run(_pair(f"unix:@danaus-bench-{secrets.token_hex(8)}"))
    tcp = uvloop.run(_pair("tcp://127.0.0.1:0"))
    raw = _floors.raw_tcp_bulk(64 << 20, 5) / 2  # one way
    rows = [
        {
            "figure": "small call round trip, Unix socket (untagged)",
            "value": f"{unix['small'].median_us:.1f} us",
            "floor": "",
            "ratio": "",
        },
        {
            "figure": "small call round trip, TCP (every frame tagged)",
            "value": f"{tcp['small'].median_us:.1f} us",
            "floor": f"{unix['small'].median_us:.1f} us (Unix)",
            "ratio": f"{tcp['small'].median_us / unix['small'].median_us:.2f}",
        },
        {
            "figure": "64 MiB argument one way, Unix socket",
            "value": f"{unix['bulk'] / 1e9:.2f} GB/s",
            "floor": "",
            "ratio": "",
        },
        {
            "figure": "64 MiB argument one way, TCP, tagged",
            "value": f"{tcp['bulk'] / 1e9:.2f} GB/s",
            "floor": f"{raw / 1e9:.2f} GB/s raw TCP",
            "ratio": f"{tcp['bulk'] / raw:.2f}",
        },
    ]
    print(format_table(rows, ["figure", "value", "floor", "ratio"]))
    print("\nboth ends in this process: each figure counts the tagging and the checking")


if __name__ == "__main__":
    main()
