"""``Future``: awaitable in async code, ``.get()`` in sync code."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Generic, TypeVar

__all__ = ["Future"]

T = TypeVar("T")


def _no_running_loop(what: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(
        f"{what} blocks, and this thread is running an event loop: "
        "use `await` on the future instead of .get()"
    )


class Future(asyncio.Future[T], Generic[T]):
    """The result of a call: ``await fut`` in async code, ``fut.get()`` in sync code.

    It is an ``asyncio.Future``, so it works with ``asyncio.gather``, ``wait_for`` and
    ``add_done_callback``. Calls made from synchronous code run on danaus's own
    background event loop, and ``get()`` waits for them from the calling thread.
    """

    def get(self, timeout: float | None = None) -> T:
        """Wait for the result from synchronous code.

        Args:
            timeout: seconds to wait at most; ``None`` waits until the result comes
                (calls into dead procs still fail, they never hang).

        Raises:
            RuntimeError: called from a thread that runs an event loop (``await`` there).
            TimeoutError: no result within ``timeout``.
        """
        _no_running_loop("Future.get()")
        if not self.done():
            loop = self.get_loop()
            if not loop.is_running():
                raise RuntimeError(
                    "this future belongs to an event loop that is not running; "
                    "await it inside that loop"
                )
            event = threading.Event()

            def arm() -> None:
                self.add_done_callback(lambda _: event.set())

            loop.call_soon_threadsafe(arm)
            if not event.wait(timeout):
                raise TimeoutError(f"no result within {timeout} s")
        return self.result()

    def __repr__(self) -> str:
        state = "pending" if not self.done() else ("cancelled" if self.cancelled() else "done")
        return f"<danaus.Future {state}>"


def resolved(loop: asyncio.AbstractEventLoop, value: Any) -> Future[Any]:
    """A future that is already done with ``value``."""
    f: Future[Any] = Future(loop=loop)
    f.set_result(value)
    return f
