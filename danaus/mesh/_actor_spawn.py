"""Spawning an actor mesh: the ``Spawn`` message to each proc of a group (once the procs
have started and their addresses are known), and the replies that settle the mesh's
``initialized`` future or mark the ranks whose ``__init__`` (or proc) failed. What
``ProcMesh.spawn`` does once it has checked the class and the name."""

from __future__ import annotations

import itertools
import os
import secrets
import time
from concurrent.futures import Future as ThreadFuture
from typing import TypeVar

from ..actors.seam import (
    ERROR,
    Actor,
    Runtime,
    current_runtime,
    dumps,
    run_on,
    spawn_creators,
)
from ..config import config
from ..errors import ActorError, SupervisionError
from ..geometry import Point, Shape
from ._actor_mesh import ActorMesh
from ._proc_group import ProcGroup, ensure_supervisor
from ._process import process
from ._supervision import MeshState, StuckReport, current_owner, report_stuck

__all__ = ["spawn_actor_mesh"]

A = TypeVar("A", bound=Actor)


def _new_token() -> None:
    """In a forked child, this process's part of the wire keys of the actors it spawns
    ("name.token.n") is drawn again (``process.spawn_token``, random), so that actors
    spawned by different procs (forked from one fork server, say) into the same proc
    never share a key."""
    process.spawn_token = secrets.token_hex(4)
    process.spawn_ids = itertools.count()


os.register_at_fork(after_in_child=_new_token)


def spawn_actor_mesh(
    group: ProcGroup,
    shape: Shape,
    name: str,
    actor_cls: type[A],
    args: tuple[object, ...],
    kwargs: dict[str, object],
) -> ActorMesh[A]:
    """One ``actor_cls`` actor in each proc of ``group`` that ``shape`` (the whole
    group's, or a slice's) selects."""
    encoded = dumps(
        (actor_cls, args, kwargs), lambda: f"actor class {actor_cls.__name__} and its arguments"
    )
    rt = current_runtime()
    init: ThreadFuture[None] = ThreadFuture()
    sent: ThreadFuture[None] = ThreadFuture()
    ranks = shape.global_ranks()
    creators = spawn_creators()  # who spawns: this actor (or the root), now
    wire = f"{name}.{process.spawn_token}.{next(process.spawn_ids)}"
    errors: list[BaseException] = []
    left = [len(ranks)]
    state = MeshState(
        name,
        group.shape,
        current_owner(),
        frozenset(ranks),
        group.name,
        f"{actor_cls.__module__}.{actor_cls.__qualname__}",
    )
    group.add(wire, state)

    replied: set[int] = set()

    def on_reply(rank: int, status: int, value: object) -> bool:
        replied.add(rank)
        if rank < 0:  # this runtime closed before every proc answered (Runtime.aclose)
            if not init.done():
                init.set_exception(
                    value if isinstance(value, BaseException) else SupervisionError(str(value))
                )
            return True
        if status == ERROR:
            err = value if isinstance(value, BaseException) else SupervisionError(str(value))
            errors.append(err)
            kind = "init" if isinstance(err, ActorError) else "proc"
            state.fail([rank], str(err), kind)
        left[0] -= 1
        if left[0] == 0:
            if errors:
                init.set_exception(errors[0])
            else:
                init.set_result(None)
            return True
        return False

    def send() -> None:
        from ._controllers import ensure_controllers

        ensure_controllers(rt)  # the actors' get_or_spawn_controller requests come here
        ensure_supervisor(rt)  # and their failures and stuck endpoints
        port = rt.open_port(on_reply)
        sizes = group.shape.sizes
        all_addrs = group.addrs()
        for r in ranks:
            addr = all_addrs[r]
            if not addr:  # the proc never started
                err = SupervisionError(f"proc {group.handles[r]} did not start")
                rt.deliver(port, r, ERROR, err)
                continue
            rt.spawn(addr, port, r, wire, group.name, sizes, encoded, all_addrs, creators)
        sent.set_result(None)
        _watch_init(rt, init, replied, group, name, ranks)

    # Remote procs learn their addresses from their host agent: spawn once they have.
    group.started.add_done_callback(lambda _: run_on(rt, send))
    return ActorMesh(name, wire, actor_cls, shape, None, init, rt, group, sent, state)


#: what a report of an ``__init__`` that runs on its proc's event loop says of its stack
LOOP_INIT = (
    "(not available: this actor has async endpoints, so its __init__ runs on its proc's "
    "event loop, which it holds until it returns; `danaus debug` or py-spy can show it)"
)


def _watch_init(
    rt: Runtime,
    init: ThreadFuture[None],
    replied: set[int],
    group: ProcGroup,
    name: str,
    ranks: list[int],
) -> None:
    """Report each actor whose ``__init__`` has not returned after ``stuck_warn_after``
    (again at twice as long, and so on), as a stuck endpoint is reported. An actor whose
    endpoints are all sync runs ``__init__`` on its thread, and its proc reports it with
    its stack; one with async endpoints runs it on its proc's loop, which then reports
    nothing: the spawner does, a little later than the proc would have."""
    after = config.stuck_warn_after
    if after <= 0:
        return
    start = time.monotonic()

    def check(wait: float) -> None:
        if init.done():
            return
        told = {m.actor_id for _, m in process.stuck_reports if m.endpoint == "__init__"}
        running = round(time.monotonic() - start, 3)
        for r in ranks:
            actor_id = f"{group.name}[{r}].{name}[{r}]"
            if r in replied or actor_id in told:
                continue  # done, or its proc told (with the stack)
            point = str(Point.from_rank(r, group.shape.sizes))
            report_stuck(StuckReport(actor_id, name, point, "__init__", running, LOOP_INIT))
        rt.loop.call_later(wait, check, 2 * wait)

    first = after + 2 * config.heartbeat_interval
    rt.loop.call_later(first, check, first)
