"""``ActorMesh``: one actor per proc of a mesh, and the adverbs of its endpoints."""

from __future__ import annotations

import functools
import inspect
import itertools
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future as ThreadFuture
from typing import Any, Generic, TypeVar

import msgspec

from ..actors._api import (
    AS_ENDPOINT,
    CAST_GATHER,
    CAST_NONE,
    CAST_REDUCE,
    ERROR,
    JOB_ID,
    Actor,
    Cancel,
    Future,
    Port,
    PortReceiver,
    Region,
    Runtime,
    Spawn,
    StopActor,
    current_runtime,
    describe_endpoints,
    dumps,
    dumps_args,
    endpoints_of,
    forward,
    run_on,
    run_task,
    runtime_here,
    waiting_actor,
)
from ..config import config
from ..errors import ActorError, EndpointNotFoundError, SerializationError, SupervisionError
from ._cast import send_cast
from ._proc_group import ProcGroup, remove_actor_mesh
from ._shape import Shape
from ._shaped import Shaped
from ._supervision import MeshState, current_owner, resolved
from ._value_mesh import ValueMesh

__all__ = ["Accumulator", "ActorEndpoint", "ActorMesh", "NotAnEndpoint", "as_endpoint", "send"]

A = TypeVar("A", bound=Actor)
_spawn_ids = itertools.count()
_choose_lock = threading.Lock()


