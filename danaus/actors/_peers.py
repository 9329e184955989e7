"""What this process knows of its peers besides their connections, and how a lost peer
is told to whoever waited on it.

The registries below are shared by every runtime of the process: the keys of peers that
authenticate with another key, the readiness and the exit status of the procs this
process spawned (set by the spawner, thread-safe). When a connection is lost, the
calls pending on it fail here with a :class:`~danaus.errors.SupervisionError` that says
why, waiting a moment for a spawned proc's exit status when that names the cause
better; the runtime owns the connections and the ports those errors go to.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future as ThreadFuture
from typing import TYPE_CHECKING

from ..errors import AuthenticationError, ProtocolError, SupervisionError, actor_failed
from ._cast import SkipOnLoss
from ._wire import ERROR

if TYPE_CHECKING:
    from ._connection import Connection
    from ._runtime import Runtime

__all__ = [
    "fail_pending",
    "fail_pending_after_exit",
    "peer_exit_reason",
    "peer_exited",
    "peer_keys",
    "peer_lost_error",
    "proc_ready",
]

#: When the connection to a proc we spawned breaks while the proc is exiting, its calls
#: wait this long (s) for the exit status, which names the cause ("killed by SIGKILL")
#: better than "connection reset". An exiting process is reaped within moments; one
#: still alive after this is reported as unreachable. Not a setting: it only shapes the
#: error message, and only delays failing calls that are failing anyway.
_EXIT_STATUS_WAIT = 0.5

#: Peers that authenticate with another key than this process's runtimes: host agents
#: attached after those started (``attach_to_hosts``), and the procs they started for
#: us. Address -> key. Connections dialed to them use that key.
peer_keys: dict[str, bytes] = {}

#: Readiness of procs being spawned, by address; set by the runtime that spawned them
#: (thread-safe, so a runtime on another loop can wait for a proc before dialing it).
proc_ready: dict[str, ThreadFuture[None]] = {}
#: For procs this process spawned: a callable telling why the proc is gone, if it is.
peer_exit_reason: dict[str, Callable[[], str | None]] = {}
#: For procs this process spawned: resolves with the exit status when the proc exits.
peer_exited: dict[str, ThreadFuture[int]] = {}


def peer_lost_error(peer: str, cause: BaseException | None, rank: int = -1) -> SupervisionError:
    """The error of a call to ``rank`` (if known) at ``peer``, whose connection was lost
    for ``cause``: the exit reason of a proc we spawned, if it is known."""
    why = None
    describe = peer_exit_reason.get(peer)
    if describe is not None and not isinstance(cause, SupervisionError):
        why = describe()
    if why is None:
        if isinstance(cause, SupervisionError):
            why = str(cause)
        elif isinstance(cause, (ProtocolError, AuthenticationError)):
            # we closed it: what the peer (or someone between us) sent failed a check
            why = f"the connection was closed: {cause}"
        elif cause:
            why = f"connection lost ({type(cause).__name__}: {cause})"
        else:
            why = "connection lost"
    if rank >= 0:  # a call to the actor of that rank there, which went with its proc
        err = SupervisionError(actor_failed(f"of rank {rank} at {peer}", f"its proc failed: {why}"))
        err.lost = (rank, f"its proc failed: {why}")  # the mesh layer names the actor
        return err
    return SupervisionError(f"proc at {peer} failed: {why}")


def fail_pending(rt: Runtime, conn: Connection, pending: dict[int, int | list[int]]) -> None:
    """Fail the calls that were ``pending`` on the lost ``conn`` (their ports are ``rt``'s)."""
    for port, ranks in pending.items():
        for rank in ranks if isinstance(ranks, list) else (ranks,):
            rt.deliver(
                port,
                rank,
                ERROR,
                peer_lost_error(conn.peer or "(unknown)", conn.close_reason, rank),
            )
        if isinstance(ranks, SkipOnLoss):
            ranks.send_skips(rt)


async def fail_pending_after_exit(
    rt: Runtime, conn: Connection, pending: dict[int, int | list[int]], exited: ThreadFuture[int]
) -> None:
    """:func:`fail_pending`, once the proc at the peer has exited (its exit status names
    the cause) or after ``_EXIT_STATUS_WAIT`` (alive but unreachable)."""
    try:
        await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(exited)), _EXIT_STATUS_WAIT)
    except TimeoutError:
        pass  # alive but unreachable: say so
    finally:
        fail_pending(rt, conn, pending)
