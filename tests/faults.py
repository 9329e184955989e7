"""Fault injection for the tests: kill or freeze a proc, drop a connection, delay a peer.

Each helper acts on real processes and sockets; none of them sleeps.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from danaus.actors._loops import current_runtime
from danaus.mesh import MeshFailure


def kill(procs: Any, rank: int, sig: int = signal.SIGKILL) -> int:
    """Send ``sig`` to the proc at linear ``rank`` of ``procs``; returns its pid."""
    pid = int(procs.pids[rank])
    os.kill(pid, sig)
    return pid


def freeze(procs: Any, rank: int) -> int:
    """SIGSTOP a proc: alive at the socket level, but it answers nothing."""
    return kill(procs, rank, signal.SIGSTOP)


def thaw(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def drop_connection(addr: str) -> None:
    """Abort this runtime's connection to ``addr`` (as if the network dropped it)."""
    conn = current_runtime().conns.get(addr)
    if conn is None or conn.transport is None:
        raise LookupError(f"no open connection to {addr}")
    conn.transport.abort()


def delay_reads(addr: str) -> Any:
    """Stop reading from ``addr`` until the returned function is called (a slow peer)."""
    conn = current_runtime().conns[addr]
    token = object()
    conn.hold_reading(token)
    return lambda: conn.release_reading(token)


def _process_table() -> list[tuple[int, int, str, bytes]]:
    """(pid, parent pid, state, command line) of every process: one look at /proc."""
    rows = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        rows.append((int(d), int(fields[1]), fields[0], cmd))
    return rows


def danaus_procs(spawner: int, servers: bool = False) -> list[int]:
    """Pids of the live (non-zombie) danaus procs that process ``spawner`` started, however
    they were started (exec: its children; fork: children of its fork server) and wherever
    they were reparented since; with ``servers``, its fork servers too."""
    rows = _process_table()
    tag = f"--parent-pid\0{spawner}\0".encode()
    exec_procs = {
        p
        for p, _, st, cmd in rows
        if st != "Z" and b"danaus.actors._proc_main" in cmd and tag in cmd
    }
    forked = {
        p: pp
        for p, pp, st, cmd in rows
        if st != "Z" and b"danaus.mesh._procs.forkserver" in cmd and tag in cmd
    }
    # A fork server's children run its command line too: the server is the one whose
    # parent is not a fork server of the same spawner.
    found = [p for p, pp in forked.items() if servers or pp in forked]
    return sorted(exec_procs | set(found))


def danaus_children(parent: int) -> list[int]:
    """Pids of the live (non-zombie) danaus procs that ``parent`` started: one look."""
    return danaus_procs(parent)


class Failures(list[MeshFailure]):
    """Failures that reach the controller's fault hook (the ``failures`` fixture
    installs one); ``await failures.first()`` waits for the first, with a deadline."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived = asyncio.Event()

    def __call__(self, failure: MeshFailure) -> None:
        self.append(failure)
        self.arrived.set()

    async def first(self, deadline: float = 10) -> MeshFailure:
        async with asyncio.timeout(deadline):
            await self.arrived.wait()
        return self[0]
