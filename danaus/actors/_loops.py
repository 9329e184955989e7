"""Which event loop and runtime a call goes through, danaus's background loop, and
running work on a runtime's loop from any thread."""

from __future__ import annotations

import asyncio
import atexit
import inspect
import socket
import sys
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future as ThreadFuture
from types import FrameType
from typing import TypeVar, TypeVarTuple

from ..config import config
from ._actor_thread import thread_home
from ._future import Future
from ._process import process
from ._runtime import Runtime, log

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class Background:
    """danaus's background loop, on a thread of its own, and its runtime."""

    """danaus's own event loop in a daemon thread, for calls made from sync code.

    It is stopped at interpreter exit (``atexit``, bounded): a daemon thread still
    running the loop while the interpreter finalizes can wake up (a timer, a socket, a
    proc's exit) after Python's state is torn down, and crash the process.
    """

    def __init__(self, addr: str | None = None, sock: socket.socket | None = None) -> None:
        self.loop = new_event_loop()
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, name="danaus-loop", daemon=True)
        self.thread.start()
        self.started.wait()
        fut: ThreadFuture[Runtime] = ThreadFuture()

        def make() -> None:
            try:
                fut.set_result(Runtime(self.loop, addr=addr, sock=sock))
            except BaseException as e:
                fut.set_exception(e)

        self.loop.call_soon_threadsafe(make)
        self.runtime = fut.result(timeout=30)
        with process.runtimes_lock:
            process.runtimes[self.loop] = self.runtime
        atexit.register(self.close)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the loop and join its thread (at most ``timeout`` s), then close the loop.

        Later calls through it then fail (the loop is closed) instead of waiting forever.
        """
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout)
        if not self.thread.is_alive():
            self.loop.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self.started.set)
        while True:
            try:
                self.loop.run_forever()
                return  # stopped by close()
            except (KeyboardInterrupt, SystemExit):
                # asyncio lets these out of the loop after storing them in the task that
                # raised them: an async endpoint's own code (an actor of this_proc()),
                # never a signal (those go to the main thread). They fail that actor (the
                # task's done callback runs when the loop resumes), not this loop.
                continue


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop where uvloop is importable (and ``config.use_uvloop``), else asyncio's."""
    if config.use_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def background_runtime() -> Runtime:
    """The runtime of danaus's background loop (started on first use)."""
    bg = process.background
    if bg is None:
        with process.background_lock:  # one background loop, even when threads race here
            if process.background is None:
                process.background = Background()
            bg = process.background
    return bg.runtime


def start_background_runtime(addr: str, sock: socket.socket) -> Runtime:
    """Start the background loop with a runtime known to peers as ``addr`` while it
    listens on ``sock`` (``attach``: peers reach it through a gateway at ``addr``).

    Raises:
        RuntimeError: the background loop has started already.
    """
    with process.background_lock:
        if process.background is not None:
            raise RuntimeError("danaus's background runtime has started already")
        bg = process.background = Background(addr, sock)
        return bg.runtime


def current_runtime() -> Runtime:
    """The runtime the calling code sends through (see :func:`runtime_here`)."""
    return runtime_here()[0]


