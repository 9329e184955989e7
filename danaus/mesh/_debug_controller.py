"""Monarch's ``debug_controller()``: the controller's debugger as an actor, for programs
and notebooks that list paused actors or wait for one, rather than run ``danaus debug``.

``debug_controller()`` is a singleton actor (``get_or_spawn_controller``) in the
controller's process, so it sees the sessions of :data:`danaus.mesh._debug.registry`::

    dc = debug_controller()
    await dc.wait_pending_session.call_one()     # an actor stopped at breakpoint()
    for s in await dc.list.call_one(print_output=False):
        print(s["mesh"], s["rank"], s["where"])

People attach to a session with ``danaus debug`` (``monarch debug``'s counterpart).
"""

from __future__ import annotations

import functools
import time

from ..actors._api import Actor, endpoint
from ._controllers import get_or_spawn_controller
from ._debug import DebugRecord, registry

__all__ = ["DebugController", "debug_controller"]


class DebugController(Actor):
    """The controller's view of the actors paused in pdb (Monarch's ``DebugController``)."""

    @endpoint
    async def list(self, print_output: bool = True) -> list[DebugRecord]:
        """One record per open session (id, mesh, rank, actor, where, state, ...); with
        ``print_output``, also printed as a table, as Monarch's does."""
        records = [s.record() for s in registry.sessions()]
        if print_output:
            print(_table(records), flush=True)
        return records

    @endpoint
    async def wait_pending_session(self, timeout: float = 300.0) -> None:  # noqa: ASYNC109 - the caller's bound, sent with the call
        """Return once an actor is paused in pdb; ``TimeoutError`` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        cursor = -1
        while not registry.sessions():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no actor stopped in pdb within {timeout} s")
            cursor, _, _ = await registry.read(cursor, wait=min(left, 1.0))


def _table(records: list[DebugRecord]) -> str:
    if not records:
        return "no actor is paused in pdb"
    rows = [("id", "mesh", "rank", "actor", "where", "state")]
    rows += [
        (str(r["id"]), r["mesh"], str(r["rank"]), r["actor"], r["where"], r["state"])
        for r in records
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows
    )


@functools.cache
def debug_controller() -> DebugController:
    """The debug controller (Monarch's ``monarch.actor.debug_controller``): the same
    singleton actor mesh on every call, from the controller or any actor of its procs."""
    return get_or_spawn_controller("debug_controller", DebugController).get()
