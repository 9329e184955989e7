"""Hello, mesh: spawn two procs, put a counter actor in each, and drive them all at once.

Run with ``make demo`` (or ``python examples/hello_mesh.py``).
"""

from __future__ import annotations

import asyncio
import os
import time

import numpy as np

from danaus import Actor, ActorError, Channel, Port, current_rank, endpoint, this_host


class Counter(Actor):
    """Holds a number; lives in its own OS process."""

    def __init__(self, start: int) -> None:
        self.value = start

    @endpoint
    def incr(self, n: int = 1) -> int:
        self.value += n
        return self.value

    @endpoint
    async def where(self) -> str:
        return f"rank {current_rank()} in pid {os.getpid()}"

    @endpoint
    def count_to(self, port: Port[str], n: int) -> None:
        for i in range(n):
            port.send(f"{current_rank()} says {i}")

    @endpoint
    def norm(self, a: np.ndarray) -> float:
        return float(np.linalg.norm(a))

    @endpoint
    def divide(self, x: int) -> float:
        return 1 / x


async def main() -> None:
    t0 = time.perf_counter()
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        counters = procs.spawn("counter", Counter, 10)
        await counters.initialized
        print(f"spawned 2 procs with a Counter each in {time.perf_counter() - t0:.3f} s")

        for point, where in (await counters.where.call()).items():
            print(f"  {point}: {where}")

        print("incr.call(5) on the whole mesh ->", (await counters.incr.call(5)).values())
        print("incr.call_one() on rank 1       ->", await counters.slice(procs=1).incr.call_one())

        t = time.perf_counter()
        n = 10_000
        await asyncio.gather(*(counters.slice(procs=0).incr.call_one() for _ in range(n)))
        print(f"{n} pipelined calls in {time.perf_counter() - t:.3f} s")

        a = np.ones(8 << 20)  # 64 MiB travels out of band, straight into its buffer
        print(
            "norm of a 64 MiB array, computed remotely ->",
            await counters.slice(procs=0).norm.call_one(a),
        )

        port, receiver = Channel[str].open()
        counters.slice(procs=1).count_to.broadcast(port, 3)
        for _ in range(3):
            print("  port got:", await receiver.recv())

        try:
            await counters.slice(procs=0).divide.call_one(0)
        except ActorError as e:
            print(f"a remote error comes back as ActorError: {e.exc_type} at rank {e.rank}")
        print("and the actor keeps serving:", await counters.slice(procs=0).divide.call_one(4))
    print(f"procs stopped; total {time.perf_counter() - t0:.3f} s")


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
