"""``RDMABuffer``: memory that other procs read and write without control messages."""

from __future__ import annotations

import asyncio
import math
import warnings
from collections.abc import Callable
from typing import Any

from ..actors.seam import Future, Runtime, call_in_loop, current_runtime, run_task, runtime_here
from ..config import config
from ..errors import RDMABufferDroppedError, RDMABufferError
from ._handle import BufferHandle
from ._manager import manager
from ._memory import byte_view, is_cuda_tensor

__all__ = ["RDMAAction", "RDMABuffer", "backends", "get_rdma_backend"]


def _done(rt: Runtime) -> Future[None]:
    fut: Future[None] = Future(loop=rt.loop)
    fut.set_result(None)
    return fut


def _time_limit(timeout: float | None) -> float:
    """A transfer's deadline in seconds: ``timeout``, else ``config.rdma_timeout``."""
    limit = config.rdma_timeout if timeout is None else timeout
    where = "config.rdma_timeout (DANAUS_RDMA_TIMEOUT)" if timeout is None else "timeout"
    if (
        isinstance(limit, bool)
        or not isinstance(limit, int | float)
        or not math.isfinite(limit)
        or limit <= 0
    ):
        raise ValueError(f"{where} must be a positive, finite number of seconds, got {limit!r}")
    return float(limit)


