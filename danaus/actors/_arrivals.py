"""Messages for actors that do not exist (yet) in this proc.

A call or a cast may reach a proc before the Spawn of its actor (it came another way,
e.g. down a cast tree): it is held, at most ``config.spawn_wait`` seconds, and
redelivered in order once the Spawn arrives. An actor that was stopped, or whose wait
expired, is known gone: messages for it fail at once, with an error that says why.
This module owns the held messages and the gone actors of one runtime
(:attr:`Runtime.arrivals <danaus.actors._runtime.Runtime.arrivals>`); the runtime owns
the actors themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..config import config
from ._wire import ErrorInfo

if TYPE_CHECKING:
    from ._runtime import Runtime

__all__ = ["ActorArrivals"]


class ActorArrivals:
    """The messages held for actors of ``rt`` not spawned yet, and the actors gone."""

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        #: messages that arrived before their actor's Spawn, by actor; and actors whose
        #: wait expired, or that were stopped (messages for those fail at once)
        self.awaiting: dict[str, list[Callable[[], None]]] = {}
        self.expired: set[str] = set()
        self.gone_actors: set[str] = set()

    def __repr__(self) -> str:
        return (
            f"<ActorArrivals awaiting={len(self.awaiting)} expired={len(self.expired)} "
            f"gone={len(self.gone_actors)}>"
        )

    def await_actor(self, actor: str, retry: Callable[[], None]) -> bool:
        """Hold a message for ``actor`` until its Spawn arrives (it may have come another
        way, e.g. down a cast tree, and overtaken the Spawn), at most ``spawn_wait`` s.

        Returns False when there is nothing to wait for: fail the message now.
        """
        if "." not in actor or actor in self.gone_actors or actor in self.expired:
            return False  # not a spawned actor's key ("name.job.n"), or known gone
        waiting = self.awaiting.get(actor)
        if waiting is None:
            waiting = self.awaiting[actor] = []

            def expire() -> None:
                if actor in self.awaiting:
                    self.expired.add(actor)
                    self.release_actor(actor)

            self._rt.loop.call_later(config.spawn_wait, expire)
        waiting.append(retry)
        return True

    def release_actor(self, actor: str) -> None:
        """``actor`` exists now (or never will): redeliver what waited for it, in order."""
        for retry in self.awaiting.pop(actor, []):
            retry()

    def no_actor(self, actor: str) -> ErrorInfo:
        """The error of a message for ``actor``, which is not here (and will not be)."""
        why = (
            "it was stopped"
            if actor in self.gone_actors
            else (f"it has: {sorted(self._rt.actors) or 'none'}")
        )
        return ErrorInfo(
            "supervision",
            actor,
            "",
            "SupervisionError",
            f"no actor named {actor!r} in proc {self._rt.addr} ({why})",
            "",
        )
