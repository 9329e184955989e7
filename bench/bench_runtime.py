"""Actor runtime benchmark: each figure next to a floor measured in the same run.

(a) floor: raw uvloop Unix-socket ping-pong of a small msgspec message between two processes
(b) ``call_one`` round trip of a 16-byte payload to an actor in another proc (median, p99)
(c) pipelined throughput with 1,000 ``call_one`` futures in flight (vs the raw pipelined floor)
(d) 64 MiB numpy round trip (vs the same bytes sent raw over a Unix socket)

Latency is measured in three placements, because on these 2-vCPU machines where the two
processes run dominates: both on one CPU, one per CPU (waking an idle CPU costs ~35 us
each way), and wherever the scheduler puts them.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import numpy as np
import uvloop

from danaus import Actor, endpoint, this_host

from . import _floors
from ._floor_io import pin_children
from ._stats import format_table, summarize


class Echo(Actor):
    @endpoint
    def echo(self, x: Any) -> Any:
        return x

    @endpoint
    async def aecho(self, x: Any) -> Any:
        return x


def _pin(me: set[int] | None, child: set[int] | None) -> None:
    os.sched_setaffinity(0, me if me else set(range(os.cpu_count() or 1)))
    pin_children(child)


async def _latency(ep: Any, n: int) -> Any:
    payload = b"x" * 16
    for _ in range(300):
        await ep.call_one(payload)
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        await ep.call_one(payload)
        samples.append(time.perf_counter() - t)
    return summarize(samples)


async def _throughput(ep: Any, batches: int, inflight: int = 1000) -> float:
    payload = b"x" * 16
    await asyncio.gather(*(ep.call_one(payload) for _ in range(inflight)))
    t = time.perf_counter()
    for _ in range(batches):
        await asyncio.gather(*(ep.call_one(payload) for _ in range(inflight)))
    return batches * inflight / (time.perf_counter() - t)


async def _bulk(ep: Any, nbytes: int, iters: int) -> float:
    a = np.random.default_rng(0).random(nbytes // 8)
    for _ in range(2):  # warm up: first touch of fresh memory is slow here
        await ep.call_one(a)
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        b = await ep.call_one(a)
        times.append(time.perf_counter() - t)
        del b
    times.sort()
    return 2 * nbytes / times[len(times) // 2]


async def _danaus(child_cpus: set[int] | None, full: bool) -> dict[str, Any]:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        await procs.initialized
        if child_cpus:
            for pid in procs.pids:
                os.sched_setaffinity(pid, child_cpus)
        echo = procs.spawn("echo", Echo)
        await echo.initialized
        out: dict[str, Any] = {
            "lat": await _latency(echo.echo, 2000),
            "alat": await _latency(echo.aecho, 2000),
        }
        if full:
            out["tput"] = await _throughput(echo.echo, 40)
            out["atput"] = await _throughput(echo.aecho, 40)
            out["bulk"] = await _bulk(echo.echo, 64 << 20, 5)
        return out


def main() -> None:
    ncpu = len(os.sched_getaffinity(0))
    placements: list[tuple[str, set[int] | None, set[int] | None]] = [("one CPU", {0}, {0})]
    if ncpu > 1:
        placements.append(("one CPU each", {0}, {1}))
    placements.append(("unpinned", None, None))
    rows = []
    for name, me, child in placements:
        _pin(me, child)
        full = name == "unpinned"
        floor = _floors.uvloop_pingpong(3000)
        got = uvloop.run(_danaus(child, full))
        for key, kind in (("lat", "sync"), ("alat", "async")):
            rows.append(
                {
                    "figure": f"(b) call_one RTT, {kind} endpoint, {name}",
                    "median us": got[key].median_us,
                    "p99 us": got[key].p99_us,
                    "floor us": floor.median_us,
                    "ratio": got[key].median_us / floor.median_us,
                    "target": "<= 1.6x",
                }
            )
        if full:
            tfloor = _floors.uvloop_pipelined(50_000, 1000)
            bfloor = _floors.raw_unix_bulk(64 << 20, 5)
    _pin(None, None)
    hop = _floors.thread_handover(5000)
    rows.append(
        {
            "figure": "    floor: loop -> thread -> loop hand-over, in one process",
            "median us": hop.median_us,
            "p99 us": hop.p99_us,
            "floor us": "",
            "ratio": "",
            "target": "",
        }
    )
    print(format_table(rows, ["figure", "median us", "p99 us", "floor us", "ratio", "target"]))
    print()
    rows2 = [
        {
            "figure": "(c) pipelined calls/s, 1000 in flight, sync endpoint",
            "value": got["tput"],
            "floor": tfloor,
            "ratio": got["tput"] / tfloor,
            "target": ">= 100,000/s",
        },
        {
            "figure": "    async endpoint",
            "value": got["atput"],
            "floor": tfloor,
            "ratio": got["atput"] / tfloor,
            "target": ">= 100,000/s",
        },
        {
            "figure": "(d) 64 MiB numpy round trip, GB/s",
            "value": got["bulk"] / 1e9,
            "floor": bfloor / 1e9,
            "ratio": got["bulk"] / bfloor,
            "target": ">= 0.5x",
        },
    ]
    print(format_table(rows2, ["figure", "value", "floor", "ratio", "target"]))
    print(
        "\nfloors: (a) raw uvloop ping-pong, raw uvloop pipelined echo, raw Unix-socket "
        "64 MiB round trip (2*n/s), each measured in this run. A sync endpoint runs on its "
        "actor's thread: it pays about one loop -> thread -> loop hand-over over an async one"
    )


if __name__ == "__main__":
    main()
