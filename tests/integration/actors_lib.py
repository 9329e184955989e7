"""Actor classes used by the integration tests (importable by procs)."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from danaus import Actor, Port, context, current_rank, current_size, endpoint


class Counter(Actor):
    def __init__(self, start: int = 0) -> None:
        self.value = start

    @endpoint
    def incr(self, n: int = 1) -> int:
        self.value += n
        return self.value

    @endpoint
    async def get(self) -> int:
        return self.value


class Recorder(Actor):
    """Remembers the order in which messages arrived."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    @endpoint
    def record(self, i: int) -> int:
        self.seen.append(i)
        return i

    @endpoint
    async def arecord(self, i: int) -> int:
        await asyncio.sleep(0)  # let other messages arrive while this one is in progress
        self.seen.append(i)
        return i

    @endpoint
    def history(self) -> list[int]:
        return self.seen


class Echo(Actor):
    @endpoint
    def echo(self, x: Any) -> Any:
        return x

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def whoami(self) -> dict[str, Any]:
        ctx = context()
        assert ctx.actor_instance is not None
        return {
            "rank": str(current_rank()),
            "rank_int": current_rank().rank,
            "coords": dict(current_rank()),
            "size": current_size(),
            "actor_id": ctx.actor_instance.actor_id,
        }

    @endpoint
    def fail(self, msg: str) -> None:
        raise ValueError(msg)

    @endpoint
    def unpicklable_result(self) -> Any:
        return threading.Lock()

    @endpoint
    async def wait_forever(self) -> None:
        await asyncio.Event().wait()

    @endpoint
    def exit_now(self, code: int) -> None:
        os._exit(code)


class Streamer(Actor):
    @endpoint
    def feed(self, port: Port[int], n: int) -> None:
        for i in range(n):
            port.send(i)

    @endpoint
    def feed_error(self, port: Port[int]) -> None:
        port.send(1)
        port.exception(KeyError("missing"))


class BadInit(Actor):
    def __init__(self, fail_rank: int) -> None:
        if current_rank().rank == fail_rank:
            raise RuntimeError(f"init failed on purpose at {current_rank()}")

    @endpoint
    def ping(self) -> str:
        return "pong"


class Caller(Actor):
    """Calls other meshes it was handed (actor-to-actor)."""

    @endpoint
    async def call_mesh(self, mesh: Any, value: int) -> list[int]:
        return (await mesh.incr.call(value)).values()

    @endpoint
    async def call_each(self, mesh: Any) -> list[int]:
        return [await mesh.slice(procs=i).get.call_one() for i in range(len(mesh))]

    @endpoint
    async def sum_values(self, mesh: Any) -> int:
        import operator

        from danaus import Accumulator

        return await Accumulator(mesh.get, 0, operator.add).accumulate()


class Supervisor(Actor):
    """Records each failure of the meshes it owns, as ``mesh|ranks|kind|report``, and
    tells ``port`` of it; its ``__supervise__`` handles them if ``handle``."""

    def __init__(self, handle: bool, port: Port[str] | None = None) -> None:
        self.handle = handle
        self.port = port
        self.failures: list[str] = []

    @endpoint
    def seen(self) -> list[str]:
        return self.failures

    def __supervise__(self, failure: Any) -> bool:
        self.failures.append(
            f"{failure.mesh}|{[str(r) for r in failure.ranks]}|{failure.kind}|{failure.report}"
        )
        if self.port is not None:
            self.port.send(self.failures[-1])
        return self.handle


class Parent(Supervisor):
    """Owns a child mesh; records the failures it is told about."""

    def __init__(self, handle: bool, port: Port[str] | None = None) -> None:
        super().__init__(handle, port)
        self.children: Any = None
        self.procs: Any = None

    @endpoint
    async def spawn_children(self, n: int) -> list[int]:
        from danaus import this_host

        self.procs = this_host().spawn_procs(per_host={"procs": n}, name="kids")
        self.children = self.procs.spawn("child", Echo)
        await self.children.initialized
        return self.procs.pids

    @endpoint
    async def call_children(self) -> list[Any]:
        return (await self.children.echo.call(1)).values()

    @endpoint
    async def call_child(self, rank: int) -> Any:
        return await self.children.slice(procs=rank).echo.call_one(rank)


class Cleaner(Actor):
    def __init__(self, port: Port[str]) -> None:
        self.port = port

    @endpoint
    def ping(self) -> str:
        return "pong"

    @endpoint
    def boom(self) -> None:
        raise RuntimeError("nobody is listening")

    def __cleanup__(self, exc: BaseException | None) -> None:
        self.port.send(f"cleanup {current_rank()} exc={type(exc).__name__ if exc else None}")


class Sink(Actor):
    """Receives a stream of (sender, i) slowly, and remembers the order."""

    def __init__(self) -> None:
        self.got: dict[str, list[int]] = {}
        self.max_depth = 0

    @endpoint
    async def take(self, sender: str, i: int) -> None:
        inst = context().actor_instance.runtime_actor  # type: ignore[union-attr]
        self.max_depth = max(self.max_depth, len(inst.mailbox))
        self.got.setdefault(sender, []).append(i)
        if i % 64 == 0:
            await asyncio.sleep(0)  # suspend now and then, so messages queue up

    @endpoint
    def ack(self) -> None:
        pass

    @endpoint
    def report(self) -> dict[str, Any]:
        return {"got": self.got, "max_depth": self.max_depth}


class Source(Actor):
    @endpoint
    async def pump(self, sink: Any, n: int) -> int:
        me = str(current_rank())
        for i in range(n):
            await sink.take.post(me, i)
        await sink.ack.call_one()  # per-sender order: every post was handled before this
        return n


