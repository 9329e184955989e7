"""Who is running: ``context()``, ``current_rank()``, ``current_size()``, ``current_actor_name()``."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn

from ..errors import actor_display_name
from ._point import Point, point_in_region
from ._wire import Region

if TYPE_CHECKING:
    from ..mesh import ProcMesh
    from ._actor import Actor
    from ._instance import ActorInstance

__all__ = [
    "ActorContext",
    "Context",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
]


@dataclass(frozen=True)
class ActorContext:
    """The actor handling the current message (Monarch's ``context().actor_instance``).

    Attributes:
        actor_id: stable text id, like ``procs[1].counter[1]``.
        name: the actor mesh's name (``"counter"``).
        rank: this actor's own rank in the mesh it was spawned in, in named coordinates
            (the message rank, :func:`current_rank`, may differ: see ``Context``).
        proc_addr: the listening address of the proc it lives in.
        instance: the actor object itself.
    """

    actor_id: str
    name: str
    rank: Point
    proc_addr: str
    instance: Actor | None = field(repr=False, default=None)
    #: the ActorInstance (runtime side): owner of the meshes spawned in its endpoints
    runtime_actor: ActorInstance | None = field(repr=False, default=None, compare=False)
    #: the proc mesh it was spawned on: its name and its procs' addresses, by rank
    proc_mesh_name: str = field(repr=False, default="", compare=False)
    proc_addrs: tuple[str, ...] = field(repr=False, default=(), compare=False)

    @property
    def proc_id(self) -> str:
        """The id of the proc this actor lives in, like ``procs[1]`` (Monarch's name)."""
        return self.actor_id.rpartition(".")[0] or self.proc_addr

    @property
    def proc(self) -> ProcMesh:
        """The proc this actor lives in, as a proc mesh of one (Monarch's
        ``actor_instance.proc``): ``proc.spawn(...)`` puts actors next to this one. Only
        from code running in this actor's proc."""
        if proc_of_actor is None:
            raise RuntimeError("actor_instance.proc needs danaus.mesh (import danaus)")
        return proc_of_actor(self)

    @property
    def proc_mesh(self) -> ProcMesh:
        """The proc mesh this actor was spawned on (Monarch's ``actor_instance.proc_mesh``),
        as a reference: ``proc_mesh.spawn(...)`` puts actors on every one of its procs,
        owned by the current actor; its ``stop()`` stops those actors, never the procs
        (their spawner owns them)."""
        if proc_mesh_of_actor is None:
            raise RuntimeError("actor_instance.proc_mesh needs danaus.mesh (import danaus)")
        return proc_mesh_of_actor(self)

    @property
    def class_name(self) -> str:
        """The actor's class, qualified by its module."""
        t = type(self.instance)
        return f"{t.__module__}.{t.__qualname__}"

    def __str__(self) -> str:
        """Its display name, as Monarch prints an actor instance."""
        return self.display_name

    @property
    def display_name(self) -> str:
        """How failure reports name this actor (Monarch's form, with its class and point:
        ``procs[0].<app.Trainer trainers{'gpus': 0/2}>``)."""
        return actor_display_name(self.proc_id, self.class_name, self.name, self.rank)

    def abort(self, reason: str | None = None) -> None:
        """Fail this actor (Monarch's ``actor_instance.abort``): as if an endpoint raised
        something that is not an ``Exception``, its owner (``__supervise__``, else the
        fault hook) hears of it, with ``reason`` (or "no reason provided") and the actor's
        class in the report, later calls fail with ``SupervisionError``, and it stops."""
        why = reason or "no reason provided"
        self._on_loop(lambda a: a.fail(f"{self.class_name} aborted: {why}", "actor"))

    def kill(self, reason: str | None = None) -> None:
        """Monarch's other name for :meth:`abort`: terminate with a failure."""
        self.abort(reason)

    def stop(self, reason: str | None = None) -> None:
        """Stop this actor and what it spawned, without a failure (Monarch's
        ``actor_instance.stop``): the message running now finishes, ``__cleanup__`` runs,
        and messages still queued and later calls fail with ``SupervisionError`` saying
        it was stopped."""
        del reason  # Monarch records it; a stopped actor's callers read "was stopped"
        self._on_loop(lambda a: a.stop_self())

    def _on_loop(self, act: Callable[[ActorInstance], object]) -> None:
        a = self.runtime_actor
        if a is None:
            raise RuntimeError(f"{self.actor_id} is not a running actor of this process")
        if a.rt.on_loop():
            act(a)
        else:  # a sync endpoint, on the actor's thread
            a.rt.loop.call_soon_threadsafe(act, a)

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            f"context().actor_instance ({self.actor_id}) cannot be pickled: it is the "
            "running actor itself (its object, thread and event loop), as in Monarch; send "
            "what the other side needs: its actor_id, rank, or proc_mesh (a reference)"
        )


@dataclass(frozen=True)
class Context:
    """What :func:`context` returns: the current actor (``None`` on the controller) and
    where the message being handled found it.

    ``message_rank`` is the position of this actor in the slice that was called, as in
    Monarch: ``mesh.slice(procs=slice(2, 4)).ep.call()`` reaches rank 2 at message rank
    ``{'procs': 0/2}``; ``actor_instance.rank`` stays ``{'procs': 2/4}``.
    """

    actor_instance: ActorContext | None
    #: the slice the current message was sent to, when not the actor's whole mesh
    region: Region | None = field(default=None, repr=False)

    @property
    def rank(self) -> Point:
        """The actor's own rank (an empty point on the controller)."""
        return self.actor_instance.rank if self.actor_instance else _CONTROLLER_POINT

    @property
    def message_rank(self) -> Point:
        """The current actor's position in the slice the current message was sent to (its
        own rank when the whole mesh was called; an empty point on the controller)."""
        me = self.actor_instance
        if me is None:
            return _CONTROLLER_POINT
        if self.region is None:
            return me.rank
        point = point_in_region(me.rank.rank, self.region)
        return me.rank if point is None else point

    @property
    def is_controller(self) -> bool:
        return self.actor_instance is None

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            "context() cannot be pickled: it says who runs the current message in this "
            "process, as in Monarch; send what the other side needs: its message_rank, "
            "or actor_instance.actor_id, .rank or .proc_mesh (a reference)"
        )


#: True in a proc (a process a spawner started), False in a controller
in_proc = False
#: set by danaus.mesh: the proc mesh of one of an actor's own proc
proc_of_actor: Callable[[ActorContext], ProcMesh] | None = None
#: set by the mesh layer: ``actor_instance.proc_mesh``
proc_mesh_of_actor: Callable[[ActorContext], ProcMesh] | None = None

_CONTROLLER_POINT = Point({}, {})
_CONTROLLER = Context(None)
current: contextvars.ContextVar[Context] = contextvars.ContextVar(
    "danaus_context", default=_CONTROLLER
)


def context() -> Context:
    """The context of the code running now: an actor's endpoint, or the controller."""
    return current.get()


def current_rank() -> Point:
    """Where the current message found this actor, as a :class:`Point`
    (``str()`` like ``{'procs': 1/2}``): its position in the slice that was called, as in
    Monarch. The actor's own rank is ``context().actor_instance.rank``."""
    return current.get().message_rank


def current_size() -> dict[str, int]:
    """The size of each dimension of the slice the current message was sent to (``{}``
    on the controller)."""
    return current.get().message_rank.sizes


def current_actor_name() -> str:
    """The current actor's id (``procs[1].counter[1]``), or ``"client"`` on the controller."""
    me = current.get().actor_instance
    return "client" if me is None else me.actor_id
