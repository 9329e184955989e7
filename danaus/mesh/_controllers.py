"""``get_or_spawn_controller``: singleton service actors, one per name per controller.

The first call with a name spawns the actor in the controller's own process
(``this_proc()``); every later call, from the controller or from inside any actor of
its procs, gets the same actor mesh. A call from inside an actor goes up the chain of
spawners (each runtime that spawned actors hosts a small system actor,
``__controllers__``) to the controller, so it works from procs on other hosts too.
"""

from __future__ import annotations

from typing import TypeVar, cast

from ..actors.seam import (
    Actor,
    Future,
    Runtime,
    concurrent_endpoint,
    context,
    current_runtime,
    ensure_actor,
    run_task,
)
from ..geometry import Shape
from ._actor_mesh import ActorMesh, mesh_ref
from ._process import process
from ._supervision import MeshFailure

__all__ = ["get_or_spawn_controller"]

A = TypeVar("A", bound=Actor)

#: The wire key of the system actor that answers get_or_spawn_controller requests.
CONTROLLERS = "__controllers__"


def get_or_spawn_controller(
    name: str, Class: type[A], *args: object, **kwargs: object
) -> Future[A]:
    """The singleton actor ``name``: spawned as ``Class(*args, **kwargs)`` in the
    controller's process on first use, the same actor mesh on every later call (from
    the controller, or from inside any actor of its procs). As in Monarch, a
    :class:`~danaus.Future` of the mesh: ``await`` it, or ``.get()``.

    The future raises ``ActorError`` if the actor's ``__init__`` raised, and
    ``ValueError`` if the singleton failed since.
    """
    if not (isinstance(Class, type) and issubclass(Class, Actor)):
        raise TypeError(f"get_or_spawn_controller needs a subclass of danaus.Actor, got {Class!r}")
    rt = current_runtime()
    parent = _parent_of(rt)
    if parent is not None:  # inside a proc: ask whoever spawned us, up to the controller
        ref = mesh_ref(CONTROLLERS, _Controllers, Shape.from_sizes({}), {0: parent})
        # The reply is the singleton's ActorMesh, which stands for ``A`` (as spawn types it).
        return cast("Future[A]", ref.get_or_spawn.call_one(name, Class, args, kwargs))
    mesh = _get_or_spawn_here(name, Class, args, kwargs)

    async def ready() -> A:
        await mesh.initialized
        return cast(A, mesh)  # as Monarch types it: the mesh stands for its actor class

    return run_task(rt, ready)


def _get_or_spawn_here(
    name: str, cls: type[Actor], args: tuple[object, ...], kwargs: dict[str, object]
) -> ActorMesh[Actor]:
    from ._proc_mesh import this_proc

    with process.singletons_lock:
        found = process.singletons.get(name)
        if isinstance(found, MeshFailure):
            raise ValueError(f"the controller {name!r} failed: {found}")
        if found is not None and found.spawn_loop_closed():
            found = None  # its loop ended (an earlier asyncio.run): spawn it anew
        if found is None:
            found = this_proc().spawn_mesh(name, cls, *args, **kwargs)
            process.singletons[name] = found
        return found


def _parent_of(rt: Runtime) -> str | None:
    """Where requests from this runtime go: the runtime that spawned the actor asking (or,
    in a proc, any of its actors' spawner); ``None`` in the controller itself."""
    me = context().actor
    inst = me.runtime_actor if me is not None else None
    owner = getattr(inst, "owner_addr", "")
    if owner and owner != rt.addr:
        return str(owner)
    for actor in rt.local_actors():
        owner = getattr(actor, "owner_addr", "")
        if owner and owner != rt.addr:
            return str(owner)
    return None


def ensure_controllers(rt: Runtime) -> None:
    """Before ``rt`` spawns actors: host the system actor their requests come to (on
    ``rt``'s loop)."""
    ensure_actor(rt, CONTROLLERS, _Controllers)


class _Controllers(Actor):
    """Answers get_or_spawn_controller requests from the actors this runtime spawned."""

    @concurrent_endpoint
    async def get_or_spawn(
        self, name: str, cls: type[Actor], args: tuple[object, ...], kwargs: dict[str, object]
    ) -> ActorMesh[Actor]:
        rt = current_runtime()
        parent = _parent_of(rt)
        if parent is not None:  # a proc that spawned actors itself: pass it on up
            ref = mesh_ref(CONTROLLERS, _Controllers, Shape.from_sizes({}), {0: parent})
            # the controller's reply: the singleton's mesh
            found = await ref.get_or_spawn.call_one(name, cls, args, kwargs)
            return cast(ActorMesh[Actor], found)
        mesh = _get_or_spawn_here(name, cls, tuple(args), dict(kwargs))
        await mesh.initialized
        return mesh

    def __supervise__(self, failure: MeshFailure) -> bool:
        """A singleton spawned here failed: later requests for it raise ``ValueError``."""
        with process.singletons_lock:
            found = process.singletons.get(failure.mesh)
            if isinstance(found, ActorMesh):
                process.singletons[failure.mesh] = failure
                return True
            return isinstance(found, MeshFailure)  # a later report of the same failure
