"""``ActorMesh``: one actor per proc of a mesh, as a reference that can be passed on: the
internal API its endpoints use (wire name, addresses, the gate calls wait behind, the
slice a call names), its slices, its pickling, ``initialized``, ``stop`` and the choice of
rank behind ``choose``. Spawning it is in ``_actor_spawn``, its endpoints and their
adverbs in ``_actor_endpoint``, ``stats`` and ``stacks`` in ``_inspect``; type checkers'
view of it (the actor class) in ``_actor_face``."""

from __future__ import annotations

import inspect
from collections.abc import Generator
from concurrent.futures import Future as ThreadFuture
from typing import Generic, TypeVar

from ..actors.seam import (
    Actor,
    Future,
    RegionWire,
    Runtime,
    current_runtime,
    describe_endpoints,
    endpoints_of,
    run_on,
)
from ..config import config
from ..errors import EndpointNotFoundError, SerializationError
from ..geometry import Shape, Shaped
from ._actor_endpoint import ActorEndpoint
from ._admin.inspect import mesh_stacks, mesh_stats, unless_endpoint
from ._admin.records import ActorStats, GoneActorStats, StackEntry
from ._endpoint_ops import NotAnEndpoint
from ._proc_group import ProcGroup, remove_actor_mesh
from ._process import process
from ._supervision import MeshState, resolved
from ._value_mesh import ValueMesh

__all__ = ["ActorMesh", "mesh_ref"]

A = TypeVar("A", bound=Actor)
#: a mesh of ``Foo`` actors is a mesh of actors: ``ActorMesh[Foo]`` is an ``ActorMesh[Actor]``
A_co = TypeVar("A_co", bound=Actor, covariant=True)


