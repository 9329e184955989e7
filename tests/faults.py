"""Fault injection for the tests: kill or freeze a proc, drop a connection, delay a peer.

Each helper acts on real processes and sockets; none of them sleeps.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from danaus.actors._runtime import current_runtime


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


def danaus_children(parent: int) -> list[int]:
    """Pids of the live (non-zombie) danaus procs whose parent is ``parent``: one look."""
    out = []
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
        if int(fields[1]) == parent and fields[0] != "Z" and b"danaus.actors._proc" in cmd:
            out.append(int(d))
    return out
