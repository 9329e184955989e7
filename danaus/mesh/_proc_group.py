"""``ProcGroup``: the one owner of a proc mesh's state.

A proc mesh and every slice of it share one group. The group alone changes, through its
methods:

- its procs' failures and whether it was stopped (``state``, a :class:`MeshState`, and
  ``phase``): :meth:`~ProcGroup.proc_failed`, :meth:`~ProcGroup.stop_all`,
  :meth:`~ProcGroup.failed_procs` to ask;
- **the list of actor meshes spawned on the proc mesh**: ``add`` / ``remove`` /
  ``states`` / ``states_at`` / ``stop_all``. It keeps this process's registry of live
  meshes (:data:`~danaus.mesh._live_meshes.live_meshes`) told of its procs, by address,
  through which a lost connection becomes a proc failure (:func:`on_peer_lost`), and of
  its actor meshes, by wire name, where the runtime's supervisor (``_Supervisor``, the
  system actor the actor layer tells of failed actors) finds the mesh a failure names;
- who owns it (``owner``: :meth:`~ProcGroup.claim`) and the actors that ran its
  bootstrap function (``bootstrap``: :meth:`~ProcGroup.set_bootstrap`);
- what a proc mesh pickles to (:meth:`ProcGroup.reference`, a :class:`GroupRef`: the
  procs' addresses and what is known of them), and the group it is unpickled as
  (:meth:`ProcGroup.from_reference`): this process's own group of those procs, or a
  reference group (``RefProcHandle`` procs, never stopped or killed from there).

Set when it is made and never replaced: ``name``, ``shape``, ``started`` (resolves
once every proc's address is known: a host agent's procs learn theirs when the agent
answers), ``log`` (the procs' output options, which ``ProcMesh.logging_option`` sets)
and ``is_reference``. The procs (``handles``, one
:class:`Proc` per global rank, each the owner of its own readiness and exit) change
only where a failed one is started again in its place (:meth:`~ProcGroup.respawn`,
through ``respawner``, which the host mesh that spawned them sets).

``ProcMesh`` creates a group; it, ``ActorMesh``, the inspectors, the metrics, the
snapshot (admin endpoint) and the tensor engine read those attributes and ask the
methods below; none changes a group but through them.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import functools
import logging
from asyncio.events import _get_running_loop
from collections.abc import Callable, Sequence
from concurrent.futures import Future as ThreadFuture
from typing import TYPE_CHECKING, NamedTuple

from ..actors.seam import (
    SUPERVISOR,
    Actor,
    Runtime,
    current_runtime,
    endpoint,
    ensure_actor,
    peers,
)
from ..config import config
from ..errors import SerializationError, SupervisionError
from ..geometry import Shape
from ._live_meshes import live_meshes
from ._procs.handles import Proc, ProcHandle, RefProcHandle, RemoteProcHandle, SelfProcHandle
from ._procs.local import stop_procs, wait_exited
from ._procs.logs import LogOptions
from ._supervision import MeshState, Owner, StuckReport, current_owner, report_stuck, resolved

if TYPE_CHECKING:
    from ._actor_mesh import ActorMesh
    from ._host_mesh import _Bootstrap

__all__ = [
    "GroupRef",
    "GroupState",
    "ProcGroup",
    "ensure_supervisor",
    "remove_actor_mesh",
]

log = logging.getLogger("danaus.mesh")
supervision_log = logging.getLogger("danaus.supervision")


class GroupState(enum.Enum):
    """Where a group is in its life; it counts as stopped from ``STOPPING`` on."""

    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


class GroupRef(NamedTuple):
    """What a proc mesh pickles to: its name, shape and procs' addresses, with what is
    known of them. Plain data: never a process handle, socket, loop, lock or key."""

    name: str
    #: the whole mesh's shape: global ranks index ``addrs``
    shape: Shape
    #: each proc's address, by global rank ("" for a proc that never started)
    addrs: tuple[str, ...]
    #: global rank -> why it failed, for the procs known to have failed
    failed: dict[int, str]
    #: why the mesh was stopped (None while it runs)
    stopped: str | None


class ProcGroup:
    """The procs of one proc mesh, their failures, and the actor meshes spawned on them.

    Args:
        name: the proc mesh's name.
        shape: the whole mesh's shape: global ranks index ``handles``.
        handles: one per global rank.
        started: resolves once every proc's address is known.
        log: the procs' output options, shared by the mesh's slices.
        reference: the procs are another process's, known by their addresses (an
            unpickled proc mesh): the group has no owner until an actor spawns on it
            (:meth:`claim`), and touches no runtime when made (unpickling must not start
            one).
    """

    def __init__(
        self,
        name: str,
        shape: Shape,
        handles: Sequence[Proc],
        started: ThreadFuture[None],
        log: LogOptions,
        *,
        reference: bool = False,
    ) -> None:
        self.name = name
        self.shape = shape
        self.handles: tuple[Proc, ...] = tuple(handles)
        self.started = started
        self.log = log
        self.is_reference = reference
        #: who spawned the mesh (an ActorInstance, or None for the controller)
        self.owner = None if reference else current_owner()
        self.state = MeshState(name, shape, self.owner)
        self._bootstrap: ActorMesh[_Bootstrap] | None = None
        self._phase = GroupState.RUNNING
        self._actors: dict[str, MeshState] = {}  # by wire name, in spawn order
        #: resolved by a proc's failure, for those who wait for one (wait_failed)
        self._failure_waiters: list[asyncio.Future[None]] = []
        #: starts a new proc of a rank in place of one that failed (set by the host
        #: mesh that spawned the procs; None where none can: this process, another's)
        self.respawner: Callable[[int], Proc] | None = None
        #: the ``spawn_procs(bootstrap=...)`` function (run in a respawned proc too)
        self.bootstrap_fn: Callable[[], object] | None = None
        if reference:
            return  # no proc of this process's: nothing to watch
        rt = current_runtime()
        rt.watch_lost(on_peer_lost)
        for h in self.handles:
            self._watch(h)

    def _watch(self, h: Proc) -> None:
        """Learn of ``h``'s failures: its exit, a lost connection to its address."""
        if isinstance(h, ProcHandle):
            live_meshes.add_proc(h.addr, self, h.rank)
            h.exit_callbacks.append(functools.partial(self._proc_exited, h))
        elif isinstance(h, RemoteProcHandle):
            if h.addr is not None:
                live_meshes.add_proc(h.addr, self, h.rank)
            else:
                h.on_started.append(self._index_remote)

    def __repr__(self) -> str:
        return (
            f"<ProcGroup {self.name} {self.shape.sizes} {self._phase.value}, "
            f"{len(self._actors)} actor meshes>"
        )

    @property
    def phase(self) -> GroupState:
        """Running, stopping (``stop_all`` under way) or stopped."""
        return self._phase

    @property
    def stopped(self) -> bool:
        """True from the moment ``stop_all`` starts."""
        return self._phase is not GroupState.RUNNING

    @property
    def bootstrap(self) -> ActorMesh[_Bootstrap] | None:
        """The actors that ran the ``spawn_procs(bootstrap=...)`` function, if any: the
        procs count as initialized after them."""
        return self._bootstrap

    def set_bootstrap(self, actors: ActorMesh[_Bootstrap], fn: Callable[[], object]) -> None:
        """``actors`` run the ``spawn_procs(bootstrap=...)`` function ``fn`` (set once, by
        ``spawn_procs``; a respawned proc runs ``fn`` too)."""
        self._bootstrap = actors
        self.bootstrap_fn = fn

    # pickling
    def reference(self) -> GroupRef:
        """What a proc mesh of this group pickles to.

        Remote procs learn their addresses when their host agent answers: sync code
        (a script, a sync endpoint) waits for that, up to ``config.proc_start_timeout``;
        code on an event loop's thread cannot (the answer may need that very loop).

        Raises:
            SerializationError: a proc has no address yet (await ``procs.initialized``
                first).
        """
        if not self.started.done() and _get_running_loop() is None:
            try:
                self.started.result(timeout=config.proc_start_timeout)
            except Exception:
                pass  # the procs that never started are reported below
        addrs = tuple(self.addrs())
        failed = self.failed_procs()
        for rank, addr in enumerate(addrs):
            if addr or rank in failed:
                continue
            why = self.start_failure(rank)
            if why is None:
                raise SerializationError(
                    f"proc mesh {self.name!r} cannot be pickled before its procs have "
                    "started (their addresses are not known yet): `await procs.initialized` "
                    "first"
                )
            failed[rank] = f"proc did not start: {why}"
        stopped = (self.state.stopped or "stopped") if self.stopped else None
        return GroupRef(self.name, self.shape, addrs, failed, stopped)

    @classmethod
    def from_reference(cls, ref: GroupRef) -> ProcGroup:
        """The group a pickled proc mesh stands for here: this process's own group of
        those procs if it started them and they run, else a reference group."""
        mine = live_meshes.proc_at(ref.addrs[0]) if ref.addrs else None
        if mine is not None:
            group = mine[0]
            if group.name == ref.name and tuple(group.addrs()) == ref.addrs:
                return group
        handles = [RefProcHandle(addr, rank) for rank, addr in enumerate(ref.addrs)]
        group = cls(ref.name, ref.shape, handles, resolved(), LogOptions(), reference=True)
        group.state.failed.update(ref.failed)
        if ref.stopped is not None:
            group.state.stopped = ref.stopped
            group._phase = GroupState.STOPPED
        return group

    def claim(self, owner: Owner) -> bool:
        """``owner`` spawns on this reference group first: the actor meshes spawned on
        it stop when that actor stops (as those of ``actor_instance.proc_mesh`` do). True
        if it became the owner (only a reference group without one yet)."""
        if not self.is_reference or self.owner is not None:
            return False
        self.owner = owner
        self.state.owner = owner
        return True

    # procs
    def addr_of(self, rank: int) -> str:
        """The address of the proc of global ``rank`` ("" while it has none: a host
        agent's proc before it started, or one that never did)."""
        return self.handles[rank].addr or ""

    def start_failure(self, rank: int) -> BaseException | None:
        """Why the proc of global ``rank`` never started (None if it did, or may yet)."""
        ready = self.handles[rank].ready
        if ready.done() and not ready.cancelled():
            return ready.exception()
        return None

    def failed_procs(self) -> dict[int, str]:
        """Why each proc known to have failed did, by global rank (a copy)."""
        return dict(self.state.failed)

    async def wait_failed(self, ranks: Sequence[int] = ()) -> dict[int, str]:
        """:meth:`failed_procs`, once at least one proc is known to have failed (at
        once where one is), and every one of ``ranks`` (global). For a caller that has
        seen something fail (a peer's "connection closed") before supervision has named
        the proc, under a bound of its own (``asyncio.timeout``): every path a failure
        comes by (an exit, a missed heartbeat, a host agent's report) ends in
        :meth:`proc_failed`, on the runtime's loop."""
        while not self.state.failed or not set(ranks) <= self.state.failed.keys():
            changed = asyncio.get_running_loop().create_future()
            self._failure_waiters.append(changed)
            await changed
        return self.failed_procs()

    def addrs(self) -> list[str]:
        """The address of every proc, by global rank (see :meth:`addr_of`)."""
        return [h.addr or "" for h in self.handles]

    def all_ranks(self) -> list[int]:
        """Every global rank of the mesh."""
        return [h.rank for h in self.handles]

    def agent_of(self, rank: int) -> str | None:
        """The address of the host agent that started ``rank``'s proc; None for a proc
        this process started itself."""
        h = self.handles[rank]
        return h.agent if isinstance(h, RemoteProcHandle) else None

    def host_addr(self, rank: int) -> str:
        """Where this process reaches the host of ``rank``'s proc: its host agent's
        address, or (a local proc) the proc's own."""
        h = self.handles[rank]
        agent = h.agent if isinstance(h, RemoteProcHandle) else None
        return agent or h.addr or ""

    async def started_addrs(self, ranks: Sequence[int]) -> list[str]:
        """The addresses of these ranks' procs, once every proc has started."""
        await asyncio.wrap_future(self.started)
        return [self.addr_of(r) for r in ranks]

    # the actor meshes on these procs
    def add(self, wire: str, state: MeshState) -> None:
        """Record an actor mesh spawned on these procs under its wire name; its ranks
        whose procs failed already are failed from the start."""
        self._actors[wire] = state
        live_meshes.add_actor_mesh(wire, self, state)
        for r, why in self.state.failed.items():
            state.failed[r] = why

    def remove(self, wire: str) -> None:
        """Forget the actor mesh ``wire`` (it was stopped)."""
        self._actors.pop(wire, None)
        live_meshes.remove_actor_mesh(wire)

    def states(self) -> list[MeshState]:
        """The actor meshes on these procs (not stopped by their own ``stop``), oldest
        first."""
        return list(self._actors.values())

    def states_at(self, rank: int) -> list[MeshState]:
        """The actor meshes not stopped that have an actor in the proc of ``rank``."""
        return [s for s in self._actors.values() if s.stopped is None and rank in s.ranks]

    async def respawn(self, ranks: Sequence[int]) -> None:
        """New procs in place of the failed procs of global ``ranks``, on the same hosts
        (as they were started: the same environment, Python and CPUs); returns once they
        are up. The mesh is then whole again: its rank ``r`` is the new process, and actor
        meshes spawned on it from now on have an actor there. Those spawned before keep
        rank ``r`` failed (their actors there are not brought back).

        Raises:
            SupervisionError: the mesh was stopped; its procs are not this process's
                to start (this process, another's); a new proc did not start within
                ``config.proc_start_timeout`` s (the rank stays failed).
            ValueError: a rank that is not a failed proc of the mesh.
        """
        if self.stopped:
            raise SupervisionError(
                f"proc mesh {self.name!r} was stopped ({self.state.stopped}): none of its "
                "procs can be started again"
            )
        if self.respawner is None:
            raise SupervisionError(
                f"the procs of proc mesh {self.name!r} were not started by this process "
                "(this process's own, or another's): it cannot start them again"
            )
        bad = [r for r in ranks if not (0 <= r < len(self.handles)) or r not in self.state.failed]
        if bad:
            raise ValueError(
                f"rank(s) {bad} of proc mesh {self.name!r} are not failed procs of it (failed: "
                f"{sorted(self.state.failed)}): only a failed proc is started again"
            )
        new: list[Proc] = []
        try:
            for r in dict.fromkeys(ranks):
                new.append(self.respawner(r))
        except BaseException:  # (one could not start: none replaces its proc)
            for h in new:
                if isinstance(h, ProcHandle):
                    h.stop_now()
                else:
                    h.kill()
            raise
        for h in new:
            r, old = h.rank, self.handles[h.rank]
            self.handles = (*self.handles[:r], h, *self.handles[r + 1 :])
            if old.addr:  # (its messages, its index: the new proc has another address)
                peers.forget([old.addr])
                live_meshes.forget_procs([old.addr])
            del self.state.failed[r]
            self._watch(h)
        ups = [asyncio.wrap_future(h.ready) for h in new]
        timeout = config.proc_start_timeout
        try:
            async with asyncio.timeout(timeout):
                await asyncio.gather(*ups)
        except BaseException as e:
            for h in new:
                if not (h.ready.done() and h.ready.exception() is None):
                    self.kill(h.rank)
                    self.proc_failed(h.rank, f"proc did not start again: {e!r}")
            if isinstance(e, TimeoutError):
                raise SupervisionError(
                    f"proc(s) of proc mesh {self.name!r} at rank(s) "
                    f"{[h.rank for h in new]} did not start within {timeout} s"
                ) from e
            raise

    def kill(self, rank: int) -> None:
        """Kill the proc of global ``rank``, where it is this process's (started here or
        through a host agent): its failure is then reported as any exit is."""
        h = self.handles[rank]
        if isinstance(h, RemoteProcHandle):
            from ._procs.host_agent import kill_remote_proc

            current_runtime().spawn_task(kill_remote_proc(h))
        else:
            h.kill()

    # failures
    def _proc_exited(self, h: Proc, why: str) -> None:
        if self.handles[h.rank] is h:  # (not a proc another has taken the place of)
            self.proc_failed(h.rank, f"proc {h.addr} {why}")

    def proc_failed(self, rank: int, report: str) -> None:
        """The proc of ``rank`` is gone: its actors failed; tell their owners (or, where
        none lived there, the proc mesh's owner)."""
        if self.stopped:
            return
        live = self.states_at(rank)
        for state in live:
            state.fail([rank], report, "proc")
        if live:
            self.state.failed.setdefault(rank, report)
        else:
            self.state.fail([rank], report, "proc")
        waiters, self._failure_waiters = self._failure_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def _index_remote(self, h: RemoteProcHandle) -> None:
        if h.addr is not None:
            live_meshes.add_proc(h.addr, self, h.rank)

    # stopping
    async def stop_all(self, reason: str) -> None:
        """Stop every actor mesh and proc of the group; later calls raise
        ``SupervisionError`` saying ``reason``. Procs this process started (itself or
        through host agents) are stopped and reaped; others (this process, another
        process's) keep running, with these actors stopped."""
        self._phase = GroupState.STOPPING
        for state in self._actors.values():
            state.stopped = state.stopped or f"its proc mesh {self.name!r} was stopped: {reason}"
        self.state.stopped = reason
        rt = current_runtime()
        local = [h for h in self.handles if isinstance(h, ProcHandle)]
        remote = [h for h in self.handles if isinstance(h, RemoteProcHandle)]
        if remote:
            from ._procs.host_agent import stop_remote_procs

            await asyncio.wrap_future(self.started)
            await stop_remote_procs(remote)
        # Procs that are not ours (this process, another's procs): their actors stop, the
        # processes stay.
        kept = [
            h.addr
            for h in self.handles
            if h.addr and isinstance(h, (SelfProcHandle, RefProcHandle))
        ]
        acks = [
            _stop_actor_at(rt, addr, wire) for addr in dict.fromkeys(kept) for wire in self._actors
        ]
        await stop_procs(rt, local, config.stop_timeout)
        if acks:  # stopped (or their proc is gone) when this returns: later calls fail
            await asyncio.gather(*acks)
        # Only procs this process started are forgotten: another group here may hold the
        # addresses of a this_proc() or reference mesh.
        addrs = [h.addr for h in self.handles if h.addr and isinstance(h, _STARTED_HERE)]
        peers.forget(addrs)
        live_meshes.forget_procs(addrs)
        for wire in list(self._actors):
            self.remove(wire)
        if self.log.aggregator is not None:  # the procs' last lines, before we return
            self.log.aggregator.flush()
        self._phase = GroupState.STOPPED


