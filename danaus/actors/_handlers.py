"""Where the messages to actors are handled: ``Call``, ``Spawn``, ``StopActor``,
``StopProc``, ``Cancel`` and ``SeqSkip`` (the ``on_*`` functions, which the one handler
table, ``_dispatch.py``, names); every proc's control actor
(:class:`ProcControl`); and the check that reports endpoints running too long."""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar, cast

from .._records import StackEntry
from ..config import config
from ..errors import ProtocolError, SerializationError, actor_failed
from ..geometry import Point
from ._actor import Actor, endpoint, is_long_running
from ._actor_thread import InitJob, JobFn
from ._connection import Connection
from ._context import ActorContext, creator_from_wire
from ._errinfo import encode_error, info_from_error
from ._instance import ActorInstance, tell_supervisor
from ._process import process
from ._serialize import loads
from ._stats import actor_record, proc_record, thread_stacks
from ._wire import (
    CLOSE,
    NIL,
    Buffer,
    Call,
    Cancel,
    ErrorInfo,
    Result,
    SeqSkip,
    Spawn,
    StopActor,
    StopProc,
)

if TYPE_CHECKING:
    from ._replies_out import ReplySink
    from ._runtime import Runtime

T = TypeVar("T")

__all__ = [
    "ProcControl",
    "check_stuck",
    "install_actor",
    "on_call",
    "on_cancel",
    "on_seq_skip",
    "on_spawn",
    "on_stop_actor",
    "on_stop_proc",
    "spawn_actor",
]


class _FailedActor:
    """Stands in for an actor whose ``__init__`` raised: every call fails with the reason."""

    def __init__(
        self, rt: Runtime, actor_id: str, rank: int, info: ErrorInfo, display: str
    ) -> None:
        self.rt = rt
        self.info = ErrorInfo(
            "supervision",
            actor_id,
            info.rank,
            "SupervisionError",
            actor_failed(display, f"its __init__ raised {info.exc_type}: {info.message}"),
            info.traceback,
        )
        self.rank = rank
        self.stopped = False

    def deliver(
        self, conn: ReplySink, msg: Call, parts: Sequence[Buffer], sender: str | None = None
    ) -> None:
        self.rt.reply_error(conn, msg.reply, self.rank, self.info)

    def skip(self, sender: str, seq: int) -> None:
        pass

    def cancel(self, conn: ReplySink, reply: int) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True


def install_actor(rt: Runtime, key: str, obj: Actor) -> ActorInstance:
    """Register an already-built actor under ``key`` (system actors: a proc's control
    actor, a host agent)."""
    ctx = ActorContext(f"{rt.addr}.{key}", key, Point({}, {}), rt.addr, obj)
    inst = ActorInstance(rt, key, ctx, obj, inline_sync=True)
    rt.actors[key] = inst
    return inst


def ensure_actor(rt: Runtime, key: str, make: Callable[[], Actor]) -> None:
    """The system actor under ``key`` on ``rt``: the one there while it serves, else (none
    yet, or the one there failed or stopped) a new one from ``make()``, installed as
    :func:`install_actor` does. What the layers above install where they spawn or serve:
    a spawner's supervisor and controllers, a host agent and its gateway, a job's lease,
    the data plane's service."""
    inst = rt.local_actor(key)
    if inst is None or getattr(inst, "failed", None) is not None or getattr(inst, "stopped", False):
        install_actor(rt, key, make())