def runtime_here() -> tuple[Runtime, bool]:
    """``(runtime, on its loop)``: which runtime the calling code's calls go through.

    - An actor's thread (a sync endpoint): its proc's runtime, handed over to its loop.
    - A thread running no loop (a script, a worker thread): danaus's background loop.
    - A loop danaus runs (a proc's, the background one): that loop's runtime.
    - An application's loop (aiohttp, ``asyncio.run``, a Jupyter kernel): its own runtime,
      on that loop with no thread hop, for code inside a coroutine (an ``async def``, a
      notebook statement with a top-level ``await``) or a loop callback; a notebook cell's
      plain statements (module-level code that the kernel runs from a coroutine) go through
      the background loop instead, so that ``.get()`` can block without deadlocking.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        home = thread_home()
        return (home, False) if home is not None else (background_runtime(), False)
    p = process
    last_loop, rt = p.last
    if loop is not last_loop:
        rt = p.runtimes.get(loop)
    if (rt is None or rt.borrowed) and not _caller_can_await():
        return background_runtime(), False
    if rt is None:
        with p.runtimes_lock:
            rt = p.runtimes.get(loop)
            if rt is None:
                for old_loop, old in list(p.runtimes.items()):
                    if old_loop.is_closed():  # e.g. an earlier asyncio.run()
                        del p.runtimes[old_loop]
                        old.abandon()
                rt = Runtime(loop)
                rt.borrowed = True
                p.runtimes[loop] = rt
    p.last = (loop, rt)
    return rt, True


_ASYNC_CODE = inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE | inspect.CO_ASYNC_GENERATOR


def _caller_can_await() -> bool:
    """Is the code calling into danaus able to await what it gets, on the running loop?

    Walks out from the caller to the first coroutine frame (an ``async def``, a notebook
    statement with a top-level ``await``): yes. Interactive code is module-level code that
    an async framework runs with ``exec`` (a Jupyter cell's plain statements, whose
    ``<module>`` frame is called from a coroutine): it cannot await, so no. Everything
    else — plain functions, torch's dispatch, comprehensions, a script's own top level
    below the loop, a loop callback — passes through, and reaching the end counts as yes
    (a callback of the running loop).
    """
    f: FrameType | None = sys._getframe(2)  # noqa: SLF001 - the stdlib's
    while f is not None:
        code = f.f_code
        if code.co_flags & _ASYNC_CODE:
            return True
        back = f.f_back
        if code.co_name == "<module>" and back is not None and back.f_code.co_flags & _ASYNC_CODE:
            return False
        f = back
    return True


async def close_loop_runtime(loop: asyncio.AbstractEventLoop) -> None:
    """Close the runtime of ``loop`` if it has one (e.g. before the loop itself closes)."""
    with process.runtimes_lock:
        rt = process.runtimes.pop(loop, None)
        if process.last[0] is loop:
            process.last = (None, None)
    if rt is not None:
        await rt.aclose()


def install_runtime(rt: Runtime) -> None:
    """Make ``rt`` the runtime of its loop (a proc's main does this)."""
    with process.runtimes_lock:
        process.runtimes[rt.loop] = rt


def all_runtimes() -> list[Runtime]:
    with process.runtimes_lock:
        return list(process.runtimes.values())


def runtime_started() -> bool:
    """Whether a runtime of this process listens (danaus has begun here)."""
    return any(not rt.closed for rt in all_runtimes())


def enable_transport(transport: object) -> None:
    """Choose how this process and the procs it starts here listen (Monarch's
    ``enable_transport``): a ``ChannelTransport``, Monarch's short names (``"tcp"``,
    ``"ipc"``, ``"tls"``, ...) or an address (``"tcp://127.0.0.1:8080"``). Sets
    ``config.transport`` as ``configure`` does, so procs started later inherit it.

    Call it before anything else of danaus runs here: once a runtime is listening,
    enabling the same transport again is a no-op and another raises ``RuntimeError``.

    Raises:
        TypeError, ValueError: ``transport`` names no transport (``config.transport_text``).
        RuntimeError: a runtime already listens with another transport.
    """
    from ..config import configure, transport_text

    text = transport_text(transport)
    if runtime_started():
        if text == config.transport:
            return
        raise RuntimeError(
            f"enable_transport({transport!r}) must come before any other danaus call: this "
            f"process already listens with transport {config.transport!r}, and one "
            "transport is enabled at a time"
        )
    configure(transport=text)


def run_on(rt: Runtime, fn: Callable[[*Ts], object], *args: *Ts) -> None:
    """Call ``fn(*args)`` on ``rt``'s loop: now if we are on it, else thread-safely (and
    until it has run there, this runtime's threads write no frame themselves: see
    ``Runtime.hand_over``)."""
    if rt.on_loop():
        fn(*args)
    else:
        rt.call_soon_handed(fn, *args)


def call_in_loop(rt: Runtime, fn: Callable[[*Ts], T], *args: *Ts) -> T:
    """``fn(*args)`` on ``rt``'s loop thread, waiting for its value: for danaus state that
    only the loop may touch, reached from sync code on another thread."""
    if rt.on_loop():
        return fn(*args)
    fut: ThreadFuture[T] = ThreadFuture()

    def go() -> None:
        try:
            fut.set_result(fn(*args))
        except BaseException as e:  # handed to the waiting thread
            fut.set_exception(e)

    rt.loop.call_soon_threadsafe(go)
    return fut.result(timeout=config.connect_timeout)


def run_task(rt: Runtime, make: Callable[[], Coroutine[object, object, T]]) -> Future[T]:
    """Run the coroutine ``make()`` as a task of ``rt`` (from any thread); a Future of its
    outcome: awaitable on ``rt``'s loop, ``.get()`` elsewhere."""
    fut: Future[T] = Future(loop=rt.loop)

    def start() -> None:
        # The outcome goes to ``fut``: its caller gets the error (and asyncio reports one
        # set on a future that is dropped unretrieved), so the runtime does not log it too.
        task = rt.spawn_task(make(), log_failure=False)

        def done(t: asyncio.Task[T]) -> None:
            exc = None if t.cancelled() else t.exception()
            if fut.done():  # the caller gave up on it (cancelled): nobody else gets this
                if exc is not None and not isinstance(exc, asyncio.CancelledError):
                    log.error("task failed after its caller stopped waiting", exc_info=exc)
                return
            if t.cancelled():
                fut.cancel()
            elif exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(t.result())

        task.add_done_callback(done)
        # Cancelling the future (a timeout, a cancelled caller) stops the work too.
        fut.set_cancel_hook(lambda: run_on(rt, task.cancel))

    run_on(rt, start)
    return fut
