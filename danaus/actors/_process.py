"""The actor layer's state in this process, held by one object, :data:`process` (as trio
keeps its run's state in one run context): what every runtime of the process shares.

It holds the runtime of each event loop and danaus's background loop (``_loops``), the
checks every runtime runs on its heartbeat (``Runtime``), when each running endpoint is
next to be reported stuck (``_handlers.check_stuck``) and the last CPU sample a proc's
record was taken from (``_stats``). What the process knows of its peers is the ``peers``
object's (``_peers``). The layer's other module-level state, listed by
``scripts/process_state.py``, is to move here; a forked proc starts with a copy of it, as
it does of every module's.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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

    def __repr__(self) -> str:
        return f"<ActorProcess runtimes={len(self.runtimes)} background={self.background}>"


#: this process's
process = ActorProcess()
