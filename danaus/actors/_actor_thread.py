"""The thread that runs an actor's synchronous code, off its proc's event loop.

A proc's event loop reads every connection, answers heartbeats, forwards logs and
routes port messages. Sync endpoints (and ``__init__``) may block for hours, so they run
here instead: one thread per actor, started at its first sync message, running that
actor's sync jobs one at a time, in the order handed over. The loop hands over a run of
consecutive sync messages at once and takes the finished jobs back in batches (one
wake-up of the loop per batch, not per job), so a stream of small calls stays pipelined.
A job that returns a small atom (an ``int``, a short ``str``...) with no job queued behind
it sends its reply from here at once (``Replier.reply_from_thread``), unless something
sent earlier is still on its way through the loop: the loop's wake-up is then off the
caller's path. Behind a queue of jobs, the loop batches their replies as before.

Code running here may call other actors and wait with ``.get()``: its calls go out
through the proc's own runtime (see :func:`thread_home`).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, cast

from ..config import config
from ._context import current

if TYPE_CHECKING:
    from ._instance import ActorInstance
    from ._replies_out import ReplySink
    from ._runtime import Runtime
    from ._wire import Call

__all__ = ["ActorThread", "InitJob", "Job", "JobFn", "thread_home", "waiting_actor"]

log = logging.getLogger("danaus.actor")


class _Local(threading.local):
    """Per thread: set in actor threads only (class defaults elsewhere, no lookup miss)."""

    runtime: Runtime | None = None
    actor: ActorInstance | None = None


_local = _Local()


def thread_home() -> Runtime | None:
    """The runtime of the proc whose actor thread this is (``None`` elsewhere)."""
    return _local.runtime


def waiting_actor() -> ActorInstance | None:
    """The actor whose message the calling code is handling, if waiting here for a
    call into that same actor could never end (it runs one message at a time)."""
    actor = _local.actor
    if actor is not None:
        return actor
    ctx = current.get().actor
    if ctx is None:
        return None  # the controller
    inst = ctx.runtime_actor
    running = inst.in_flight.task if inst is not None else None
    if running is not None:
        try:
            task = asyncio.current_task()
        except RuntimeError:
            return None
        if running is task:
            return inst
    return None


class JobFn(Protocol):
    """What a job runs: an endpoint's function, given the actor and the caller's values."""

    def __call__(self, actor: object, /, *args: object, **kwargs: object) -> object: ...


class Job:
    """One piece of sync work: ``fn(*args, **kwargs)``, and how it ended: ``ok`` with its
    ``value``, or the ``error`` it raised."""

    __slots__ = (
        "args",
        "cancelled",
        "conn",
        "error",
        "fn",
        "kwargs",
        "msg",
        "ok",
        "replied",
        "started",
        "started_at",
        "value",
    )

    def __init__(
        self,
        conn: ReplySink,
        msg: Call,
        fn: JobFn,
        args: tuple[object, ...],
        kwargs: dict[str, object],
    ) -> None:
        self.conn = conn
        self.msg = msg
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.ok = False
        self.value: object = None
        self.error: BaseException | None = None
        self.cancelled = False  # the caller gave up: skip it, or drop its result
        self.replied = False  # its reply went out from the actor's thread
        self.started = False
        self.started_at = 0.0  # (time.monotonic())

    def __repr__(self) -> str:
        state = (
            "cancelled"
            if self.cancelled
            else "done"
            if self.ok or self.error is not None
            else "running"
            if self.started
            else "queued"
        )
        return f"<Job {getattr(self.fn, '__name__', self.fn)} {state}>"


class InitJob(Job):
    """An actor's ``__init__``, when its endpoints are all sync: the first job on its
    thread, as Monarch runs it there (thread-local state it sets is its endpoints');
    ``then(job)`` runs on the loop once it is done."""

    def __init__(
        self,
        fn: JobFn,
        args: tuple[object, ...],
        kwargs: dict[str, object],
        then: Callable[[InitJob], None],
    ) -> None:
        super().__init__(cast("ReplySink", None), cast("Call", None), fn, args, kwargs)
        self.then = then


def _stop_at_error(exc: BaseException, actor: ActorInstance) -> None:
    """``config.debug_on_error``: pdb at the frame that raised, before the caller hears."""
    from ._debugging import hook as _debug

    if _debug.wants_post_mortem(exc):
        _debug.post_mortem(exc, actor)


class ActorThread:
    """Runs one actor's sync jobs in order on a daemon thread; reports finished ones
    back to the loop with ``on_done(jobs)``, called on the loop's thread."""

    def __init__(
        self,
        rt: Runtime,
        actor: ActorInstance,
        name: str,
        cv: contextvars.Context,
        on_done: Callable[[list[Job]], None],
    ) -> None:
        self._rt = rt
        self._loop = rt.loop
        self._actor = actor
        self._cv = cv
        self._on_done = on_done
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._done: collections.deque[Job] = collections.deque()
        self._wake_pending = False
        #: jobs handed back to the loop (this thread's count), and those the loop has
        #: answered (the loop's): equal, no earlier reply is still to go out
        self._handed_back = 0
        self._answered = 0
        self.closed = False
        self.current: Job | None = None
        self._thread = threading.Thread(target=self._main, name=f"danaus-actor {name}", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "running" if self.current else "idle"
        return f"<ActorThread {self._thread.name} {state}>"

    @property
    def ident(self) -> int | None:
        """The thread's ident (for ``sys._current_frames``)."""
        return self._thread.ident

    def submit(self, job: Job) -> None:
        self._jobs.put(job)

    def close(self) -> None:
        """Finish the job running now (if any), skip the rest, and end the thread."""
        self.closed = True
        self._jobs.put(None)

    def _main(self) -> None:
        _local.runtime = self._rt
        _local.actor = self._actor
        run = self._cv.run
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if not job.cancelled and not self.closed:
                job.started_at = time.monotonic()
                job.started = True
                self.current = job
                try:
                    job.value = run(job.fn, *job.args, **job.kwargs)
                    job.ok = True
                except BaseException as e:  # user code: every outcome is reported
                    if config.debug_on_error:
                        _stop_at_error(e, self._actor)
                    job.error = e
                    if not isinstance(e, Exception):
                        self.closed = True  # it fails the actor: the jobs behind never run
                self.current = None
                if (
                    job.ok
                    and self._handed_back == self._answered
                    and self._jobs.empty()  # (a stream of calls: the loop batches replies)
                    and type(job) is Job
                    and not job.cancelled
                    and not self.closed
                ):
                    # Its reply, from here: the loop's wake-up (for the next message)
                    # is then off its caller's path.
                    job.replied = self._reply_from_here(job)
            job.args = job.kwargs = None  # type: ignore[assignment]  # free them now
            self._done.append(job)
            self._handed_back += 1
            if not self._wake_pending:
                self._wake_pending = True
                try:
                    self._loop.call_soon_threadsafe(self._flush)
                except RuntimeError:  # the loop closed: the proc is exiting
                    return

    def _reply_from_here(self, job: Job) -> bool:
        try:
            return self._actor.replier.reply_from_thread(job)
        except Exception:  # (a fault of ours: the loop replies instead, as it can)
            log.exception("replying from %s failed; the loop replies", self._thread.name)
            return False

    def _flush(self) -> None:
        self._wake_pending = False  # before draining: a job finished after this wakes us again
        done = self._done
        jobs = []
        while done:
            jobs.append(done.popleft())
        if jobs:
            self._on_done(jobs)
            self._answered += len(jobs)