def _stop_actor_at(rt: Runtime, addr: str, wire: str) -> asyncio.Future[None]:
    """Stop the actor ``wire`` in the proc at ``addr``: resolves once it has stopped, or
    its proc is gone."""
    done: asyncio.Future[None] = rt.loop.create_future()

    def on_reply(rank: int, status: int, value: object) -> bool:
        if not done.done():
            done.set_result(None)
        return True

    rt.stop_actor(addr, wire, rt.open_port(on_reply), 0)
    return done


#: the kinds of proc that this process started (itself or through a host agent)
_STARTED_HERE = (ProcHandle, RemoteProcHandle)


def remove_actor_mesh(wire: str) -> None:
    """Forget the actor mesh ``wire`` (it was stopped), whichever group it is on."""
    group = live_meshes.remove_actor_mesh(wire)
    if group is not None:
        group.remove(wire)


class _Supervisor(Actor):
    """The system actor (``SUPERVISOR``) of a runtime that spawns actor meshes: the actor
    layer of their procs tells it, in ordinary calls, when actors failed and when an
    endpoint has run too long. Its endpoints are sync: a system actor runs them inline,
    in the order they arrive."""

    @endpoint
    def failed(self, mesh: str, actor: str, ranks: list[int], report: str, kind: str) -> None:
        """Actors ``ranks`` of our actor mesh ``actor`` (named ``mesh``) failed."""
        state = live_meshes.actor_mesh(actor)
        if state is None:
            supervision_log.error("failure of unknown mesh %s (%s): %s", mesh, actor, report)
            return
        # outside this system actor's context, as a message handler ran: the mesh's owner
        # (or the fault hook, in the controller's context) is who hears of it, and a mesh
        # the hook spawns is the controller's, not this actor's
        contextvars.Context().run(state.fail, ranks, report, kind)

    @endpoint
    def stuck(
        self, actor_id: str, mesh: str, rank: str, method: str, seconds: float, stack: str
    ) -> None:
        """Endpoint ``method`` of ``actor_id`` has been running for ``seconds``."""
        report_stuck(StuckReport(actor_id, mesh, rank, method, seconds, stack))


