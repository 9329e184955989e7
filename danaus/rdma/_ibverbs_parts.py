"""Parts of the ``ibverbs`` backend that stand on their own: the reader's cache of local
memory regions, the completion-queue poller thread, and memory views as raw addresses."""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import RDMABufferError, RDMATransferError
from . import _verbs
from ._verbs import Completion, Device, MemoryRegion

__all__ = ["LocalMR", "LocalRegions", "Poller", "address", "byte_view"]

_POLL_BATCH = 64
_SPIN_POLLS = 64  # empty polls that only yield the GIL before the poller starts sleeping
_MAX_POLL_SLEEP = 1e-3


@dataclass(eq=False)
class LocalMR:
    """A reader-side registration of local memory, cached.

    ``view`` keeps the memory alive, and so at the same address mapping the same pages,
    for as long as the region exists: a freed and reused address would otherwise leave the
    region pinning the old pages.
    """

    key: tuple[int, int, int]
    region: MemoryRegion
    view: memoryview
    inuse: int = 0


class LocalRegions:
    """The reader's registrations of its own memory, kept for reuse (most recently used
    last); at most ``size`` idle ones stay registered."""

    def __init__(
        self, device: Device, size: int, deregister: Callable[[MemoryRegion], None]
    ) -> None:
        self._device = device
        self._size = size
        self._deregister = deregister
        self.entries: collections.OrderedDict[tuple[int, int, int], LocalMR] = (
            collections.OrderedDict()
        )

    def __len__(self) -> int:
        return len(self.entries)

    def acquire(self, view: memoryview, addr: int, need: int) -> LocalMR:
        n = view.nbytes
        access = 0 if view.readonly else _verbs.ACCESS_LOCAL_WRITE
        entry = self.entries.get((addr, n, access))
        if entry is None:  # a larger region holding this range will do
            for e in self.entries.values():
                r = e.region
                if r.addr <= addr and addr + n <= r.addr + r.length and r.access & need == need:
                    entry = e
                    break
        if entry is None:
            try:
                region = self._device.register(addr, n, access)
            except Exception as e:
                raise RDMATransferError(
                    f"registering {n} bytes of local memory at {addr:#x} failed: {e}"
                ) from e
            entry = LocalMR((addr, n, access), region, view)
            self.entries[entry.key] = entry
        self.entries.move_to_end(entry.key)
        entry.inuse += 1
        self.evict()
        return entry

    def evict(self) -> None:
        """Deregister the least recently used idle regions past the cache size."""
        while len(self.entries) > self._size:
            victim = next((e for e in self.entries.values() if e.inuse == 0), None)
            if victim is None:
                return
            del self.entries[victim.key]
            self._deregister(victim.region)

    def clear(self) -> None:
        """Deregister every region (the backend is closing)."""
        for entry in self.entries.values():
            self._deregister(entry.region)
        self.entries.clear()


class Poller:
    """Polls the completion queue on a thread and hands completions to the event loop.

    It polls only while work requests are outstanding (``expect``); when the queue is
    empty it yields the GIL, then sleeps a little longer each time, up to 1 ms.
    """

    def __init__(
        self,
        device: Device,
        loop: asyncio.AbstractEventLoop,
        deliver: Callable[[list[Completion]], None],
        on_error: Callable[[BaseException], None],
    ) -> None:
        self._device = device
        self._loop = loop
        self._deliver = deliver
        self._on_error = on_error
        self._cond = threading.Condition()
        self._expected = 0
        self._stopping = False
        self._thread = threading.Thread(
            target=self._run, daemon=True, name=f"danaus-ibverbs-cq-{device.name}"
        )
        self._thread.start()

    def expect(self, n: int) -> None:
        with self._cond:
            self._expected += n
            if self._expected > 0:
                self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def join(self) -> None:
        self._thread.join()

    def _run(self) -> None:
        idle = 0
        while True:
            with self._cond:
                while self._expected <= 0 and not self._stopping:
                    self._cond.wait()
                    idle = 0
                if self._stopping:
                    return
            try:
                completions = self._device.poll_cq(_POLL_BATCH)
            except Exception as e:
                self._call(self._on_error, e)
                return
            if completions:
                idle = 0
                with self._cond:
                    self._expected -= len(completions)
                if not self._call(self._deliver, completions):
                    return
            else:
                idle += 1
                time.sleep(
                    0
                    if idle < _SPIN_POLLS
                    else min(_MAX_POLL_SLEEP, 2e-5 * (idle - _SPIN_POLLS + 1))
                )

    def _call(self, fn: Callable[[Any], None], arg: Any) -> bool:
        try:
            self._loop.call_soon_threadsafe(fn, arg)
        except RuntimeError:  # the loop is closed: nobody is left to tell
            return False
        return True


def byte_view(view: memoryview) -> memoryview:
    if not isinstance(view, memoryview):
        view = memoryview(view)
    if not view.c_contiguous:
        raise RDMABufferError("ibverbs transfers need C-contiguous memory")
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    return view


def address(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)
