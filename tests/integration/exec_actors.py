"""Actors for the execution-model tests (importable by procs and by notebook kernels)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from danaus import Actor, Port, concurrent_endpoint, context, current_rank, endpoint


class Worker(Actor):
    """Sync endpoints that block in three ways, and quick ones of both kinds."""

    def __init__(self) -> None:
        self.value = 0

    @endpoint
    def sleep(self, seconds: float) -> str:
        time.sleep(seconds)  # blocked in C, GIL released
        return "slept"

    @endpoint
    def spin(self, seconds: float) -> int:
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:  # pure Python: holds the GIL but for switches
            n += 1
        return n

    @endpoint
    def matmul(self, seconds: float) -> int:
        import torch

        a = torch.randn(1024, 1024)
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            torch.mm(a, a)  # inside torch's kernels
            n += 1
        return n

    @endpoint
    def wedge(self) -> bool:
        """Catastrophic backtracking: minutes inside the regex engine, which never lets
        go of the GIL (a proc wedged in C code holding it)."""
        import re

        return re.match(r"(a+)+$", "a" * 64 + "b") is not None

    @endpoint
    def incr(self, n: int = 1) -> int:
        self.value += n
        return self.value

    @endpoint
    async def aget(self) -> int:
        return self.value

    @endpoint
    def ticks(self, port: Port[int], n: int, every: float) -> int:
        """Send ``n`` values and print ``n`` lines while busy, then return."""
        for i in range(n):
            port.send(i)
            print(f"tick {i}", flush=True)
            time.sleep(every)
        return n


class Caller(Actor):
    """Calls other actors, and its own mesh, from inside endpoints."""

    def __init__(self, other: Any = None) -> None:
        self.other = other
        self.value = current_rank().rank * 10

    @endpoint
    def relay(self, x: Any) -> Any:
        return self.other.incr.call_one(x).get(timeout=30)

    @endpoint
    def value_of(self) -> int:
        return self.value

    @endpoint
    def call_many(self, other: Any, n: int) -> int:
        """``n`` calls from this actor's thread, each waited for: their replies' sum."""
        return sum(other.incr.call_one(1).get(timeout=30) for _ in range(n))

    @endpoint
    def sum_of_others(self, me: Any) -> int:
        """``.get()`` on the other ranks of this actor's own mesh."""
        mine = context().actor_instance.rank.rank
        total = 0
        for r in range(me.size()):
            if r != mine:
                total += me.slice(procs=r).value_of.call_one().get(timeout=30)
        return total

    @endpoint
    def call_self(self, me: Any) -> int:
        return (
            me.slice(procs=context().actor_instance.rank.rank).value_of.call_one().get(timeout=30)
        )

    @endpoint
    async def acall_self(self, me: Any) -> int:
        return await me.slice(procs=context().actor_instance.rank.rank).value_of.call_one()

    @endpoint
    def send_later(self, me: Any) -> str:
        """Calling itself without waiting is fine: the call runs after this returns."""
        me.slice(procs=context().actor_instance.rank.rank).value_of.broadcast()
        return "sent"


class Cancellable(Actor):
    """Records what happened to calls whose callers gave up."""

    def __init__(self) -> None:
        self.events: list[str] = []

    @endpoint
    async def wait(self, port: Port[str]) -> None:
        port.send("started")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.events.append("cancelled")
            raise

    @endpoint
    def sync_wait(self, port: Port[str], seconds: float) -> str:
        port.send("started")
        time.sleep(seconds)
        self.events.append("sync finished")
        return "done"

    @endpoint
    def record(self, what: str) -> str:
        self.events.append(what)
        return what

    @endpoint
    async def arecord(self, what: str) -> str:
        self.events.append(what)
        return what

    @endpoint
    def history(self) -> list[str]:
        return self.events


class Deferred(Actor):
    """Answers through explicit response ports, later or with an error."""

    def __init__(self) -> None:
        self.waiting: list[tuple[Port[str], str]] = []

    @endpoint(explicit_response_port=True)
    def ask(self, port: Port[str], question: str) -> None:
        self.waiting.append((port, question))

    @endpoint
    def answer_all(self, prefix: str) -> int:
        n = len(self.waiting)
        for port, q in self.waiting:
            port.send(prefix + q)
        self.waiting.clear()
        return n

    @endpoint(explicit_response_port=True)
    async def refuse(self, port: Port[str]) -> None:
        port.exception(ValueError("no answer for you"))

    @endpoint(explicit_response_port=True)
    def raise_instead(self, port: Port[str]) -> None:
        raise RuntimeError("forgot to answer")

    @endpoint
    def ping(self) -> str:
        return "pong"


class Barrier(Actor):
    """``arrive`` waits for a later message: only possible as a concurrent endpoint."""

    def __init__(self) -> None:
        self.arrived = 0
        self.all_here = asyncio.Event()

    @concurrent_endpoint
    async def arrive(self, n: int) -> int:
        self.arrived += 1
        if self.arrived >= n:
            self.all_here.set()
        await self.all_here.wait()
        return self.arrived

    @endpoint
    async def count(self) -> int:
        return self.arrived


class Ordered(Actor):
    """Plain async endpoints still run one at a time, in order."""

    def __init__(self) -> None:
        self.log: list[str] = []

    @endpoint
    async def step(self, name: str) -> list[str]:
        self.log.append(f"start {name}")
        await asyncio.sleep(0.01)
        self.log.append(f"end {name}")
        return list(self.log)


class Sender(Actor):
    @endpoint
    def send_to(self, port: Port[int], value: int) -> None:
        port.send(value)


class Holder(Actor):
    """Owns bytes and hands out an RDMA buffer of them (made in a sync endpoint)."""

    @endpoint
    def buffer(self, n: int) -> Any:
        import torch

        from danaus.rdma import RDMABuffer

        self.data = torch.arange(n, dtype=torch.uint8)
        return RDMABuffer(self.data)


class Recorder(Actor):
    """Notes who sent what, in the order its calls run (a sync endpoint)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, int]] = []

    @endpoint
    def note(self, sender: str, i: int, payload: Any = None) -> int:
        size = 0 if payload is None else int(getattr(payload, "nbytes", None) or len(payload))
        self.seen.append((sender, i, size))
        return i

    @endpoint
    def log(self) -> list[tuple[str, int, int]]:
        return list(self.seen)

    @endpoint
    def send_then_return(self, port: Port[int], n: int) -> int:
        for i in range(n):
            port.send(i)
        return n

    @endpoint
    def small_or_not(self, i: int) -> Any:
        """A small atom (replied from the actor's thread) or a list (pickled: the loop's)."""
        return i if i % 3 else [i]