def ensure_supervisor(rt: Runtime) -> None:
    """Before ``rt`` spawns actors: host the system actor their failures come to."""
    ensure_actor(rt, SUPERVISOR, _Supervisor)


def on_peer_lost(addr: str) -> None:
    """A connection to ``addr`` was lost: if it was one of our procs (or a host agent),
    those procs failed. A local proc that is still alive (frozen: it stopped answering
    heartbeats) is killed, so it cannot come back as a zombie member of the mesh."""
    entry = live_meshes.take_proc(addr)
    if entry is not None:
        group, rank = entry
        h = group.handles[rank]
        if isinstance(h, ProcHandle):
            current_runtime().spawn_task(_lost_local(group, rank, h))
        elif isinstance(h, RemoteProcHandle):
            _lost_remote(group, rank, h, addr)
        else:
            group.proc_failed(rank, f"proc {addr} is unreachable: connection lost")
        return
    via_agent = [
        (a, group, rank)
        for a, group, rank in live_meshes.procs()
        if isinstance(h := group.handles[rank], RemoteProcHandle) and h.agent == addr
    ]
    for a, group, rank in via_agent:
        live_meshes.take_proc(a)
        group.proc_failed(rank, f"its host agent {addr} is gone")


def _lost_remote(group: ProcGroup, rank: int, h: RemoteProcHandle, addr: str) -> None:
    """A host agent's proc whose connection we lost fails now, and is fenced: its agent
    kills it, so a frozen one never comes back as a zombie member, and readers of its
    buffers on other hosts see their transfers end as its sockets close."""
    why = current_runtime().lost.get(addr)
    if isinstance(why, SupervisionError):  # our heartbeat gave up on it
        text = f"proc {addr} stopped answering (no heartbeat for {config.heartbeat_timeout} s)"
    else:
        text = f"proc {addr} is unreachable: connection lost ({type(why).__name__}: {why})"
    group.proc_failed(rank, f"{text}; fenced: its host agent {h.agent} kills it")
    from ._procs.host_agent import kill_remote_proc

    current_runtime().spawn_task(kill_remote_proc(h))


async def _lost_local(group: ProcGroup, rank: int, h: ProcHandle) -> None:
    if h.stopping:
        return  # danaus is stopping it (a mesh's stop, the exit hook): losing it is expected
    if not await wait_exited(h, 0.5):
        h.kill()  # alive, but its connection is gone: it cannot come back as a member
        why = current_runtime().lost.get(h.addr or "")
        if isinstance(why, SupervisionError):  # our heartbeat gave up on it
            group.proc_failed(rank, f"proc {h.addr} stopped answering (no heartbeat); killed it")
        else:  # a dropped connection is no missed heartbeat: say what happened
            group.proc_failed(
                rank,
                f"proc {h.addr} lost its connection while alive "
                f"({type(why).__name__}: {why}); killed it",
            )
    # else: its exit callback reported the exit status
