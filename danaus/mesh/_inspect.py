"""What a mesh is doing: ``mesh.stats()`` and ``mesh.stacks()``, asked of every proc's
control actor (which answers from the proc's loop, also while an actor's thread is busy)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ..actors._api import ProcControl
from ._value_mesh import ValueMesh

if TYPE_CHECKING:
    from ._actor_mesh import ActorMesh
    from ._proc_mesh import ProcMesh

__all__ = ["actor_mesh_stats", "proc_mesh_stats", "stacks_of"]


async def _ask(mesh: ActorMesh[Any] | ProcMesh, method: str, *args: Any) -> list[Any]:
    """Ask the control actor of each proc under ``mesh`` (in rank order), all at once.

    One call per proc: a control actor has no rank of its own to tag a reply with."""
    from ._actor_mesh import ActorMesh, mesh_ref
    from ._shape import Shape

    if isinstance(mesh, ActorMesh):
        await asyncio.wrap_future(mesh._sent)  # its procs have started: addresses known
        addrs = [mesh._addr_of(g) for g in mesh._ranks]
    else:
        await asyncio.wrap_future(mesh._started)
        addrs = [h.addr for h in mesh._handles()]
    one = Shape.from_sizes({})
    calls = [
        getattr(mesh_ref("__proc__", ProcControl, one, {0: addr}), method).call_one(*args)
        for addr in addrs
    ]
    return list(await asyncio.gather(*calls))


async def actor_mesh_stats(mesh: ActorMesh[Any]) -> ValueMesh[dict[str, Any]]:
    """Per actor of ``mesh``: its record and its proc's (``"proc"``)."""
    values = []
    for record in await _ask(mesh, "stats", [mesh._wire]):
        actor = record["actors"].get(mesh._wire) or {"actor": None, "gone": True}
        values.append({**actor, "proc": record["proc"]})
    return ValueMesh(mesh._shape, values)


async def proc_mesh_stats(procs: ProcMesh) -> ValueMesh[dict[str, Any]]:
    """Per proc: its record, with the records of the actors in it (``"actors"``)."""
    got = await _ask(procs, "stats", None)
    values = [{**r["proc"], "actors": list(r["actors"].values())} for r in got]
    return ValueMesh(procs._shape, values)


async def stacks_of(mesh: ActorMesh[Any] | ProcMesh) -> ValueMesh[list[dict[str, Any]]]:
    """Per proc under ``mesh``: the stack of every thread and running async endpoint."""
    return ValueMesh(mesh._shape, await _ask(mesh, "stacks"))
