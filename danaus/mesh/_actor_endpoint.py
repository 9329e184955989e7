"""``ActorEndpoint``: one endpoint of every actor in a mesh, with Monarch's adverbs
(``call``, ``call_one``, ``choose``, ``stream``, ``broadcast``, ``post``, ``rref``): how a
call's arguments are encoded and sent to the actors (one by one, or down a casting tree
for wide meshes), how their replies are gathered into a future, a ``ValueMesh`` or a
``Stream``, and how cancelling a future cancels its calls. What is built on endpoints
(``Accumulator``, ``send``, ``as_endpoint``) is in ``_endpoint_ops``."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Generic, NamedTuple, TypeAlias, TypeVar, cast

import msgspec

from ..actors.seam import (
    ERROR,
    Actor,
    CallSpec,
    Future,
    PortReceiver,
    Runtime,
    current_runtime,
    dumps_args,
    outgoing_trace,
    run_on,
    runtime_here,
    waiting_actor,
)
from ..config import config
from ..errors import SupervisionError, actor_failed
from ._tensor_engine_hook import tensor_engine
from ._value_mesh import ValueMesh

if TYPE_CHECKING:
    from ..actors.seam import RegionWire
    from ._actor_mesh import ActorMesh
    from ._supervision import MeshState

__all__ = ["ActorEndpoint", "Encoded", "Stream", "as_error"]

#: an endpoint's result (what its method returns, awaited)
R_co = TypeVar("R_co", covariant=True)
T = TypeVar("T")

#: a call's arguments, encoded: (header value, pickled?, out-of-band parts)
Encoded: TypeAlias = tuple[msgspec.Raw, bool, list[bytes | bytearray | memoryview]]


class _Hot(NamedTuple):
    """Where ``call_one`` of a one-actor mesh goes once the mesh is open for a loop's
    runtime: nothing of it changes while that runtime lives (it is checked on each call,
    with the mesh's failures), so the call skips the mesh's lookups."""

    rt: Runtime
    ranks: list[int]  # the mesh's own list, of one rank
    addr: str
    wire: str
    region: RegionWire | None
    state: MeshState


class ActorEndpoint(Generic[R_co]):
    """An endpoint of every actor in a mesh, with Monarch's adverbs; ``R`` is what it
    returns.

    Where the mesh is typed as its actor class (what ``spawn`` returns), type checkers
    see its endpoints as ``BoundEndpoint`` (``_actor_face``): this class with the
    arguments checked against the method's and ``R`` its result. An
    ``ActorMesh[Foo]``'s endpoints, found by name at run time, are
    ``ActorEndpoint[object]``.
    """

    def __init__(self, mesh: ActorMesh[Actor], name: str) -> None:
        self._mesh = mesh
        self._name = name
        #: ``call_one``'s route once it is known to need nothing but a write (see
        #: :meth:`send_encoded`): runtime, rank, proc address, wire key, region, mesh state
        self._hot: _Hot | None = None

    @property
    def mesh(self) -> ActorMesh[Actor]:
        """The actors this endpoint calls."""
        return self._mesh

    @property
    def name(self) -> str:
        """The endpoint's name (the method's)."""
        return self._name

    def __repr__(self) -> str:
        return f"<endpoint {self._mesh.actor_class.__name__}.{self._name} of {self._mesh!r}>"

    def __reduce__(self) -> tuple[type[ActorEndpoint[R_co]], tuple[ActorMesh[Actor], str]]:
        # A reference: its mesh's (see ActorMesh.__reduce__) and its name.
        return (type(self), (self._mesh, self._name))

    def encode_args(self, args: tuple[object, ...], kwargs: dict[str, object]) -> Encoded:
        """A call's arguments as :meth:`send_encoded` takes them."""
        return dumps_args(args, kwargs, self._describe_args)

    def _describe_args(self) -> str:
        return f"arguments of {self._mesh.actor_class.__name__}.{self._name}"

    def send_encoded(
        self,
        rt: Runtime,
        ranks: list[int],
        port: int,
        enc: Encoded,
        reducer: tuple[msgspec.Raw, bool] | None = None,
        here: bool | None = None,
    ) -> None:
        """Send the call with arguments ``enc`` (from :meth:`encode_args`) to the actors
        of global ranks ``ranks``, their replies to ``port`` (0: none)."""
        if here is None:
            here = rt.on_loop()
        # with telemetry on, the caller's span (taken here, in the caller's context)
        trace = outgoing_trace() if config.telemetry else ""
        mesh = self._mesh
        state = mesh.mesh_state
        if state.failed or state.stopped:  # fail those ranks at once, send to the rest
            ranks = _live_ranks(rt, state, ranks, port)
            if not ranks:
                return
        spec = CallSpec(mesh.wire_name, self._name, *enc, mesh.call_region, trace)
        if here and len(ranks) == 1 and mesh.is_open_for(rt):
            rank = ranks[0]  # the hot path: one actor, already spawned, from its loop
            addr = mesh.addr_of(rank)
            if ranks is mesh.global_ranks():  # a mesh of one: call_one goes straight here
                self._hot = _Hot(rt, ranks, addr, spec.actor, spec.region, state)
            rt.send_call(addr, rank, port, spec)
            return
        gate = mesh.call_gate(rt, here)
        ready = gate.done()
        if ready and len(ranks) == 1 and (addr := mesh.addr_of(ranks[0])):
            # From another thread (a plain thread's call, a sync endpoint's), the thread
            # writes the call itself where it can, without waking the loop to do it.
            rt.call([(ranks[0], addr)], port, spec, here=here)
            return

        def go() -> None:
            targets = []
            for r in ranks:
                a = mesh.addr_of(r)
                if a:
                    targets.append((r, a))
                elif port:
                    rt.deliver(
                        port,
                        r,
                        ERROR,
                        SupervisionError(
                            f"the proc of rank {r} of {mesh!r} never started"
                            + mesh.why_not_started(r)
                        ),
                    )
            rt.call(targets, port, spec, reducer)

        if here:
            if ready:
                go()
            else:
                gate.add_done_callback(lambda _: run_on(rt, go))
            return
        # From another thread: counted as handed to the loop from now, so that this
        # thread's later calls, written by itself, cannot overtake it.
        if ready:
            rt.call_soon_handed(go)
        else:
            send = rt.hand_over(go)
            gate.add_done_callback(lambda _: rt.loop.call_soon_threadsafe(send))

    def rref(self, *args: object, **kwargs: object) -> object:
        """Call the endpoint on every actor with DTensor arguments (each actor gets its
        proc's shard) and make what each returns a shard of a new DTensor, without
        waiting (Monarch's ``rref``). The endpoint needs ``@endpoint(propagate=fn)``:
        ``fn`` gives the output's shape from the arguments', as ``@remote``'s does.
        Imports the tensor engine (and torch) on first use."""
        return tensor_engine().rref(self, args, kwargs)

    def call_one(self, *args: object, **kwargs: object) -> Future[R_co]:
        """Call the one actor of this mesh; ``ValueError`` if it holds more or fewer."""
        hot = self._hot
        if hot is not None:  # the hot path, as send_encoded's first branch, inlined
            enc = dumps_args(args, kwargs, self._describe_args)
            rt, here = runtime_here()
            state = hot.state
            if here and rt is hot.rt and not state.failed and not state.stopped:
                fut: Future[R_co] = _CallFuture(loop=rt.loop)
                port = rt.open_future_port(fut)
                self._arm(fut, rt, port, hot.ranks)
                trace = outgoing_trace() if config.telemetry else ""
                spec = CallSpec(hot.wire, self._name, *enc, hot.region, trace)
                rt.send_call(hot.addr, hot.ranks[0], port, spec)
                return fut
            return self._send_single(enc, rt, here, hot.ranks)
        ranks = self._mesh.global_ranks()
        if len(ranks) != 1:
            raise ValueError(
                f"call_one needs a mesh of exactly one actor, {self._mesh!r} has {len(ranks)}: "
                "use call(), or slice the mesh first"
            )
        return self._call_single(ranks, args, kwargs)

    def _call_single(
        self, ranks: list[int], args: tuple[object, ...], kwargs: dict[str, object]
    ) -> Future[R_co]:
        enc = self.encode_args(args, kwargs)
        rt, here = runtime_here()
        return self._send_single(enc, rt, here, ranks)

    def _send_single(self, enc: Encoded, rt: Runtime, here: bool, ranks: list[int]) -> Future[R_co]:
        fut: Future[R_co] = _CallFuture(loop=rt.loop)
        port = rt.open_future_port(fut)
        self._arm(fut, rt, port, ranks)
        self.send_encoded(rt, ranks, port, enc, here=here)
        return fut

    def _arm(self, fut: Future[T], rt: Runtime, port: int, ranks: list[int]) -> None:
        """Cancelling ``fut`` cancels the calls; waiting on it from one of its own
        callees (an actor calling itself) raises instead of deadlocking."""
        # (the hook holds this endpoint: a _CallFuture's errors name it from there)
        fut.set_cancel_hook(functools.partial(_cancel_calls, rt, self, port, ranks))
        waiter = waiting_actor()
        if waiter is not None and waiter.wire == self._mesh.wire_name and waiter.rank in ranks:
            fut.set_self_wait(
                waiter,
                (
                    f"deadlock: actor {waiter.ctx.actor_id} waits for its own endpoint "
                    f"{self._name!r}; an actor handles one message at a time, so that call "
                    "could only start after the waiting endpoint returns. Send it without "
                    "waiting, make the waiting endpoint a @concurrent_endpoint, or move the "
                    "work to another actor"
                ),
            )

    def choose(self, *args: object, **kwargs: object) -> Future[R_co]:
        """Call one actor of the mesh and return its result.

        The actor with the fewest calls from this caller still in flight through
        ``choose`` is picked; ties go round robin. Failed ranks are never chosen while
        a healthy one is left (then the call fails with ``SupervisionError``).
        """
        mesh = self._mesh
        ranks = mesh.global_ranks()
        failed = mesh.mesh_state.failed
        if failed:
            healthy = [r for r in ranks if r not in failed]
            ranks = healthy or ranks
        rank = mesh.choose_rank(ranks)
        fut = self._call_single([rank], args, kwargs)
        fut.add_done_callback(lambda _: mesh.chosen_done(rank))
        return fut

    def call(self, *args: object, **kwargs: object) -> Future[ValueMesh[R_co]]:
        """Call every actor; the result is a :class:`ValueMesh` of their return values.

        Raises (when awaited) the first ``ActorError`` or ``SupervisionError`` that comes
        back, once every actor has answered.
        """
        enc = self.encode_args(args, kwargs)
        rt = current_runtime()
        fut: Future[ValueMesh[R_co]] = Future(loop=rt.loop)
        shape = self._mesh.shape
        ranks = self._mesh.global_ranks()
        index = {g: i for i, g in enumerate(ranks)}
        values: list[object] = [None] * len(ranks)
        left = [len(ranks)]
        error: list[BaseException] = []

        def on_reply(rank: int, status: int, value: object) -> bool:
            left[0] -= 1
            if status == ERROR:
                if not error:
                    error.append(failed_call(self, as_error(value)))
            else:
                values[index[rank]] = value  # the endpoint's result, decoded
            if left[0] == 0 and not fut.done():
                if error:
                    fut.set_exception(error[0])
                else:  # every rank answered (no None is left), each an R
                    fut.set_result(ValueMesh(shape, cast("list[R_co]", values)))
            return left[0] == 0

        port = rt.open_port(on_reply)
        self._arm(fut, rt, port, ranks)
        self.send_encoded(rt, ranks, port, enc)
        return fut

    def broadcast(self, *args: object, **kwargs: object) -> None:
        """Send to every actor and do not wait (fire and forget)."""
        enc = self.encode_args(args, kwargs)
        self.send_encoded(current_runtime(), self._mesh.global_ranks(), 0, enc)

    async def post(self, *args: object, **kwargs: object) -> None:
        """``broadcast`` with backpressure: send, then wait while the way to these actors
        is backed up (their mailboxes are full, or they read slower than we send).

        A loop of ``await mesh.method.post(x)`` keeps the sender's memory bounded however
        slow the receivers are; a loop of ``broadcast`` queues without bound.
        """
        rt = current_runtime()
        if not rt.on_loop():
            raise RuntimeError("post() is for async code on the calling loop; use broadcast()")
        self.broadcast(*args, **kwargs)
        mesh = self._mesh
        for r in mesh.global_ranks():
            addr = mesh.addr_of(r)
            conn = rt.open_connection(addr) if addr else None
            if conn is not None and conn.write_paused:
                await conn.writable()

    def stream(self, *args: object, **kwargs: object) -> Stream[R_co]:
        """Call every actor; their results in arrival order. As in Monarch, iterating gives
        futures (``[await f for f in ep.stream()]``, or ``f.get()``); ``async for`` gives
        the values themselves."""
        enc = self.encode_args(args, kwargs)
        rt = current_runtime()
        ranks = self._mesh.global_ranks()
        s: Stream[R_co] = Stream(rt, len(ranks))
        self.send_encoded(rt, ranks, s.port_id, enc)
        return s


