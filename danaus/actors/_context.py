"""Who is running: ``context()``, ``current_rank()``, ``current_size()``."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Any

from ._point import Point

__all__ = ["ActorContext", "Context", "context", "current_rank", "current_size"]


@dataclass(frozen=True)
class ActorContext:
    """The actor handling the current message.

    Attributes:
        actor_id: stable text id, like ``world.procs[1].counter[1]``.
        name: the actor mesh's name (``"counter"``).
        rank: this actor's rank in its mesh, in named coordinates.
        proc_addr: the listening address of the proc it lives in.
        instance: the actor object itself.
    """

    actor_id: str
    name: str
    rank: Point
    proc_addr: str
    instance: Any = field(repr=False, default=None)
    #: the ActorInstance (runtime side): owner of the meshes spawned in its endpoints
    runtime_actor: Any = field(repr=False, default=None, compare=False)


@dataclass(frozen=True)
class Context:
    """What :func:`context` returns: the current actor, or ``None`` on the controller."""

    actor_instance: ActorContext | None

    @property
    def rank(self) -> Point:
        """The current rank (an empty point on the controller)."""
        return self.actor_instance.rank if self.actor_instance else _CONTROLLER_POINT

    @property
    def is_controller(self) -> bool:
        return self.actor_instance is None


_CONTROLLER_POINT = Point({}, {})
_CONTROLLER = Context(None)
current: contextvars.ContextVar[Context] = contextvars.ContextVar(
    "danaus_context", default=_CONTROLLER
)


def context() -> Context:
    """The context of the code running now: an actor's endpoint, or the controller."""
    return current.get()


def current_rank() -> Point:
    """This actor's rank as a :class:`Point` (``str()`` like ``{'procs': 1/2}``)."""
    return current.get().rank


def current_size() -> dict[str, int]:
    """The size of each dimension of the current actor's mesh (``{}`` on the controller)."""
    return current.get().rank.sizes