class Talker(Actor):
    @endpoint
    def say(self, text: str) -> None:
        import logging
        import sys

        print(f"out: {text}")
        print(f"err: {text}", file=sys.stderr)
        logging.getLogger("talker").info("info: %s", text)
        logging.getLogger("talker").warning("warning: %s", text)

    @endpoint
    def last_words(self, text: str) -> None:
        import signal

        print(text)
        os.kill(os.getpid(), signal.SIGKILL)


class ActorFailure(BaseException):
    """Not an Exception: escaping an endpoint, it fails the actor (Monarch's tests raise
    one like it, ``ActorFailureError``)."""


def _not_an_exception(which: str) -> BaseException:
    if which == "SystemExit":
        return SystemExit(3)
    if which == "KeyboardInterrupt":
        return KeyboardInterrupt("interrupted")
    return ActorFailure("simulated actor failure")


class Fragile(Actor):
    """Fails on request: with what is not an Exception (from a sync or an async endpoint,
    or from ``__init__``), or by taking its proc down (a segfault, ``os._exit``). What it
    records, and its ``__cleanup__``, are told to ``port``."""

    def __init__(self, port: Port[str] | None = None, init_raises: str = "") -> None:
        if init_raises:
            raise _not_an_exception(init_raises)
        self.port = port

    @endpoint
    def raise_base(self, which: str) -> None:
        raise _not_an_exception(which)

    @endpoint
    async def araise_base(self, which: str) -> None:
        raise _not_an_exception(which)

    @endpoint
    async def raise_plain(self) -> None:
        raise ValueError("plain")

    @endpoint
    def record(self, i: int) -> None:
        if self.port is not None:
            self.port.send(f"record {i}")

    @endpoint
    async def arecord(self, i: int) -> None:
        if self.port is not None:
            self.port.send(f"arecord {i}")

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def segfault(self) -> None:
        import ctypes

        ctypes.string_at(0)

    @endpoint
    async def exit_now(self, code: int) -> None:
        os._exit(code)

    def __cleanup__(self, exc: BaseException | None) -> None:
        if self.port is not None:
            self.port.send(f"cleanup exc={type(exc).__name__ if exc else None}")


class Guardian(Supervisor):
    """Owns a mesh of ``Fragile`` actors on procs of its own and tells ``port`` of each
    failure of it; ``__supervise__`` handles them if ``handle``."""

    def __init__(self, handle: bool, port: Port[str] | None = None) -> None:
        super().__init__(handle, port)
        self.child: Any = None

    @endpoint
    async def spawn_child(self, n: int) -> list[int]:
        from danaus import this_host

        procs = this_host().spawn_procs(per_host={"procs": n}, name="kids")
        self.child = procs.spawn("child", Fragile)
        await self.child.initialized
        return procs.pids

    @endpoint
    async def child_raises(self, rank: int, which: str) -> str:
        """What the call that fails the child at ``rank`` raised, as text."""
        from danaus import SupervisionError

        try:
            await self.child.slice(procs=rank).araise_base.call_one(which)
        except SupervisionError as e:
            return str(e)
        return "no error"

    @endpoint
    async def child_pid(self, rank: int) -> int:
        return await self.child.slice(procs=rank).pid.call_one()


class Watcher(Actor):
    """Owns a mesh of ``Fragile`` actors (spawned in ``__init__``, as Monarch's tests do)
    and waits, inside an async endpoint, for its ``__supervise__`` to hear of a failure:
    which only works if ``__supervise__`` runs while that endpoint awaits."""

    def __init__(self, procs: Any, handle: bool = True) -> None:
        self.kids = procs.spawn("kids", Fragile)
        self.handle = handle
        self.heard: list[str] = []
        self.news = asyncio.Event()

    @endpoint
    async def fail_kid_and_wait(self, rank: int) -> list[str]:
        await self.kids.pid.call()
        self.kids.slice(procs=rank).raise_plain.broadcast()  # no caller: it fails the kid
        await asyncio.wait_for(self.news.wait(), 30)
        return self.heard

    @endpoint
    async def fail_kid_and_linger(self, rank: int) -> None:
        """Fails a kid, then stays in this endpoint (awaiting) until the actor stops."""
        await self.kids.pid.call()
        self.kids.slice(procs=rank).raise_plain.broadcast()
        # (asyncio.timeout, not wait_for: 3.11's wait_for swallows a cancel that comes
        # while the event it waits for is set, and the actor's stop is such a cancel)
        async with asyncio.timeout(30):
            await self.news.wait()
            await asyncio.Event().wait()  # ended by the actor's failure

    @endpoint
    async def spawn_named(self, procs: Any, name: str) -> list[int]:
        mesh = procs.spawn(name, Fragile)
        return (await mesh.pid.call()).values()

    def __supervise__(self, failure: Any) -> bool:
        self.heard.append(str(failure))
        self.news.set()
        return self.handle


class Liar(Actor):
    """Tells its spawner's supervisor what no actor layer would: a peer gone wrong."""

    @endpoint
    def lie(self) -> None:
        from danaus.actors._instance import tell_supervisor
        from danaus.actors._loops import current_runtime

        owner = context().actor_instance.runtime_actor.owner_addr  # type: ignore[union-attr]
        rt = current_runtime()
        tell_supervisor(rt, owner, "stuck", "too", "few")  # arguments missing
        tell_supervisor(rt, owner, "failed", "m", "nobody", "not ranks", b"\xff", None)
        tell_supervisor(rt, owner, "no_such_report")

    @endpoint
    def die(self) -> None:
        raise SystemExit(3)
