"""An actor in its proc: the mailbox that runs its messages one at a time (on the loop,
or on the actor's own thread for sync endpoints), its replies and its failure. The
messages that reach it are handled in ``_handlers``."""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import inspect
import logging
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from ..config import config
from ..errors import SerializationError, SupervisionError
from ._actor_thread import ActorThread, Job
from ._connection import Connection
from ._context import ActorContext, Context, current
from ._errinfo import encode_error, info_from_error
from ._loops import run_on
from ._port import Port
from ._serialize import _ATOMS, dumps, loads_args
from ._stats import ActorStats
from ._wire import (
    ERROR,
    NIL,
    OK,
    Call,
    ErrorInfo,
    Result,
)

if TYPE_CHECKING:
    from ._runtime import Runtime

from ._actor import AS_ENDPOINT, Endpoint, describe_endpoints, endpoints_of

log = logging.getLogger("danaus.actor")
_plain_decode = msgspec.msgpack.Decoder().decode
_plain_encode = msgspec.msgpack.Encoder().encode


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
        obj: Any,
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
        self._as_endpoints: dict[str, Endpoint[..., Any]] = {}
        #: system actors (a proc's control actor, the host agent, the RDMA service) run
        #: their short sync endpoints on the loop: they use the runtime's own state
        self.inline_sync = inline_sync
        self.stopped = False
        #: why this actor failed (an endpoint raised with no caller, or it left a failure
        #: of a mesh it owns unhandled); then every message fails with SupervisionError
        self.failed: str | None = None
        #: proc meshes spawned by this actor: stopped when it stops
        self.owned: list[Any] = []
        #: connections we stopped reading from while the mailbox is full
        self.holding: set[Connection] = set()
        self.queue: collections.deque[tuple[Any, Any, Any]] = collections.deque()
        #: the async message (or ``__supervise__``) running now; it holds the mailbox
        self.task: asyncio.Task[None] | None = None
        self._task_call: tuple[Any, Call] | None = None
        self._caller_cancelled = False
        #: concurrent endpoints running now (they do not hold the mailbox)
        self._concurrent: dict[asyncio.Task[Any], tuple[Any, Call]] = {}
        self._concurrent_cancelled: set[asyncio.Task[Any]] = set()
        #: when each async message running now started (time.monotonic())
        self._since: dict[asyncio.Task[Any], float] = {}
        self.stats = ActorStats()
        #: keep the counters and start times (config.actor_stats; read once per actor)
        self._count = config.actor_stats
        #: sync messages handed to the actor's thread and not yet reported back
        self.jobs: collections.deque[Job] = collections.deque()
        self._thread: ActorThread | None = None
        self._jobs_idle: asyncio.Future[None] | None = None
        #: per sender: the next sequence number to handle, and those that came early
        self.expect: dict[str, int] = {}
        self.held: dict[tuple[str, int], tuple[Connection, Call, list[Any]] | None] = {}
        self._gap_timer: asyncio.TimerHandle | None = None
        object.__setattr__(ctx, "runtime_actor", self)  # frozen dataclass: set once, here
        # The actor's own context: its endpoints run in it, with context() set.
        token = current.set(self.context)
        self.cv = contextvars.copy_context()
        current.reset(token)

    def endpoint(self, method: str) -> Endpoint[..., Any] | None:
        """The endpoint a message names: one of the class's, or a plain method that the
        caller made one with ``as_endpoint`` (its name then carries a marker)."""
        ep = self.endpoints.get(method)
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
        return self.task is not None or bool(self.jobs)

    def __repr__(self) -> str:
        state = (
            "stopped"
            if self.stopped
            else "failed"
            if self.failed
            else "busy"
            if self.busy
            else "idle"
        )
        return f"<ActorInstance {self.ctx.actor_id} {state} queued={len(self.queue)}>"

    def deliver(
        self, conn: Connection, msg: Call, parts: list[Any], sender: str | None = None
    ) -> None:
        """Take a message; ``sender`` (default: the connection's peer) orders it by ``msg.seq``."""
        seq = msg.seq
        if seq:
            if sender is None:
                sender = conn.peer or ""
            expected = self.expect.get(sender, 1)
            if seq != expected:
                if seq > expected:  # an earlier one is still on its way (a cast tree)
                    self.held[(sender, seq)] = (conn, msg, parts)
                    if self._gap_timer is None:
                        self._gap_timer = self.rt.loop.call_later(
                            config.seq_gap_timeout, self._gap_expired
                        )
                return  # seq < expected: already handled or skipped
            self.expect[sender] = seq + 1
            if self.held:
                self._accept(conn, msg, parts)
                self._release(sender, seq + 1)
                return
        if self.queue or self.task is not None or (self.jobs and not self._joins_thread(msg)):
            self._accept(conn, msg, parts)
        else:
            self._run(conn, msg, parts)

    def skip(self, sender: str, seq: int) -> None:
        """``seq`` from ``sender`` will never come: stop waiting for it."""
        expected = self.expect.get(sender, 1)
        if seq == expected:
            self._release(sender, seq + 1)
        elif seq > expected:
            self.held[(sender, seq)] = None

    def _gap_expired(self) -> None:
        """Messages held for a predecessor that never came: stop waiting (bounded)."""
        self._gap_timer = None
        if self.stopped or not self.held:
            return
        for sender in {s for s, _ in self.held}:
            expected = self.expect.get(sender, 1)
            first = min(q for s, q in self.held if s == sender)
            if first > expected:
                log.warning(
                    "%s: messages %d..%d from %s never arrived (lost with a failed "
                    "path); handling the ones after them",
                    self.ctx.actor_id,
                    expected,
                    first - 1,
                    sender,
                )
                self._release(sender, first)
        if self.held:
            self._gap_timer = self.rt.loop.call_later(config.seq_gap_timeout, self._gap_expired)

    def _release(self, sender: str, nxt: int) -> None:
        held = self.held
        while held and (sender, nxt) in held:
            item = held.pop((sender, nxt))
            if item is not None:
                self._accept(*item)
            nxt += 1
        self.expect[sender] = nxt

    def _joins_thread(self, msg: Call) -> bool:
        """May ``msg`` go to the actor's thread now, behind the sync messages there?"""
        if (
            self.task is not None
            or not self.jobs
            or self.failed is not None
            or self.stopped
            or len(self.jobs) >= config.mailbox_limit
        ):  # the thread's queue counts too
            return False
        ep = self.endpoint(msg.method)
        return ep is not None and not ep.is_async and not self.inline_sync

    def _accept(self, conn: Connection, msg: Call, parts: list[Any]) -> None:
        if not self.queue and (
            (not self.jobs and self.task is None) or (self.jobs and self._joins_thread(msg))
        ):
            self._run(conn, msg, parts)
            return
        self.queue.append((conn, msg, parts))
        if len(self.queue) + len(self.jobs) >= config.mailbox_limit and isinstance(
            conn, Connection
        ):
            # Backpressure: stop reading from this sender until the mailbox drains;
            # its socket fills, then its own writes pause (see ActorEndpoint.post).
            conn.hold_reading(self)
            self.holding.add(conn)

    def _drain(self) -> None:
        queue = self.queue
        while queue and not self.stopped:
            conn, msg, parts = queue[0]
            if self.task is not None or (
                self.jobs and (conn is None or not self._joins_thread(msg))
            ):
                break
            queue.popleft()
            if conn is None:
                msg()  # a supervision event, in mailbox order
            else:
                self._run(conn, msg, parts)
        if self.holding and (
            len(queue) + len(self.jobs) <= config.mailbox_limit // 2 or self.stopped
        ):
            for c in self.holding:
                c.release_reading(self)
            self.holding.clear()

    def _run(self, conn: Connection, msg: Call, parts: list[Any]) -> None:
        if self.failed is not None:
            self._reply_supervision(
                conn, msg, f"actor {self.ctx.actor_id} failed earlier: {self.failed}"
            )
            return
        ep = self.endpoint(msg.method)
        if ep is None:
            self._reply_error(
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
                args, kwargs = loads_args(msg.args, parts, _Describe(self, msg, "arguments"))
            else:  # plain arguments: one msgpack decode
                args, kwargs = _plain_decode(msg.args)
        except (SerializationError, msgspec.DecodeError, ValueError, TypeError) as e:
            if not isinstance(e, SerializationError):
                e = SerializationError(
                    f"arguments of {type(self.obj).__name__}.{msg.method} could not be decoded: {e}"
                )
            self._reply_error(conn, msg, _info(e, self, include_tb=False))
            return
        if self._count:
            handled = self.stats.handled
            handled[msg.method] = handled.get(msg.method, 0) + 1
        if ep.explicit_response_port:
            args = [ResponsePort(self, conn, msg), *args]
        region = msg.region
        fn: Callable[..., Any] = ep.fn
        if region is not None:  # a slice was called: current_rank() is the place in it
            fn = functools.partial(_in_message, Context(self.ctx, region), ep.fn)
        if not ep.is_async and not self.inline_sync:
            job = Job(conn, msg, fn, (self.obj, *args), kwargs)
            self.jobs.append(job)
            thread = self._thread
            if thread is None:
                thread = self._thread = ActorThread(
                    self.rt, self, self.ctx.actor_id, self.cv.copy(), self._thread_done
                )
            thread.submit(job)
            return
        try:
            if ep.is_async:
                # A Task per call, in the actor's context (so asyncio.timeout,
                # current_task and TaskGroup work).
                coro: Any = ep.fn(self.obj, *args, **kwargs)
                cv = self.cv
                if region is not None:
                    cv = cv.copy()
                    cv.run(current.set, Context(self.ctx, region))
                task = self.rt.loop.create_task(coro, context=cv)
                if self._count:
                    self._since[task] = time.monotonic()
                if ep.concurrent:
                    self._concurrent[task] = (conn, msg)
                    task.add_done_callback(functools.partial(self._concurrent_done, conn, msg, ep))
                else:  # the actor is busy until it is done
                    self.task = task
                    self._task_call = (conn, msg)
                    task.add_done_callback(functools.partial(self._async_done, conn, msg, ep))
                return
            result = self.cv.run(fn, self.obj, *args, **kwargs)
        except BaseException as e:  # user code: SystemExit too
            self._endpoint_raised(conn, msg, ep, e)
            return
        self._finish(conn, msg, ep, result)

    def _finish(self, conn: Connection, msg: Call, ep: Endpoint[..., Any], result: Any) -> None:
        if msg.reply and not ep.explicit_response_port:
            self._reply(conn, msg, result)

    def _endpoint_raised(
        self, conn: Connection, msg: Call, ep: Endpoint[..., Any], exc: BaseException
    ) -> None:
        info = _info(exc, self)
        self.stats.failed(msg.method, f"{info.exc_type}: {info.message}")
        if ep.explicit_response_port:
            # As in Monarch: it owed its caller an answer through the port and raised
            # instead; nobody else will see this exception, so the actor has failed.
            report = (
                f"{info.exc_type}: {info.message} in {msg.method} (an explicit-response-port "
                f"endpoint raised instead of answering)\n{info.traceback}"
            )
            if self.failed is None:
                self.fail(report, "actor")
            self._reply_supervision(
                conn,
                msg,
                f"actor {self.ctx.actor_id} failed: {info.exc_type}: {info.message}",
                info.traceback,
            )
            return
        self._reply_error(conn, msg, info)

    def _thread_done(self, jobs: list[Job]) -> None:
        """Sync messages the actor's thread finished (on the loop's thread, in order)."""
        batched = []
        if len(jobs) > 1:  # their replies go out in one write per connection
            for job in jobs:
                c = job.conn
                if type(c) is Connection and c not in batched and c.batch_begin():
                    batched.append(c)
        for job in jobs:
            self.jobs.popleft()
            conn, msg = job.conn, job.msg
            if job.cancelled:
                continue  # its caller gave up: the result goes nowhere
            ep = self.endpoint(msg.method)
            assert ep is not None  # it ran, so it was found
            if not job.started:
                if msg.reply:
                    self._reply_supervision(
                        conn,
                        msg,
                        f"actor {self.ctx.actor_id} was stopped before handling {msg.method}",
                    )
            elif job.error is None:
                self._finish(conn, msg, ep, job.value)
            else:
                self._endpoint_raised(conn, msg, ep, job.error)
        for c in batched:
            c.batch_end()
        if not self.jobs and self._jobs_idle is not None and not self._jobs_idle.done():
            self._jobs_idle.set_result(None)
        self._drain()

    def _async_done(
        self, conn: Connection, msg: Call, ep: Endpoint[..., Any], task: asyncio.Task[Any]
    ) -> None:
        self.task = None
        self._task_call = None
        self._since.pop(task, None)
        by_caller, self._caller_cancelled = self._caller_cancelled, False
        self._settle_task(conn, msg, ep, task, by_caller)
        self._drain()

    def _concurrent_done(
        self, conn: Connection, msg: Call, ep: Endpoint[..., Any], task: asyncio.Task[Any]
    ) -> None:
        self._concurrent.pop(task, None)
        self._since.pop(task, None)
        by_caller = task in self._concurrent_cancelled
        self._concurrent_cancelled.discard(task)
        self._settle_task(conn, msg, ep, task, by_caller)

    def _settle_task(
        self,
        conn: Connection,
        msg: Call,
        ep: Endpoint[..., Any],
        task: asyncio.Task[Any],
        by_caller: bool,
    ) -> None:
        if by_caller and (task.cancelled() or task.exception() is None):
            return  # its caller gave up: nobody waits for the outcome
        if task.cancelled() and self.stopped:
            if msg.reply:  # (a broadcast has nobody to tell)
                self._reply_supervision(
                    conn, msg, f"actor {self.ctx.actor_id} was stopped while handling {msg.method}"
                )
        elif task.cancelled():  # the endpoint's own code let a cancellation out
            self._reply_error(
                conn,
                msg,
                ErrorInfo(
                    "actor",
                    self.ctx.actor_id,
                    self.rank_text,
                    "asyncio.CancelledError",
                    f"{msg.method} was cancelled (by the endpoint's own code)",
                    "",
                ),
            )
        elif (exc := task.exception()) is not None:
            if by_caller and isinstance(exc, asyncio.CancelledError):
                return
            if config.debug_on_error and not by_caller:
                from . import _debug

                if _debug.wants_post_mortem(exc):
                    _debug.post_mortem(exc, self)  # (on the loop: its peers are told)
            self._endpoint_raised(conn, msg, ep, exc)
        else:
            self._finish(conn, msg, ep, task.result())

    # ------------------------------------------------------------ what it is doing

    def running_calls(self) -> list[tuple[str, float]]:
        """(endpoint, time.monotonic() it started) of each message running now."""
        thread = self._thread
        job = thread.current if thread is not None else None
        out = [(job.msg.method, job.started_at)] if job is not None else []
        for task, since in list(self._since.items()):
            call = self._concurrent.get(task) or (self._task_call if task is self.task else None)
            if call is not None:
                out.append((call[1].method, since))
        return out

    def running_threads(self) -> list[tuple[int, str, float]]:
        """(thread ident, endpoint, start) of the sync message its thread runs now."""
        thread = self._thread
        job = thread.current if thread is not None else None
        if job is None or thread is None or thread.ident is None:
            return []
        return [(thread.ident, job.msg.method, job.started_at)]

    def running_tasks(self) -> list[tuple[asyncio.Task[Any], str, float]]:
        """(task, endpoint, start) of each async message running now."""
        out = []
        for task, since in list(self._since.items()):
            call = self._concurrent.get(task) or (self._task_call if task is self.task else None)
            if call is not None:
                out.append((task, call[1].method, since))
        return out

    def mailbox_depth(self) -> int:
        """Messages waiting to run (queued, or handed to its thread and not started)."""
        return len(self.queue) + sum(1 for j in list(self.jobs) if not j.started)

    def cancel(self, conn: Any, reply: int) -> None:
        """The caller of the message whose reply goes to ``reply`` on ``conn``'s peer gave
        up: drop it if queued, cancel it if it runs async, drop the result if it runs sync."""
        peer = getattr(conn, "peer", None)

        def mine(c: Any, m: Call) -> bool:
            return m.reply == reply and (
                c is conn or (peer is not None and getattr(c, "peer", None) == peer)
            )

        for i, (c, m, _) in enumerate(self.queue):
            if c is not None and mine(c, m):
                del self.queue[i]
                return
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

    def _reply(self, conn: Connection, msg: Call, result: Any) -> None:
        t = type(result)
        if t in _ATOMS or (t is bytes and len(result) < 4096):  # no pickle, no checks
            try:
                raw = msgspec.Raw(_plain_encode(result))
            except (OverflowError, UnicodeEncodeError):
                pass  # an int too large for msgpack, a str with lone surrogates: pickle it
            else:
                if len(raw) <= config.oob_threshold:
                    conn.send(Result(msg.reply, OK, raw, False, self.rank))
                    return
        try:
            raw, pickled, parts = dumps(result, _Describe(self, msg, "return value"))
        except SerializationError as e:
            self._reply_error(conn, msg, _info(e, self, include_tb=False))
            return
        conn.send(Result(msg.reply, OK, raw, pickled, self.rank), parts)

    def _reply_supervision(self, conn: Connection, msg: Call, why: str, tb: str = "") -> None:
        """Fail ``msg`` with ``SupervisionError``: the actor failed or stopped (``why``)."""
        info = ErrorInfo(
            "supervision", self.ctx.actor_id, self.rank_text, "SupervisionError", why, tb
        )
        self._reply_error(conn, msg, info)

    def _reply_error(self, conn: Connection, msg: Call, info: ErrorInfo) -> None:
        if msg.reply:
            self.rt.reply_error(conn, msg.reply, self.rank, info)
        elif info.kind == "actor" and self.failed is None:
            # Nobody waits for this result (broadcast): the actor has failed.
            self.fail(
                f"{info.exc_type}: {info.message} in {msg.method} (called with "
                f"broadcast, so no caller saw it)\n{info.traceback}",
                "actor",
            )
        else:
            log.error("%s: %s (no caller waited for this result)", self.ctx.actor_id, info.message)

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

    def fail(self, report: str, kind: str) -> None:
        """Mark this actor failed and report it to the owner of its mesh."""
        from ._wire import Failure

        self.failed = report.splitlines()[0] if report else kind
        log.error("actor %s failed: %s", self.ctx.actor_id, report)
        if self.owner_addr:
            self.rt.connection(self.owner_addr).send(
                Failure("", self.mesh, self.wire, [self.rank], report, kind)
            )

    def supervise(self, failure: Any, escalate_report: str) -> None:
        """Give ``failure`` (of a mesh this actor owns) to ``__supervise__``, in mailbox order.

        A falsy return (or none, or an exception) leaves it unhandled: this actor then
        fails too, and its own owner hears of it.
        """

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
                self.task = task = self.rt.loop.create_task(_await(r), context=self.cv)

                def done(t: asyncio.Task[Any]) -> None:
                    self.task = None
                    if t.cancelled() or t.exception() is not None or not t.result():
                        self.fail(escalate_report, "unhandled")
                    self._drain()

                task.add_done_callback(done)
            elif not r:
                self.fail(escalate_report, "unhandled")

        if self.busy or self.queue:
            self.queue.append((None, run, None))
        else:
            run()

    async def stop(self) -> None:
        """Stop: pending messages fail with ``SupervisionError``; ``__cleanup__`` runs.

        A sync endpoint running now on the actor's thread cannot be interrupted: stop
        waits for it up to ``config.stop_timeout``, then goes on without it.
        """
        if self.stopped:
            return
        self.stopped = True
        if self.task is not None:
            self.task.cancel()
            await asyncio.wait([self.task])  # its outcome is replied by _async_done
        if self._concurrent:
            for task in self._concurrent:
                task.cancel()
            await asyncio.wait(list(self._concurrent))
        if self._thread is not None:
            self._thread.close()  # jobs not started yet are reported as not handled
            if self.jobs:
                self._jobs_idle = self.rt.loop.create_future()
                try:
                    await asyncio.wait_for(asyncio.shield(self._jobs_idle), config.stop_timeout)
                except TimeoutError:
                    log.warning(
                        "%s: stopping while a sync endpoint still runs (%s)",
                        self.ctx.actor_id,
                        self._thread,
                    )
        waiting = [item for item in self.held.values() if item is not None]
        self.held.clear()
        while self.queue or waiting:
            conn, msg, _ = self.queue.popleft() if self.queue else waiting.pop(0)
            if conn is not None and msg.reply:
                self._reply_supervision(
                    conn, msg, f"actor {self.ctx.actor_id} was stopped before handling {msg.method}"
                )
        for mesh in self.owned:  # meshes this actor spawned stop with it
            try:
                await mesh.stop()
            except Exception:
                log.exception("stopping %r, owned by %s", mesh, self.ctx.actor_id)
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


class ResponsePort(Port[Any]):
    """The caller's reply port, given to an ``explicit_response_port`` endpoint.

    ``send(v)`` answers the call with ``v``, ``exception(e)`` with an error; from the
    endpoint, another task, or another message's handler, at any time. Pickled, it
    becomes a plain :class:`Port` to the caller, which another actor may answer through.
    """

    __slots__ = ("_actor", "_conn", "_rank")

    def __init__(self, actor: ActorInstance, conn: Any, msg: Call) -> None:
        super().__init__(getattr(conn, "peer", None) or "", msg.reply)
        self._actor = actor
        self._conn = conn
        self._rank = actor.rank

    def __repr__(self) -> str:
        return f"ResponsePort({self.addr}#{self.port_id})"

    def exception(self, exc: BaseException) -> None:
        a = self._actor
        tb = "".join(traceback.format_exception(exc))

        info = info_from_error(exc, a.ctx.actor_id, a.rank_text, tb)
        self._post(ERROR, encode_error(info), False, [], exc)

    def _post(self, status: int, raw: Any, pickled: bool, parts: list[Any], local: Any) -> None:
        if not self.port_id:
            return  # a broadcast: nobody waits for an answer
        msg = Result(
            self.port_id,
            status,
            raw if raw is not None else NIL,
            pickled,
            self._rank,
        )
        run_on(self._actor.rt, self._conn.send, msg, parts)


class _Describe:
    """Names a message's payload for an error message, built only if one is raised."""

    __slots__ = ("actor", "msg", "what")

    def __init__(self, actor: ActorInstance, msg: Call, what: str) -> None:
        self.actor = actor
        self.msg = msg
        self.what = what

    def __call__(self) -> str:
        return f"{self.what} of {type(self.actor.obj).__name__}.{self.msg.method}"


async def _await(r: Any) -> Any:
    return await r


def _in_message(ctx: Context, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a sync endpoint with ``context()`` saying where its message found the actor."""
    token = current.set(ctx)
    try:
        return fn(*args, **kwargs)
    finally:
        current.reset(token)


def _info(e: BaseException, actor: ActorInstance, include_tb: bool = True) -> ErrorInfo:

    # Skip the runtime's own frame: the user's code starts one frame down.
    tb = (
        "".join(
            traceback.format_exception(
                type(e), e, e.__traceback__.tb_next if e.__traceback__ else None
            )
        )
        if include_tb
        else ""
    )
    return info_from_error(e, actor.ctx.actor_id, actor.rank_text, tb)