class ProcControl(Actor):
    """Every proc's system actor (key ``__proc__``): settings the controller changes live."""

    @endpoint
    def set_log_level(self, level: int) -> None:
        logging.getLogger().setLevel(level)

    @endpoint
    def pid(self) -> int:
        import os

        return os.getpid()

    @endpoint
    def reload_modules(self, paths: list[str]) -> list[str]:
        """Reload the modules loaded from these files (a workspace synced with
        ``auto_reload``), in the order they were first imported; let later imports find
        new files. Returns the names of the modules reloaded.

        As ``importlib.reload``: a module's objects are replaced in it, but names another
        module bound with ``from x import y`` keep the old objects, and actors already
        spawned keep their class (new actors get the new one)."""
        import importlib
        import os
        import sys

        importlib.invalidate_caches()
        wanted = {os.path.realpath(p) for p in paths}
        reloaded = []
        for name, module in list(sys.modules.items()):
            file = getattr(module, "__file__", None)
            if file and os.path.realpath(file) in wanted:
                importlib.reload(module)
                reloaded.append(name)
        return reloaded

    # An endpoint named like a mesh member is, on the mesh, that endpoint (``mesh_stats``
    # reaches the member); type checkers see the member on every actor, hence the ignores.
    @endpoint
    def stats(self, actors: list[str] | None = None) -> dict[str, object]:  # type: ignore[override]
        """This proc's record, and the records of the actors with these wire keys (every
        actor but the system ones when None)."""
        rt = _rt_here()
        now = time.monotonic()
        keys = [k for k in rt.actors if not k.startswith("__")] if actors is None else actors
        records = {}
        for key in keys:
            inst = rt.actors.get(key)
            if isinstance(inst, ActorInstance):  # (not one whose __init__ raised)
                records[key] = actor_record(inst, now)
        return {"proc": proc_record(rt), "actors": records}

    @endpoint
    def stacks(self) -> list[StackEntry]:  # type: ignore[override]
        """Every thread's stack, and every running async endpoint's."""
        rt = _rt_here()
        out = thread_stacks(rt)
        now = time.monotonic()
        for inst in list(rt.actors.values()):
            if not isinstance(inst, ActorInstance):
                continue  # one whose __init__ raised: it runs nothing
            for task, method, since in inst.running_tasks():
                out.append(
                    {
                        "task": task.get_name(),
                        "actor": inst.ctx.actor_id,
                        "endpoint": method,
                        "seconds": round(now - since, 6),
                        "stack": _task_stack(task),
                    }
                )
        return out


def _spawn_payload(
    value: object,
) -> tuple[type[Actor], tuple[object, ...], dict[str, object]]:
    """A Spawn's payload, ``(actor class, args, kwargs)``, checked for its shape.

    Raises:
        ProtocolError: the spawner sent something else.
    """
    if isinstance(value, tuple) and len(value) == 3:
        cls, args, kwargs = value
        if (
            isinstance(cls, type)
            and issubclass(cls, Actor)
            and isinstance(args, tuple)
            and isinstance(kwargs, dict)
        ):
            return cls, args, kwargs
    raise ProtocolError(f"a Spawn's payload is {type(value).__name__}, not (class, args, kwargs)")


