"""The registry of this process's live proc meshes: :data:`live_meshes`, the one owner of

- the procs this process started (itself or through a host agent), by address: which
  group and rank, so that a lost connection becomes that proc's failure
  (:func:`~danaus.mesh._proc_group.on_peer_lost`); the groups they belong to are the
  proc meshes this process spawned and has not stopped (:meth:`LiveMeshes.groups`);
- the actor meshes spawned on any group, by wire name, where a failure the runtime's
  supervisor hears of finds the mesh it names (one dict lookup);
- the proc meshes spawned here by name, for default names (``"procs"``, ``"procs2"``...).

``ProcGroup`` keeps the first two as its procs start, fail and stop and as actor meshes
come and go; ``HostMesh.spawn_procs`` keeps the names. Nothing else holds these lists;
everyone changes and reads them through the methods below (thread-safe: a proc mesh is
spawned on the caller's thread, its procs are lost on the runtime's loop).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._proc_group import ProcGroup
    from ._supervision import MeshState

__all__ = ["LiveMeshes", "live_meshes"]


class LiveMeshes:
    """The procs, actor meshes and proc mesh names of this process's live proc meshes
    (see the module's docstring): one per process, :data:`live_meshes`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: address -> the group and global rank of a proc this process started; gone
        #: once its group is stopped or its connection is lost
        self._procs: dict[str, tuple[ProcGroup, int]] = {}
        #: wire name -> the actor mesh's group and state. (The group is held weakly: a
        #: mesh nobody stopped or holds goes, as before, and with it the default name
        #: it reserved.)
        self._actor_meshes: dict[str, tuple[weakref.ref[ProcGroup], MeshState]] = {}
        #: name -> the group of a proc mesh spawned here under that name
        self._names: weakref.WeakValueDictionary[str, ProcGroup] = weakref.WeakValueDictionary()
        #: default names handed out whose meshes are still being spawned
        self._reserved: set[str] = set()

    def __repr__(self) -> str:
        return (
            f"<LiveMeshes {len(self._procs)} procs, {len(self._actor_meshes)} actor meshes, "
            f"{len(self._names)} names>"
        )

    # procs
    def add_proc(self, addr: str, group: ProcGroup, rank: int) -> None:
        """The proc at ``addr`` (started here) is ``group``'s of global ``rank``."""
        with self._lock:
            self._procs[addr] = (group, rank)

    def proc_at(self, addr: str) -> tuple[ProcGroup, int] | None:
        """The group and rank of the live proc at ``addr`` that this process started."""
        with self._lock:
            return self._procs.get(addr)

    def take_proc(self, addr: str) -> tuple[ProcGroup, int] | None:
        """:meth:`proc_at`, and forget it (its connection was lost: it fails once)."""
        with self._lock:
            return self._procs.pop(addr, None)

    def forget_procs(self, addrs: Iterable[str]) -> None:
        """These procs are gone for good (their group was stopped)."""
        with self._lock:
            for addr in addrs:
                self._procs.pop(addr, None)

    def procs(self) -> list[tuple[str, ProcGroup, int]]:
        """Every live proc this process started: its address, group and rank."""
        with self._lock:
            return [(addr, group, rank) for addr, (group, rank) in self._procs.items()]

    def groups(self) -> list[ProcGroup]:
        """The groups of procs this process started and has not stopped, oldest first."""
        with self._lock:
            entries = list(self._procs.values())
        groups: list[ProcGroup] = []
        for group, _ in entries:
            if not group.stopped and group not in groups:
                groups.append(group)
        return groups

    # actor meshes
    def add_actor_mesh(self, wire: str, group: ProcGroup, state: MeshState) -> None:
        """The actor mesh ``wire``, of this ``state``, was spawned on ``group``."""
        with self._lock:
            self._actor_meshes[wire] = (weakref.ref(group), state)

    def actor_mesh(self, wire: str) -> MeshState | None:
        """The state of the actor mesh ``wire`` (None: not one of ours, or stopped)."""
        with self._lock:
            entry = self._actor_meshes.get(wire)
        return None if entry is None else entry[1]

    def remove_actor_mesh(self, wire: str) -> ProcGroup | None:
        """Forget the actor mesh ``wire`` (it was stopped); its group, if it still lives."""
        with self._lock:
            entry = self._actor_meshes.pop(wire, None)
        return None if entry is None else entry[0]()

    # names
    def named(self, name: str, group: ProcGroup) -> None:
        """``group`` is a proc mesh spawned here as ``name``."""
        with self._lock:
            self._names[name] = group

    def default_name(self) -> str:
        """``"procs"``, or ``"procsN"`` while a mesh of that name still runs here, or is
        being spawned: the name is reserved until :meth:`release` (its mesh named by then,
        or never spawned), so that two threads spawning at once get two names."""
        with self._lock:
            for n in itertools.count(1):
                name = "procs" if n == 1 else f"procs{n}"
                group = self._names.get(name)
                if name not in self._reserved and (group is None or group.stopped):
                    self._reserved.add(name)
                    return name
        raise AssertionError("unreachable")

    def release(self, name: str) -> None:
        """The spawn given the default ``name`` is over: the name is taken by its mesh
        (see :meth:`named`), or free again if it failed."""
        with self._lock:
            self._reserved.discard(name)


#: The one :class:`LiveMeshes` of this process.
live_meshes = LiveMeshes()
