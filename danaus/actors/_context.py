"""Who is running: ``context()``, ``current_rank()``, ``current_size()``, ``current_actor_name()``."""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn, Protocol, cast

from ..config import config
from ..errors import actor_display_name
from ..geometry import Point, point_in_region
from ._process import process
from ._wire import Creator, RegionWire

if TYPE_CHECKING:
    from ..mesh import ProcMesh
    from ._actor import Actor
    from ._instance import ActorInstance

__all__ = [
    "ROOT",
    "ActorContext",
    "Context",
    "CreatorInstance",
    "RootInstance",
    "context",
    "creator_from_wire",
    "current_actor_name",
    "current_rank",
    "current_size",
    "spawn_creators",
]


@dataclass(frozen=True)
class CreatorInstance:
    """Who spawned an actor (Monarch's ``actor_instance.creator``): its spawner's name,
    class and rank, and that one's own creator, up to the controller's ``root``. It
    pickles (a record, not the running actor), so an endpoint may return it.

    ``str()`` is the whole line of creation, as Monarch prints it:
    ``<root>.<app.Trainer trainers{'gpus': 0/2}>``."""

    name: str
    class_name: str | None
    rank: Point
    creator: CreatorInstance | None = None

    def __str__(self) -> str:
        return qualified_name(self)

    __repr__ = __str__


def spawn_creators() -> list[Creator]:
    """The line of creation an actor spawned now gets (``Spawn.creators``): the running
    actor, or this program's root, then their creators."""
    who: CreatorInstance | None = current.get().actor_instance.as_creator()
    links: list[Creator] = []
    while who is not None:
        links.append(Creator(who.name, who.class_name or "", who.rank.rank, who.rank.sizes))
        who = who.creator
    return links


def creator_from_wire(links: list[Creator]) -> CreatorInstance | None:
    """The :class:`CreatorInstance` a ``Spawn.creators`` line describes."""
    who: CreatorInstance | None = None
    for link in reversed(links):
        rank = Point.from_rank(link.rank, link.sizes)
        who = CreatorInstance(link.name, link.class_name or None, rank, who)
    return who


def qualified_name(who: CreatorInstance | None) -> str:
    """An instance and its creators, root first: ``<root>.<app.A a{'procs': 0/2}>``."""
    names: list[str] = []
    while who is not None:
        prefix = "" if who.class_name is None else f"{who.class_name} "
        names.append(f"<{prefix}{who.name}{who.rank if len(who.rank) else ''}>")
        who = who.creator
    return ".".join(reversed(names))


class RootInstance:
    """The controller's own instance (``context().actor_instance`` outside any actor, as
    in Monarch): named ``root``, printed ``<root>``, the creator of every actor the
    controller spawns. It is not an actor: nothing sends to it, and it does not stop or
    abort (end the program instead)."""

    name = "root"
    actor_id = "client"
    class_name: str | None = None
    creator: CreatorInstance | None = None
    runtime_actor: ActorInstance | None = None

    @property
    def rank(self) -> Point:
        return _CONTROLLER_POINT

    @property
    def proc(self) -> ProcMesh:
        """The controller's own proc as a mesh of one (``this_proc()``)."""
        make = process.controller_proc
        if make is None:
            raise RuntimeError("actor_instance.proc needs danaus.mesh (import danaus)")
        return cast("ProcMesh", make())

    proc_mesh = proc

    def as_creator(self) -> CreatorInstance:
        return _ROOT_CREATOR

    def abort(self, reason: str | None = None) -> None:
        raise RuntimeError(
            f"the controller's root instance cannot abort ({reason or 'no reason provided'}): "
            "it is not an actor; raise or exit to end the program"
        )

    kill = abort

    def stop(self, reason: str | None = None) -> None:
        raise RuntimeError(
            "the controller's root instance cannot stop: it is not an actor; "
            "stop its meshes, or end the program"
        )

    def __str__(self) -> str:
        return "<root>"

    __repr__ = __str__

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            "context().actor_instance (the controller's root) cannot be pickled, as in "
            "Monarch; send what the other side needs: its rank or a proc mesh"
        )


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
    #: who spawned it (Monarch's ``actor_instance.creator``): ``root`` for the controller
    creator: CreatorInstance | None = field(repr=False, default=None, compare=False)

    def as_creator(self) -> CreatorInstance:
        """This actor as the creator of actors it spawns."""
        return CreatorInstance(self.name, self.class_name, self.rank, self.creator)

    @property
    def proc_id(self) -> str:
        """The id of the proc this actor lives in, like ``procs[1]`` (Monarch's name)."""
        return self.actor_id.rpartition(".")[0] or self.proc_addr

    @property
    def proc(self) -> ProcMesh:
        """The proc this actor lives in, as a proc mesh of one (Monarch's
        ``actor_instance.proc``): ``proc.spawn(...)`` puts actors next to this one. Only
        from code running in this actor's proc."""
        make = process.proc_of_actor
        if make is None:
            raise RuntimeError("actor_instance.proc needs danaus.mesh (import danaus)")
        return cast("ProcMesh", make(self))

    @property
    def proc_mesh(self) -> ProcMesh:
        """The proc mesh this actor was spawned on (Monarch's ``actor_instance.proc_mesh``),
        as a reference: ``proc_mesh.spawn(...)`` puts actors on every one of its procs,
        owned by the current actor; its ``stop()`` stops those actors, never the procs
        (their spawner owns them)."""
        make = process.proc_mesh_of_actor
        if make is None:
            raise RuntimeError("actor_instance.proc_mesh needs danaus.mesh (import danaus)")
        return cast("ProcMesh", make(self))

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
        from ._loops import run_on  # (here: _loops imports this module)

        run_on(a.rt, act, a)  # (from a sync endpoint's thread, its reply waits behind it)

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            f"context().actor_instance ({self.actor_id}) cannot be pickled: it is the "
            "running actor itself (its object, thread and event loop), as in Monarch; send "
            "what the other side needs: its actor_id, rank, or proc_mesh (a reference)"
        )