def spawn_actor(rt: Runtime, conn: Connection, msg: Spawn, parts: list[Buffer]) -> None:
    """Handle a Spawn message: build the actor, run its ``__init__``, reply."""

    point = Point.from_rank(msg.rank, msg.sizes)
    name = msg.actor.split(".", 1)[0]  # the wire key is "name.job.n", unique per spawn
    actor_id = f"{msg.mesh}[{msg.rank}].{name}[{msg.rank}]"
    if msg.actor in rt.actors:
        clash = ValueError(f"an actor named {msg.actor!r} already lives in proc {rt.addr}")
        info = info_from_error(clash, actor_id, str(point))  # (the caller can catch it)
        conn.send(Result(msg.reply, 1, encode_error(info), False, msg.rank))
        return
    inst: ActorInstance | None = None
    display = actor_id  # the class, once known, joins it (ActorContext.display_name)
    try:
        cls, args, kwargs = _spawn_payload(
            loads(
                msg.payload, msg.pickled, parts, lambda: f"actor class and arguments of {actor_id}"
            )
        )
        obj = cls.__new__(cls)
        ctx = ActorContext(
            actor_id,
            name,
            point,
            rt.addr,
            obj,
            proc_mesh_name=msg.mesh,
            proc_addrs=tuple(msg.proc_addrs),
            creator=creator_from_wire(msg.creators),
        )
        display = ctx.display_name
        inst = ActorInstance(rt, msg.actor, ctx, obj, msg.mesh, msg.owner_addr)
        if inst.all_sync:
            # On its thread, as its endpoints (Monarch's: thread-local state set in
            # __init__ is theirs); calls that come meanwhile wait for it (rt.arrivals).
            def then(job: InitJob, inst: ActorInstance = inst) -> None:
                rt.initializing.pop(msg.actor, None)
                if job.error is not None:
                    _spawn_failed(rt, conn, msg, inst, job.error, actor_id, point, display)
                else:
                    _spawned(rt, conn, msg, inst)

            rt.initializing[msg.actor] = inst  # (a hanging __init__ is reported as stuck)
            inst.init_on_thread(cast(JobFn, cls.__init__), (obj, *args), kwargs, then)
            return
        inst.cv.run(cls.__init__, obj, *args, **kwargs)
    except BaseException as e:  # user code: SystemExit too
        _spawn_failed(rt, conn, msg, inst, e, actor_id, point, display)
        return
    _spawned(rt, conn, msg, inst)


def _spawned(rt: Runtime, conn: Connection, msg: Spawn, inst: ActorInstance) -> None:
    rt.actors[msg.actor] = inst
    conn.send(Result(msg.reply, CLOSE, NIL, False, msg.rank))
    rt.arrivals.release_actor(msg.actor)


def _spawn_failed(
    rt: Runtime,
    conn: Connection,
    msg: Spawn,
    inst: ActorInstance | None,
    e: BaseException,
    actor_id: str,
    point: Point,
    display: str,
) -> None:
    """The actor's ``__init__`` (or its payload) failed with ``e``: it stands failed, and
    the spawner hears why."""
    tb = "".join(traceback.format_exception(e))
    info = info_from_error(e, actor_id, str(point), tb)
    if not isinstance(e, SerializationError):
        info = ErrorInfo(
            "actor", actor_id, str(point), info.exc_type, info.message, tb, "", info.exception
        )
    rt.actors[msg.actor] = _FailedActor(rt, actor_id, msg.rank, info, display)
    if inst is not None:
        if inst.owned:  # what it spawned before raising stops (Monarch)
            rt.spawn_task(inst.stop_owned())
        inst.in_flight.close_thread()
    conn.send(Result(msg.reply, 1, encode_error(info), False, msg.rank))
    rt.arrivals.release_actor(msg.actor)


# ---------------------------------------------------------------- message handlers


def on_call(rt: Runtime, conn: Connection, msg: Call, parts: list[Buffer]) -> None:
    """A call to one actor here: into its mailbox (held if it is not spawned yet)."""
    actor = rt.actors.get(msg.actor)
    if actor is None:
        if not rt.arrivals.await_actor(msg.actor, lambda: rt.dispatch(conn, msg, parts)):
            rt.reply_error(conn, msg.reply, -1, rt.arrivals.no_actor(msg.actor))
    else:
        actor.deliver(conn, msg, parts)


def on_spawn(rt: Runtime, conn: Connection, msg: Spawn, parts: list[Buffer]) -> None:
    """Spawn an actor here (see :func:`spawn_actor`)."""
    spawn_actor(rt, conn, msg, parts)


def on_stop_actor(rt: Runtime, conn: Connection, msg: StopActor, parts: list[object]) -> None:
    """Stop one actor here; answer once it has stopped."""
    rt.spawn_task(_stop_actor(rt, conn, msg))


def on_stop_proc(rt: Runtime, conn: Connection, msg: StopProc, parts: list[object]) -> None:
    """Stop every actor here, answer, and end the proc."""
    rt.spawn_task(_stop_proc(rt, conn, msg))


