"""``ProcMesh``: processes laid out as a named mesh, where actors live.

What a proc mesh and its slices share (the procs, their failures, the actor meshes on
them) is its :class:`~danaus.mesh._proc_group.ProcGroup`'s; a ``ProcMesh`` is a shape
over a group. It pickles to a reference (its group's :class:`GroupRef` and its shape):
unpickled in another process, actors can be spawned on it and called.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Coroutine, Generator, Sequence
from concurrent.futures import Future as ThreadFuture
from contextlib import AbstractContextManager
from types import EllipsisType, TracebackType
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

from ..actors.seam import (
    Actor,
    Future,
    ProcControl,
    actor_process,
    current_runtime,
    endpoints_of,
    run_on,
    run_task,
)
from ..errors import ClosedError, SupervisionError
from ..geometry import Point, Shape, Shaped
from ._actor_mesh import ActorMesh
from ._actor_spawn import spawn_actor_mesh
from ._admin.inspect import unless_endpoint
from ._admin.records import ProcStats, StackEntry
from ._admin.server import maybe_start_admin
from ._live_meshes import live_meshes
from ._proc_group import GroupRef, ProcGroup
from ._procs.forkserver import note_actor_module, preload_module
from ._procs.handles import Proc, RefProcHandle, SelfProcHandle
from ._procs.logs import LogOptions
from ._supervision import current_owner, resolved
from ._tensor_engine_hook import tensor_engine
from ._value_mesh import ValueMesh

if TYPE_CHECKING:
    from ._host_mesh import HostMesh

__all__ = [
    "ProcMesh",
    "group_of",
    "live_proc_meshes",
    "new_proc_mesh",
    "shutdown_context",
    "this_proc",
]

A = TypeVar("A", bound=Actor)


def this_proc() -> ProcMesh:
    """This process as a mesh of one proc (no dims): ``this_proc().spawn("x", Cls)`` runs
    the actor here, on the current event loop (or danaus's background loop in sync code).

    Its endpoints then share this loop with the caller: a sync endpoint that blocks,
    blocks the caller too. Stopping the mesh stops its actors, not this process.
    """
    rt = current_runtime()
    return new_proc_mesh(Shape.from_sizes({}), [SelfProcHandle(rt.addr)], "this_proc", resolved())


class Applied(Coroutine[object, None, None]):
    """A setting applied already, as a coroutine that returns ``None`` at once (so that
    ``await`` and ``asyncio.run`` take it, as Monarch's ``async def`` methods are taken)
    and as a done future (``get()``, ``result()``, ``done()``)."""

    def __await__(self) -> Generator[object, None, None]:
        return (yield from ())

    def send(self, value: None) -> object:
        raise StopIteration(None)

    def throw(
        self,
        typ: type[BaseException] | BaseException,
        val: BaseException | object = None,
        tb: TracebackType | None = None,
    ) -> object:
        raise val if isinstance(val, BaseException) else typ

    def close(self) -> None:
        pass

    def get(self, timeout: float | None = None) -> None:
        return None

    def result(self, timeout: float | None = None) -> None:
        return None

    def done(self) -> bool:
        return True


class ProcMesh(Shaped):
    """Processes laid out as a named mesh; ``spawn`` puts one actor in each.

    Use ``async with`` (or ``with`` in sync code), or call :meth:`stop`, so the procs end
    with your program; they are killed when the controller exits in any case.

    A proc mesh is a reference: pass it (or a slice) to an actor, which can spawn actors
    on it and call them; there, :meth:`stop` stops the actors spawned through it, never
    the procs (their spawner's).
    """

    def __init__(self, shape: Shape, group: ProcGroup) -> None:
        self._shape = shape
        self._group = group  # its procs, failures and actor meshes, shared by its slices
        self.name = group.name

    def __repr__(self) -> str:
        state = "stopped" if self._group.stopped else "running"
        return f"ProcMesh({self.name}, {self._shape.sizes}, {state})"

    def __reduce__(self) -> tuple[object, ...]:
        # A reference: the procs' addresses, never their processes, sockets or loop.
        return (_rebuild, (self._group.reference(), self._shape))

    @property
    def proc_group(self) -> ProcGroup:
        """The state this mesh shares with the rest of its mesh (its procs, failures and
        actor meshes), for the layers above."""
        return self._group

    @property
    def host_mesh(self) -> HostMesh:
        """The host of this proc mesh's one proc, as a host mesh of no dims (Monarch's
        ``ProcMesh.host_mesh``, for a proc mesh of one proc): this host for a local proc
        (``this_host()``), else its host agent's, where ``spawn_procs`` starts more procs.

        Raises:
            NotImplementedError: the mesh has more than one proc (as Monarch's).
        """
        if len(self._shape) != 1:
            raise NotImplementedError(
                f"ProcMesh.host_mesh is for a proc mesh of one proc; this one has "
                f"{len(self._shape)} (slice it first: procs.slice(...))"
            )
        host = host_of(self)
        assert host is not None  # (one proc is on one host)
        return host

    def rank_tensor(self, dim: str | Sequence[str]) -> object:
        """A tensor of the tensor engine whose shard on each proc is its rank along
        ``dim`` (row-major over several dims), as Monarch's ``rank_tensor``."""
        names = (dim,) if isinstance(dim, str) else tuple(dim)
        return tensor_engine().rank_tensor(self, names)

    def rank_tensors(self) -> dict[str, object]:
        """:meth:`rank_tensor` of each dim, by name."""
        return {d: self.rank_tensor(d) for d in self._shape.labels}

    def process_group(self, dims: str | Sequence[str]) -> object:
        """The process group of ``dims`` of these procs, for ``@remote`` functions of the
        tensor engine (Monarch's ``DeviceMesh.process_group``): a
        ``danaus.tensor_engine.RemoteProcessGroup``. Imports the tensor engine."""
        names = (dims,) if isinstance(dims, str) else tuple(dims)
        return tensor_engine().process_group(self, names)

    def activate(self) -> AbstractContextManager[object]:
        """``with procs.activate():`` torch calls make distributed tensors on these procs.

        Imports the tensor engine (and torch) on first use.
        """
        try:
            engine = tensor_engine()
        except ImportError as e:
            raise RuntimeError(
                f"procs.activate() needs the tensor engine, which needs torch: {e}"
            ) from e
        return engine.activate(self)

    def logging_option(
        self,
        stream_to_client: bool | None = None,
        aggregate_window_sec: float | EllipsisType | None = ...,
        level: int | None = None,
    ) -> Applied:
        """Whether the procs' output lines reach the controller, whether identical lines
        are aggregated, and the procs' log level. Settings not given stay as they are.

        It takes effect at once, for lines and calls that follow. What it returns is done
        already, and is what Monarch's (an ``async def``) is to its callers: ``await``
        it, or ``asyncio.run(procs.logging_option(...))``; ``.get()`` works too.

        Args:
            stream_to_client: print the procs' stdout/stderr here, prefixed
                ``[mesh rank]`` (the default), or drop them.
            aggregate_window_sec: collect lines for this many seconds and print those
                that several ranks printed identically once, as ``[mesh 0-7] line``;
                ``None`` prints every line as it comes (the default).
            level: the procs' root ``logging`` level (e.g. ``logging.INFO``).

        Raises:
            ValueError: ``aggregate_window_sec`` is negative or not a number.
        """
        if aggregate_window_sec is not ...:
            if aggregate_window_sec is not None and (
                isinstance(aggregate_window_sec, bool)
                or not isinstance(aggregate_window_sec, (int, float))
                or aggregate_window_sec < 0
            ):
                raise ValueError(
                    f"aggregate_window_sec must be seconds (>= 0) or None, got "
                    f"{aggregate_window_sec!r}"
                )
            if aggregate_window_sec is None and self._group.log.aggregator is not None:
                self._group.log.aggregator.flush()
            self._group.log.aggregate_window_sec = (
                None if aggregate_window_sec is None else float(aggregate_window_sec)
            )
        if stream_to_client is not None:
            self._group.log.stream_to_client = stream_to_client
        if level is not None:
            self._group.log.level = level
            control = ActorMesh(
                "__proc__",
                "__proc__",
                ProcControl,
                self._shape,
                None,
                self._group.started,
                None,
                self._group,
            )
            control.set_log_level.broadcast(level)
        return Applied()

    def stats(self) -> Future[ValueMesh[ProcStats]]:
        """Each proc's record (pid, host, CPU %, RSS, connections, bytes in and out),
        with the records of the actors in it (``"actors"``; see ``ActorMesh.stats``)."""
        from ._admin.inspect import proc_mesh_stats

        return run_task(current_runtime(), lambda: proc_mesh_stats(self._group, self._shape))

    def stacks(self) -> Future[ValueMesh[list[StackEntry]]]:
        """The Python stack of every thread and running async endpoint of each proc."""
        from ._admin.inspect import proc_mesh_stacks

        return run_task(current_runtime(), lambda: proc_mesh_stacks(self._group, self._shape))

    def to_table(self) -> str:
        """A text table of the procs: rank, coordinates, process id and address."""
        rows = [("rank", *self._shape.labels, "pid", "address")]
        for rank, (point, h) in enumerate(zip(self._shape.points(), self._handles(), strict=True)):
            rows.append((str(rank), *(str(c) for c in point.values()), str(h.pid), h.addr or "-"))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = [
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows
        ]
        return "\n".join(line.rstrip() for line in lines)

    @property
    def failed_ranks(self) -> dict[str, str]:
        """Failed procs of this mesh: ``{str(point): reason}``."""
        sizes = self._group.shape.sizes
        return {
            str(Point.from_rank(r, sizes)): why
            for r, why in self._group.failed_procs().items()
            if r in set(self._shape.global_ranks())
        }

    def _with_shape(self, shape: Shape) -> ProcMesh:
        return ProcMesh(shape, self._group)

    def _handles(self) -> list[Proc]:
        handles = self._group.handles
        return [handles[g] for g in self._shape.global_ranks()]

    @property
    def initialized(self) -> Future[None]:
        """Resolves once every proc is up (raises ``SupervisionError`` if one failed)."""
        rt = current_runtime()
        fut: Future[None] = Future(loop=rt.loop)
        handles = self._handles()

        bootstrap = self._group.bootstrap

        def check() -> None:
            if fut.done():
                return
            for h in handles:
                if not h.ready.done():
                    h.ready.add_done_callback(lambda _: run_on(rt, check))
                    return
                exc = h.ready.exception()
                if exc is not None:
                    fut.set_exception(exc)
                    return
            if bootstrap is not None:  # and the bootstrap function ran in every proc
                boot = bootstrap.init_done
                if not boot.done():
                    boot.add_done_callback(lambda _: run_on(rt, check))
                    return
                if boot.exception() is not None:
                    fut.set_exception(boot.exception())  # type: ignore[arg-type]
                    return
            fut.set_result(None)

        self._group.started.add_done_callback(lambda _: run_on(rt, check))
        return fut

    @property
    def pids(self) -> list[int]:
        """Process ids of the procs, in rank order (each on its own host; -1 if not started)."""
        return [h.pid for h in self._handles()]

    # actors
    def sync_workspace(
        self, workspace: object, conda: bool = False, auto_reload: bool = False
    ) -> None:
        """As Monarch's: not on a proc mesh; use ``HostMesh.sync_workspace`` (its hosts
        get the files once each, and its procs reload)."""
        raise NotImplementedError(
            "sync_workspace is not implemented for ProcMesh; use HostMesh.sync_workspace"
        )

    def spawn(self, name: str, cls: type[A], *args: object, **kwargs: object) -> A:
        """Create one ``cls(*args, **kwargs)`` actor in every proc of this mesh.

        Returns at once an :class:`ActorMesh`, typed (as in Monarch) as the actor class
        itself, so that type checkers check calls of its endpoints against their methods
        (``mesh.incr.call_one(3)``) and see the mesh's members (``_actor_face``); where
        the mesh's internals are needed, :meth:`spawn_mesh` gives it as an ``ActorMesh``.
        Messages sent to the mesh are handled after ``__init__`` ran. ``await
        mesh.initialized`` (or ``mesh.initialized.get()``) raises ``ActorError`` naming
        the rank if an ``__init__`` raised.
        """
        # The one place the lie is told: an ActorMesh[A] stands for its actor class.
        return cast(A, self.spawn_mesh(name, cls, *args, **kwargs))

    def spawn_mesh(self, name: str, cls: type[A], *args: object, **kwargs: object) -> ActorMesh[A]:
        """:meth:`spawn`, typed as what it returns: an ``ActorMesh`` (for code that uses
        the mesh's internal API, or stores meshes of several actor classes)."""
        if not (isinstance(cls, type) and issubclass(cls, Actor)):
            raise TypeError(f"spawn needs a subclass of danaus.Actor, got {cls!r}")
        note_actor_module(cls.__module__)  # procs forked later have it imported already
        if not name or "." in name or "[" in name:
            raise ValueError(f"actor mesh name {name!r} must be non-empty, without '.' or '['")
        shadowed = sorted(
            n
            for n in endpoints_of(cls)
            if hasattr(ActorMesh, n) and not isinstance(ActorMesh.__dict__.get(n), unless_endpoint)
        )
        if shadowed:  # mesh.stop would be the mesh's, never the endpoint: refuse, as Monarch
            raise ValueError(
                f"{cls.__name__} has endpoint(s) named like ActorMesh attributes, which "
                f"mesh.<name> could never reach: {', '.join(shadowed)}; rename them"
            )
        group = self._group
        if group.stopped:
            raise ClosedError(f"{self!r} was stopped")
        if group.is_reference and group.owner is None:
            owner = current_owner()
            if owner is not None and group.claim(owner):
                owner.owned.append(ProcMesh(group.shape, group))  # its actors stop with it
        return spawn_actor_mesh(group, self._shape, name, cls, args, kwargs)

    # lifecycle
    def stop(self, reason: str = "stopped by its owner") -> Future[None]:
        """Stop every actor and proc of this mesh (the whole mesh, also from a slice).

        Procs get ``config.stop_timeout`` seconds to exit cleanly, then are killed. Later
        calls raise ``SupervisionError`` saying ``reason``.
        """
        group = self._group
        return run_task(current_runtime(), lambda: group.stop_all(reason))

    async def __aenter__(self) -> ProcMesh:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def __enter__(self) -> ProcMesh:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop().get()


def shutdown_context() -> Future[None]:
    """Stop every proc mesh this process spawned and has not stopped (Monarch's
    ``shutdown_context``); idempotent. Also done at interpreter exit, where procs still
    running are killed."""
    groups = live_meshes.groups()

    async def stop_all() -> None:
        await asyncio.gather(*(g.stop_all("the controller shut down") for g in groups))

    return run_task(current_runtime(), stop_all)


def new_proc_mesh(
    shape: Shape,
    handles: Sequence[Proc],
    name: str,
    started: ThreadFuture[None],
    log_options: LogOptions | None = None,
) -> ProcMesh:
    """A whole new proc mesh of these procs (``handles[r]`` the proc of global rank
    ``r``), owned by whoever spawns it now: an actor stops it when it stops itself."""
    group = ProcGroup(name, shape, handles, started, log_options or LogOptions())
    mesh = ProcMesh(shape, group)
    if group.owner is not None:
        group.owner.owned.append(mesh)
    maybe_start_admin()
    return mesh


def _rebuild(ref: GroupRef, shape: Shape) -> ProcMesh:
    """A pickled proc mesh, here (see :meth:`ProcGroup.from_reference`)."""
    return ProcMesh(shape, ProcGroup.from_reference(ref))


def host_of(procs: ProcMesh) -> HostMesh | None:
    """The host mesh where new procs can take the place of ``procs``' (to respawn
    them): this host where this process started them all itself, their one host
    agent's where they share one; None where they are on several hosts."""
    from ._host_mesh import this_host

    group = procs.proc_group
    agents = {group.agent_of(r) for r in procs.shape.global_ranks()}
    if agents == {None}:
        return this_host()
    (agent,) = agents if len(agents) == 1 else (None,)
    if agent is None:
        return None
    return _agents_host(procs, [agent])


def _agents_host(procs: ProcMesh, agents: list[str]) -> HostMesh:
    """The host mesh of these host agents (in rank order), which starts procs on their
    hosts in the place of ``procs``': of one, a mesh with no dims; else one dim,
    ``hosts``."""
    from ._actor_mesh import mesh_ref
    from ._host_mesh import HostMesh
    from ._procs.host_agent import AGENT, HostAgent, agent_ref

    if len(agents) == 1:
        return HostMesh(Shape.from_sizes({}), f"host of {procs.name}", agent_ref(agents[0]))
    shape = Shape.from_sizes({"hosts": len(agents)})
    mesh = mesh_ref(AGENT, HostAgent, shape, dict(enumerate(agents)))
    return HostMesh(shape, f"hosts of {procs.name}", mesh)


def host_blocks(procs: ProcMesh) -> tuple[list[str], int] | None:
    """The host agents of ``procs`` in rank order and the procs on each, where they are
    on several hosts laid out host by host (each host's procs one block of ranks, as
    many on each, every one started by a host agent); else None."""
    group = procs.proc_group
    ranks = list(procs.shape.global_ranks())
    agents = [group.agent_of(r) for r in ranks]
    hosts = [a for a in dict.fromkeys(agents) if a is not None]
    if len(hosts) < 2 or None in agents or len(ranks) % len(hosts):
        return None
    per = len(ranks) // len(hosts)
    if any(agents[i] != hosts[i // per] for i in range(len(ranks))):
        return None
    return hosts, per


def hosts_of(procs: ProcMesh) -> tuple[HostMesh, dict[str, int]] | None:
    """Where new procs can take the place of ``procs``' on several hosts: the mesh of
    their host agents (in rank order) and the procs per host, such that its
    ``spawn_procs(per_host=...)`` gives as many procs, rank for rank (of ``procs``'
    shape where its first dim is the hosts'); None where they are not laid out host by
    host (:func:`host_blocks`), or a host agent of theirs is gone (its host cannot
    start procs)."""
    blocks = host_blocks(procs)
    if blocks is None or any(a in current_runtime().lost for a in blocks[0]):
        return None
    hosts, per = blocks
    sizes = dict(procs.shape.sizes)
    first, *rest = sizes
    per_host = {k: sizes[k] for k in rest} if sizes[first] == len(hosts) else {"procs": per}
    return _agents_host(procs, hosts), per_host


def preload_for(procs: ProcMesh, module: str) -> None:
    """Procs that take the place of ``procs``' later start with ``module`` imported (a
    model's library): where this process forks them, and on ``procs``' hosts, whose
    agents are told at once (:func:`~._procs.forkserver.preload_module`)."""
    group = procs.proc_group
    agents = {group.agent_of(r) for r in procs.shape.global_ranks()}
    preload_module(module, sorted(a for a in agents if a is not None))


def hosts_left(
    procs: ProcMesh, lost: Collection[int] = ()
) -> tuple[HostMesh, int, list[int]] | None:
    """Where ``procs`` are on several hosts laid out host by host (:func:`host_blocks`),
    and some of their host agents are gone or some of their procs ``lost``: where new
    procs can start, as many on each host, the most of them: a host mesh of the hosts
    chosen (in rank order; of one, a mesh with no dims), which can start procs there,
    the procs to start on each, and the ranks of ``procs`` on the hosts gone. A host
    whose agent is there takes as many as its procs not in ``lost`` (two hosts of two
    procs, one lost: one on each; see :func:`even_spread`). None where nothing is gone
    or lost, or no host is left."""
    blocks = host_blocks(procs)
    if blocks is None:
        return None
    hosts, per = blocks
    gone = {i for i, a in enumerate(hosts) if a in current_runtime().lost}
    room = [0 if i in gone else per for i in range(len(hosts))]
    for r in set(lost):
        room[r // per] = max(0, room[r // per] - 1)
    if room == [per] * len(hosts):  # (nothing gone, nothing lost)
        return None
    best = even_spread(room)
    if best == 0:
        return None
    chosen = [i for i, n in enumerate(room) if n >= best]
    host = _agents_host(procs, [hosts[i] for i in chosen])
    return host, best, [i * per + j for i in sorted(gone) for j in range(per)]


def even_spread(room: Sequence[int]) -> int:
    """How many procs to start on each host, given the most each can take (``room``),
    such that as many on each host that takes any gives the most procs in all; of
    spreads as large, the one over more hosts (a rank's copy is then on another host):
    ``[2, 1]`` gives 1 (one on each), ``[3, 3, 0]`` gives 3; 0 where none has room."""
    sizes = range(1, max(room, default=0) + 1)
    return max(sizes, key=lambda c: (c * sum(n >= c for n in room), -c), default=0)


def respawnable(procs: ProcMesh) -> bool:
    """Whether the failed procs of ``procs`` can be started again in their places
    (:func:`respawn_procs`): a whole mesh, not stopped, whose procs this process
    started, on this host or through host agents that are all still there."""
    group = procs.proc_group
    if group.respawner is None or group.stopped or len(procs) != len(group.shape):
        return False
    agents = {group.agent_of(r) for r in range(len(procs))} - {None}
    return not any(a in current_runtime().lost for a in agents)


async def respawn_procs(procs: ProcMesh, ranks: Sequence[int]) -> None:
    """New procs in place of the failed procs of ``procs``' global ``ranks``, on the same
    hosts, each having run the mesh's bootstrap function where it has one; returns once
    they are up (see :meth:`ProcGroup.respawn`). The proc mesh its user holds is whole
    again: later spawns have an actor at those ranks; actor meshes spawned before keep
    them failed.

    Raises:
        SupervisionError: the procs cannot be started again (the mesh was stopped, its
            procs are not this process's, a host agent is gone), a new proc did not
            start in ``config.proc_start_timeout`` s, or its bootstrap function raised.
        ValueError: a rank that is not a failed proc of the mesh.
    """
    from ._host_mesh import _Bootstrap

    group = procs.proc_group
    await group.respawn(ranks)
    if group.bootstrap_fn is None:
        return
    whole = ProcMesh(group.shape, group)
    for r in dict.fromkeys(ranks):
        one = whole.slice(**dict(Point.from_rank(r, group.shape.sizes)))
        boot = one.spawn_mesh("bootstrap", _Bootstrap, group.bootstrap_fn)
        try:
            await asyncio.wrap_future(boot.init_done)
        except Exception as e:
            raise SupervisionError(
                f"proc {r} of proc mesh {group.name!r} was started again, but its bootstrap "
                f"function raised: {e}"
            ) from e


def live_proc_meshes() -> list[ProcMesh]:
    """Every proc mesh this process spawned and has not stopped, whole."""
    return [ProcMesh(g.shape, g) for g in live_meshes.groups()]


def group_of(procs: ProcMesh) -> ProcGroup:
    """The state ``procs`` shares with the rest of its mesh (for the layers above)."""
    return procs.proc_group


class _PlacedActor(Protocol):
    """What ``context().actor_instance`` says of where an actor lives."""

    @property
    def actor_id(self) -> str: ...
    @property
    def rank(self) -> Point: ...
    @property
    def proc_addr(self) -> str: ...
    @property
    def proc_mesh_name(self) -> str: ...
    @property
    def proc_addrs(self) -> tuple[str, ...]: ...


def _proc_of_actor(actor: _PlacedActor) -> ProcMesh:
    """``context().actor_instance.proc``: the actor's own proc as a mesh of one."""
    rt = current_runtime()
    if rt.addr != actor.proc_addr:
        raise RuntimeError(
            f"actor_instance.proc of {actor.actor_id} is only reachable from its own proc "
            f"({actor.proc_addr}), not from {rt.addr}"
        )
    return this_proc()


actor_process.proc_of_actor = _proc_of_actor
actor_process.controller_proc = this_proc


def _proc_mesh_of_actor(actor: _PlacedActor) -> ProcMesh:
    """``context().actor_instance.proc_mesh``: a reference to the actor's proc mesh."""
    addrs = actor.proc_addrs
    if not addrs:
        raise RuntimeError(
            f"actor_instance.proc_mesh: {actor.actor_id} was not spawned on a proc mesh "
            "(it runs in the controller)"
        )
    sizes = actor.rank.sizes
    handles = [RefProcHandle(a, r) for r, a in enumerate(addrs)]
    return new_proc_mesh(Shape.from_sizes(sizes), handles, actor.proc_mesh_name, resolved())


actor_process.proc_mesh_of_actor = _proc_mesh_of_actor