class ActorMesh(Shaped, Generic[A_co]):
    """One actor of class ``A`` in each proc of a proc mesh.

    ``mesh.method`` is an :class:`ActorEndpoint` with the adverbs ``call``,
    ``call_one``, ``choose``, ``stream`` and ``broadcast``. A mesh is a reference: pass
    it (or a slice of it) to another actor, and that actor can call it too.
    """

    def __init__(
        self,
        name: str,
        wire: str,
        cls: type[A_co],
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
        self._region_memo: tuple[RegionWire | None] | None = None

    # The internal API of the endpoints (``_actor_endpoint``) and the layers above: read-
    # only views and small methods. Class attributes, so spawn() refuses endpoints named
    # like them (an instance attribute would hide such an endpoint without a word).

    @property
    def actor_class(self) -> type[A_co]:
        """The class of these actors."""
        return self._cls

    @property
    def wire_name(self) -> str:
        """The actors' key in their procs (unique per spawn): what calls to them name."""
        return self._wire

    @property
    def mesh_state(self) -> MeshState:
        """The supervision state of the whole mesh, shared by its slices: its failed
        ranks and whether it was stopped."""
        return self._state

    @property
    def spawn_sent(self) -> ThreadFuture[None]:
        """Resolves once the Spawn messages are on their way (the procs have started:
        their addresses are known)."""
        return self._sent

    @property
    def init_done(self) -> ThreadFuture[None]:
        """Resolves once every actor's ``__init__`` ran (raises the first error)."""
        return self._init

    def global_ranks(self) -> list[int]:
        """The global rank of each actor of this mesh (or slice), in order (not to be
        changed: it is the mesh's own list)."""
        return self._ranks

    def is_open_for(self, rt: Runtime) -> bool:
        """Whether calls from ``rt`` are known to need no wait (see :meth:`call_gate`)."""
        return self._open_for is rt

    def spawn_loop_closed(self) -> bool:
        """Whether the runtime that spawned these actors has closed (its loop ended)."""
        return self._spawn_rt is not None and self._spawn_rt.closed

    @property
    def call_region(self) -> RegionWire | None:
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
                    RegionWire(
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
            self._tl = [(g, self.addr_of(g)) for g in self._ranks]
        return self._tl

    def addr_of(self, rank: int) -> str:
        """The address of the proc of the actor of global rank ``rank``; "" if that proc
        never started."""
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

    def why_not_started(self, rank: int) -> str:
        """Why the proc of the actor of global ``rank`` never started, as ``": why"`` (or
        "" when not known)."""
        group = self._proc_group
        why = group.start_failure(rank) if group is not None else None
        return f": {why}" if why is not None else ""

    def __reduce__(self) -> tuple[object, ...]:
        if self._sent.done():
            addrs = dict(self._targets_list)
        else:
            # Right after spawn(), as Monarch allows: local procs' addresses are known (their
            # sockets are bound by the spawner, so a receiver's dial waits in the kernel's
            # queue), and a call that overtakes the Spawn is held for it (spawn_wait).
            addrs = {g: self.addr_of(g) for g in self._ranks}
            if not all(addrs.values()) and self._wait_for_addresses():
                addrs = {g: self.addr_of(g) for g in self._ranks}
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

    def __getattr__(self, name: str) -> ActorEndpoint[object]:
        if name.startswith("__"):
            raise AttributeError(name)
        if name not in endpoints_of(self._cls):
            if not name.startswith("_") and inspect.isfunction(getattr(self._cls, name, None)):
                return NotAnEndpoint(self, name)  # type: ignore[return-value]
            raise EndpointNotFoundError(
                f"{self._cls.__name__} has no endpoint {name!r}; its endpoints are: "
                f"{describe_endpoints(self._cls)}"
            )
        ep: ActorEndpoint[object] = ActorEndpoint(self, name)
        # Kept: ``mesh.step.call()`` in a loop finds it as a plain attribute from now on.
        self.__dict__[name] = ep
        return ep

    def _with_shape(self, shape: Shape) -> ActorMesh[A_co]:
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

    def __await__(self) -> Generator[object, None, ActorMesh[A_co]]:
        """``await procs.spawn(...)`` waits for every ``__init__`` and gives the mesh."""
        yield from self.initialized.__await__()
        return self

    def rank_addrs(self) -> list[tuple[int, str]]:
        """``(global rank, proc address)`` of each actor; only once the procs started."""
        return self._targets_list

    @property
    def failed_ranks(self) -> dict[str, str]:
        """Failed actors of this mesh (or slice): ``{str(point): reason}``."""
        mine = set(self._ranks)
        st = self._state
        return {str(st.point(r)): why for r, why in list(st.failed.items()) if r in mine}

    @unless_endpoint
    def stats(self: ActorMesh[Actor]) -> Future[ValueMesh[ActorStats | GoneActorStats]]:
        """What each actor is doing: messages handled and failed per endpoint, its last
        failure, its mailbox depth, the endpoints running now and for how long, and its
        proc's record (pid, host, CPU %, RSS, connections, bytes in and out)."""
        return mesh_stats(self)

    @unless_endpoint
    def stacks(self: ActorMesh[Actor]) -> Future[ValueMesh[list[StackEntry]]]:
        """The Python stack of every thread (and running async endpoint) of each actor's
        proc; a thread or task running an endpoint names the actor, the endpoint and for
        how long (``seconds``)."""
        return mesh_stacks(self)

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

            def on_reply(rank: int, status: int, value: object) -> bool:
                left[0] -= 1
                if left[0] == 0 and not fut.done():
                    fut.set_result(None)  # stopped, or its proc is gone: either way, done
                return left[0] == 0

            port = rt.open_port(on_reply)
            for r in ranks:
                rt.stop_actor(mesh.addr_of(r), mesh._wire, port, r)

        gate = self._sent if rt is self._spawn_rt else self._init
        gate.add_done_callback(lambda _: run_on(rt, go))
        return fut

    def call_gate(self, rt: Runtime, here: bool) -> ThreadFuture[None]:
        """What calls from ``rt`` wait for: after our own Spawn went out, the connection
        keeps our calls behind it; from another runtime (another loop or proc), until the
        actors exist. Once open for a loop's own runtime, that is remembered (the hot
        path of a call skips asking)."""
        gate = self._sent if rt is self._spawn_rt else self._init
        if here and self._open_for is None and gate.done():
            self._open_for = rt
        return gate

    def choose_rank(self, ranks: list[int]) -> int:
        """The rank ``choose`` calls among ``ranks``: the one with the fewest of this
        caller's ``choose`` calls in flight, ties round robin; in flight until
        :meth:`chosen_done`."""
        inflight = self._inflight
        with process.choose_lock:  # the count is also lowered on the loop's thread
            start = self._rr
            self._rr = start + 1
            n = len(ranks)
            best = min(range(n), key=lambda i: (inflight.get(ranks[(start + i) % n], 0), i))
            rank = ranks[(start + best) % n]
            inflight[rank] = inflight.get(rank, 0) + 1
        return rank

    def chosen_done(self, rank: int) -> None:
        """The ``choose`` call to ``rank`` ended."""
        with process.choose_lock:
            self._inflight[rank] -= 1

    def next_turn(self, n: int) -> int:
        """Round robin over ``n`` actors: the index of the next one."""
        with process.choose_lock:
            i = self._rr % n
            self._rr += 1
        return i

    def _all_ranks(self) -> list[int]:
        if self._proc_group is not None:
            return self._proc_group.all_ranks()
        assert self._addrs is not None
        return list(self._addrs)


def _rebuild(
    name: str,
    wire: str,
    cls: type[A],
    shape: Shape,
    addrs: dict[int, str],
    whole: Shape | None = None,
) -> ActorMesh[A]:
    state = MeshState(name, whole, None) if whole is not None else None
    return ActorMesh(name, wire, cls, shape, addrs, resolved(), None, None, state=state)


def mesh_ref(name: str, cls: type[A], shape: Shape, addrs: dict[int, str]) -> ActorMesh[A]:
    """A reference to actors that exist already under the wire name ``name`` (host agents)."""
    return ActorMesh(name, name, cls, shape, addrs, resolved(), None, None)