def as_error(value: object) -> BaseException:
    """What a port got with status ``ERROR``: always an exception."""
    return value if isinstance(value, BaseException) else SupervisionError(str(value))


def failed_call(ep: ActorEndpoint[object], exc: BaseException) -> BaseException:
    """``exc``, which a call of ``ep`` got, as its caller sees it: a ``SupervisionError``
    names the call (Monarch's "Endpoint call mesh.method() failed, ..."). Only errors come
    here, never a call that succeeded."""
    if isinstance(exc, SupervisionError):
        state = ep.mesh.mesh_state
        if exc.lost is not None and exc.endpoint is None:
            rank, why = exc.lost
            exc = SupervisionError(actor_failed(state.display_name(rank), why))
        return exc.for_endpoint(f"{state.name}.{ep.name}()")
    return exc


def _live_ranks(rt: Runtime, state: MeshState, ranks: list[int], port: int) -> list[int]:
    """Those of ``ranks`` not failed or stopped; the others' calls fail at once (their
    replies to ``port``, if any)."""
    live = []
    for r in ranks:
        err = state.error_for(r)
        if err is None:
            live.append(r)
        elif port:
            run_on(rt, rt.deliver, port, r, ERROR, err)
    return live


def _cancel_calls(rt: Runtime, ep: ActorEndpoint[object], port: int, ranks: list[int]) -> None:
    """The caller gave up on the calls of ``ep`` answering to ``port``: tell their actors."""
    mesh = ep.mesh

    addrs = [a for r in ranks if (a := mesh.addr_of(r))]
    run_on(rt, rt.cancel, mesh.wire_name, port, addrs)


