"""``ProcGroup``: the one owner of a proc mesh's state.

A proc mesh and every slice of it share one group. The group alone holds and changes:

- the procs: one handle per global rank (``handles``, each a :class:`Proc`), and
  ``started``, which resolves once every proc's address is known (a host agent's procs
  learn theirs when the agent answers);
- the proc mesh's failure state (``state``, a :class:`MeshState`) and whether it was
  stopped;
- **the list of actor meshes spawned on the proc mesh**: ``add`` / ``remove`` /
  ``states_at`` / ``stop_all``. No other list of them exists. The same methods keep a
  process-wide index by actor wire name, where :func:`handle_failure` finds the mesh a
  ``Failure`` message names (one dict lookup);
- the index of this process's procs by address, through which a lost connection
  becomes a proc failure (:func:`on_peer_lost`).

``ProcMesh`` creates a group and asks it; ``ActorMesh``, the inspectors, the metrics,
the snapshot (admin endpoint) and the tensor engine go through the methods below, never
through its fields.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import weakref
from collections.abc import Sequence
from concurrent.futures import Future as ThreadFuture
from typing import TYPE_CHECKING

from ..actors._api import Connection, Failure, Runtime, StopActor, current_runtime
from ..config import config
from ..errors import SupervisionError
from ._local_procs import forget, stop_procs, wait_exited
from ._logs import LogOptions
from ._proc_handles import Proc, ProcHandle, RefProcHandle, RemoteProcHandle, SelfProcHandle
from ._shape import Shape
from ._supervision import MeshState, current_owner

if TYPE_CHECKING:
    from ._actor_mesh import ActorMesh
    from ._host_mesh import _Bootstrap

__all__ = ["GroupState", "ProcGroup", "handle_failure", "live_groups", "remove_actor_mesh"]

log = logging.getLogger("danaus.mesh")
supervision_log = logging.getLogger("danaus.supervision")

#: the actor meshes of every group, by wire name: where Failure messages find theirs.
#: (Their group is held weakly: a mesh nobody stopped or holds goes, as before, and
#: with it the default name it reserved.)
_by_wire: dict[str, tuple[weakref.ref[ProcGroup], MeshState]] = {}
#: the procs this process started (itself or through a host agent), by address: which
#: group and rank (for lost connections); gone once their group is stopped
_by_addr: dict[str, tuple[ProcGroup, int]] = {}


class GroupState(enum.Enum):
    """Where a group is in its life; it counts as stopped from ``STOPPING`` on."""

    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


class ProcGroup:
    """The procs of one proc mesh, their failures, and the actor meshes spawned on them.

    Args:
        name: the proc mesh's name.
        shape: the whole mesh's shape: global ranks index ``handles``.
        handles: one per global rank.
        started: resolves once every proc's address is known.
        log: the procs' output options, shared by the mesh's slices.
    """

    def __init__(
        self,
        name: str,
        shape: Shape,
        handles: Sequence[Proc],
        started: ThreadFuture[None],
        log: LogOptions,
    ) -> None:
        self.name = name
        self.shape = shape
        self.handles: tuple[Proc, ...] = tuple(handles)
        self.started = started
        self.log = log
        #: who spawned the mesh (an ActorInstance, or None for the controller)
        self.owner = current_owner()
        self.state = MeshState(name, shape, self.owner)
        #: the actors that ran the ``spawn_procs(bootstrap=...)`` function, if any (set
        #: once, by ``spawn_procs``): the procs count as initialized after them
        self.bootstrap: ActorMesh[_Bootstrap] | None = None
        self._phase = GroupState.RUNNING
        self._actors: dict[str, MeshState] = {}  # by wire name, in spawn order
        rt = current_runtime()
        if on_peer_lost not in rt.on_lost:
            rt.on_lost.append(on_peer_lost)
        for h in self.handles:
            if isinstance(h, ProcHandle):
                _by_addr[h.addr] = (self, h.rank)
                h.exit_callbacks.append(functools.partial(self._proc_exited, h.rank))
            elif isinstance(h, RemoteProcHandle):
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

    def addrs(self) -> list[str]:
        """The address of every proc, by global rank (see :meth:`addr_of`)."""
        return [h.addr or "" for h in self.handles]

    def all_ranks(self) -> list[int]:
        """Every global rank of the mesh."""
        return [h.rank for h in self.handles]

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
        _by_wire[wire] = (weakref.ref(self), state)
        for r, why in self.state.failed.items():
            state.failed[r] = why

    def remove(self, wire: str) -> None:
        """Forget the actor mesh ``wire`` (it was stopped)."""
        self._actors.pop(wire, None)
        _by_wire.pop(wire, None)

    def states(self) -> list[MeshState]:
        """The actor meshes on these procs (not stopped by their own ``stop``), oldest
        first."""
        return list(self._actors.values())

    def states_at(self, rank: int) -> list[MeshState]:
        """The actor meshes not stopped that have an actor in the proc of ``rank``."""
        return [s for s in self._actors.values() if s.stopped is None and rank in s.ranks]

    # failures
    def _proc_exited(self, rank: int, why: str) -> None:
        self.proc_failed(rank, f"proc {self.handles[rank].addr} {why}")

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

    def _index_remote(self, h: RemoteProcHandle) -> None:
        if h.addr is not None:
            _by_addr[h.addr] = (self, h.rank)

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
            from ._host_agent import stop_remote_procs

            await asyncio.wrap_future(self.started)
            await stop_remote_procs(remote)
        # Procs that are not ours (this process, another's procs): their actors stop, the
        # processes stay.
        kept = [h.addr for h in self.handles if isinstance(h, (SelfProcHandle, RefProcHandle))]
        for addr in dict.fromkeys(kept):
            for wire in self._actors:
                rt.connection(addr).send(StopActor(wire, 0))
        await stop_procs(rt, local, config.stop_timeout)
        addrs = [h.addr for h in self.handles if h.addr]
        forget(addrs)
        for addr in addrs:
            _by_addr.pop(addr, None)
        for wire in list(self._actors):
            self.remove(wire)
        if self.log.aggregator is not None:  # the procs' last lines, before we return
            self.log.aggregator.flush()
        self._phase = GroupState.STOPPED


def remove_actor_mesh(wire: str) -> None:
    """Forget the actor mesh ``wire`` (it was stopped), whichever group it is on."""
    entry = _by_wire.pop(wire, None)
    group = entry[0]() if entry is not None else None
    if group is not None:
        group.remove(wire)


def live_groups() -> list[ProcGroup]:
    """The groups of procs this process started and has not stopped."""
    groups: list[ProcGroup] = []
    for group, _ in list(_by_addr.values()):
        if not group.stopped and group not in groups:
            groups.append(group)
    return groups


def handle_failure(rt: Runtime, conn: Connection, msg: Failure, parts: list[object]) -> None:
    """A proc reports that actors of one of our actor meshes failed."""
    entry = _by_wire.get(msg.actor)
    if entry is None:
        supervision_log.error(
            "failure of unknown mesh %s (%s): %s", msg.mesh, msg.actor, msg.report
        )
        return
    entry[1].fail(msg.ranks, msg.report, msg.kind)


def on_peer_lost(addr: str) -> None:
    """A connection to ``addr`` was lost: if it was one of our procs (or a host agent),
    those procs failed. A local proc that is still alive (frozen: it stopped answering
    heartbeats) is killed, so it cannot come back as a zombie member of the mesh."""
    entry = _by_addr.pop(addr, None)
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
        for a, (group, rank) in _by_addr.items()
        if isinstance(h := group.handles[rank], RemoteProcHandle) and h.agent == addr
    ]
    for a, group, rank in via_agent:
        _by_addr.pop(a, None)
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
    from ._host_agent import kill_remote_proc

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
