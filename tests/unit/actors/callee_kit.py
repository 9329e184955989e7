"""What the in-process callee tests share: "procs" that are runtimes on loops of their
own, in threads of this process (so that coverage sees the callee half of the actor
runtime), the messages a mesh would send them, and the actors they run.

A :class:`Proc` is made as a proc's main makes its runtime (``danaus/actors/_proc_main.py``):
a loop of its own, a ``Runtime`` installed as that loop's, the control actor installed.
Actors reach it the real way, as a ``Spawn`` over a real connection from the caller's
runtime; calls, casts, cancels and stops are the wire messages the mesh layer sends.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Sequence

from danaus.actors import Actor, Port, concurrent_endpoint, context, current_rank, endpoint
from danaus.actors._future import Future
from danaus.actors._handlers import ProcControl, install_actor
from danaus.actors._loops import close_loop_runtime, install_runtime, new_event_loop
from danaus.actors._runtime import Runtime
from danaus.actors._serialize import dumps, dumps_args
from danaus.actors._wire import (
    ERROR,
    CallSpec,
    Cancel,
    Spawn,
    StopActor,
    StopProc,
)

#: The job key every runtime of these tests authenticates with.
KEY = b"c" * 32
#: Generous bound for anything that should happen at once; a hang fails instead of stalling.
TIMEOUT = 5.0

_wire_ids = itertools.count()
#: Gates a sync endpoint blocks on until the test opens them (by name; see ``Worker``).
GATES: dict[str, threading.Event] = {}


class Proc:
    """A callee runtime on its own event loop, in its own thread: a proc, in-process."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop = new_event_loop()
        self.rt: Runtime | None = None
        self._thread = threading.Thread(target=self._run, name=f"callee {name}", daemon=True)

    def __repr__(self) -> str:
        return f"<Proc {self.name} {self.rt!r}>"

    @property
    def addr(self) -> str:
        assert self.rt is not None, "not started"
        return self.rt.addr

    async def start(self) -> None:
        """Start the loop's thread and make the runtime there, as a proc's main does."""
        self._thread.start()
        made = asyncio.run_coroutine_threadsafe(self._make(), self.loop)
        async with asyncio.timeout(TIMEOUT):
            self.rt = await asyncio.wrap_future(made)

    async def _make(self) -> Runtime:
        rt = Runtime(asyncio.get_running_loop(), key=KEY)
        install_runtime(rt)
        install_actor(rt, "__proc__", ProcControl())
        return rt

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
            # What the closed runtime cancelled finishes here, as asyncio.run's cleanup.
            left = asyncio.all_tasks(self.loop)
            for task in left:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()

    async def stop_requested(self) -> None:
        """Wait until the runtime is asked to end its proc (a ``StopProc``)."""
        rt = self.rt
        assert rt is not None
        here = asyncio.get_running_loop()
        asked: asyncio.Future[None] = here.create_future()

        def watch() -> None:
            rt.stop_requested.add_done_callback(
                lambda _: here.call_soon_threadsafe(_set_none, asked)
            )

        self.loop.call_soon_threadsafe(watch)
        async with asyncio.timeout(TIMEOUT):
            await asked

    async def aclose(self) -> None:
        """Close the runtime on its own loop, stop the loop, join the thread (bounded)."""
        if self._thread.is_alive():
            closing = asyncio.run_coroutine_threadsafe(close_loop_runtime(self.loop), self.loop)
            try:
                async with asyncio.timeout(TIMEOUT):
                    await asyncio.wrap_future(closing)
            finally:  # (the loop stops even if its runtime did not close in time)
                self.loop.call_soon_threadsafe(self.loop.stop)
                self._thread.join(TIMEOUT)
            assert not self._thread.is_alive(), f"{self} did not stop"
        elif not self.loop.is_closed():  # never started
            self.loop.close()