def on_cancel(rt: Runtime, conn: Connection, msg: Cancel, parts: list[object]) -> None:
    """The caller gave up on a call: drop it from the mailbox, or cancel it if running."""
    actor = rt.actors.get(msg.actor)
    if actor is not None:
        actor.cancel(conn, msg.reply)


def on_seq_skip(rt: Runtime, conn: Connection, msg: SeqSkip, parts: list[object]) -> None:
    """A message a sender's cast lost will never come: stop waiting for its number."""
    actor = rt.actors.get(msg.actor)
    if actor is not None:
        actor.skip(msg.sender or conn.peer or "", msg.seq)


async def _stop_actor(rt: Runtime, conn: Connection, msg: StopActor) -> None:
    actor = rt.actors.pop(msg.actor, None)
    rt.arrivals.gone_actors.add(msg.actor)
    if actor is not None:
        await actor.stop()
    if msg.reply:
        conn.send(Result(msg.reply, CLOSE, NIL))


async def _stop_proc(rt: Runtime, conn: Connection, msg: StopProc) -> None:
    actors, rt.actors = rt.actors, {}
    # Calls still arriving before the proc exits fail at once ("it was stopped"), not
    # after spawn_wait, as for one stopped actor.
    rt.arrivals.gone_actors.update(actors)
    for actor in actors.values():
        await actor.stop()
    if msg.reply:
        conn.send(Result(msg.reply, CLOSE, NIL))
    conn.flush()
    if not rt.stop_requested.done():
        rt.stop_requested.set_result(None)


def _rt_here() -> Runtime:
    from ._loops import current_runtime

    return current_runtime()


def _task_stack(task: asyncio.Task[T]) -> str:
    import io

    buf = io.StringIO()
    task.print_stack(file=buf)
    return buf.getvalue()


# ---------------------------------------------------------------- stuck endpoints


def check_stuck(rt: Runtime) -> None:
    """Tell the spawner of each actor whose endpoint (or ``__init__``, on its thread) has
    run past ``stuck_warn_after`` (again at twice as long, and so on)."""
    after = config.stuck_warn_after
    if after <= 0:
        return
    from ._debugging import hook as _debug

    now = time.monotonic()
    seen: set[tuple[int, str, str, float]] = set()
    for key, inst in [*rt.actors.items(), *rt.initializing.items()]:
        if not isinstance(inst, ActorInstance) or not inst.owner_addr:
            continue  # a system actor, or one nobody spawned from afar
        paused = _debug.is_paused(key)
        for method, since in inst.running_calls():
            k = (id(rt), key, method, since)
            seen.add(k)
            if paused:
                continue  # in a debugger: waiting for a person, not stuck
            if is_long_running(inst.obj, method):
                continue  # it runs as long as what it serves (a shell): not stuck
            # Time spent paused in a debugger does not count: the clock restarts after.
            running = now - max(since, _debug.resumed_at(key))
            if running < process.stuck_next.get(k, after):
                continue
            process.stuck_next[k] = 2 * running
            tell_supervisor(
                rt,
                inst.owner_addr,
                "stuck",
                inst.ctx.actor_id,
                inst.ctx.name,
                inst.rank_text,
                method,
                round(now - since, 3),
                _stack_of(inst, method),
            )
    for k in [k for k in process.stuck_next if k[0] == id(rt) and k not in seen]:
        del process.stuck_next[k]  # finished: forget it


def _stack_of(inst: ActorInstance, method: str) -> str:
    """The stack of ``inst``'s running ``method``: its thread's, or its task's."""
    import sys
    import traceback

    for ident, m, _ in inst.running_threads():
        frame = sys._current_frames().get(ident)  # noqa: SLF001 - the stdlib's
        if m == method and frame is not None:
            return "".join(traceback.format_stack(frame))
    for task, m, _ in inst.running_tasks():
        if m == method:
            return _task_stack(task)
    return "(no stack: it runs on the proc's loop)"
