"""Actors the benchmarks spawn (importable by the procs)."""

from __future__ import annotations

import asyncio
from typing import Any

from danaus import Actor, context, current_rank, endpoint


class Ping(Actor):
    @endpoint
    def ping(self, x: int) -> int:
        return x


class Waiter(Actor):
    @endpoint
    async def wait_forever(self) -> None:
        await asyncio.Event().wait()


class Sink(Actor):
    """Takes (sender, i) messages, suspending now and then so its mailbox fills."""

    def __init__(self) -> None:
        self.count = 0
        self.max_depth = 0

    @endpoint
    async def take(self, sender: str, i: int) -> None:
        me = context().actor_instance
        inst = me.runtime_actor if me is not None else None
        assert inst is not None  # (an actor's own context always has both)
        self.max_depth = max(self.max_depth, len(inst.mailbox))
        self.count += 1
        if i % 64 == 0:
            await asyncio.sleep(0)

    @endpoint
    def ack(self) -> None:
        pass

    @endpoint
    def report(self) -> dict[str, Any]:
        return {"count": self.count, "max_depth": self.max_depth}


class Source(Actor):
    @endpoint
    async def pump(self, sink: Any, n: int) -> int:
        me = str(current_rank())
        for i in range(n):
            await sink.take.post(me, i)
        await sink.ack.call_one()
        return n


class Memory(Actor):
    """Its proc's resident memory and its high-water mark (bytes), from /proc."""

    @endpoint
    def status(self) -> dict[str, int]:
        out = {}
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(value.split()[0]) * 1024
        return out
