"""Python calls per message: how much interpreted work one ``call_one`` costs each side.

Counted with ``sys.setprofile`` (a ``call`` event per Python function entered or
coroutine resumed; ``c_call`` per builtin or C function called from Python), over many
round trips, divided by their number:

- the caller: ``await ep.call_one(x)`` on the controller's loop, which also reads and
  settles the reply, so everything the controller's thread runs per round trip;
- the callee: the proc's loop thread (reading, dispatch, the mailbox, the reply's write)
  and, for a sync endpoint, the actor's own thread, counted from inside the proc.

The counts are what the code does, not timings, so they do not depend on the machine's
load: a change to the message path shows here as a difference of whole calls.
``python -m bench.bench_calls``.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

import uvloop

from danaus import Actor, endpoint, this_host

from ._stats import format_table

N = 2000


class _Counter:
    """Counts profile events on the threads it is installed on."""

    def __init__(self) -> None:
        self.py = 0
        self.c = 0

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            self.py += 1
        elif event == "c_call":
            self.c += 1


class Counted(Actor):
    """An echo whose proc counts its own Python calls while told to."""

    def __init__(self) -> None:
        self.counter = _Counter()

    @endpoint
    def echo(self, x: bytes) -> bytes:
        return x

    @endpoint
    async def aecho(self, x: bytes) -> bytes:
        return x

    @endpoint
    async def count_loop(self, on: bool) -> tuple[int, int]:
        """Start (``on``) or stop counting on the proc's loop thread; the counts so far."""
        if on:
            self.counter = _Counter()
        sys.setprofile(self.counter if on else None)
        return self.counter.py, self.counter.c

    @endpoint
    def count_thread(self, on: bool) -> None:
        """The same on the actor's own thread (where sync endpoints run)."""
        sys.setprofile(self.counter if on else None)


async def _caller(actor: Any, sync: bool, n: int) -> tuple[float, float]:
    """As user code calls: the endpoint looked up on the mesh each time."""
    payload = b"x" * 16
    counter = _Counter()
    for counting in (False, True):
        if counting:
            sys.setprofile(counter)
        try:
            if sync:
                for _ in range(n):
                    await actor.echo.call_one(payload)
            else:
                for _ in range(n):
                    await actor.aecho.call_one(payload)
        finally:
            sys.setprofile(None)
    return counter.py / n, counter.c / n


async def _callee(actor: Any, ep: Any, sync: bool, n: int) -> tuple[float, float]:
    payload = b"x" * 16
    for _ in range(200):
        await ep.call_one(payload)
    await actor.count_loop.call_one(True)
    if sync:
        await actor.count_thread.call_one(True)
    for _ in range(n):
        await ep.call_one(payload)
    if sync:
        await actor.count_thread.call_one(False)
    py, c = await actor.count_loop.call_one(False)
    return py / n, c / n


async def measure(n: int = N) -> dict[str, tuple[float, float]]:
    """(Python calls, C calls) per round trip, for each side and endpoint kind."""
    async with this_host().spawn_procs(per_host={"procs": 1}, name="calls") as procs:
        actor = procs.spawn("counted", Counted)
        await actor.initialized
        return {
            "caller, await, async endpoint": await _caller(actor, False, n),
            "caller, await, sync endpoint": await _caller(actor, True, n),
            "callee, async endpoint": await _callee(actor, actor.aecho, False, n),
            "callee, sync endpoint": await _callee(actor, actor.echo, True, n),
        }


def main() -> None:
    got = uvloop.run(measure())
    cols = ["per call_one (16 B)", "Python calls", "C calls"]
    rows = [
        dict(zip(cols, (side, round(py, 1), round(c, 1)), strict=True))
        for side, (py, c) in got.items()
    ]
    print(format_table(rows, cols))


if __name__ == "__main__":
    main()
