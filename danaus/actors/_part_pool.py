"""The pool of large receive buffers, kept for reuse across frames and connections.

A large part of a frame (``POOLED_PART`` in :mod:`~danaus.actors._frame_reader`) is received
into a buffer of its own; once nothing but the pool refers to such a buffer, a later
part of the same size is received into it rather than into fresh memory. This module owns the pool (one
per process) and its trimming on the heartbeat; the frame reader
(:mod:`~danaus.actors._frame_reader`) takes buffers from it and gives them back.
"""

from __future__ import annotations

import sys
import time

__all__ = ["PartPool", "part_pool", "trim_part_pool"]


class PartPool:
    """Keeps large receive buffers for reuse once nothing but the pool refers to them.

    Fresh memory costs a page fault per 4 KiB on first touch (0.5-0.7 GB/s here), so a
    64 MiB part received into reused memory arrives several times faster. Buffers not
    reused for ``idle`` seconds go back to the system (:meth:`trim`, on each heartbeat).
    """

    def __init__(self, max_bytes: int = 512 << 20, idle: float = 10.0) -> None:
        self._bufs: list[bytearray] = []
        self._used: list[float] = []  # when each buffer was last handed out
        self._max = max_bytes
        self._idle = idle

    def reuse(self, n: int) -> bytearray | None:
        """A free pooled buffer of exactly ``n`` bytes, if there is one."""
        bufs = self._bufs
        for i in range(len(bufs)):  # (enumerate's cached tuple would hold a reference)
            b = bufs[i]
            # 3 = this list, the local ``b``, getrefcount's argument.
            if len(b) == n and sys.getrefcount(b) <= 3:
                self._used[i] = time.monotonic()
                return b
        return None

    def keep(self, b: bytearray) -> None:
        """Pool ``b`` (a large buffer just filled) for later parts of its size."""
        if any(x is b for x in self._bufs):
            return
        total = sum(len(x) for x in self._bufs)
        while self._bufs and total + len(b) > self._max:
            total -= len(self._bufs.pop(0))
            self._used.pop(0)
        self._bufs.append(b)
        self._used.append(time.monotonic())

    def trim(self) -> None:
        """Let go of buffers that nobody used lately."""
        if not self._bufs:
            return
        cutoff = time.monotonic() - self._idle
        keep = [i for i, t in enumerate(self._used) if t >= cutoff]
        self._bufs = [self._bufs[i] for i in keep]
        self._used = [self._used[i] for i in keep]


#: The process's pool (every connection's reader shares it).
part_pool = PartPool()


def trim_part_pool() -> None:
    """Give idle pooled receive buffers back to the system (called every heartbeat)."""
    part_pool.trim()
