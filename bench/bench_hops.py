"""The thread hand-overs of one ``call_one``, measured (issue 29's count of the hops).

A call crosses threads at up to four points: on the caller's side, a plain thread's
``.get()`` hands the send to danaus's background loop and is woken from it when the
reply lands; on the callee's side, a sync endpoint runs on the actor's own thread, handed
the message by the proc's loop and handing its result back for the write. Four variants
of the same round trip (async or sync endpoint; ``await`` on a loop or ``.get()`` from a
plain thread), interleaved in rounds, give each side's hop cost as a difference; the
raw hand-overs, without danaus, are measured in the same run as floors.

``python -m bench.bench_hops``; all processes unpinned (where the scheduler puts them).
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from typing import Any

import uvloop

from danaus import this_host

from . import _floors
from ._stats import format_table, summarize
from .bench_runtime import Echo, _latency

N = 2000
ROUNDS = 5


def thread_to_loop_and_back(n: int = 5000, warmup: int = 500) -> float:
    """A plain thread asks an idle loop to run a callback that wakes it back
    (``call_soon_threadsafe``, then a ``threading.Event``): median µs."""
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    samples = []
    try:
        for i in range(warmup + n):
            done = threading.Event()
            start = time.perf_counter()
            loop.call_soon_threadsafe(done.set)
            done.wait(10)
            if i >= warmup:
                samples.append(time.perf_counter() - start)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)
        loop.close()
    return summarize(samples).median_us


def _sync_rtt(ep: Any, n: int) -> float:
    payload = b"x" * 16
    for _ in range(200):
        ep.call_one(payload).get(30)
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        ep.call_one(payload).get(30)
        samples.append(time.perf_counter() - t)
    return summarize(samples).median_us


def _measure() -> dict[str, list[float]]:
    got: dict[str, list[float]] = {k: [] for k in ("aa", "as", "ga", "gs")}
    procs = this_host().spawn_procs(per_host={"procs": 1}, name="hops")
    try:
        echo = procs.spawn("echo", Echo)
        echo.initialized.get(60)
        for _ in range(ROUNDS):
            # await on a loop (the caller's own: no caller-side hop)
            a, s = uvloop.run(_both(echo))
            got["aa"].append(a)
            got["as"].append(s)
            # .get() from this plain thread (through danaus's background loop)
            got["ga"].append(_sync_rtt(echo.aecho, N))
            got["gs"].append(_sync_rtt(echo.echo, N))
    finally:
        procs.stop().get(60)
    return got


async def _both(echo: Any) -> tuple[float, float]:
    return (await _latency(echo.aecho, N)).median_us, (await _latency(echo.echo, N)).median_us


def main() -> None:
    floor = _floors.uvloop_pingpong(3000).median_us
    handover = _floors.thread_handover(3000).median_us
    wake = thread_to_loop_and_back(3000)
    got = {k: statistics.median(v) for k, v in _measure().items()}
    rows = [
        {"figure": "call_one RTT, await, async endpoint (no hop)", "us": got["aa"]},
        {"figure": "call_one RTT, await, sync endpoint (callee hops)", "us": got["as"]},
        {"figure": "call_one RTT, .get(), async endpoint (caller hops)", "us": got["ga"]},
        {"figure": "call_one RTT, .get(), sync endpoint (both)", "us": got["gs"]},
        {"figure": "  callee's hops (sync - async endpoint, await)", "us": got["as"] - got["aa"]},
        {"figure": "  caller's hops (.get() - await, async endpoint)", "us": got["ga"] - got["aa"]},
        {"figure": "floor: raw uvloop ping-pong, two processes", "us": floor},
        {"figure": "floor: loop -> thread -> loop hand-over (no danaus)", "us": handover},
        {"figure": "floor: thread -> loop -> thread wake (no danaus)", "us": wake},
    ]
    print(format_table(rows, ["figure", "us"]))
    print(f"medians of {ROUNDS} interleaved rounds of {N} calls; unpinned")


if __name__ == "__main__":
    main()
