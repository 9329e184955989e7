"""Supervision benchmark: SIGKILL-to-error time, throughput under backpressure.

(1) Time from SIGKILL of a proc to the caller's SupervisionError, median over 20 kills.
(2) Mailbox throughput when 4 senders push 100,000 messages through ``post()`` into one
    actor whose mailbox is capped (backpressure on), with the controller's RSS growth.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import uvloop

from danaus import SupervisionError, this_host
from danaus.config import config
from danaus.mesh import set_unhandled_fault_hook

from . import _floors
from ._stats import format_table, summarize


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def _kill_times(n: int) -> list[float]:
    from ._actors import Waiter

    out = []
    per = 10
    for _ in range(n // per):
        async with this_host().spawn_procs(per_host={"procs": per}) as procs:
            echo = await procs.spawn("waiter", Waiter)
            for r in range(per):
                stuck = echo.slice(procs=r).wait_forever.call_one()
                await asyncio.sleep(0)  # let the call leave
                t = time.perf_counter()
                os.kill(procs.pids[r], signal.SIGKILL)
                try:
                    await asyncio.wait_for(stuck, 5)
                except SupervisionError:
                    out.append(time.perf_counter() - t)
    return out


async def _backpressure(total: int) -> tuple[float, float, int]:
    from ._actors import Sink, Source

    config.mailbox_limit = 500
    rss0 = _rss_mib()
    async with this_host().spawn_procs(
        per_host={"procs": 5}, env={"DANAUS_MAILBOX_LIMIT": "500"}
    ) as procs:
        sink = await procs.slice(procs=0).spawn("sink", Sink)
        sources = await procs.slice(procs=slice(1, 5)).spawn("source", Source)
        t = time.perf_counter()
        await sources.pump.call(sink, total // 4)
        dt = time.perf_counter() - t
        report = await sink.report.call_one()
    return total / dt, _rss_mib() - rss0, report["max_depth"]


def main() -> None:
    set_unhandled_fault_hook(lambda f: None)  # the kills are on purpose
    floor = _floors.uvloop_pipelined(50_000, 1000)
    kills = uvloop.run(_kill_times(20))
    rate, rss, depth = uvloop.run(_backpressure(100_000))
    s = summarize(kills)
    rows = [
        {
            "figure": "SIGKILL -> SupervisionError in the caller",
            "value": f"{s.median_us / 1e3:.1f} ms median",
            "detail": f"p99 {s.p99_us / 1e3:.1f} ms, n={s.n}",
            "target": "< 200 ms",
        },
        {
            "figure": "mailbox throughput, 4 senders, backpressure on",
            "value": f"{rate:,.0f} msg/s",
            "detail": f"{rate / floor:.3f}x raw pipelined floor ({floor:,.0f}/s); max mailbox "
            f"{depth} (limit 500)",
            "target": "",
        },
        {
            "figure": "controller RSS growth over that run",
            "value": f"{rss:.1f} MiB",
            "detail": "100,000 messages",
            "target": "bounded",
        },
    ]
    print(format_table(rows, ["figure", "value", "detail", "target"]))


if __name__ == "__main__":
    main()
