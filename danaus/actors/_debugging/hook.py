"""``breakpoint()`` and post-mortem debugging in a proc: the hook, and which actors are
paused.

A proc sets ``sys.breakpointhook`` (:func:`install`, at its start). ``breakpoint()`` then
stops the calling thread in pdb whose terminal is the actor's spawner (see
:mod:`danaus.actors._debugging.remote_pdb`, imported only when a session opens); with
``config.debug_on_error`` an endpoint that raises stops in pdb at the raising frame
(:func:`post_mortem`) before its caller gets the error. ``PYTHONBREAKPOINT=0`` turns
``breakpoint()`` off; any other value of it is obeyed as Python does.

While an actor is paused here the stuck-endpoint reporter says nothing of it
(:func:`is_paused`, :func:`resumed_at`), and while a prompt blocks the proc's loop its
peers are told not to declare it lost (``Runtime.announce_pause``).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import TYPE_CHECKING

from ...config import config
from .._process import process

if TYPE_CHECKING:
    from .._instance import ActorInstance
    from .._runtime import Runtime

__all__ = [
    "install",
    "is_paused",
    "post_mortem",
    "proc_parent",
    "proc_runtime",
    "resumed_at",
    "session_ended",
    "session_opened",
    "wants_post_mortem",
]


def install(rt: Runtime, parent: str) -> None:
    """In a proc (its main, once): ``breakpoint()`` opens a session to the actor's
    spawner, or to ``parent`` (who started this proc) outside an actor."""
    process.debug_rt, process.debug_parent = rt, parent
    sys.breakpointhook = breakpointhook


def proc_parent() -> str:
    """The address of who started this proc ("" outside a proc)."""
    return process.debug_parent


def proc_runtime() -> Runtime | None:
    """The proc's own runtime (None outside a proc)."""
    return process.debug_rt


def breakpointhook(*args: object, **kwargs: object) -> object:
    """``sys.breakpointhook`` of a proc: pdb, typed into from the spawner."""
    hook = os.environ.get("PYTHONBREAKPOINT")
    if hook is not None and hook.strip() not in ("", "pdb.set_trace"):
        return sys.__breakpointhook__(*args, **kwargs)  # "0" (off), or the user's own
    from .remote_pdb import set_trace

    set_trace(sys._getframe(1))  # noqa: SLF001 - the stdlib's, as pdb.set_trace uses
    return None


def wants_post_mortem(exc: BaseException) -> bool:
    """Should an endpoint that raised ``exc`` stop in pdb first (``debug_on_error``)?"""
    import bdb

    return (
        config.debug_on_error
        and process.debug_rt is not None
        and not isinstance(exc, (bdb.BdbQuit, asyncio.CancelledError, GeneratorExit))
    )


def post_mortem(exc: BaseException, actor: ActorInstance) -> None:
    """Stop in pdb at the frame that raised ``exc`` in an endpoint of ``actor`` (an
    ActorInstance) until the user continues (or nobody can attach)."""
    from .remote_pdb import post_mortem as pm

    pm(exc, actor)


def session_opened(actor: str) -> None:
    if actor:
        with process.debug_lock:
            process.debug_open[actor] = process.debug_open.get(actor, 0) + 1


def session_ended(actor: str) -> None:
    if actor:
        with process.debug_lock:
            n = process.debug_open.get(actor, 0) - 1
            if n > 0:
                process.debug_open[actor] = n
            else:
                process.debug_open.pop(actor, None)
            process.debug_ended[actor] = time.monotonic()


def is_paused(actor: str) -> bool:
    """Has the actor with this wire key an open debugger session?"""
    return process.debug_open.get(actor, 0) > 0


def resumed_at(actor: str) -> float:
    """When (``time.monotonic()``) the actor's last debugger session ended (0: never)."""
    return process.debug_ended.get(actor, 0.0)
