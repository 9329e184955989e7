"""A user's program, as issue 29 sets it: the actor class lives in ``__main__`` (so it
travels to the procs by value), which imports numpy, as user code does; the endpoints are
``def f(self, x): return x`` and its ``async`` twin. Run as a script by
``bench.bench_user``, which prints the table; this prints one JSON line of medians.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from typing import Any

import numpy as np  # noqa: F401  (user code imports numpy: its import cost is in every proc)
import uvloop

from danaus import Actor, endpoint, this_host

N = 2000
PAYLOAD = b"x" * 16


class Echo(Actor):
    @endpoint
    def f(self, x: Any) -> Any:
        return x

    @endpoint
    async def af(self, x: Any) -> Any:
        return x


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def sync_get() -> float:
    """``echo.f.call_one(x).get()`` from this plain thread (no event loop): median µs."""
    with this_host().spawn_procs(per_host={"procs": 1}, name="user_sync") as procs:
        echo = procs.spawn("echo", Echo)
        echo.initialized.get(60)
        for _ in range(300):
            echo.f.call_one(PAYLOAD).get(30)
        samples = []
        for _ in range(N):
            t = time.perf_counter()
            echo.f.call_one(PAYLOAD).get(30)
            samples.append(time.perf_counter() - t)
    return _median_us(samples)


async def _rtt(ep: Any) -> float:
    for _ in range(300):
        await ep.call_one(PAYLOAD)
    samples = []
    for _ in range(N):
        t = time.perf_counter()
        await ep.call_one(PAYLOAD)
        samples.append(time.perf_counter() - t)
    return _median_us(samples)


async def _in_flight(ep: Any, batches: int = 30, inflight: int = 1000) -> float:
    await asyncio.gather(*(ep.call_one(PAYLOAD) for _ in range(inflight)))
    t = time.perf_counter()
    for _ in range(batches):
        await asyncio.gather(*(ep.call_one(PAYLOAD) for _ in range(inflight)))
    return batches * inflight / (time.perf_counter() - t)


async def _mesh_call(ep: Any, n: int = 500) -> float:
    for _ in range(50):
        await ep.call(PAYLOAD)
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        await ep.call(PAYLOAD)
        samples.append(time.perf_counter() - t)
    return _median_us(samples)


async def awaited() -> dict[str, float]:
    async with this_host().spawn_procs(per_host={"procs": 1}, name="user_await") as procs:
        echo = procs.spawn("echo", Echo)
        await echo.initialized
        out = {
            "await_sync": await _rtt(echo.f),
            "await_async": await _rtt(echo.af),
            "in_flight": await _in_flight(echo.f),
        }
    async with this_host().spawn_procs(per_host={"procs": 8}, name="user_eight") as procs:
        echoes = procs.spawn("echo", Echo)
        await echoes.initialized
        out["call_8"] = await _mesh_call(echoes.f)
    return out


def main() -> None:
    from bench import _floors  # (the same floors as the rest of make bench)

    floor = _floors.uvloop_pingpong(3000).median_us
    pipelined = _floors.uvloop_pipelined(50_000, 1000)
    got = {"floor_pingpong_us": floor, "floor_pipelined_per_s": pipelined}
    got["sync_get"] = sync_get()
    got.update(uvloop.run(awaited()))
    json.dump(got, sys.stdout)
    print()


if __name__ == "__main__":
    main()
