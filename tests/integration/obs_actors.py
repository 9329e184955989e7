"""Actors for the stats and stacks tests (importable by procs)."""

from __future__ import annotations

import asyncio
import threading

from danaus import Actor, concurrent_endpoint, endpoint

#: what a blocked sync endpoint waits for, and a waiting async one: set by another actor
#: of the same proc (a busy actor's own mailbox holds further messages behind them)
_gate = threading.Event()
_wake: list[asyncio.Event] = []


class Busy(Actor):
    def __init__(self) -> None:
        if not _wake:
            _wake.append(asyncio.Event())  # (made on the proc's loop: __init__ runs there)

    @endpoint
    def ok(self) -> int:
        return 1

    @endpoint
    def boom(self) -> None:
        raise ValueError("boom on purpose")

    @endpoint
    def block(self) -> str:
        _gate.wait(60)  # the stack shows this line while it waits
        return "released"

    @concurrent_endpoint
    async def release(self) -> None:
        _gate.set()

    @endpoint(long_running=True)
    def serve(self) -> str:
        """Runs as long as what it serves (a shell, a server loop): never stuck."""
        _gate.wait(60)
        return "served"

    @concurrent_endpoint(long_running=True)
    async def serve_async(self) -> str:
        await asyncio.wait_for(_wake[0].wait(), 60)
        return "served"

    @endpoint
    async def asleep(self) -> str:
        await asyncio.wait_for(_wake[0].wait(), 60)  # an async endpoint waiting
        return "woken"

    @concurrent_endpoint
    async def wake_up(self) -> None:
        _wake[0].set()


class OwnStats(Actor):
    """An actor with its own endpoint named ``stats``, as many have."""

    @endpoint
    def stats(self) -> str:
        return "mine"


#: what a slow __init__ waits for: set by another actor of its proc
_init_gate = threading.Event()


class SlowInit(Actor):
    """Sync endpoints only: its ``__init__`` runs on its thread, and waits for the gate."""

    def __init__(self) -> None:
        _init_gate.wait(60)  # the stack shows this line while it waits

    @endpoint
    def ok(self) -> int:
        return 1


class OpensInit(Actor):
    @endpoint
    async def open_init_gate(self) -> None:
        _init_gate.set()


class HangingAsyncInit(Actor):
    """An async endpoint: its ``__init__`` runs on its proc's loop, and holds it."""

    def __init__(self) -> None:
        threading.Event().wait(60)

    @endpoint
    async def ok(self) -> int:
        return 1
