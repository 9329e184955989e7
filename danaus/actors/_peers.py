"""What this process knows of its peers besides their connections, and how a lost peer
is told to whoever waited on it.

:data:`peers` (a :class:`Peers`) is the one owner of that knowledge, shared by every
runtime of the process and changed only through its methods: the keys of peers that
authenticate with another key, and the readiness and the exit status of the procs this
process spawned (set by the spawner, read by runtimes on other loops' threads). When a
connection is lost, the calls pending on it fail here with a
:class:`~danaus.errors.SupervisionError` that says why, waiting a moment for a spawned
proc's exit status when that names the cause better; the runtime owns the connections
and the ports those errors go to.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from concurrent.futures import Future as ThreadFuture
from typing import TYPE_CHECKING

from ..errors import AuthenticationError, ProtocolError, SupervisionError, actor_failed
from ._cast import SkipOnLoss
from ._wire import ERROR

if TYPE_CHECKING:
    from ._connection import Connection
    from ._runtime import Runtime

__all__ = [
    "Peers",
    "fail_pending",
    "fail_pending_after_exit",
    "peer_lost_error",
    "peers",
]

#: When the connection to a proc we spawned breaks while the proc is exiting, its calls
#: wait this long (s) for the exit status, which names the cause ("killed by SIGKILL")
#: better than "connection reset". An exiting process is reaped within moments; one
#: still alive after this is reported as unreachable. Not a setting: it only shapes the
#: error message, and only delays failing calls that are failing anyway.
_EXIT_STATUS_WAIT = 0.5


class Peers:
    """What this process knows of its peers besides their connections: one per process
    (:data:`peers`), shared by its runtimes.

    It holds, by peer address: the key of a peer that authenticates with another key
    than this process's runtimes (host agents attached after those started,
    ``attach_to_hosts``, and the procs they started for us); and, for the procs this
    process spawned, their readiness (a thread-safe future, so that a runtime on another
    loop can wait for a proc before dialing it), their exit status and why they are gone.
    Its dicts change one operation at a time (each atomic under the GIL), so runtimes on
    any thread may call its methods.
    """

    def __init__(self) -> None:
        self._keys: dict[str, bytes] = {}
        self._ready: dict[str, ThreadFuture[None]] = {}
        self._exit_reason: dict[str, Callable[[], str | None]] = {}
        self._exited: dict[str, ThreadFuture[int]] = {}

    def __repr__(self) -> str:
        return f"<Peers {len(self._keys)} keys, {len(self._ready)} spawned procs>"

    # keys
    def set_key(self, addr: str, key: bytes) -> None:
        """Connections with the peer at ``addr`` authenticate with ``key``."""
        self._keys[addr] = key

    def key_of(self, addr: str) -> bytes | None:
        """The key given for the peer at ``addr`` (:meth:`set_key`); None: the runtime's."""
        return self._keys.get(addr)

    # procs this process spawns
    def expect(self, addr: str) -> ThreadFuture[None]:
        """A proc this process spawns will listen at ``addr``: its readiness, a fresh
        future (in place of an earlier proc's at that address), which resolves when it
        connects (:meth:`ready`) and which dials to ``addr`` wait for."""
        fut: ThreadFuture[None] = ThreadFuture()
        self._ready[addr] = fut
        return fut

    def ready(self, addr: str) -> None:
        """A connection with ``addr`` opened: if it is a proc we spawned, it is up."""
        fut = self._ready.get(addr)
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def wait_ready(self, addr: str) -> None:
        """Return once the proc at ``addr`` is up, if we spawned it and it is not yet
        (raises as its readiness does: it never came up); at once otherwise."""
        fut = self._ready.get(addr)
        if fut is not None and not fut.done():
            await asyncio.wrap_future(fut)

    def spawned(
        self, addr: str, exited: ThreadFuture[int], exit_reason: Callable[[], str | None]
    ) -> None:
        """The proc at ``addr`` was started here: ``exited`` resolves with its exit
        status, ``exit_reason()`` says why it is gone (None while it runs)."""
        self._exit_reason[addr] = exit_reason
        self._exited[addr] = exited

    def exit_status(self, addr: str) -> ThreadFuture[int] | None:
        """Resolves with the exit status of the proc we spawned at ``addr`` (None: not
        one of ours)."""
        return self._exited.get(addr)

    def exit_reason(self, addr: str) -> str | None:
        """Why the proc we spawned at ``addr`` is gone ("killed by SIGKILL"); None while it
        runs, or if it is not one of ours."""
        describe = self._exit_reason.get(addr)
        return None if describe is None else describe()

    def forget(self, addrs: Iterable[str]) -> None:
        """Drop what is known of procs we spawned that are gone for good (their mesh was
        stopped). Keys stay: they are the job's, not one proc's."""
        for addr in addrs:
            self._ready.pop(addr, None)
            self._exit_reason.pop(addr, None)
            self._exited.pop(addr, None)


#: The one :class:`Peers` of this process.
peers = Peers()


def peer_lost_error(peer: str, cause: BaseException | None, rank: int = -1) -> SupervisionError:
    """The error of a call to ``rank`` (if known) at ``peer``, whose connection was lost
    for ``cause``: the exit reason of a proc we spawned, if it is known."""
    why = None if isinstance(cause, SupervisionError) else peers.exit_reason(peer)
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
