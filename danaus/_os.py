"""What danaus asks of the operating system for this process: to die with its parent,
how long it has run, and to give back the memory malloc holds freed (Linux; elsewhere,
nothing and None)."""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
from collections.abc import Callable

__all__ = ["die_with_parent", "process_uptime", "trim_malloc"]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel kill this process when its parent dies (Linux's
    ``PR_SET_PDEATHSIG``); exit at once where the parent ``parent_pid`` is gone already."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            PR_SET_PDEATHSIG = 1
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except OSError:
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def process_uptime() -> float | None:
    """Seconds since this process started (from /proc); None where that is unknown."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            boot_seconds = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(boot_seconds - start_ticks / _TICKS, 0.0)


def trim_malloc() -> None:
    """Give the memory glibc's malloc holds freed back to the OS (``malloc_trim(0)``):
    freed blocks under its mmap threshold (up to 32 MiB) otherwise stay in the heap,
    resident. A no-op where the C library is not glibc."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return trim