class RDMABuffer:
    """Bytes registered for one-sided transfers: ``RDMABuffer(tensor_or_array_or_memoryview)``.

    Nothing is copied at registration; the object is kept alive until :meth:`drop`. The
    buffer is a small picklable handle (owner proc, id, size, per-backend keys): pass it
    to another actor, which then ``await buf.read_into(dst)`` or ``write_from(src)``.
    Bytes move on the data plane (ibverbs, shm or tcp), never in control messages.

    CUDA tensors: registered directly on ibverbs with GPUDirect where the device offers
    it; otherwise staged through pinned host memory by the owner (see docs/data-plane.md).
    """

    def __init__(self, data: Any) -> None:
        rt, here = runtime_here()
        self._cuda = None
        if is_cuda_tensor(data):
            import torch

            if data.dim() != 1 or not data.is_contiguous():
                raise RDMABufferError(
                    "a CUDA tensor must be 1-D and contiguous; view others "
                    "with t.view(torch.uint8).flatten()"
                )
            staging = torch.empty(
                data.numel() * data.element_size(), dtype=torch.uint8, pin_memory=True
            )
            staging.copy_(data.view(torch.uint8))
            self._cuda = data
            data = staging
        view, addr, keepalive = byte_view(data, writable=False, what="an RDMABuffer's memory")

        def register() -> BufferHandle:
            return manager(rt).register(view, addr, (keepalive, data), cuda=self._cuda)

        # The manager's tables belong to its loop: from another thread (sync code, an
        # actor's sync endpoint), register there and wait.
        self._handle: BufferHandle = register() if here else call_in_loop(rt, register)
        self._local = True

    @classmethod
    def _from_handle(cls, handle: BufferHandle) -> RDMABuffer:
        self = cls.__new__(cls)
        self._handle = handle
        self._cuda = None
        self._local = False
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (RDMABuffer._from_handle, (self._handle,))

    def __repr__(self) -> str:
        h = self._handle
        return f"RDMABuffer({h.size} bytes, id {h.buf_id} at {h.owner})"

    @property
    def handle(self) -> BufferHandle:
        return self._handle

    @property
    def owner(self) -> str:
        """The control-plane address of the proc that registered the memory."""
        return self._handle.owner

    def size(self) -> int:
        """The number of bytes."""
        return self._handle.size

    def _range(self, n: int, offset: int, what: str, *, write: bool) -> int:
        """How many bytes move: the range ``[offset, size)`` of a read, into a destination
        at least that large (its prefix is filled, as in Monarch); all of a write's
        source, which must fit in that range."""
        size = self._handle.size
        if offset < 0 or offset > size:
            raise RDMABufferError(f"offset {offset} is outside the buffer of {size} bytes")
        room = size - offset
        if write and n > room:
            raise RDMABufferError(
                f"{what} has {n} bytes but the buffer range [{offset}, {size}) has only "
                f"{room}: it must fit"
            )
        if not write and n < room:
            raise RDMABufferError(
                f"{what} has {n} bytes but the buffer range [{offset}, {size}) has "
                f"{room}: it must hold at least that many"
            )
        return n if write else room

    @property
    def backend(self) -> str:
        """The backend a transfer between this process and the buffer uses (``"shm"``,
        ``"tcp"`` or ``"ibverbs"``; Monarch's ``RDMABuffer.backend``)."""
        return get_rdma_backend(self)

    def read_into(self, dst: Any, *, offset: int = 0, timeout: float | None = None) -> Future[None]:
        """Copy the buffer's bytes from ``offset`` to its end into ``dst``.

        ``dst`` (a writable, contiguous tensor, array or memoryview) must hold at least that
        many bytes; a larger one gets them at its start, the rest untouched (as in
        Monarch). Await it, or ``.get()`` in sync code.

        Args:
            dst: where the bytes go.
            offset: the first byte of the buffer to read.
            timeout: seconds the transfer may take; ``None``: ``config.rdma_timeout``
                (``DANAUS_RDMA_TIMEOUT``, 60 s unless set).

        Raises:
            ValueError: ``timeout`` is not a positive, finite number (raised at once).
            RDMABufferError: ``dst`` is not contiguous, not writable, or too small.
            RDMABufferDroppedError: the buffer was dropped.
            RDMAOwnerError: the owner died, became unreachable, or was declared lost
                (frozen) by the control plane (``dst`` not fully written).
            TimeoutError: the transfer did not finish within ``timeout`` (``dst`` not
                fully written).
        """
        return self._transfer(dst, offset, timeout, write=False)

    def write_from(
        self, src: Any, *, offset: int = 0, timeout: float | None = None
    ) -> Future[None]:
        """Copy ``src`` into the buffer from ``offset`` on; ``src`` must fit in the range
        ``[offset, size)`` (a smaller one fills its start, as in Monarch).

        Args and raises: as :meth:`read_into` (the buffer is then not fully written).
        """
        return self._transfer(src, offset, timeout, write=True)

    def _describe(self) -> str:
        h = self._handle
        return f"buffer {h.buf_id} ({h.size} bytes) of {h.owner}"

    def _transfer(
        self, obj: Any, offset: int, timeout: float | None, *, write: bool
    ) -> Future[None]:
        what = "write_from's source" if write else "read_into's destination"
        limit = _time_limit(timeout)
        if write and not self._handle.writable:
            raise RDMABufferError(
                f"{self!r} is read-only memory (bytes, or a non-writable "
                "array): it cannot be written"
            )
        view, _, keep = byte_view(obj, writable=not write, what=what)
        n = self._range(view.nbytes, offset, what, write=write)
        if n != view.nbytes:
            view = view[:n]
        rt, here = runtime_here()
        handle = self._handle
        cuda = "cuda" in handle.keys
        if here and not cuda:  # small same-host transfers finish right here: no task
            if manager(rt).backend_for(handle).move_now(handle, offset, view, write=write):
                return _done(rt)

        async def go(keep: Any = keep) -> None:  # keep: the user's memory stays alive
            # An owner that is frozen keeps its sockets open and its kernel acknowledging,
            # and a reader may have no control connection to it that would notice: only
            # a deadline ends such a transfer. Backends stop touching the caller's memory
            # (or keep it referenced) before their cancellation propagates.
            deadline = asyncio.timeout(limit)
            try:
                async with deadline:
                    await move()
            except TimeoutError:
                if not deadline.expired():
                    raise
                op = "write_from" if write else "read_into"
                raise TimeoutError(
                    f"{op} of {self._describe()} did not finish within its timeout of "
                    f"{limit:g} s: the owner may be frozen, overloaded or unreachable (or the "
                    f"link too slow for that timeout); the {'buffer' if write else 'destination'}"
                    " is not (fully) written"
                ) from None

        async def move() -> None:
            mgr = manager(rt)
            if handle.owner == rt.addr and handle.buf_id not in mgr.buffers:
                raise RDMABufferDroppedError(f"buffer {handle.buf_id} was dropped")
            backend = mgr.backend_for(handle)
            if write:
                if cuda and view.nbytes != handle.size:
                    # Only part of the staging copy is written, and all of it goes back
                    # to the device: refresh it first, so the rest stays what it was.
                    await mgr.exchange(handle.owner, "cuda", {"op": "out", "buf": handle.buf_id})
                await backend.write(handle, offset, view)
                if cuda:  # device memory: the owner copies the staging bytes in
                    await mgr.exchange(handle.owner, "cuda", {"op": "in", "buf": handle.buf_id})
            else:
                if cuda:  # device memory: the owner refreshes its staging copy first
                    await mgr.exchange(handle.owner, "cuda", {"op": "out", "buf": handle.buf_id})
                await backend.read(handle, offset, view)

        return run_task(rt, go)

    def drop(self) -> Future[None]:
        """Release the registration; later transfers raise ``RDMABufferDroppedError``."""
        rt = current_runtime()
        handle = self._handle

        async def go() -> None:
            mgr = manager(rt)
            if handle.owner == rt.addr:
                mgr.drop(handle.buf_id)
            else:
                await mgr.exchange_drop(handle)

        return run_task(rt, go)


