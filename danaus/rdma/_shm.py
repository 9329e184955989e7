"""The ``shm`` backend: procs on one host.

One-sided: the reader copies straight out of (or into) the owner's memory with
``process_vm_readv``/``process_vm_writev``, at memcpy speed, while the owner's event loop
does nothing. Around each transfer it reads the buffer's validity word in the owner, so
a buffer dropped before or during the transfer is reported, not silently read.

Where ptrace rules forbid that between these two processes (Yama ``ptrace_scope``), it
falls back to a shared-memory segment: the owner copies into it and the reader out of it
(two copies, and the owner's loop does one).
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import logging
from collections.abc import Awaitable
from multiprocessing import shared_memory
from typing import TYPE_CHECKING, Any

from ..errors import RDMABufferDroppedError, RDMAOwnerError, RDMATransferError
from ._backend import Backend
from ._handle import BufferHandle
from ._memory import read_word, vm_available, vm_copy

if TYPE_CHECKING:
    from ._manager import RDMAManager

log = logging.getLogger("danaus.rdma")

#: transfers at least this large run in a thread, off the event loop
OFFLOAD_BYTES = 1 << 20
#: the shared-memory fallback moves at most this much per round trip
SEGMENT_BYTES = 16 << 20
#: transfers at least this large are copied in parts at once (``copy_threads()``)
SPLIT_BYTES = 8 << 20


def copy_threads() -> int:
    """How many threads copy one large transfer: ``config.rdma_copy_threads``, else (0)
    as many as this process may run on, at most 4."""
    import os

    from ..config import config

    if config.rdma_copy_threads > 0:
        return config.rdma_copy_threads
    return max(1, min(4, len(os.sched_getaffinity(0))))


async def _uncancellable(work: Awaitable[None]) -> None:
    """Await ``work`` (a copy in a thread, which cannot be stopped); when cancelled, let it
    end first, so that nothing writes into the caller's memory after the transfer failed."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        if not task.cancelled():
            task.exception()  # the caller stopped waiting: its outcome is nobody's now
        raise


def _addr(view: memoryview) -> int:
    import numpy as np

    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data) if view.nbytes else 0