class _unless_endpoint:
    """An ``ActorMesh`` method whose name an actor class may also give an endpoint (e.g.
    ``stats``): where it does, ``mesh.stats`` is that endpoint, as without the method
    (reach the method as ``danaus.mesh_stats(mesh)`` then)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__

    def __get__(self, mesh: Any, owner: type | None = None) -> Any:
        if mesh is None:
            return self
        if self.name in endpoints_of(mesh._cls):
            return ActorEndpoint(mesh, self.name)
        return functools.partial(self.fn, mesh)


class ActorMesh(Shaped, Generic[A]):
    """One actor of class ``A`` in each proc of a proc mesh.

    ``mesh.method`` is an :class:`ActorEndpoint` with the adverbs ``call``,
    ``call_one``, ``choose``, ``stream`` and ``broadcast``. A mesh is a reference: pass
    it (or a slice of it) to another actor, and that actor can call it too.
    """

    def __init__(
        self,
        name: str,
        wire: str,
        cls: type[A],
        shape: Shape,
        addrs: dict[int, str] | None,
        initialized: ThreadFuture[None],
        spawn_rt: Runtime | None,
        proc_group: ProcGroup | None,
        sent: ThreadFuture[None] | None = None,
        state: MeshState | None = None,
    ) -> None:
        self._name = name
        self._wire = wire  # unique per spawn: the actor's key in its procs
        self._cls = cls
        self._shape = shape
        self._addrs = addrs  # global rank -> proc address (None: ask the procs, later)
        self._init = initialized  # every __init__ ran
        self._sent = sent or initialized  # the Spawn messages are on their way
        self._spawn_rt = spawn_rt
        #: the procs it was spawned on, when spawned by this process (None: a reference)
        self._proc_group = proc_group
        self._ranks = shape.global_ranks()
        self._tl: list[tuple[int, str]] | None = None
        self._known: dict[int, str] = {}  # proc addresses learnt so far
        self._inflight: dict[int, int] = {}
        self._rr = 0
        self._state = state if state is not None else MeshState(name, shape, None)
        #: the runtime for which the spawn gate is known open (skips checking it again)
        self._open_for: Runtime | None = None
        self._region_memo: tuple[Region | None] | None = None

    @property
    def _region(self) -> Region | None:
        """What calls to this mesh tell their actors about the slice called, so that
        ``current_rank()`` there is the place in it (Monarch's message rank); ``None``
        when this is the whole mesh, where message ranks are the actors' own ranks."""
        memo = self._region_memo
        if memo is None:
            shape, whole = self._shape, self._state.shape
            if shape == whole and whole == Shape.from_sizes(whole.sizes):
                memo = (None,)
            else:
                memo = (
                    Region(
                        list(shape.labels),
                        list(shape.sizes.values()),
                        list(shape.strides.values()),
                        shape.offset,
                    ),
                )
            self._region_memo = memo
        return memo[0]

    @property
    def _targets_list(self) -> list[tuple[int, str]]:
        """(global rank, proc address) of each actor; only once the procs are started."""
        if self._tl is None:
            self._tl = [(g, self._addr_of(g)) for g in self._ranks]
        return self._tl

    def _addr_of(self, rank: int) -> str:
        addrs = self._addrs
        if addrs is not None:
            return addrs[rank]
        addr = self._known.get(rank)
        if addr is None:
            assert self._proc_group is not None
            addr = self._proc_group.addr_of(rank)
            if not addr:
                return ""  # the proc never started (its host agent failed)
            self._known[rank] = addr
        return addr

    @classmethod
    def _spawn(
        cls,
        group: ProcGroup,
        shape: Shape,
        name: str,
        actor_cls: type[A],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> ActorMesh[A]:
        """One ``actor_cls`` actor in each proc of ``group`` that ``shape`` (the whole
        group's, or a slice's) selects."""
        raw, pickled, parts = dumps(
            (actor_cls, args, kwargs), lambda: f"actor class {actor_cls.__name__} and its arguments"
        )
        rt = current_runtime()
        init: ThreadFuture[None] = ThreadFuture()
        sent: ThreadFuture[None] = ThreadFuture()
        ranks = shape.global_ranks()
        wire = f"{name}.{JOB_ID}.{next(_spawn_ids)}"
        errors: list[BaseException] = []
        left = [len(ranks)]
        state = MeshState(name, group.shape, current_owner(), frozenset(ranks))
        group.add(wire, state)

        def on_reply(rank: int, status: int, value: Any) -> bool:
            if status == ERROR:
                errors.append(value)
                kind = "init" if isinstance(value, ActorError) else "proc"
                state.fail([rank], str(value), kind)
            left[0] -= 1
            if left[0] == 0:
                if errors:
                    init.set_exception(errors[0])
                else:
                    init.set_result(None)
                return True
            return False

        def send() -> None:
            from ._controllers import ensure_controllers

            ensure_controllers(rt)  # the actors' get_or_spawn_controller requests come here
            port = rt.open_port(on_reply)
            sizes = group.shape.sizes
            all_addrs = group.addrs()
            for r in ranks:
                addr = all_addrs[r]
                if not addr:  # the proc never started
                    err = SupervisionError(f"proc {group.handles[r]} did not start")
                    rt.deliver(port, r, ERROR, err)
                    continue
                conn = rt.connection(addr)
                msg = Spawn(wire, port, group.name, r, sizes, raw, pickled, rt.addr, all_addrs)
                if conn.send(msg, parts):
                    conn.pending[port] = r
                else:
                    rt.deliver(port, r, ERROR, rt.peer_lost_error(addr, conn.close_reason))
            sent.set_result(None)

        # Remote procs learn their addresses from their host agent: spawn once they have.
        group.started.add_done_callback(lambda _: run_on(rt, send))
        return cls(name, wire, actor_cls, shape, None, init, rt, group, sent, state)

    def __reduce__(self) -> tuple[Any, ...]:
        if self._sent.done():
            addrs = dict(self._targets_list)
        else:
            # Right after spawn(), as Monarch allows: local procs' addresses are known (their
            # sockets are bound by the spawner, so a receiver's dial waits in the kernel's
            # queue), and a call that overtakes the Spawn is held for it (spawn_wait).
            addrs = {g: self._addr_of(g) for g in self._ranks}
            if not all(addrs.values()) and self._wait_for_addresses():
                addrs = {g: self._addr_of(g) for g in self._ranks}
            if not all(addrs.values()):
                raise SerializationError(
                    f"{self!r} cannot be passed on before its procs have started (their "
                    "addresses are not known yet): `await mesh.initialized` first"
                )
        return (
            _rebuild,
            (self._name, self._wire, self._cls, self._shape, addrs, self._state.shape),
        )

    def _wait_for_addresses(self) -> bool:
        """A host agent's procs learn their addresses when the agent answers: wait for
        that (bounded) where waiting blocks no loop that must deliver the answer (sync
        code: a script, a sync endpoint); True if the procs have started."""
        group = self._proc_group
        if group is None or group.started.done():
            return group is not None
        rt = self._spawn_rt
        if rt is None or rt.on_loop():
            return False  # async code on the loop that gets the answer: it must await
        try:
            group.started.result(timeout=config.proc_start_timeout)
        except Exception:
            return False  # the spawn failed: the error below says the procs never started
        return True

    def __repr__(self) -> str:
        return f"ActorMesh({self._name}: {self._cls.__name__}, {self._shape.sizes})"

    def __getattr__(self, name: str) -> ActorEndpoint[A]:
        if name.startswith("__"):
            raise AttributeError(name)
        if name not in endpoints_of(self._cls):
            if not name.startswith("_") and inspect.isfunction(getattr(self._cls, name, None)):
                return NotAnEndpoint(self, name)  # type: ignore[return-value]
            raise EndpointNotFoundError(
                f"{self._cls.__name__} has no endpoint {name!r}; its endpoints are: "
                f"{describe_endpoints(self._cls)}"
            )
        return ActorEndpoint(self, name)

    def _with_shape(self, shape: Shape) -> ActorMesh[A]:
        return ActorMesh(
            self._name,
            self._wire,
            self._cls,
            shape,
            self._addrs,
            self._init,
            self._spawn_rt,
            self._proc_group,
            self._sent,
            self._state,
        )

    @property
    def initialized(self) -> Future[None]:
        """Resolves once every actor's ``__init__`` ran; raises ``ActorError`` if one raised."""
        rt = current_runtime()
        fut: Future[None] = Future(loop=rt.loop)

        def done(f: ThreadFuture[None]) -> None:
            def settle() -> None:
                if fut.done():
                    return
                exc = f.exception()
                if exc is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(exc)

            run_on(rt, settle)

        self._init.add_done_callback(done)
        return fut

    def __await__(self) -> Any:
        """``await procs.spawn(...)`` waits for every ``__init__`` and gives the mesh."""
        yield from self.initialized.__await__()
        return self

    def _targets(self) -> list[tuple[int, str]]:
        return self._targets_list

    @property
    def failed_ranks(self) -> dict[str, str]:
        """Failed actors of this mesh (or slice): ``{str(point): reason}``."""
        mine = set(self._ranks)
        st = self._state
        return {str(st.point(r)): why for r, why in list(st.failed.items()) if r in mine}

    @_unless_endpoint
    def stats(self) -> Future[ValueMesh[dict[str, Any]]]:
        """What each actor is doing: messages handled and failed per endpoint, its last
        failure, its mailbox depth, the endpoints running now and for how long, and its
        proc's record (pid, host, CPU %, RSS, connections, bytes in and out)."""
        from ._inspect import actor_mesh_stats

        return run_task(current_runtime(), lambda: actor_mesh_stats(self))

    @_unless_endpoint
    def stacks(self) -> Future[ValueMesh[list[dict[str, Any]]]]:
        """The Python stack of every thread (and running async endpoint) of each actor's
        proc; a thread or task running an endpoint names the actor, the endpoint and for
        how long (``seconds``)."""
        from ._inspect import actor_mesh_stacks

        return run_task(current_runtime(), lambda: actor_mesh_stacks(self))

    def stop(self, reason: str = "stopped by its owner") -> Future[None]:
        """Stop these actors (``__cleanup__`` runs); later calls raise ``SupervisionError``
        saying ``reason``.

        Stops the whole actor mesh, also when called on a slice. The procs keep running.
        """
        rt = current_runtime()
        fut: Future[None] = Future(loop=rt.loop)
        state = self._state
        mesh = self

        def go() -> None:
            state.stopped = reason
            remove_actor_mesh(mesh._wire)
            ranks = [r for r in mesh._all_ranks() if r not in state.failed]
            if not ranks:
                fut.set_result(None)
                return
            left = [len(ranks)]

            def on_reply(rank: int, status: int, value: Any) -> bool:
                left[0] -= 1
                if left[0] == 0 and not fut.done():
                    fut.set_result(None)  # stopped, or its proc is gone: either way, done
                return left[0] == 0

            port = rt.open_port(on_reply)
            for r in ranks:
                addr = mesh._addr_of(r)
                conn = rt.connection(addr) if addr else None
                if conn is not None and conn.send(StopActor(mesh._wire, port)):
                    conn.pending[port] = r
                else:
                    rt.deliver(port, r, ERROR, None)

        gate = self._sent if rt is self._spawn_rt else self._init
        gate.add_done_callback(lambda _: run_on(rt, go))
        return fut

    def _all_ranks(self) -> list[int]:
        if self._proc_group is not None:
            return self._proc_group.all_ranks()
        assert self._addrs is not None
        return list(self._addrs)


def _rebuild(
    name: str,
    wire: str,
    cls: type[Any],
    shape: Shape,
    addrs: dict[int, str],
    whole: Shape | None = None,
) -> ActorMesh[Any]:
    state = MeshState(name, whole, None) if whole is not None else None
    return ActorMesh(name, wire, cls, shape, addrs, resolved(), None, None, state=state)


def mesh_ref(name: str, cls: type[A], shape: Shape, addrs: dict[int, str]) -> ActorMesh[A]:
    """A reference to actors that exist already under the wire name ``name`` (host agents)."""
    return ActorMesh(name, name, cls, shape, addrs, resolved(), None, None)


class ActorEndpoint(Generic[A]):
    """An endpoint of every actor in a mesh, with Monarch's adverbs."""

    def __init__(self, mesh: ActorMesh[A], name: str) -> None:
        self._mesh = mesh
        self._name = name

    def __repr__(self) -> str:
        return f"<endpoint {self._mesh._cls.__name__}.{self._name} of {self._mesh!r}>"

    def _encode(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, bool, list[Any]]:
        return dumps_args(args, kwargs, self._describe_args)

    def _describe_args(self) -> str:
        return f"arguments of {self._mesh._cls.__name__}.{self._name}"

    def _send(
        self,
        rt: Runtime,
        ranks: list[int],
        port: int,
        enc: tuple[Any, bool, list[Any]],
        mode: int = CAST_GATHER,
        reducer: tuple[msgspec.Raw, bool] | None = None,
        here: bool | None = None,
    ) -> None:
        if here is None:
            here = rt.on_loop()
        mesh = self._mesh
        raw, pickled, parts = enc
        actor = mesh._wire
        method = self._name
        # After our own Spawn went out, the connection keeps our calls behind it; from
        # another runtime (another loop or proc), wait until the actors exist.
        state = mesh._state
        if state.failed or state.stopped:  # fail those ranks at once, send to the rest
            live = []
            for r in ranks:
                err = state.error_for(r)
                if err is None:
                    live.append(r)
                elif port:
                    run_on(rt, rt.deliver, port, r, ERROR, err)
            ranks = live
            if not ranks:
                return
        region = mesh._region
        if here and len(ranks) == 1 and mesh._open_for is rt:
            rank = ranks[0]  # the hot path: one actor, already spawned, from its loop
            rt.send_call(
                mesh._addr_of(rank), actor, method, port, rank, raw, pickled, parts, region
            )
            return
        gate = mesh._sent if rt is mesh._spawn_rt else mesh._init
        ready = gate.done()
        if ready and mesh._open_for is None and here:
            mesh._open_for = rt
        if ready and len(ranks) == 1 and here and (addr := mesh._addr_of(ranks[0])):
            rt.send_call(addr, actor, method, port, ranks[0], raw, pickled, parts, region)
            return
        fanout = config.cast_fanout

        def go() -> None:
            targets = []
            for r in ranks:
                a = mesh._addr_of(r)
                if a:
                    targets.append((r, a))
                elif port:
                    rt.deliver(
                        port,
                        r,
                        ERROR,
                        SupervisionError(f"the proc of rank {r} of {mesh!r} never started"),
                    )
            if fanout and len(targets) > fanout:
                tree = []
                for rank, addr in targets:
                    seqs = rt.seqs.setdefault(addr, {})
                    seq = seqs[actor] = seqs.get(actor, 0) + 1
                    tree.append((rank, addr, seq))
                send_cast(
                    rt,
                    actor,
                    method,
                    tree,
                    port,
                    mode if port else CAST_NONE,
                    fanout,
                    raw,
                    pickled,
                    parts,
                    reducer,
                    region,
                )
            else:
                for rank, addr in targets:
                    rt.send_call(addr, actor, method, port, rank, raw, pickled, parts, region)

        if ready:
            run_on(rt, go)
        else:
            gate.add_done_callback(lambda _: run_on(rt, go))

    def rref(self, *args: Any, **kwargs: Any) -> Any:
        """Call the endpoint on every actor with DTensor arguments (each actor gets its
        proc's shard) and make what each returns a shard of a new DTensor, without
        waiting (Monarch's ``rref``). The endpoint needs ``@endpoint(propagate=fn)``:
        ``fn`` gives the output's shape from the arguments', as ``@remote``'s does.
        Imports the tensor engine (and torch) on first use."""
        if rref_hook is None:
            import danaus.tensor_engine  # noqa: F401 - sets rref_hook
        assert rref_hook is not None
        return rref_hook(self, args, kwargs)

    def call_one(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """Call the one actor of this mesh; ``ValueError`` if it holds more or fewer."""
        ranks = self._mesh._ranks
        if len(ranks) != 1:
            raise ValueError(
                f"call_one needs a mesh of exactly one actor, {self._mesh!r} has {len(ranks)}: "
                "use call(), or slice the mesh first"
            )
        return self._call_single(ranks, args, kwargs)

    def _call_single(
        self, ranks: list[int], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Future[Any]:
        enc = self._encode(args, kwargs)
        rt, here = runtime_here()
        fut: Future[Any] = Future(loop=rt.loop)
        port = rt.open_future_port(fut)
        self._arm(fut, rt, port, ranks)
        self._send(rt, ranks, port, enc, here=here)
        return fut

    def _arm(self, fut: Future[Any], rt: Runtime, port: int, ranks: list[int]) -> None:
        """Cancelling ``fut`` cancels the calls; waiting on it from one of its own
        callees (an actor calling itself) raises instead of deadlocking."""
        fut._on_cancel = functools.partial(_cancel_calls, rt, self._mesh, port, ranks)
        waiter = waiting_actor()
        if waiter is not None and waiter.wire == self._mesh._wire and waiter.rank in ranks:
            fut._self_wait = (
                waiter,
                (
                    f"deadlock: actor {waiter.ctx.actor_id} waits for its own endpoint "
                    f"{self._name!r}; an actor handles one message at a time, so that call "
                    "could only start after the waiting endpoint returns. Send it without "
                    "waiting, make the waiting endpoint a @concurrent_endpoint, or move the "
                    "work to another actor"
                ),
            )

    def choose(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """Call one actor of the mesh and return its result.

        The actor with the fewest calls from this caller still in flight through
        ``choose`` is picked; ties go round robin. Failed ranks are never chosen while
        a healthy one is left (then the call fails with ``SupervisionError``).
        """
        mesh = self._mesh
        ranks = mesh._ranks
        failed = mesh._state.failed
        if failed:
            healthy = [r for r in ranks if r not in failed]
            ranks = healthy or ranks
        inflight = mesh._inflight
        with _choose_lock:  # the count is also lowered on the loop's thread
            start = mesh._rr
            mesh._rr = start + 1
            n = len(ranks)
            best = min(range(n), key=lambda i: (inflight.get(ranks[(start + i) % n], 0), i))
            rank = ranks[(start + best) % n]
            inflight[rank] = inflight.get(rank, 0) + 1
        fut = self._call_single([rank], args, kwargs)

        def done(_: Any) -> None:
            with _choose_lock:
                inflight[rank] -= 1

        fut.add_done_callback(done)
        return fut

    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh[Any]]:
        """Call every actor; the result is a :class:`ValueMesh` of their return values.

        Raises (when awaited) the first ``ActorError`` or ``SupervisionError`` that comes
        back, once every actor has answered.
        """
        enc = self._encode(args, kwargs)
        rt = current_runtime()
        fut: Future[ValueMesh[Any]] = Future(loop=rt.loop)
        shape = self._mesh._shape
        ranks = self._mesh._ranks
        index = {g: i for i, g in enumerate(ranks)}
        values: list[Any] = [None] * len(ranks)
        left = [len(ranks)]
        error: list[BaseException] = []

        def on_reply(rank: int, status: int, value: Any) -> bool:
            left[0] -= 1
            if status == ERROR:
                if not error:
                    error.append(value)
            else:
                values[index[rank]] = value
            if left[0] == 0 and not fut.done():
                if error:
                    fut.set_exception(error[0])
                else:
                    fut.set_result(ValueMesh(shape, values))
            return left[0] == 0

        port = rt.open_port(on_reply)
        self._arm(fut, rt, port, ranks)
        self._send(rt, ranks, port, enc)
        return fut

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Send to every actor and do not wait (fire and forget)."""
        enc = self._encode(args, kwargs)
        self._send(current_runtime(), self._mesh._ranks, 0, enc, CAST_NONE)

    async def post(self, *args: Any, **kwargs: Any) -> None:
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
        for r in mesh._ranks:
            addr = mesh._addr_of(r)
            conn = rt.conns.get(addr) if addr else None
            if conn is not None and conn.write_paused:
                await conn.writable()

    def stream(self, *args: Any, **kwargs: Any) -> _Stream:
        """Call every actor; their results in arrival order. As in Monarch, iterating gives
        futures (``[await f for f in ep.stream()]``, or ``f.get()``); ``async for`` gives
        the values themselves."""
        enc = self._encode(args, kwargs)
        rt = current_runtime()
        ranks = self._mesh._ranks
        s = _Stream(rt, len(ranks))
        self._send(rt, ranks, s.port_id, enc)
        return s


def _cancel_calls(rt: Runtime, mesh: ActorMesh[Any], port: int, ranks: list[int]) -> None:
    """The caller gave up on the calls answering to ``port``: tell their actors."""

    def go() -> None:
        rt.close_port(port)
        msg = Cancel(mesh._wire, port)
        for r in ranks:
            addr = mesh._addr_of(r)
            conn = rt.conns.get(addr) if addr else None
            if conn is not None:
                conn.pending.pop(port, None)
                conn.send(msg)

    run_on(rt, go)


class Accumulator(Generic[A]):
    """Reduce an endpoint's results over a mesh: ``Accumulator(mesh.value, 0, operator.add)``.

    Results are combined on the way up the casting tree (so ``combine`` must be
    associative), and the caller gets ``combine(identity, reduced)``.
    """

    def __init__(
        self, endpoint: ActorEndpoint[A], identity: Any, combine: Callable[[Any, Any], Any]
    ) -> None:
        self._endpoint = endpoint
        self._identity = identity
        self._combine = combine

    def accumulate(self, *args: Any, **kwargs: Any) -> Future[Any]:
        ep = self._endpoint
        enc = ep._encode(args, kwargs)
        rt = current_runtime()
        fut: Future[Any] = Future(loop=rt.loop)
        ranks = ep._mesh._ranks
        acc = [self._identity]
        left = [len(ranks)]
        combine = self._combine

        def on_reply(rank: int, status: int, value: Any) -> bool:
            left[0] -= 1
            if fut.done():
                return left[0] <= 0
            if status == ERROR:
                fut.set_exception(value)
            else:
                try:
                    acc[0] = combine(acc[0], value)
                except Exception as e:
                    fut.set_exception(e)
            if left[0] <= 0 and not fut.done():
                fut.set_result(acc[0])
            return left[0] <= 0

        reducer = dumps((self._identity, combine), lambda: "the accumulator's combine function")
        port = rt.open_port(on_reply)
        if config.cast_fanout and len(ranks) > config.cast_fanout:
            # Each top-level subtree answers once, with its reduced value.
            left[0] = min(config.cast_fanout, len(ranks))
        ep._send(rt, ranks, port, enc, CAST_REDUCE, (reducer[0], reducer[1]))
        return fut


class _Stream:
    """Results of a call in arrival order: ``for f in s`` gives futures (Monarch's way),
    ``async for v in s`` the values."""

    def __init__(self, rt: Runtime, n: int) -> None:
        self._n = n
        self._receiver: PortReceiver[Any] = PortReceiver(rt, once=False)
        self.port_id = self._receiver.port_id

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._aiter()

    async def _aiter(self) -> AsyncIterator[Any]:
        try:
            for _ in range(self._n):
                yield await self._receiver.recv()
        finally:
            self._receiver.close()

    def __iter__(self) -> Iterator[Future[Any]]:
        """One future per actor, resolving in arrival order (Monarch's ``stream()``):
        ``[await f for f in ep.stream()]`` in async code, ``f.get()`` in sync code.
        (The port closes when this stream is dropped.)"""
        futures = [self._receiver.recv() for _ in range(self._n)]
        for f in futures:
            f._keepalive = self._receiver  # type: ignore[attr-defined]  # the port lives while a future waits
        yield from futures


class NotAnEndpoint:
    """``mesh.method`` for a plain method (not an ``@endpoint``) of the actor class: not
    callable as is; ``as_endpoint(mesh.method)`` makes an endpoint of it, as in Monarch."""

    def __init__(self, mesh: ActorMesh[Any], name: str) -> None:
        self._mesh = mesh
        self._name = name

    def __repr__(self) -> str:
        return f"<plain method {self._mesh._cls.__name__}.{self._name} of {self._mesh!r}>"

    def __getattr__(self, adverb: str) -> Any:
        if adverb.startswith("__"):
            raise AttributeError(adverb)
        raise EndpointNotFoundError(
            f"{self._mesh._cls.__name__}.{self._name} is a plain method, not an @endpoint: "
            f"mark it @endpoint, or call it through as_endpoint(mesh.{self._name}).{adverb}(...)"
        )


def as_endpoint(
    not_an_endpoint: Any, *, propagate: Any = None, explicit_response_port: bool = False
) -> ActorEndpoint[Any]:
    """Call a plain method of a spawned actor (not an ``@endpoint``) with the adverbs:
    ``as_endpoint(mesh.method).call(...)``, as in Monarch.

    Args:
        not_an_endpoint: ``mesh.method`` for a plain method of the actor class.
        propagate: accepted for Monarch compatibility.
        explicit_response_port: the method gets the caller's reply port as its first
            argument and answers through it (see ``endpoint``).

    Raises:
        ValueError: ``not_an_endpoint`` is not a plain method of an actor mesh.
    """
    del propagate
    if not isinstance(not_an_endpoint, NotAnEndpoint):
        raise ValueError(
            f"as_endpoint expects a plain method of an actor mesh (mesh.method), got "
            f"{not_an_endpoint!r}"
        )
    kind = "port" if explicit_response_port else "call"
    return ActorEndpoint(not_an_endpoint._mesh, f"{AS_ENDPOINT}{kind}:{not_an_endpoint._name}")


def send(
    endpoint: ActorEndpoint[Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    port: Port[Any] | None = None,
    selection: str = "all",
) -> None:
    """Send a call without waiting for it, as Monarch's ``send``.

    Args:
        endpoint: ``mesh.method`` (or a slice's).
        args: positional arguments.
        kwargs: keyword arguments.
        port: where each actor's result (or error) goes; a receiver from
            ``Channel.open_ranked()`` gets ``(rank, value)`` pairs, ``rank`` being the
            actor's place in the mesh called. ``None``: results are dropped (an endpoint
            that raises then fails its actor, as with ``broadcast``).
        selection: ``"all"`` (every actor) or ``"choose"`` (one of them).

    Raises:
        ValueError: ``selection`` is neither ``"all"`` nor ``"choose"``.
    """
    if selection not in ("all", "choose"):
        raise ValueError(f"send(selection=...) takes 'all' or 'choose', not {selection!r}")
    if not isinstance(endpoint, ActorEndpoint):
        raise TypeError(
            f"send() takes an endpoint of an actor mesh (mesh.method), got {endpoint!r}"
        )
    if port is None:
        if selection == "all":
            endpoint.broadcast(*args, **kwargs)
        else:
            endpoint.choose(*args, **kwargs)  # its result is dropped
        return
    enc = endpoint._encode(args, kwargs)
    rt = current_runtime()
    mesh = endpoint._mesh
    ranks = mesh._ranks
    if selection == "choose":
        with _choose_lock:
            i = mesh._rr % len(ranks)
            mesh._rr += 1
        ranks = [ranks[i]]
        index = {ranks[0]: i}
    else:
        index = {g: i for i, g in enumerate(ranks)}
    left = [len(ranks)]

    def on_reply(rank: int, status: int, value: Any) -> bool:
        left[0] -= 1
        forward(rt, port, index.get(rank, -1), status, value)
        return left[0] == 0

    endpoint._send(rt, ranks, rt.open_port(on_reply), enc)


def mesh_stats(mesh: ActorMesh[Any]) -> Future[ValueMesh[dict[str, Any]]]:
    """``mesh.stats()``, also where the actor class has an endpoint named ``stats``."""
    return ActorMesh.__dict__["stats"].fn(mesh)  # type: ignore[no-any-return]


def mesh_stacks(mesh: ActorMesh[Any]) -> Future[ValueMesh[list[dict[str, Any]]]]:
    """``mesh.stacks()``, also where the actor class has an endpoint named ``stacks``."""
    return ActorMesh.__dict__["stacks"].fn(mesh)  # type: ignore[no-any-return]


#: set by danaus.tensor_engine when imported (the mesh layer does not import it)
rref_hook: Any = None