@dataclass(frozen=True)
class Context:
    """What :func:`context` returns: the current actor (the controller's
    :class:`RootInstance` outside any actor, as in Monarch) and where the message being
    handled found it.

    ``message_rank`` is the position of this actor in the slice that was called, as in
    Monarch: ``mesh.slice(procs=slice(2, 4)).ep.call()`` reaches rank 2 at message rank
    ``{'procs': 0/2}``; ``actor_instance.rank`` stays ``{'procs': 2/4}``.
    """

    #: the actor running the current message; None on the controller
    actor: ActorContext | None
    #: the slice the current message was sent to, when not the actor's whole mesh
    region: RegionWire | None = field(default=None, repr=False)

    @property
    def actor_instance(self) -> ActorContext | RootInstance:
        """The running actor, or on the controller its root instance (``<root>``)."""
        return ROOT if self.actor is None else self.actor

    @property
    def rank(self) -> Point:
        """The actor's own rank (an empty point on the controller)."""
        return self.actor.rank if self.actor else _CONTROLLER_POINT

    @property
    def message_rank(self) -> Point:
        """The current actor's position in the slice the current message was sent to (its
        own rank when the whole mesh was called; an empty point on the controller)."""
        me = self.actor
        if me is None:
            return _CONTROLLER_POINT
        if self.region is None:
            return me.rank
        point = point_in_region(me.rank.rank, self.region)
        return me.rank if point is None else point

    @property
    def is_controller(self) -> bool:
        return self.actor is None

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            "context() cannot be pickled: it says who runs the current message in this "
            "process, as in Monarch; send what the other side needs: its message_rank, "
            "or actor_instance.actor_id, .rank or .proc_mesh (a reference)"
        )


_CONTROLLER_POINT = Point({}, {})
_CONTROLLER = Context(None)
_ROOT_CREATOR = CreatorInstance("root", None, _CONTROLLER_POINT)
#: the controller's instance: ``context().actor_instance`` outside any actor
ROOT = RootInstance()
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
    me = current.get().actor
    return "client" if me is None else me.actor_id


class _RecordFactory(Protocol):
    def __call__(self, *args: object, **kwargs: object) -> logging.LogRecord: ...


def _prefixed_record_factory(make: _RecordFactory) -> _RecordFactory:
    """A log record factory (``logging.setLogRecordFactory``) that begins each message
    with ``[actor=...] `` naming the current instance, when
    ``config.prefix_python_logs_with_actor`` is on (read per record). Empty messages are
    left alone: ``torch.compile`` logs structured traces as empty lines."""

    def record(*args: object, **kwargs: object) -> logging.LogRecord:
        rec = make(*args, **kwargs)
        if config.prefix_python_logs_with_actor and rec.msg:
            prefix = f"[actor={current.get().actor_instance}] "
            rec.__dict__["actor_prefix"] = prefix
            if rec.args:  # the message is a %-format: keep the prefix out of it
                prefix = prefix.replace("%", "%%")
            rec.msg = f"{prefix}{rec.msg}"
        return rec

    record.danaus_prefix = True  # type: ignore[attr-defined]
    return record


if not getattr(logging.getLogRecordFactory(), "danaus_prefix", False):
    logging.setLogRecordFactory(_prefixed_record_factory(logging.getLogRecordFactory()))
