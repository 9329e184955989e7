"""An actor in its proc: it finds the endpoint a message names and runs it (on the loop,
or on the actor's own thread for sync endpoints), one message at a time; it fails, is
supervised and stops. Its parts: the messages waiting for their turn are in
``_mailbox``, what runs now in ``_in_flight``, the answers to callers in ``_replies_out``; the
messages that reach it are handled in ``_handlers``."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Literal, Protocol

import msgspec

from ..config import config
from ..errors import SerializationError, SupervisionError, actor_failed
from ._actor import AS_ENDPOINT, Endpoint, describe_endpoints, endpoints_of
from ._actor_thread import InitJob, Job, JobFn
from ._context import ActorContext, Context, current
from ._in_flight import InFlight
from ._mailbox import Mailbox
from ._replies_out import Describe, Replier, ReplySink, ResponsePort, error_info
from ._serialize import dumps_args, loads_args
from ._stats import ActorStats
from ._telemetry import await_in_span, run_in_span
from ._wire import Buffer, Call, ErrorInfo

if TYPE_CHECKING:
    from ._runtime import Runtime

__all__ = [
    "SUPERVISOR",
    "ActorInstance",
    "FailureKind",
    "RunnableEndpoint",
    "Stoppable",
    "tell_supervisor",
]

log = logging.getLogger("danaus.actor")
_plain_decode = msgspec.msgpack.Decoder().decode

#: Why an actor failed, as its owner hears it (``failed``'s ``kind``).
FailureKind = Literal["actor", "undeliverable", "unhandled"]

#: The system actor, in the runtime that spawned an actor, that hears what became of it
#: (the mesh layer installs it where it spawns): ordinary calls, nobody waiting for a
#: reply, ``failed(mesh, actor, ranks, report, kind)`` when the actor failed and
#: ``stuck(actor_id, mesh, rank, endpoint, seconds, stack)`` when an endpoint of it has
#: run longer than ``stuck_warn_after``.
SUPERVISOR = "__supervisor__"


def tell_supervisor(rt: Runtime, owner_addr: str, method: str, *args: object) -> None:
    """Call ``method`` of the :data:`SUPERVISOR` at ``owner_addr`` with ``args``, nobody
    waiting. Unnumbered (``seq`` 0), as the messages it replaced were: a report that
    could not be sent leaves no gap for the next to wait out, and a proc that takes a
    lost one's address starts no sequence the supervisor has seen past."""
    raw, pickled, parts = dumps_args(args, {}, lambda: f"a {method} report")
    rt.connection(owner_addr).send(Call(SUPERVISOR, method, 0, raw, pickled, 0), parts)


class RunnableEndpoint(Protocol):
    """What running a message needs of its endpoint (an :class:`Endpoint`)."""

    @property
    def fn(self) -> JobFn: ...
    @property
    def is_async(self) -> bool: ...
    @property
    def explicit_response_port(self) -> bool: ...
    @property
    def concurrent(self) -> bool: ...


class Stoppable(Protocol):
    """A proc mesh an actor spawned: it stops when the actor stops."""

    def stop(self) -> Awaitable[object]: ...


