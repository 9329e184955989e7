"""Mesh benchmark: call() latency by mesh size, tree vs flat, and spawn time.

Each figure is printed with its ratio to the runtime floor (a raw uvloop ping-pong
between two processes) measured in the same run.
"""

from __future__ import annotations

import time
from typing import Any

import uvloop

from danaus import this_host
from danaus.config import config

from . import _floors
from ._actors import Ping  # a light module: each proc imports it (this one imports numpy)
from ._stats import Stats, format_table, summarize


async def _call_latency(mesh: Any, n: int, endpoint: str = "ping", arg: object = 1) -> Stats:
    """``await mesh.<endpoint>.call(arg)``, after 50 to warm up: ``n`` round trips."""
    ep = getattr(mesh, endpoint)
    for _ in range(50):
        await ep.call(arg)
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        await ep.call(arg)
        samples.append(time.perf_counter() - t)
    return summarize(samples)


async def _spawn_8() -> float:
    t = time.perf_counter()
    async with this_host().spawn_procs(per_host={"procs": 8}) as procs:
        mesh = procs.spawn("ping", Ping)
        await mesh.ping.call(1)
        return time.perf_counter() - t


async def _run() -> tuple[list[dict[str, object]], dict[str, Stats]]:
    rows: list[dict[str, object]] = []
    spawn = [await _spawn_8() for _ in range(3)]
    spawn.sort()
    rows.append(
        {
            "figure": "spawn 8 procs + 1 actor each + one call()",
            "median": f"{spawn[1] * 1e3:.0f} ms",
            "p99": "",
            "vs floor": "",
            "target": "< 600 ms",
        }
    )
    async with this_host().spawn_procs(per_host={"procs": 32}) as procs:
        meshes = {}
        for n in (1, 2, 8):
            meshes[n] = procs.slice(procs=slice(0, n)).spawn(f"ping{n}", Ping)
        meshes[32] = procs.spawn("ping32", Ping)
        for m in meshes.values():
            await m.initialized
        results: dict[str, Stats] = {}
        for n in (1, 2, 8, 32):
            results[f"call() on {n} actors"] = await _call_latency(
                meshes[n], 400 if n < 32 else 200
            )
        old = config.cast_fanout
        try:
            config.cast_fanout = 0
            results["call() on 32 actors, flat (no tree)"] = await _call_latency(meshes[32], 200)
            config.cast_fanout = 2
            results["call() on 8 actors, tree fan-out 2"] = await _call_latency(meshes[8], 400)
        finally:
            config.cast_fanout = old
    return rows, results


def main() -> None:
    floor = _floors.uvloop_pingpong(3000)
    rows, results = uvloop.run(_run())
    for name, s in results.items():
        rows.append(
            {
                "figure": name,
                "median": f"{s.median_us:.0f} us",
                "p99": f"{s.p99_us:.0f} us",
                "vs floor": f"{s.median_us / floor.median_us:.1f}x",
                "target": "< 500 us" if name == "call() on 8 actors" else "",
            }
        )
    print(format_table(rows, ["figure", "median", "p99", "vs floor", "target"]))
    print(
        f"\nfloor: raw uvloop ping-pong {floor.median_us:.1f} us median, this run. "
        f"Meshes of 32 are 32 procs (one actor per proc) on this 2-vCPU machine; "
        f"tree fan-out {config.cast_fanout} by default (meshes up to that size are sent flat)."
    )


if __name__ == "__main__":
    main()