class RDMAAction:
    """A batch of transfers submitted together:
    ``await RDMAAction().read_into(buf, dst).write_from(buf2, src).submit()``.

    The transfers run concurrently; the result raises the first error, after all ended.
    """

    def __init__(self) -> None:
        self._ops: list[Callable[[float], Future[None]]] = []

    def read_into(self, buf: RDMABuffer, dst: Any, *, offset: int = 0) -> RDMAAction:
        """Queue ``buf.read_into(dst, offset=offset)``."""
        byte_view(dst, writable=True, what="read_into's destination")  # fail now, not later
        self._ops.append(lambda limit: buf.read_into(dst, offset=offset, timeout=limit))
        return self

    def write_from(self, buf: RDMABuffer, src: Any, *, offset: int = 0) -> RDMAAction:
        """Queue ``buf.write_from(src, offset=offset)``."""
        byte_view(src, writable=False, what="write_from's source")
        self._ops.append(lambda limit: buf.write_from(src, offset=offset, timeout=limit))
        return self

    def read_remote(self, dst: Any, src: RDMABuffer) -> RDMAAction:
        """Queue a read of buffer ``src`` into local ``dst`` (Monarch's argument order)."""
        return self.read_into(src, dst)

    def write_remote(self, dst: RDMABuffer, src: Any) -> RDMAAction:
        """Queue a write of local ``src`` into buffer ``dst`` (Monarch's argument order)."""
        return self.write_from(dst, src)

    def submit(self, *, timeout: float | None = None) -> Future[None]:
        """Start every queued transfer; the result settles once all of them ended.

        Args:
            timeout: seconds each transfer may take (they run concurrently, so the batch
                ends within about that); ``None``: ``config.rdma_timeout``.

        Raises:
            ValueError: ``timeout`` is not a positive, finite number (raised at once).
            Exception: the first error of the transfers, as :meth:`RDMABuffer.read_into`.
        """
        limit = _time_limit(timeout)
        rt = current_runtime()
        ops = list(self._ops)

        async def go() -> None:
            started: list[Future[None]] = []
            error: BaseException | None = None
            for op in ops:
                try:
                    started.append(op(limit))
                except Exception as e:  # refused up front: still wait for the others
                    error = error or e
            results = await asyncio.gather(*started, return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException):
                    error = error or r
            if error is not None:
                raise error

        return run_task(rt, go)


def backends() -> list[str]:
    """The backends available in this process, best first."""
    from ._manager import PREFERENCE

    mgr = manager()
    return [n for n in PREFERENCE if n in mgr.backends]


def get_rdma_backend(buf: RDMABuffer | BufferHandle | None = None) -> str:
    """The backend a transfer between this process and ``buf`` would use; without
    ``buf`` (as Monarch's ``get_rdma_backend()``), the best one available here."""
    if buf is None:
        return backends()[0]
    handle = buf.handle if isinstance(buf, RDMABuffer) else buf
    return manager().backend_for(handle).name


def is_ibverbs_available() -> bool:
    """Whether this process can use ibverbs (an RDMA device and pyverbs; not disabled by
    ``DANAUS_RDMA_DISABLE_IBVERBS``)."""
    from ._ibverbs import IbverbsBackend

    return IbverbsBackend.probe() is None


def is_rdma_available() -> bool:
    """Deprecated in Monarch (several backends make it ambiguous): whether ibverbs is
    available. Use :func:`is_ibverbs_available` or :func:`get_rdma_backend`."""
    warnings.warn(
        "is_rdma_available is deprecated (as in Monarch): use is_ibverbs_available() or "
        "get_rdma_backend()",
        DeprecationWarning,
        stacklevel=2,
    )
    return is_ibverbs_available()


class RDMAReadTransferWarning(Warning):
    """Monarch's warning class for reads that take a slow path; danaus defines it for
    programs that filter it, and does not raise it (it logs its backend choice instead)."""


class RDMAWriteTransferWarning(Warning):
    """As :class:`RDMAReadTransferWarning`, for writes."""


class RDMATcpFallbackWarning(Warning):
    """Monarch's warning that transfers fall back to TCP; danaus defines it for programs
    that filter it, and does not raise it: shm and tcp are regular backends here."""
