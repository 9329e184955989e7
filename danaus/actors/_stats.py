"""What every actor and proc is doing: counters kept as messages run, and records and
stacks read on demand (``mesh.stats()``, ``mesh.stacks()``; the records' fields are
in ``danaus._records``).

The counters cost a dict update per message; the rest is computed only when asked for.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING

from .._os import process_uptime
from .._records import ActorRecord, ProcRecord, StackEntry
from ._actor import is_long_running
from ._process import process

if TYPE_CHECKING:
    from ._instance import ActorInstance
    from ._runtime import Runtime

__all__ = [
    "ActorStats",
    "actor_record",
    "proc_record",
    "thread_stacks",
]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class ActorStats:
    """Counters of one actor: messages handled and failed per endpoint, the last failure."""

    __slots__ = ("errors", "handled", "last_failure")

    def __init__(self) -> None:
        self.handled: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.last_failure: str | None = None

    def failed(self, method: str, what: str) -> None:
        self.errors[method] = self.errors.get(method, 0) + 1
        self.last_failure = f"{method}: {what}"


def actor_record(inst: ActorInstance, now: float | None = None) -> ActorRecord:
    """One actor's record: its counters, mailbox depth, and the endpoints running now
    (with how long, in seconds)."""
    now = time.monotonic() if now is None else now
    running = [(method, round(now - since, 6)) for method, since in inst.running_calls()]
    st = inst.stats
    return {
        "actor": inst.ctx.actor_id,
        "mesh": inst.ctx.name,
        "rank": inst.rank,
        "handled": dict(st.handled),
        "errors": dict(st.errors),
        "last_failure": st.last_failure,
        "mailbox": inst.mailbox_depth(),
        "in_flight": len(running),
        "running": running,
        # (those of them that run as long as what they serve: never stuck)
        "long_running": [m for m, _ in running if is_long_running(inst.obj, m)],
        "failed": inst.failed,
        "stopped": inst.stopped,
    }


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def proc_record(rt: Runtime) -> ProcRecord:
    """This proc: pid, host, CPU % since the last record, RSS, connections, bytes."""
    now, cpu, pid = time.monotonic(), _cpu_seconds(), os.getpid()
    last_pid, then, cpu_then = process.last_cpu
    if last_pid != pid:  # the first record of this process: since it started
        then, cpu_then = now - max(process_uptime() or 1.0, 1e-3), 0.0
    process.last_cpu[:] = [pid, now, cpu]
    rss = 0
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * _PAGE
    except OSError:
        pass
    conns = [c for c in rt.conns.values() if c.transport is not None]
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "addr": rt.addr,
        "cpu_percent": round(100.0 * (cpu - cpu_then) / max(now - then, 1e-6), 1),
        "rss_bytes": rss,
        "connections": len(conns),
        "bytes_in": sum(c.bytes_in for c in rt.conns.values()),
        "bytes_out": sum(c.bytes_out for c in rt.conns.values()),
        "actors": len(rt.actors),
        "threads": threading.active_count(),
    }


def thread_stacks(rt: Runtime) -> list[StackEntry]:
    """The Python stack of every thread of this process, innermost frame last; a thread
    running an actor's endpoint says which (``actor``, ``endpoint``, ``seconds``)."""
    now = time.monotonic()
    running: dict[int, tuple[str, str, float]] = {}
    from ._instance import ActorInstance  # (it imports this module)

    for inst in list(rt.actors.values()):
        if not isinstance(inst, ActorInstance):
            continue  # one whose __init__ raised: it runs nothing
        for ident, method, since in inst.running_threads():
            running[ident] = (inst.ctx.actor_id, method, round(now - since, 6))
    names = {t.ident: t.name for t in threading.enumerate()}
    out: list[StackEntry] = []
    for ident, frame in sys._current_frames().items():  # noqa: SLF001 - the stdlib's
        entry: StackEntry = {
            "thread": names.get(ident, f"thread {ident}"),
            "stack": "".join(traceback.format_stack(frame)),
        }
        if ident in running:
            entry["actor"], entry["endpoint"], entry["seconds"] = running[ident]
        out.append(entry)
    return out