class ShmBackend(Backend):
    name = "shm"

    def __init__(self, mgr: RDMAManager) -> None:
        self.mgr = mgr
        self._vm_ok: dict[int, bool] = {}  # owner pid -> may we process_vm_* it?
        self._segments: dict[str, shared_memory.SharedMemory] = {}  # owner -> our segment
        self._attached: dict[str, shared_memory.SharedMemory] = {}  # owner side: theirs
        self._locks: dict[str, asyncio.Lock] = {}

    @classmethod
    def probe(cls) -> str | None:
        return vm_available()

    def reaches(self, handle: BufferHandle) -> bool:
        return handle.host == self.mgr.host

    # ------------------------------------------------------------ one-sided path

    def _vm_allowed(self, handle: BufferHandle) -> bool:
        ok = self._vm_ok.get(handle.owner_pid)
        if ok is None:
            try:
                read_word(handle.owner_pid, handle.valid_addr)
                ok = True
            except OSError as e:
                if e.errno == errno.ESRCH:
                    raise RDMAOwnerError(
                        f"the owner of buffer {handle.buf_id} ({handle.owner}, "
                        f"pid {handle.owner_pid}) is gone"
                    ) from None
                ok = False
                log.warning(
                    "rdma shm: process_vm_readv of pid %d refused (%s); using a "
                    "shared-memory segment instead",
                    handle.owner_pid,
                    e,
                )
            self._vm_ok[handle.owner_pid] = ok
        return ok

    def _check_valid(self, handle: BufferHandle, when: str) -> None:
        try:
            word = read_word(handle.owner_pid, handle.valid_addr)
        except OSError as e:
            raise RDMAOwnerError(
                f"the owner of buffer {handle.buf_id} ({handle.owner}) is gone ({e})"
            ) from None
        if word != handle.buf_id:
            raise RDMABufferDroppedError(
                f"buffer {handle.buf_id} of {handle.owner} was dropped {when} the transfer"
            )

    def _vm(
        self, handle: BufferHandle, offset: int, view: memoryview, write: bool, checked: bool = True
    ) -> None:
        if checked:
            self._check_valid(handle, "before")
        try:
            vm_copy(handle.owner_pid, _addr(view), handle.addr + offset, view.nbytes, write=write)
        except OSError as e:
            if e.errno == errno.ESRCH:
                raise RDMAOwnerError(
                    f"the owner of buffer {handle.buf_id} ({handle.owner}) died during the transfer"
                ) from None
            raise RDMATransferError(
                f"process_vm transfer from {handle.owner} failed: {e}"
            ) from None
        if checked:
            self._check_valid(handle, "during")

    async def _vm_split(
        self, handle: BufferHandle, offset: int, view: memoryview, write: bool
    ) -> None:
        """A large transfer as ``copy_threads()`` copies of its parts at once, each in a
        thread: one copy alone does not reach memory's bandwidth."""
        parts = copy_threads()
        self._check_valid(handle, "before")
        step = -(-view.nbytes // parts) + 4095 & ~4095  # page-aligned parts
        await asyncio.gather(
            *(
                asyncio.to_thread(self._vm, handle, offset + at, view[at : at + step], write, False)
                for at in range(0, view.nbytes, step)
            )
        )
        self._check_valid(handle, "during")

    def move_now(self, handle: BufferHandle, offset: int, view: memoryview, write: bool) -> bool:
        if view.nbytes >= OFFLOAD_BYTES or not self._vm_allowed(handle):
            return False
        self._vm(handle, offset, view, write)
        return True

    async def read(self, handle: BufferHandle, offset: int, dst: memoryview) -> None:
        await self._move(handle, offset, dst, write=False)

    async def write(self, handle: BufferHandle, offset: int, src: memoryview) -> None:
        await self._move(handle, offset, src, write=True)

    async def _move(self, handle: BufferHandle, offset: int, view: memoryview, write: bool) -> None:
        if not view.nbytes:
            return
        if self._vm_allowed(handle):
            if view.nbytes >= SPLIT_BYTES and copy_threads() > 1:
                await _uncancellable(self._vm_split(handle, offset, view, write))
            elif view.nbytes >= OFFLOAD_BYTES:
                await _uncancellable(asyncio.to_thread(self._vm, handle, offset, view, write))
            else:
                self._vm(handle, offset, view, write)
            return
        await self._segment_move(handle, offset, view, write)

    # ------------------------------------------------------------ fallback path

    async def _segment_move(
        self, handle: BufferHandle, offset: int, view: memoryview, write: bool
    ) -> None:
        lock = self._locks.setdefault(handle.owner, asyncio.Lock())
        async with lock:  # one segment per owner: one transfer through it at a time
            await self._segment_move_locked(handle, offset, view, write)

    async def _segment_move_locked(
        self, handle: BufferHandle, offset: int, view: memoryview, write: bool
    ) -> None:
        seg = self._segments.get(handle.owner)
        if seg is None:
            seg = shared_memory.SharedMemory(create=True, size=SEGMENT_BYTES)
            self._segments[handle.owner] = seg
        try:
            await self._segment_steps(seg, handle, offset, view, write)
        except asyncio.CancelledError:
            # A request we stopped waiting for (the deadline passed) may still be carried
            # out by the owner later: never let that copy land in the next transfer's bytes.
            if self._segments.get(handle.owner) is seg:
                del self._segments[handle.owner]
            seg.close()
            seg.unlink()
            raise

    async def _segment_steps(
        self,
        seg: shared_memory.SharedMemory,
        handle: BufferHandle,
        offset: int,
        view: memoryview,
        write: bool,
    ) -> None:
        done = 0
        n = view.nbytes
        while done < n:
            step = min(n - done, SEGMENT_BYTES)
            assert seg.buf is not None
            if write:
                seg.buf[:step] = view[done : done + step]
            await self.mgr.exchange(
                handle.owner,
                "shm",
                {
                    "op": "write" if write else "read",
                    "buf": handle.buf_id,
                    "offset": offset + done,
                    "n": step,
                    "segment": seg.name,
                },
            )
            if not write:
                view[done : done + step] = seg.buf[:step]
            done += step

    async def serve(self, request: dict[str, Any]) -> dict[str, Any]:
        """Owner side of the fallback: copy between the buffer and the reader's segment."""
        name = str(request["segment"])
        seg = self._attached.get(name)
        if seg is None:
            seg = shared_memory.SharedMemory(name=name)
            self._attached[name] = seg
        n = int(request["n"])
        local = self.mgr.local(int(request["buf"]), int(request["offset"]), n)
        assert seg.buf is not None
        if request["op"] == "read":
            ctypes.memmove(_addr(seg.buf[:n]), _addr(local), n)
        else:
            ctypes.memmove(_addr(local), _addr(seg.buf[:n]), n)
        return {"n": n}

    async def aclose(self) -> None:
        for seg in self._segments.values():
            seg.close()
            seg.unlink()
        for seg in self._attached.values():
            seg.close()
        self._segments.clear()
        self._attached.clear()
