"""``setup_torch_elastic_env``: torchrun's environment in every proc of a mesh."""

from __future__ import annotations

import itertools
import uuid
from typing import TYPE_CHECKING, Any

from ..actors.seam import Future, current_runtime, run_task
from ._actor import SPMDActor

if TYPE_CHECKING:
    from ..mesh import ProcMesh

_names = itertools.count()


def _check(master_addr: str | None, master_port: int | None) -> None:
    if (master_addr is None) != (master_port is None):
        raise ValueError(
            "give both master_addr and master_port, or neither (then rank 0's host and a "
            f"free port there are used); got master_addr={master_addr!r}, "
            f"master_port={master_port!r}"
        )


async def _setup(
    procs: ProcMesh, master_addr: str | None, master_port: int | None, use_ipaddr: Any
) -> tuple[Any, str, int, str]:
    """Spawn an ``SPMDActor`` per proc and set the variables: (actors, addr, port, run id)."""
    actors = procs.spawn(f"_spmd{next(_names)}", SPMDActor)
    if master_addr is None or master_port is None:
        first = actors.slice(**dict.fromkeys(procs.sizes, 0))
        master_addr, master_port = await first.get_host_port.call_one(use_ipaddr)
    run_id = uuid.uuid4().hex
    await actors.setup_env.call(master_addr, master_port, run_id)
    return actors, master_addr, master_port, run_id


def setup_torch_elastic_env(
    procs: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: Any = None,
) -> None:
    """Set torchrun's variables in every proc of ``procs`` and return once they are set.

    ``RANK`` is the proc's linear rank, ``LOCAL_RANK`` its coordinate in the mesh's last
    dim (the procs of one host), ``GROUP_RANK`` the host's index; ``MASTER_ADDR`` and
    ``MASTER_PORT`` are rank 0's host and a free port there unless both are given. Actors
    then call ``torch.distributed.init_process_group()`` (gloo or NCCL) themselves. Call
    it again after respawning a mesh. In async code use
    :func:`setup_torch_elastic_env_async` (this blocks, as Monarch's does).
    """
    _check(master_addr, master_port)
    setup_torch_elastic_env_async(procs, master_addr, master_port, use_ipaddr).get()


def setup_torch_elastic_env_async(
    procs: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: Any = None,
) -> Future[None]:
    """:func:`setup_torch_elastic_env`, as a future: ``await`` it (or ``.get()``)."""
    _check(master_addr, master_port)

    async def go() -> None:
        actors, *_ = await _setup(procs, master_addr, master_port, use_ipaddr)
        await actors.stop()  # (the variables are set: the actors that set them can go)

    return run_task(current_runtime(), go)
