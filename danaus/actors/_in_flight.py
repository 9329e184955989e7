"""What an actor is running now: the async message (or ``__supervise__``) that holds its
mailbox, its concurrent endpoints, and the sync messages handed to its own thread
(:class:`ActorThread`, started at the first one). It owns those tasks and jobs: their
bookkeeping from start to end, a caller's cancellation, the answers to "what is it
doing" (``mesh.stats()``, ``mesh.stacks()``, stuck warnings), and waiting for them when
the actor stops. What an outcome means (a reply, a failure) is the actor instance's."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

from ..config import config
from ._actor_thread import ActorThread, InitJob, Job
from ._wire import Call

if TYPE_CHECKING:
    from ._instance import ActorInstance
    from ._replies_out import ReplySink
    from ._runtime import Runtime

__all__ = ["InFlight", "Mine"]

log = logging.getLogger("danaus.actor")

#: Is the message sent on this connection this one (the one a caller gave up on)?
Mine: TypeAlias = "Callable[[ReplySink, Call], bool]"


class InFlight:
    """The messages one actor runs now: at most one holding its mailbox (an async task,
    or a run of sync jobs on its thread), and any number of concurrent endpoints."""

    def __init__(
        self,
        rt: Runtime,
        actor: ActorInstance,
        count: bool,
        on_jobs_done: Callable[[list[Job]], None],
    ) -> None:
        self._rt = rt
        self._actor = actor
        #: keep start times (config.actor_stats)
        self._count = count
        self._on_jobs_done = on_jobs_done
        #: the async message (or ``__supervise__``) running now; it holds the mailbox
        self.task: asyncio.Task[object] | None = None
        self._task_call: tuple[ReplySink, Call] | None = None
        self._caller_cancelled = False
        #: concurrent endpoints running now (they do not hold the mailbox)
        self._concurrent: dict[asyncio.Task[object], tuple[ReplySink, Call]] = {}
        self._concurrent_cancelled: set[asyncio.Task[object]] = set()
        #: when each async message running now started (time.monotonic())
        self._since: dict[asyncio.Task[object], float] = {}
        #: sync messages handed to the actor's thread and not yet reported back
        self.jobs: collections.deque[Job] = collections.deque()
        self._thread: ActorThread | None = None
        self._jobs_idle: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return (
            f"<InFlight {self._actor.ctx.actor_id} task={self.task is not None} "
            f"concurrent={len(self._concurrent)} jobs={len(self.jobs)}>"
        )

    @property
    def busy(self) -> bool:
        """A message holds the mailbox (an async one runs, or sync ones are on the thread)."""
        return self.task is not None or bool(self.jobs)

    # ------------------------------------------------------------ start and end

    def submit(self, job: Job) -> None:
        """Hand a sync message to the actor's thread (started now if it is the first)."""
        self.jobs.append(job)
        thread = self._thread
        if thread is None:
            a = self._actor
            thread = self._thread = ActorThread(
                self._rt, a, a.ctx.actor_id, a.cv.copy(), self._on_jobs_done
            )
        thread.submit(job)

    def close_thread(self) -> None:
        """End the actor's thread, if it has one (its ``__init__`` failed there)."""
        if self._thread is not None:
            self._thread.close()

    def finished(self, n: int) -> None:
        """The thread reported back its ``n`` oldest jobs."""
        jobs = self.jobs
        for _ in range(n):
            jobs.popleft()
        if not jobs and self._jobs_idle is not None and not self._jobs_idle.done():
            self._jobs_idle.set_result(None)

    def start(
        self,
        task: asyncio.Task[object],
        conn: ReplySink,
        msg: Call,
        concurrent: bool,
        done: Callable[[asyncio.Task[object]], object],
    ) -> None:
        """``task`` runs ``msg``: alongside others if ``concurrent``, else holding the
        mailbox until it is done; ``done(task)`` then."""
        if self._count:
            self._since[task] = time.monotonic()
        if concurrent:
            self._concurrent[task] = (conn, msg)
        else:  # the actor is busy until it is done
            self.task = task
            self._task_call = (conn, msg)
        task.add_done_callback(done)

    def hold(self, task: asyncio.Task[object]) -> None:
        """``task`` (an async ``__supervise__``) holds the mailbox until :meth:`task_done`."""
        self.task = task

    def task_done(self, task: asyncio.Task[object]) -> bool:
        """The task holding the mailbox ended; True if its caller had cancelled it."""
        self.task = None
        self._task_call = None
        self._since.pop(task, None)
        by_caller, self._caller_cancelled = self._caller_cancelled, False
        return by_caller

    def concurrent_done(self, task: asyncio.Task[object]) -> bool:
        """A concurrent endpoint's task ended; True if its caller had cancelled it."""
        self._concurrent.pop(task, None)
        self._since.pop(task, None)
        by_caller = task in self._concurrent_cancelled
        self._concurrent_cancelled.discard(task)
        return by_caller

    def cancel(self, mine: Mine) -> None:
        """The caller of the running message that is ``mine`` gave up: cancel it if it
        runs async, drop its result if it runs (or waits to run) on the thread."""
        if self._task_call is not None and mine(*self._task_call) and self.task is not None:
            self._caller_cancelled = True
            self.task.cancel()
            return
        for task, (c, m) in self._concurrent.items():
            if mine(c, m):
                self._concurrent_cancelled.add(task)
                task.cancel()
                return
        for job in self.jobs:
            if mine(job.conn, job.msg):
                job.cancelled = True
                return

    async def stop(self) -> None:
        """Cancel the async messages and wait for them; end the thread, waiting for the
        sync message it runs now up to ``config.stop_timeout`` (it cannot be interrupted)."""
        if self.task is not None:
            self.task.cancel()
            await asyncio.wait([self.task])  # its outcome is replied by its done callback
        if self._concurrent:
            for task in self._concurrent:
                task.cancel()
            await asyncio.wait(list(self._concurrent))
        if self._thread is not None:
            self._thread.close()  # jobs not started yet are reported as not handled
            if self.jobs:
                self._jobs_idle = self._rt.loop.create_future()
                try:
                    await asyncio.wait_for(asyncio.shield(self._jobs_idle), config.stop_timeout)
                except TimeoutError:
                    log.warning(
                        "%s: stopping while a sync endpoint still runs (%s)",
                        self._actor.ctx.actor_id,
                        self._thread,
                    )

    # ------------------------------------------------------------ what it is doing

    def _call_of(self, task: asyncio.Task[object]) -> tuple[ReplySink, Call] | None:
        return self._concurrent.get(task) or (self._task_call if task is self.task else None)

    def running_calls(self) -> list[tuple[str, float]]:
        """(endpoint, time.monotonic() it started) of each message running now."""
        thread = self._thread
        job = thread.current if thread is not None else None
        out = [(_method(job), job.started_at)] if job is not None else []
        for task, since in list(self._since.items()):
            call = self._call_of(task)
            if call is not None:
                out.append((call[1].method, since))
        return out

    def running_threads(self) -> list[tuple[int, str, float]]:
        """(thread ident, endpoint, start) of the sync message its thread runs now."""
        thread = self._thread
        job = thread.current if thread is not None else None
        if job is None or thread is None or thread.ident is None:
            return []
        return [(thread.ident, _method(job), job.started_at)]

    def running_tasks(self) -> list[tuple[asyncio.Task[object], str, float]]:
        """(task, endpoint, start) of each async message running now."""
        out = []
        for task, since in list(self._since.items()):
            call = self._call_of(task)
            if call is not None:
                out.append((task, call[1].method, since))
        return out

    def not_started(self) -> int:
        """Sync messages handed to the thread that it has not started yet."""
        return sum(1 for j in list(self.jobs) if not j.started)


def _method(job: Job) -> str:
    """What a job runs, as reports name it: its endpoint, or ``__init__``."""
    return "__init__" if isinstance(job, InitJob) else job.msg.method