def _set_none(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


# ---------------------------------------------------------------- what the mesh sends


def new_wire_key(name: str) -> str:
    """A spawned actor's wire key, ``name.job.n`` as the mesh layer makes them."""
    return f"{name}.callee.{next(_wire_ids)}"


def spawn(
    caller: Runtime,
    procs: Sequence[Proc],
    cls: type[Actor],
    *args: object,
    wire: str | None = None,
    payload: object = None,
    ranks: Sequence[int] | None = None,
) -> tuple[str, list[Future[object]]]:
    """Send a ``Spawn`` of ``cls(*args)`` to each proc (rank = its index), as
    ``danaus/mesh/_actor_spawn.py`` does; the wire key and each rank's reply (``None``
    once its ``__init__`` has run, else the error). ``payload``: send this instead of
    ``(cls, args, kwargs)``; ``ranks``: spawn at these ranks only."""
    wire = wire or new_wire_key(cls.__name__.lower())
    what = payload if payload is not None else (cls, args, {})
    raw, pickled, parts = dumps(what, lambda: f"actor class {cls.__name__} and its arguments")
    addrs = [p.addr for p in procs]
    replies: list[Future[object]] = []
    for rank in range(len(addrs)) if ranks is None else ranks:
        addr = addrs[rank]
        fut: Future[object] = Future(loop=caller.loop)
        port = caller.open_future_port(fut)
        msg = Spawn(
            wire, port, "procs", rank, {"procs": len(addrs)}, raw, pickled, caller.addr, addrs
        )
        conn = caller.connection(addr)
        assert conn.send(msg, parts)
        conn.pending[port] = rank
        replies.append(fut)
    return wire, replies


class Sent:
    """One call sent: its reply (a future) and the port it comes to."""

    def __init__(self, reply: Future[object], port: int, addr: str, actor: str) -> None:
        self.reply = reply
        self.port = port
        self.addr = addr
        self.actor = actor

    def __repr__(self) -> str:
        return f"<Sent {self.actor}@{self.addr}#{self.port}>"


def call(caller: Runtime, addr: str, actor: str, method: str, *args: object, rank: int = 0) -> Sent:
    """Call ``method`` of ``actor`` at ``addr`` as an endpoint's ``call_one`` does."""
    raw, pickled, parts = dumps_args(args, {}, lambda: f"arguments of {method}")
    fut: Future[object] = Future(loop=caller.loop)
    port = caller.open_future_port(fut)
    caller.send_call(addr, rank, port, CallSpec(actor, method, raw, pickled, parts))
    return Sent(fut, port, addr, actor)


def cancel(caller: Runtime, sent: Sent) -> None:
    """The caller gives up on ``sent``: what cancelling an endpoint's future does."""
    sent.reply.cancel()
    caller.close_port(sent.port)
    conn = caller.conns[sent.addr]
    conn.pending.pop(sent.port, None)
    assert conn.send(Cancel(sent.actor, sent.port))


def stop_actor(caller: Runtime, addr: str, actor: str) -> Future[object]:
    """Send a ``StopActor``; its reply comes once the actor has stopped."""
    fut: Future[object] = Future(loop=caller.loop)
    assert caller.connection(addr).send(StopActor(actor, caller.open_future_port(fut)))
    return fut


def stop_proc(caller: Runtime, addr: str) -> Future[object]:
    """Send a ``StopProc``; its reply comes once every actor there has stopped."""
    fut: Future[object] = Future(loop=caller.loop)
    assert caller.connection(addr).send(StopProc(caller.open_future_port(fut)))
    return fut


class Gather:
    """A port that collects each rank's reply to a cast: ``{rank: value or error}``."""

    def __init__(self, caller: Runtime) -> None:
        self.got: dict[int, object] = {}
        #: every delivery in order, as (rank, value or error): a reduce's come per subtree
        self.deliveries: list[tuple[int, object]] = []
        self._changed = asyncio.Event()
        self.port = caller.open_port(self)

    def __repr__(self) -> str:
        return f"<Gather port={self.port} got={sorted(self.got)}>"

    def __call__(self, rank: int, status: int, value: object) -> bool:
        if status == ERROR:
            assert isinstance(value, BaseException), value
        self.got[rank] = value
        self.deliveries.append((rank, value))
        self._changed.set()
        return False  # the test closes the port

    async def until(self, done: Callable[[], bool]) -> None:
        """Wait (bounded) until ``done()`` holds."""
        async with asyncio.timeout(TIMEOUT):
            while not done():
                self._changed.clear()
                await self._changed.wait()


def cast(
    caller: Runtime,
    procs: Sequence[Proc],
    actor: str,
    method: str,
    *args: object,
    port: int = 0,
    reducer: object = None,
) -> None:
    """Cast ``method`` to ``actor`` in every proc (rank = index), as a mesh's ``call``
    does; ``reducer``: an accumulator's ``(identity, combine)``."""
    raw, pickled, parts = dumps_args(args, {}, lambda: f"arguments of {method}")
    red = None
    if reducer is not None:
        red_raw, red_pickled, _ = dumps(reducer, lambda: "the accumulator's combine function")
        red = (red_raw, red_pickled)
    targets = [(rank, p.addr) for rank, p in enumerate(procs)]
    caller.call(targets, port, CallSpec(actor, method, raw, pickled, parts), red)


# ---------------------------------------------------------------- actors


class Worker(Actor):
    """Sync endpoints (on the actor's thread) and async ones (on the proc's loop)."""

    def __init__(self, scale: int = 1) -> None:
        self.scale = scale
        self.log: list[object] = []
        self.started = asyncio.Event()
        self.cancelled = False
        self.owed: Port[object] | None = None
        self.loop = asyncio.get_running_loop()  # (its __init__ runs on the proc's loop)

    @endpoint
    def add(self, a: int, b: int) -> int:
        return (a + b) * self.scale

    @endpoint
    async def echo(self, x: object) -> object:
        await asyncio.sleep(0)  # (it really suspends, as an async endpoint may)
        return x

    @endpoint
    def fail(self, why: str) -> None:
        raise ValueError(why)

    @endpoint
    async def fail_async(self, why: str) -> None:
        raise KeyError(why)

    @endpoint
    def record(self, item: object) -> object:
        self.log.append(item)
        return item

    @endpoint
    async def record_async(self, item: object) -> object:
        self.log.append(item)
        return item

    @endpoint
    def logged(self) -> list[object]:
        return list(self.log)

    @endpoint
    def value(self) -> int:
        """What each rank contributes to a cast: ten times its rank."""
        return 10 * current_rank().rank

    @endpoint
    def value_or_fail(self, bad_rank: int) -> int:
        rank = current_rank().rank
        if rank == bad_rank:
            raise ValueError(f"rank {rank} cannot")
        return 10 * rank

    @endpoint
    async def value_or_hang(self, hang_rank: int) -> int:
        rank = current_rank().rank
        if rank == hang_rank:
            self.started.set()
            await asyncio.Event().wait()  # until cancelled (its proc closes)
        return 10 * rank

    @endpoint
    def value_or_block(self, block_rank: int, gate: str) -> int:
        """As ``value``, but rank ``block_rank`` blocks its thread on ``GATES[gate]``: it
        cannot answer, even when its proc closes."""
        rank = current_rank().rank
        if rank == block_rank:
            self.loop.call_soon_threadsafe(self.started.set)
            GATES[gate].wait(2 * TIMEOUT)
        return 10 * rank

    @endpoint
    async def hang(self) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()  # until its caller cancels it
        except asyncio.CancelledError:
            self.cancelled = True
            raise

    @concurrent_endpoint
    async def wait_started(self) -> bool:
        """Answers once a hanging endpoint has started (it does not hold the mailbox)."""
        await self.started.wait()
        return True

    @endpoint
    def was_cancelled(self) -> bool:
        return self.cancelled

    @endpoint
    def exit(self) -> None:
        raise SystemExit(3)  # not an Exception: it fails the actor

    @endpoint(explicit_response_port=True)
    def answer_later(self, port: Port[object]) -> None:
        self.owed = port  # answered by a later message (answer_owed)

    @endpoint
    def answer_owed(self, value: object) -> None:
        assert self.owed is not None
        self.owed.send(value)


class OnItsThread(Actor):
    """Endpoints all sync: ``__init__`` runs on the actor's thread too, as in Monarch."""

    def __init__(self) -> None:
        self.init_thread = threading.current_thread().name
        self.rank = context().actor_instance.rank.rank

    @endpoint
    def threads(self) -> tuple[str, str]:
        return self.init_thread, threading.current_thread().name

    @endpoint
    def my_rank(self) -> int:
        return self.rank


class BadInit(Actor):
    """An actor whose ``__init__`` raises."""

    def __init__(self) -> None:
        raise RuntimeError("no accelerator here")

    @endpoint
    def ping(self) -> str:
        return "pong"
