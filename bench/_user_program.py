"""A user's program, as issue 29 sets it: the actor class lives in ``__main__`` (so it
travels to the procs by value), which imports numpy, as user code does; the endpoints are
``def f(self, x): return x`` and its ``async`` twin. Run as a script by
``bench.bench_user``, which prints the table; this prints one JSON line of medians.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np  # noqa: F401  (user code imports numpy: its import cost is in every proc)
import uvloop

from bench import _floors  # the timers and floors of the rest of make bench
from bench.bench_hops import _sync_rtt
from bench.bench_mesh import _call_latency
from bench.bench_runtime import _latency, _throughput
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


def sync_get() -> float:
    """``echo.f.call_one(x).get()`` from this plain thread (no event loop): median µs."""
    with this_host().spawn_procs(per_host={"procs": 1}, name="user_sync") as procs:
        echo = procs.spawn("echo", Echo)
        echo.initialized.get(60)
        return _sync_rtt(echo.f, N)


async def awaited() -> dict[str, float]:
    async with this_host().spawn_procs(per_host={"procs": 1}, name="user_await") as procs:
        echo = procs.spawn("echo", Echo)
        await echo.initialized
        out = {
            "await_sync": (await _latency(echo.f, N)).median_us,
            "await_async": (await _latency(echo.af, N)).median_us,
            "in_flight": await _throughput(echo.f, 30),
        }
    async with this_host().spawn_procs(per_host={"procs": 8}, name="user_eight") as procs:
        echoes = procs.spawn("echo", Echo)
        await echoes.initialized
        out["call_8"] = (await _call_latency(echoes, 500, "f", PAYLOAD)).median_us
    return out


def main() -> None:
    floor = _floors.uvloop_pingpong(3000).median_us
    pipelined = _floors.uvloop_pipelined(50_000, 1000)
    got = {"floor_pingpong_us": floor, "floor_pipelined_per_s": pipelined}
    got["sync_get"] = sync_get()
    got.update(uvloop.run(awaited()))
    json.dump(got, sys.stdout)
    print()


if __name__ == "__main__":
    main()