class _CallFuture(Future[T]):
    """The future of a ``call_one`` or ``choose``: a ``SupervisionError`` it gets names
    the endpoint's call (:func:`failed_call`). The endpoint is the one its
    cancel hook holds (set by ``_arm``), looked up on an error's way only: a call that
    succeeds does no more work than with a plain :class:`Future`."""

    def set_exception(self, exception: type | BaseException, /) -> None:
        hook = self.cancel_hook
        if (
            isinstance(exception, SupervisionError)
            and isinstance(hook, functools.partial)
            and hook.func is _cancel_calls
        ):
            exception = failed_call(hook.args[1], exception)
        super().set_exception(exception)


class Stream(Generic[T]):
    """Results of a call in arrival order: ``for f in s`` gives futures (Monarch's way),
    ``async for v in s`` the values."""

    def __init__(self, rt: Runtime, n: int) -> None:
        self._n = n
        self._receiver: PortReceiver[T] = PortReceiver(rt, once=False)
        self.port_id = self._receiver.port_id

    def __aiter__(self) -> AsyncIterator[T]:
        return self._aiter()

    async def _aiter(self) -> AsyncIterator[T]:
        try:
            for _ in range(self._n):
                yield await self._receiver.recv()
        finally:
            self._receiver.close()

    def __iter__(self) -> Iterator[Future[T]]:
        """One future per actor, resolving in arrival order (Monarch's ``stream()``):
        ``[await f for f in ep.stream()]`` in async code, ``f.get()`` in sync code.
        (The port closes when this stream is dropped.)"""
        futures = [self._receiver.recv() for _ in range(self._n)]
        for f in futures:
            f.keep_alive(self._receiver)  # the port lives while a future waits
        yield from futures
