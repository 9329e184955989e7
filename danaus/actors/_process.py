"""The actor layer's state in this process, held by one object, :data:`process` (as trio
keeps its run's state in one run context): what every runtime of the process shares.

It holds the runtime of each event loop and danaus's background loop (``_loops``), the
checks every runtime runs on its heartbeat (``Runtime``), when each running endpoint is
next to be reported stuck (``_handlers.check_stuck``), the last CPU sample a proc's
record was taken from (``_stats``), the debugger's state in this process
(``_debugging``: the proc's hook, the sessions open per actor, the runtimes watched), the
job's key (``job_key``), the TLS contexts (``_address``) and the tracer (``_telemetry``). What the process knows of its peers is the ``peers``
object's (``_peers``). The layer's other module-level state, listed by
``scripts/process_state.py``, is to move here; a forked proc starts with a copy of it, as
it does of every module's.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..config import config

if TYPE_CHECKING:
    import ssl

    from opentelemetry.trace import Tracer

    from ._context import ActorContext
    from ._loops import Background
    from ._runtime import Runtime

__all__ = ["ActorProcess", "process"]


class ActorProcess:
    """The actor layer's state in this process (see the module)."""

    def __init__(self) -> None:
        #: the runtime of each event loop (a loop that goes away takes its entry along)
        self.runtimes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Runtime] = (
            weakref.WeakKeyDictionary()
        )
        self.runtimes_lock = threading.Lock()
        #: danaus's background loop and its runtime, started on first use
        self.background: Background | None = None
        self.background_lock = threading.Lock()
        #: the (loop, runtime) the last caller found: ``runtime_here``'s shortcut
        self.last: tuple[asyncio.AbstractEventLoop | None, Runtime | None] = (None, None)
        #: checks every runtime, present and future, runs on its heartbeat
        self.heartbeat_checks: list[Callable[[Runtime], None]] = []
        #: when each running endpoint is next reported stuck (s running), by
        #: (runtime id, actor key, endpoint, when it started)
        self.stuck_next: dict[tuple[int, str, str, float], float] = {}
        #: (pid, when, CPU seconds) of the last proc record: a forked proc starts its own
        self.last_cpu: list[float] = [-1, 0.0, 0.0]
        # the debugger (``_debugging``): in a proc, its runtime and who started it (where
        # sessions outside an actor go); each actor's open sessions, and when its last
        # one ended; the runtimes whose lost connections end sessions, with their callbacks
        self.debug_rt: Runtime | None = None
        self.debug_parent = ""
        self.debug_open: dict[str, int] = {}
        self.debug_ended: dict[str, float] = {}
        self.debug_lock = threading.Lock()
        self.debug_watching: weakref.WeakKeyDictionary[Runtime, Callable[[str], None]] = (
            weakref.WeakKeyDictionary()
        )
        #: the job's key (:meth:`job_key`): the controller's, handed down to its procs
        self._job_key: bytes | None = None
        #: the TLS context of each side (server: True), made once (``_address``)
        self.tls: dict[bool, ssl.SSLContext | None] = {}
        #: danaus's tracer, and whether this process's telemetry providers are installed
        #: (``_telemetry``), made under the lock
        self.tracer: Tracer | None = None
        self.tracer_installed = False
        self.tracer_lock = threading.Lock()
        #: True in a proc (a process a spawner started), False in a controller
        self.in_proc = False
        # what the mesh layer gives the actor context (``actor_instance.proc`` and
        # ``proc_mesh``, the controller's ``proc``), as proc meshes: set when it is imported
        self.proc_of_actor: Callable[[ActorContext], object] | None = None
        self.proc_mesh_of_actor: Callable[[ActorContext], object] | None = None
        self.controller_proc: Callable[[], object] | None = None

    def job_key(self) -> bytes:
        """The secret of this job, which every handshake proves (``danaus._auth``):
        ``config.auth_key`` (hex) when set, else a fresh random one, made on first use;
        a proc's is its controller's (:meth:`set_job_key`)."""
        key = self._job_key
        if key is None:
            key = bytes.fromhex(config.auth_key) if config.auth_key else secrets.token_bytes(32)
            self._job_key = key
        return key

    def set_job_key(self, key: bytes | None) -> None:
        """Adopt ``key`` as the job's: the one the controller hands down (a proc at its
        start), or a host agent's; None forgets it (the next :meth:`job_key` makes one)."""
        self._job_key = key

    def __repr__(self) -> str:
        return f"<ActorProcess runtimes={len(self.runtimes)} background={self.background}>"


#: this process's
process = ActorProcess()
