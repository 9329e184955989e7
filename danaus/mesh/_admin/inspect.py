"""What a mesh is doing: ``mesh.stats()`` and ``mesh.stacks()``, asked of every proc's
control actor (which answers from the proc's loop, also while an actor's thread is busy);
``mesh_stats`` / ``mesh_stacks`` reach them also where the actor class has an endpoint of
that name (``unless_endpoint``)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, Literal, TypeVar, cast, overload

from ...actors.seam import Actor, Future, ProcControl, current_runtime, endpoints_of, run_task
from ...geometry import Shape
from .._actor_endpoint import ActorEndpoint
from .._value_mesh import ValueMesh
from .records import (
    ActorStats,
    GoneActorStats,
    ProcReply,
    ProcStats,
    StackEntry,
    proc_reply,
    stack_entries,
)

if TYPE_CHECKING:
    from .._actor_mesh import ActorMesh
    from .._proc_group import ProcGroup

__all__ = [
    "actor_mesh_stacks",
    "actor_mesh_stats",
    "ask_procs",
    "mesh_stacks",
    "mesh_stats",
    "proc_mesh_stacks",
    "proc_mesh_stats",
    "unless_endpoint",
]

A = TypeVar("A", bound=Actor)
R = TypeVar("R")


async def ask_procs(
    addrs: list[str],
    method: Literal["stats", "stacks", "reload_modules"],
    *args: list[str] | None,
) -> list[object]:
    """Ask the control actor of each proc at ``addrs`` (in that order), all at once: its
    stats, its stacks, or to reload the modules of files (a synced workspace).

    One call per proc: a control actor has no rank of its own to tag a reply with."""
    from .._actor_mesh import mesh_ref

    one = Shape.from_sizes({})
    calls = [
        getattr(mesh_ref("__proc__", ProcControl, one, {0: addr}), method).call_one(*args)
        for addr in addrs
    ]
    return list(await asyncio.gather(*calls))


async def _stats(addrs: list[str], actors: list[str] | None) -> list[ProcReply]:
    got = await ask_procs(addrs, "stats", actors)
    return [proc_reply(r, addr) for r, addr in zip(got, addrs, strict=True)]


async def _stacks(addrs: list[str]) -> list[list[StackEntry]]:
    got = await ask_procs(addrs, "stacks")
    return [stack_entries(r, addr) for r, addr in zip(got, addrs, strict=True)]


async def _actor_addrs(mesh: ActorMesh[A]) -> list[str]:
    await asyncio.wrap_future(mesh.spawn_sent)  # its procs have started: addresses known
    return [mesh.addr_of(g) for g in mesh.global_ranks()]


async def actor_mesh_stats(mesh: ActorMesh[A]) -> ValueMesh[ActorStats | GoneActorStats]:
    """Per actor of ``mesh``: its record and its proc's (``"proc"``)."""
    values: list[ActorStats | GoneActorStats] = []
    for record in await _stats(await _actor_addrs(mesh), [mesh.wire_name]):
        actor = record["actors"].get(mesh.wire_name)
        if actor is None:
            values.append({"actor": None, "gone": True, "proc": record["proc"]})
        else:
            values.append({**actor, "proc": record["proc"]})
    return ValueMesh(mesh.shape, values)


async def actor_mesh_stacks(mesh: ActorMesh[A]) -> ValueMesh[list[StackEntry]]:
    """Per actor of ``mesh``: the stack of every thread and running async endpoint of
    its proc."""
    return ValueMesh(mesh.shape, await _stacks(await _actor_addrs(mesh)))


async def proc_mesh_stats(group: ProcGroup, shape: Shape) -> ValueMesh[ProcStats]:
    """Per proc of ``group`` that ``shape`` selects: its record, with the records of the
    actors in it (``"actors"``)."""
    got = await _stats(await group.started_addrs(shape.global_ranks()), None)
    values: list[ProcStats] = [{**r["proc"], "actors": list(r["actors"].values())} for r in got]
    return ValueMesh(shape, values)


async def proc_mesh_stacks(group: ProcGroup, shape: Shape) -> ValueMesh[list[StackEntry]]:
    """Per proc of ``group`` that ``shape`` selects: the stack of every thread and
    running async endpoint."""
    return ValueMesh(shape, await _stacks(await group.started_addrs(shape.global_ranks())))


class unless_endpoint(Generic[R]):
    """An ``ActorMesh`` method whose name an actor class may also give an endpoint (e.g.
    ``stats``): where it does, ``mesh.stats`` is that endpoint, as without the method
    (reach the method as ``danaus.mesh_stats(mesh)`` then; type checkers see the method)."""

    def __init__(self, fn: Callable[[ActorMesh[Actor]], R]) -> None:
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__

    @overload
    def __get__(self, mesh: None, owner: type | None = None) -> unless_endpoint[R]: ...
    @overload
    def __get__(self, mesh: ActorMesh[A], owner: type | None = None) -> Callable[[], R]: ...
    def __get__(
        self, mesh: ActorMesh[A] | None, owner: type | None = None
    ) -> unless_endpoint[R] | Callable[[], R] | ActorEndpoint[object]:
        if mesh is None:
            return self
        if self.name in endpoints_of(mesh.actor_class):
            return ActorEndpoint(mesh, self.name)
        return functools.partial(self.fn, mesh)


def mesh_stats(mesh: ActorMesh[Actor] | Actor) -> Future[ValueMesh[ActorStats | GoneActorStats]]:
    """``mesh.stats()``, also where the actor class has an endpoint named ``stats``
    (``mesh``: what ``spawn`` returns, typed as its actor class, or an ``ActorMesh``)."""
    m = cast("ActorMesh[Actor]", mesh)  # what spawn returns: an ActorMesh, typed as its class
    return run_task(current_runtime(), lambda: actor_mesh_stats(m))


def mesh_stacks(mesh: ActorMesh[Actor] | Actor) -> Future[ValueMesh[list[StackEntry]]]:
    """``mesh.stacks()``, also where the actor class has an endpoint named ``stacks``
    (``mesh``: what ``spawn`` returns, typed as its actor class, or an ``ActorMesh``)."""
    m = cast("ActorMesh[Actor]", mesh)  # what spawn returns: an ActorMesh, typed as its class
    return run_task(current_runtime(), lambda: actor_mesh_stacks(m))
