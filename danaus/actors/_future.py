"""``Future``: awaitable in async code, ``.get()`` in sync code, from any thread or loop."""

from __future__ import annotations

import asyncio
import threading
from asyncio.events import _get_running_loop
from collections.abc import Callable, Generator
from typing import Generic, NoReturn, TypeVar

from ..errors import DeadlockError

__all__ = ["Future"]

T = TypeVar("T")


class Future(asyncio.Future[T], Generic[T]):
    """The result of a call: ``await fut`` in async code, ``fut.get()`` in sync code.

    It is an ``asyncio.Future`` of the loop that sent the call, so it works with
    ``asyncio.gather``, ``wait_for`` and ``add_done_callback`` there. It may also be
    awaited on another running loop (a notebook cell awaiting a call made by sync code;
    the value is relayed between the loops), and ``get()`` works from any thread except
    the one running this future's own loop, where waiting would deadlock.

    Cancelling it (``fut.cancel()``, a cancelled task awaiting it, an
    ``asyncio.timeout``) also cancels the remote call: still queued, it never runs; an
    async endpoint running it sees ``CancelledError``; a sync endpoint finishes and its
    result is dropped.
    """

    #: called once when the future is cancelled (tells the callee); set by the sender
    _on_cancel: Callable[[], None] | None = None
    #: set when this is a call into the actor whose own endpoint made it: waiting for it
    #: from inside that endpoint can never end (the actor runs one message at a time)
    _self_wait: tuple[object, str] | None = None
    #: held as long as this future lives (the port receiver it answers from)
    _keepalive: object = None
    #: settled only through its runtime's port (``_replies_in.settle``), which wakes a
    #: thread waiting in :meth:`get` through :attr:`thread_waiter` itself
    settled_by_port = False
    #: set by :meth:`get` while a thread waits for this future (of a port, see above)
    thread_waiter: threading.Event | None = None

    def get(self, timeout: float | None = None) -> T:
        """Wait for the result from synchronous code (a script, a sync endpoint, a
        notebook cell).

        Args:
            timeout: seconds to wait at most; ``None`` waits until the result comes
                (calls into dead procs still fail, they never hang). A timeout does
                not cancel the call: ``get()`` may be called again.

        Raises:
            DeadlockError: pending, and the calling thread runs this future's loop (``await`` it
                there), or an actor waits for a call into itself.
            TimeoutError: no result within ``timeout``.
        """
        if self.done():
            return super().result()
        loop = self.get_loop()
        if _get_running_loop() is loop:
            raise DeadlockError(
                "Future.get() would deadlock: this future belongs to the event loop that "
                "this thread is running, which cannot make progress while .get() blocks "
                "it; use `await` on the future instead"
            )
        self._check_self_wait()
        if not loop.is_running():
            raise RuntimeError(
                "this future belongs to an event loop that is not running; "
                "await it inside that loop"
            )
        event = threading.Event()
        if self.settled_by_port:
            # Its port wakes us once it is settled: no trip to the loop to arm a callback.
            # (Either the settling reads this after we set it, or it settled before, and
            # done() below sees it: each side writes before it reads the other's.)
            self.thread_waiter = event
            if self.done():
                return super().result()
        else:

            def arm() -> None:
                self.add_done_callback(lambda _: event.set())

            loop.call_soon_threadsafe(arm)
        if not event.wait(timeout):
            # The caller stopped waiting: an error that comes later is for a get() called
            # again, not for asyncio's "exception was never retrieved" log.
            loop.call_soon_threadsafe(self.add_done_callback, _quiet)
            raise TimeoutError(f"no result within {timeout} s")
        return super().result()

    def result(self, timeout: float | None = None) -> T:
        """The value. Done: at once, as asyncio's. Pending: waits like :meth:`get`
        (Monarch's ``result(timeout)``), except on this future's own loop, where it raises
        ``asyncio.InvalidStateError`` as asyncio's does (waiting there would deadlock)."""
        if self.done() or _get_running_loop() is self.get_loop():
            return super().result()
        return self.get(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The exception (``None`` for a value), waiting like :meth:`result` if pending."""
        if self.done() or _get_running_loop() is self.get_loop():
            return super().exception()
        try:
            self.get(timeout)
        except TimeoutError:
            raise
        except Exception as e:
            return e
        return None

    def as_asyncio(self) -> asyncio.Future[T]:
        """An ``asyncio.Future`` of the running loop that resolves with this one (Monarch's
        name): this future itself on its own loop, a relay on another."""
        running = _get_running_loop()
        if running is None:
            raise RuntimeError("as_asyncio() needs a running event loop")
        if running is self.get_loop():
            return self
        return asyncio.ensure_future(_relay(self, running), loop=running)

    def __await__(self) -> Generator[object, None, T]:
        if self._self_wait is not None and not self.done():
            self._check_self_wait()
        running = _get_running_loop()
        if running is not None and running is not self.get_loop() and not self.done():
            return _relay(self, running).__await__()
        return super().__await__()

    __iter__ = __await__

    def cancel(self, msg: object | None = None) -> bool:
        if not super().cancel(msg=msg):
            return False
        waiter = self.thread_waiter
        if waiter is not None:
            waiter.set()
        hook = self._on_cancel
        if hook is not None:
            self._on_cancel = None
            hook()
        return True

    def set_cancel_hook(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` once when this future is cancelled: how the layer that sent
        the call tells the callee to stop."""
        self._on_cancel = hook

    @property
    def cancel_hook(self) -> Callable[[], None] | None:
        """The hook :meth:`set_cancel_hook` set (``None``: none, or it ran)."""
        return self._on_cancel

    def set_self_wait(self, actor: object, what: str) -> None:
        """Mark this as a call into ``actor`` made by its own endpoint: waiting for it
        from inside that endpoint raises ``DeadlockError(what)`` instead of hanging."""
        self._self_wait = (actor, what)

    def keep_alive(self, obj: object) -> None:
        """Hold a reference to ``obj`` as long as this future lives (the port receiver
        that resolves it, which closes its port when dropped)."""
        self._keepalive = obj

    def _check_self_wait(self) -> None:
        sw = self._self_wait
        if sw is None:
            return
        actor, what = sw
        from ._actor_thread import waiting_actor

        if waiting_actor() is actor and not self.done():
            raise DeadlockError(what)

    def __repr__(self) -> str:
        state = "pending" if not self.done() else ("cancelled" if self.cancelled() else "done")
        return f"<danaus.Future {state}>"

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            "a danaus Future cannot be pickled: it is a result arriving at this process "
            "(on its event loop), as in Monarch; send its value (`await fut`, "
            "`fut.get()`), or send a Port and reply through it"
        )


async def _relay(fut: Future[T], running: asyncio.AbstractEventLoop) -> T:
    """Await ``fut`` (of another loop, running in another thread) from ``running``."""
    if fut.done():
        return fut.result()
    home = fut.get_loop()
    if home.is_closed() or not home.is_running():
        raise RuntimeError("this future belongs to an event loop that is not running")
    waiter: asyncio.Future[None] = running.create_future()

    def wake(_: object) -> None:
        try:
            running.call_soon_threadsafe(_set_none, waiter)
        except RuntimeError:
            pass  # the awaiting loop closed meanwhile

    home.call_soon_threadsafe(fut.add_done_callback, wake)
    try:
        await waiter
    except asyncio.CancelledError:
        home.call_soon_threadsafe(fut.cancel)
        raise
    return fut.result()


def _quiet(f: asyncio.Future[T]) -> None:
    if not f.cancelled():
        f.exception()  # marks it retrieved


def _set_none(f: asyncio.Future[None]) -> None:
    if not f.done():
        f.set_result(None)
