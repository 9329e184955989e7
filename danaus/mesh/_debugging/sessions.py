"""What people and programs do with the actors paused in pdb: ``danaus debug``'s admin
operations (``debug.*``), :func:`debug_sessions`, and Monarch's ``DebugController``. The
sessions themselves are the actor layer's (``danaus/actors/_debugging/sessions.py``).
"""

from __future__ import annotations

import functools
import time

from ...actors.seam import Actor, DebugRecord, debug_registry, endpoint
from .._admin.server import admin_op

__all__ = ["DebugController", "debug_controller", "debug_sessions"]


def debug_sessions() -> list[DebugRecord]:
    """The actors paused in pdb in meshes this process spawned: one record each (id,
    mesh, rank, actor, where, state, ...). Attach to them with ``danaus debug``."""
    return [s.record() for s in debug_registry.sessions()]


# ---------------------------------------------------------------- admin ops


@admin_op("debug.list")
async def _list() -> dict[str, object]:
    return {"cursor": debug_registry.cursor(), "sessions": debug_sessions()}


@admin_op("debug.read")
async def _read(cursor: int, client: str = "", wait: float = 1.0) -> dict[str, object]:
    seq, entries, dropped = await debug_registry.read(int(cursor), str(client), float(wait))
    return {
        "cursor": seq,
        "entries": [{"seq": q, "id": i, "kind": k, "text": t} for q, i, k, t in entries],
        "dropped": dropped,
    }


@admin_op("debug.attach")
async def _attach(id: int, client: str = "") -> dict[str, object]:
    s, backlog, cursor = debug_registry.attach(int(id), str(client))
    return {"session": s.record(), "backlog": backlog, "cursor": cursor}


@admin_op("debug.send")
async def _send(ids: list[int], line: str, client: str = "") -> dict[str, object]:
    return {"sent": debug_registry.send([int(i) for i in ids], str(line), str(client))}


@admin_op("debug.continue")
async def _continue(ids: list[int] | None = None) -> dict[str, object]:
    return {"continued": debug_registry.detach(None if ids is None else [int(i) for i in ids])}


@admin_op("debug.release")
async def _release(client: str) -> dict[str, object]:
    debug_registry.release(str(client))
    return {}


# ---------------------------------------------------------------- Monarch's debug controller


class DebugController(Actor):
    """The controller's view of the actors paused in pdb (Monarch's ``DebugController``)."""

    @endpoint
    async def list(self, print_output: bool = True) -> list[DebugRecord]:
        """One record per open session (id, mesh, rank, actor, where, state, ...); with
        ``print_output``, also printed as a table, as Monarch's does."""
        records = [s.record() for s in debug_registry.sessions()]
        if print_output:
            print(_table(records), flush=True)
        return records

    @endpoint
    async def wait_pending_session(self, timeout: float = 300.0) -> None:  # noqa: ASYNC109 - the caller's bound, sent with the call
        """Return once an actor is paused in pdb; ``TimeoutError`` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        cursor = -1
        while not debug_registry.sessions():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no actor stopped in pdb within {timeout} s")
            cursor, _, _ = await debug_registry.read(cursor, wait=min(left, 1.0))


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
    from .._controllers import get_or_spawn_controller  # (it imports the layer's meshes)

    return get_or_spawn_controller("debug_controller", DebugController).get()