class ActorInstance:
    """One live actor in this proc and its mailbox.

    Messages run one at a time, in arrival order. An async endpoint runs as a task on the
    proc's loop; a sync endpoint runs on the actor's own thread (:class:`ActorThread`),
    so the loop keeps answering heartbeats, ports and other actors meanwhile. While sync
    messages run there, later sync messages are handed over at once (in order), so the
    thread never waits for the loop between them; anything else waits its turn.
    """

    def __init__(
        self,
        rt: Runtime,
        wire: str,
        ctx: ActorContext,
        obj: object,
        mesh: str = "",
        owner_addr: str = "",
        inline_sync: bool = False,
    ) -> None:
        self.rt = rt
        #: the key messages address it by in this proc (``Call.actor``): unique per spawn,
        #: unlike ``ctx.name``, the name of its mesh
        self.wire = wire
        self.ctx = ctx
        self.context = Context(ctx)
        self.obj = obj
        self.mesh = mesh
        self.owner_addr = owner_addr  # where this actor's failures are reported
        self.rank = ctx.rank.rank
        self.rank_text = str(ctx.rank)
        self.endpoints = endpoints_of(type(obj))
        self._as_endpoints: dict[str, RunnableEndpoint] = {}
        #: system actors (a proc's control actor, the host agent, the RDMA service) run
        #: their short sync endpoints on the loop: they use the runtime's own state
        self.inline_sync = inline_sync
        self.stopped = False
        #: done once stop() has finished (None: never asked to stop)
        self._stop_done: asyncio.Future[None] | None = None
        #: why this actor failed (something not an Exception escaped an endpoint, an
        #: endpoint raised with no caller to tell, or it left a failure of a mesh it owns
        #: unhandled); then it stops, and every message fails with SupervisionError
        self.failed: str | None = None
        self.failed_kind: FailureKind | None = None
        #: proc meshes spawned by this actor: stopped when it stops
        self.owned: list[Stoppable] = []
        #: keep the counters and start times (config.actor_stats; read once per actor)
        self._count = config.actor_stats
        self.in_flight = InFlight(rt, self, self._count, self._thread_done)
        #: ``__init__`` running on the actor's thread (see :meth:`init_on_thread`)
        self.init_job: InitJob | None = None
        self.mailbox = Mailbox(self, rt.loop, ctx.actor_id)
        #: take a message; ``sender`` (default: the connection's peer) orders it by
        #: ``msg.seq``. The mailbox's own method: every message comes through here.
        self.deliver = self.mailbox.deliver
        self.replier = Replier(self)
        self.stats = ActorStats()
        object.__setattr__(ctx, "runtime_actor", self)  # frozen dataclass: set once, here
        # The actor's own context: its endpoints run in it, with context() set.
        token = current.set(self.context)
        self.cv = contextvars.copy_context()
        current.reset(token)

    def endpoint(self, method: str) -> RunnableEndpoint | None:
        """The endpoint a message names: one of the class's, or a plain method that the
        caller made one with ``as_endpoint`` (its name then carries a marker)."""
        ep: RunnableEndpoint | None = self.endpoints.get(method)
        if ep is not None or not method.startswith(AS_ENDPOINT):
            return ep
        ep = self._as_endpoints.get(method)
        if ep is None:
            explicit, _, name = method[len(AS_ENDPOINT) :].partition(":")
            fn = getattr(type(self.obj), name, None)
            if name.startswith("__") or not inspect.isfunction(fn):
                return None
            ep = Endpoint(fn, explicit_response_port=explicit == "port")
            self._as_endpoints[method] = ep
        return ep

    @property
    def busy(self) -> bool:
        """A message holds the mailbox (an async one runs, or sync ones are on the thread)."""
        return self.in_flight.busy

    def __repr__(self) -> str:
        state = (
            "failed"
            if self.failed
            else "stopped"
            if self.stopped
            else "busy"
            if self.busy
            else "idle"
        )
        return f"<ActorInstance {self.ctx.actor_id} {state} queued={len(self.mailbox)}>"

    def skip(self, sender: str, seq: int) -> None:
        """``seq`` from ``sender`` will never come: stop waiting for it."""
        self.mailbox.skip(sender, seq)

    def may_start(self, msg: Call) -> bool:
        """May ``msg`` start now, with nothing queued before it? Yes if nothing holds the
        mailbox, or if sync messages do and it may join them on the thread."""
        running = self.in_flight
        if running.task is not None:
            return False
        jobs = running.jobs
        if not jobs:
            return True
        if self.failed is not None or self.stopped or len(jobs) >= config.mailbox_limit:
            return False  # (the thread's queue counts too)
        ep = self.endpoint(msg.method)
        return ep is not None and not ep.is_async and not self.inline_sync

    def start(self, conn: ReplySink, msg: Call, parts: Sequence[Buffer]) -> None:
        """Run ``msg``, whose turn has come."""
        if self.failed is not None:
            self.replier.supervision(conn, msg, self.gone(""))
            return
        ep = self.endpoint(msg.method)
        if ep is None:
            self.replier.error(
                conn,
                msg,
                ErrorInfo(
                    "endpoint",
                    self.ctx.actor_id,
                    self.rank_text,
                    "EndpointNotFoundError",
                    f"{type(self.obj).__name__} has no endpoint {msg.method!r}; its endpoints are: "
                    f"{describe_endpoints(type(self.obj))}",
                    "",
                ),
            )
            return
        try:
            if msg.pickled:
                args, kwargs = loads_args(msg.args, parts, Describe(self, msg, "arguments"))
            else:  # plain arguments: one msgpack decode
                args, kwargs = _plain_decode(msg.args)
        except (SerializationError, msgspec.DecodeError, ValueError, TypeError) as e:
            if not isinstance(e, SerializationError):
                e = SerializationError(
                    f"arguments of {type(self.obj).__name__}.{msg.method} could not be decoded: {e}"
                )
            self.replier.error(conn, msg, error_info(e, self, include_tb=False))
            return
        if self._count:
            handled = self.stats.handled
            handled[msg.method] = handled.get(msg.method, 0) + 1
        if ep.explicit_response_port:
            args = [ResponsePort(self, conn, msg), *args]
        region = msg.region
        fn: JobFn = ep.fn
        if region is not None:  # a slice was called: current_rank() is the place in it
            fn = functools.partial(_in_message, Context(self.ctx, region), ep.fn)
        traced = msg.trace or config.telemetry  # (off: no span, no wrapper)
        if traced and not ep.is_async:
            fn = functools.partial(run_in_span, *self._span_of(msg), fn)
        if not ep.is_async and not self.inline_sync:
            self.in_flight.submit(Job(conn, msg, fn, (self.obj, *args), kwargs))
            return
        try:
            if ep.is_async:
                # A Task per call, in the actor's context (so asyncio.timeout,
                # current_task and TaskGroup work).
                # An async endpoint's method (create_task refuses anything else); no
                # cast(): this is the hot path, and cast is a function call.
                coro: Coroutine[object, object, object] = ep.fn(self.obj, *args, **kwargs)  # type: ignore[assignment]
                if traced:
                    coro = await_in_span(*self._span_of(msg), coro)
                cv = self.cv
                if region is not None:
                    cv = cv.copy()
                    cv.run(current.set, Context(self.ctx, region))
                task = self.rt.loop.create_task(coro, context=cv)
                done = self._concurrent_done if ep.concurrent else self._async_done
                self.in_flight.start(
                    task, conn, msg, ep.concurrent, functools.partial(done, conn, msg, ep)
                )
                return
            result = self.cv.run(fn, self.obj, *args, **kwargs)
        except BaseException as e:  # user code: SystemExit too
            self.replier.raised(conn, msg, ep, e)
            return
        self.replier.returned(conn, msg, ep, result)

    def _span_of(self, msg: Call) -> tuple[str, str, dict[str, str | int]]:
        """The name, parent and attributes of the span of one call of this actor."""
        attributes: dict[str, str | int] = {
            "danaus.actor": self.ctx.actor_id,
            "danaus.mesh": self.ctx.name,
            "danaus.rank": self.ctx.rank.rank,
            "danaus.endpoint": msg.method,
        }
        return f"{type(self.obj).__name__}.{msg.method}", msg.trace, attributes

    def _thread_done(self, jobs: list[Job]) -> None:
        """Sync messages the actor's thread finished (on the loop's thread, in order)."""
        self.in_flight.finished(len(jobs))
        if self.init_job is not None and jobs[0] is self.init_job:  # (the first job ever)
            init, self.init_job = self.init_job, None
            init.then(init)
            jobs = jobs[1:]
        if jobs:
            self.replier.jobs_done(jobs)
        self.mailbox.drain()

    def init_on_thread(
        self,
        init: JobFn,
        args: tuple[object, ...],
        kwargs: dict[str, object],
        then: Callable[[InitJob], None],
    ) -> None:
        """Run ``init`` (``__init__``) as the first job on the actor's thread, where its
        sync endpoints run; ``then(job)`` on the loop once it is done."""
        self.init_job = InitJob(init, args, kwargs, then)
        self.in_flight.submit(self.init_job)

    @property
    def all_sync(self) -> bool:
        """Its endpoints are all sync (and some exist): Monarch runs such an actor,
        ``__init__`` included, on one thread."""
        eps = self.endpoints.values()
        return bool(eps) and not self.inline_sync and not any(ep.is_async for ep in eps)

    def _async_done(
        self, conn: ReplySink, msg: Call, ep: RunnableEndpoint, task: asyncio.Task[object]
    ) -> None:
        by_caller = self.in_flight.task_done(task)
        self.replier.task_done(conn, msg, ep, task, by_caller)
        self.mailbox.drain()

    def _concurrent_done(
        self, conn: ReplySink, msg: Call, ep: RunnableEndpoint, task: asyncio.Task[object]
    ) -> None:
        by_caller = self.in_flight.concurrent_done(task)
        self.replier.task_done(conn, msg, ep, task, by_caller)

    # ------------------------------------------------------------ what it is doing

    def running_calls(self) -> list[tuple[str, float]]:
        """(endpoint, time.monotonic() it started) of each message running now."""
        return self.in_flight.running_calls()

    def running_threads(self) -> list[tuple[int, str, float]]:
        """(thread ident, endpoint, start) of the sync message its thread runs now."""
        return self.in_flight.running_threads()

    def running_tasks(self) -> list[tuple[asyncio.Task[object], str, float]]:
        """(task, endpoint, start) of each async message running now."""
        return self.in_flight.running_tasks()

    def mailbox_depth(self) -> int:
        """Messages waiting to run (queued, or handed to its thread and not started)."""
        return len(self.mailbox) + self.in_flight.not_started()

    def cancel(self, conn: ReplySink, reply: int) -> None:
        """The caller of the message whose reply goes to ``reply`` on ``conn``'s peer gave
        up: drop it if queued, cancel it if it runs async, drop the result if it runs sync."""
        peer = getattr(conn, "peer", None)

        def mine(c: ReplySink, m: Call) -> bool:
            return m.reply == reply and (
                c is conn or (peer is not None and getattr(c, "peer", None) == peer)
            )

        if not self.mailbox.remove(mine):
            self.in_flight.cancel(mine)

    # ------------------------------------------------------------ replies and failure

    def undeliverable(self, why: str) -> None:
        """A message this actor sent can never arrive. ``_handle_undeliverable_message``
        (if the actor defines it and it returns True) takes it; otherwise the actor
        fails, and its owner hears of it."""
        handler = getattr(self.obj, "_handle_undeliverable_message", None)
        if handler is not None:
            try:
                if self.cv.run(handler, why):
                    return
            except BaseException as e:  # user code: SystemExit too
                why = f"{why}; _handle_undeliverable_message raised {type(e).__name__}: {e}"
        if self.failed is None:
            self.fail(why, "undeliverable")

    def gone(self, doing: str) -> str:
        """Why a message cannot run (or finish) here: the actor failed (Monarch's words),
        or it was stopped (``doing`` says when: "before handling m")."""
        if self.failed is not None:
            if self.failed_kind == "unhandled":  # worded already, naming the child's actor
                return self.failed
            return actor_failed(self.ctx.display_name, self.failed)
        return f"actor {self.ctx.actor_id} was stopped {doing}"

    def fail(self, report: str, kind: FailureKind) -> None:
        """Mark this actor failed, report it to the owner of its mesh, and stop it, as
        Monarch does: whatever waits in its mailbox and every later message fail with
        ``SupervisionError``, the meshes it owns stop, ``__cleanup__`` runs with the
        failure. Its proc and the other actors there keep serving."""
        if self.failed is not None:
            return  # (once: its owner hears of one failure)
        # it travels as UTF-8: a lone surrogate (from bytes that were not UTF-8) is escaped
        report = report.encode("utf-8", "backslashreplace").decode("utf-8")
        self.failed = report.splitlines()[0] if report else kind
        self.failed_kind = kind
        log.error("actor %s failed: %s", self.ctx.actor_id, report)
        if self.owner_addr:
            tell_supervisor(
                self.rt, self.owner_addr, "failed", self.mesh, self.wire, [self.rank], report, kind
            )
        self.deliver = self._refuse  # what arrives from now on fails at once
        if not self.stopped:
            self.rt.spawn_task(self.stop())

    def stop_self(self) -> None:
        """The actor ends itself without a failure (``actor_instance.stop()``): messages
        arriving from now on fail at once saying it was stopped, those already queued
        fail as :meth:`stop` fails them, and it stops (its meshes, ``__cleanup__``)."""
        if self.failed is None and not self.stopped:
            self.deliver = self._refuse
            self.rt.spawn_task(self.stop())

    def _refuse(
        self, conn: ReplySink, msg: Call, parts: Sequence[Buffer], sender: str | None = None
    ) -> None:
        """Take a message once the actor failed: it fails at once."""
        if msg.reply:
            self.replier.supervision(conn, msg, self.gone(""))

    def supervise(self, failure: object, escalate_report: str) -> None:
        """Give ``failure`` (of a mesh this actor owns) to ``__supervise__``: in mailbox
        order, except while an async message holds the mailbox and awaits; then at once,
        beside it, as Monarch does (that message may be waiting for this very event).

        A falsy return (or none, or an exception) leaves it unhandled: this actor then
        fails too, and its own owner hears of it.
        """
        beside = self.in_flight.task is not None

        def run() -> None:
            fn = getattr(self.obj, "__supervise__", None)
            if fn is None:
                self.fail(escalate_report, "unhandled")
                return
            try:
                r = self.cv.run(fn, failure)
            except BaseException as e:  # user code: SystemExit too
                self.fail(
                    f"__supervise__ raised {type(e).__name__}: {e}; {escalate_report}", "unhandled"
                )
                return
            if inspect.isawaitable(r):
                task = self.rt.loop.create_task(_await(r), context=self.cv)
                if not beside:
                    self.in_flight.hold(task)

                def done(t: asyncio.Task[object]) -> None:
                    if not beside:
                        self.in_flight.task_done(t)
                    if t.cancelled() or t.exception() is not None or not t.result():
                        exc = None if t.cancelled() else t.exception()
                        raised = (
                            f"__supervise__ raised {type(exc).__name__}: {exc}; " if exc else ""
                        )
                        self.fail(raised + escalate_report, "unhandled")
                    if not beside:
                        self.mailbox.drain()

                task.add_done_callback(done)
            elif not r:
                self.fail(escalate_report, "unhandled")

        if beside:
            self.rt.loop.call_soon(lambda: None if self.stopped else run())
        else:
            self.mailbox.post(run)

    async def stop(self) -> None:
        """Stop: pending messages fail with ``SupervisionError``; ``__cleanup__`` runs.

        A sync endpoint running now on the actor's thread cannot be interrupted: stop
        waits for it up to ``config.stop_timeout``, then goes on without it. A second
        call (a mesh's stop while a failed actor stops) waits for the first to finish.
        """
        if self._stop_done is not None:
            await asyncio.shield(self._stop_done)
            return
        self._stop_done = self.rt.loop.create_future()
        self.stopped = True
        try:
            await self._stop()
        finally:
            self._stop_done.set_result(None)

    async def _stop(self) -> None:
        await self.in_flight.stop()  # the outcomes are replied by _async_done, _thread_done
        for conn, msg, _ in self.mailbox.close():
            if msg.reply:
                self.replier.supervision(conn, msg, self.gone(f"before handling {msg.method}"))
        await self.stop_owned()
        cleanup = getattr(self.obj, "__cleanup__", None)
        if cleanup is not None:
            token = current.set(self.context)
            try:
                r = cleanup(None if self.failed is None else SupervisionError(self.failed))
                if inspect.isawaitable(r):
                    await r
            except asyncio.CancelledError:
                raise
            except BaseException:  # user code: SystemExit too
                log.exception("__cleanup__ of %s raised", self.ctx.actor_id)
            finally:
                current.reset(token)

    async def stop_owned(self) -> None:
        """Stop the meshes this actor spawned (they stop with it, or when its
        ``__init__`` failed)."""
        owned, self.owned = self.owned, []
        for mesh in owned:
            try:
                await mesh.stop()
            except Exception:
                log.exception("stopping %r, owned by %s", mesh, self.ctx.actor_id)


async def _await(r: Awaitable[object]) -> object:
    return await r


def _in_message(ctx: Context, fn: JobFn, *args: object, **kwargs: object) -> object:
    """Run a sync endpoint with ``context()`` saying where its message found the actor."""
    token = current.set(ctx)
    try:
        return fn(*args, **kwargs)
    finally:
        current.reset(token)
