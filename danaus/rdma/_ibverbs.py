"""The ``ibverbs`` backend: one-sided RDMA READ/WRITE over RC queue pairs.

The owner registers each buffer as a memory region over the buffer's own memory and puts
its rkey and address in the handle; a reader connects one RC queue pair per owner (set up
once, through ``exchange`` to the owner's :meth:`IbverbsBackend.serve`), registers its own
destination or source memory, and posts one signalled work request per chunk. The owner's
event loop does nothing during a transfer.

Completions are polled on a thread of the backend's own (pyverbs' verbs hold the GIL, so
it backs off when the queue is empty) and handed to the event loop with
``call_soon_threadsafe``; everything else runs on the loop.

An error completion puts an RC queue pair in the error state, so the connection to that
owner is dropped (its other work requests are flushed) and the next transfer sets up a
new one; the transfers that were only flushed run again on it. A transfer whose own
completion says the remote access failed, or nobody answered, asks the owner why (a
dropped buffer, a dead owner) and raises what the other backends raise for it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import secrets
from collections.abc import Callable
from typing import Any

from ..config import config
from ..errors import (
    ClosedError,
    RDMABackendUnavailableError,
    RDMABufferDroppedError,
    RDMABufferError,
    RDMAError,
    RDMAOwnerError,
    RDMATransferError,
    SupervisionError,
)
from . import _verbs
from ._backend import IBVERBS_DISABLED, Backend, Exchange, LocalBuffer
from ._handle import BufferHandle
from ._ibverbs_parts import LocalRegions, address, byte_view
from ._ibverbs_post import Conn, Poster, Transfer
from ._memory import is_cuda_tensor
from ._verbs import Device, MemoryRegion, QPInfo, QueuePair

__all__ = ["IbverbsBackend", "State", "make_ibverbs_backend"]

log = logging.getLogger("danaus.rdma")

#: a transfer whose queue pair broke under it is run again, on a new one, this many times
_ATTEMPTS = 3
#: completion errors that the owner's state may explain: a dropped buffer (its region is
#: gone), a dead owner (nobody answers)
_ASK_THE_OWNER = frozenset(
    {
        _verbs.WC_REM_ACCESS_ERR,
        _verbs.WC_REM_INV_REQ_ERR,
        _verbs.WC_RETRY_EXC_ERR,
        _verbs.WC_RNR_RETRY_EXC_ERR,
    }
)

_OWNER_ACCESS = _verbs.ACCESS_LOCAL_WRITE | _verbs.ACCESS_REMOTE_READ | _verbs.ACCESS_REMOTE_WRITE


class State(enum.Enum):
    """Lifecycle of an :class:`IbverbsBackend`."""

    OPEN = "open"
    CLOSED = "closed"


class IbverbsBackend(Backend):
    """Moves bytes with RDMA READ/WRITE over RC queue pairs (pyverbs).

    Args:
        device: the adapter (:class:`~danaus.rdma._verbs.Verbs`) or a stand-in with the
            same methods. The backend owns it and closes it in :meth:`aclose`.
        exchange: reaches the owner proc's manager, whose ``serve`` answers setup requests.
        chunk_bytes: bytes per work request.
        transfer_timeout: a transfer not complete after this many seconds fails with
            ``RDMATransferError`` and resets its queue pair (``None``: no limit).
        sq_depth: work requests in flight per queue pair.
        mr_cache: local memory regions kept registered for reuse. Each keeps its memory
            alive (a reference to the memoryview) until evicted or :meth:`aclose`.
        lost: why the control plane lost a proc (``None``: it did not). An RC queue pair
            to a dead owner is not told (its device drops the requests; the reader's
            retries may never give up, as on SoftRoCE), so the backend asks before a
            transfer, and :meth:`owner_lost` breaks the queue pair when the loss comes.
    """

    name = "ibverbs"

    def __init__(
        self,
        device: Device,
        exchange: Exchange,
        *,
        chunk_bytes: int = 1 << 20,
        transfer_timeout: float | None = 60.0,
        sq_depth: int = 128,
        mr_cache: int = 64,
        lost: Callable[[str], str | None] | None = None,
    ) -> None:
        if chunk_bytes <= 0 or sq_depth <= 0 or mr_cache <= 0:
            raise ValueError("chunk_bytes, sq_depth and mr_cache must be positive")
        self.device = device
        self.chunk_bytes = chunk_bytes
        self.transfer_timeout = transfer_timeout
        self.state = State.OPEN
        self._exchange = exchange
        self._lost = lost
        self._sq_depth = sq_depth
        self._mr_cache = mr_cache
        self._token = secrets.token_hex(8)  # who we are to owners
        self._locks: dict[str, asyncio.Lock] = {}
        self._served: dict[str, QueuePair] = {}  # reader token -> our queue pair
        self._owned: dict[int, MemoryRegion] = {}  # buf_id -> region
        self._local = LocalRegions(device, mr_cache, self._deregister)
        self._poster = Poster(device, chunk_bytes, self._local, self._destroy_qp)

    def __repr__(self) -> str:
        return (
            f"<IbverbsBackend {self.state.value} device={self.device.name} "
            f"peers={len(self._poster.conns)} served={len(self._served)} "
            f"local_mrs={len(self._local)} in_flight={len(self._poster.inflight)}>"
        )

    @classmethod
    def probe(cls) -> str | None:
        if config.rdma_disable_ibverbs:
            return IBVERBS_DISABLED
        try:
            from pyverbs.pyverbs_error import PyverbsError
        except ImportError as e:
            return f"pyverbs is not importable ({e})"
        try:
            names = _verbs.device_names()
        except PyverbsError as e:
            return f"no RDMA device ({e})"
        if not names:
            return "no RDMA device (the ibverbs device list is empty)"
        return None

    # ------------------------------------------------------------ owner side

    def register(self, buf: LocalBuffer) -> dict[str, int | str]:
        if self.state is State.CLOSED:
            return {}
        if buf.size == 0:
            region = None
        else:
            access = _verbs.ACCESS_REMOTE_READ if buf.view.readonly else _OWNER_ACCESS
            try:
                # Never true yet: byte_view refuses CUDA memory and RDMABuffer stages it
                # through pinned host memory; this is where GPUDirect registration goes.
                if is_cuda_tensor(buf.keepalive):
                    region = self._register_cuda(buf.addr, buf.size, access)
                else:
                    region = self.device.register(buf.addr, buf.size, access)
            except Exception as e:  # e.g. the pinned-memory limit: other backends move it
                log.warning(
                    "ibverbs: buffer %d (%d bytes) not registered: %s: %s",
                    buf.buf_id,
                    buf.size,
                    type(e).__name__,
                    e,
                )
                return {}
            buf.state[self.name] = region
            self._owned[buf.buf_id] = region
        return {
            "rkey": region.rkey if region else 0,
            "addr": region.addr if region else buf.addr,
            "device": self.device.name,
            "gid": self.device.gid,
            "lid": self.device.lid,
            "port": self.device.port,
        }

    def _register_cuda(self, ptr: int, size: int, access: int) -> MemoryRegion:
        if not self.device.supports_dmabuf:
            raise OSError(f"device {self.device.name} cannot register CUDA memory (no dma-buf)")
        fd, offset = _verbs.cuda_dmabuf(ptr, size)
        try:
            return self.device.register_dmabuf(fd, offset, size, access)
        finally:
            os.close(fd)  # the region holds its own reference to the dma-buf

    def unregister(self, buf: LocalBuffer) -> None:
        region = buf.state.pop(self.name, None)
        self._owned.pop(buf.buf_id, None)
        if region is not None and self.state is State.OPEN:
            self._deregister(region)

    async def serve(self, request: dict[str, Any]) -> dict[str, Any]:
        """Owner side: a reader's queue pair info in, ours (connected to it) out; or, for
        ``check``, whether a buffer is still registered under that rkey (a reader whose
        transfer completed with an access error asks)."""
        self._check_open()
        if request.get("op") == "check":
            region = self._owned.get(int(request["buf"]))
            if region is None:
                raise RDMABufferDroppedError(f"buffer {request['buf']} was dropped")
            return {"registered": region.rkey == int(request["rkey"])}
        if request.get("op") != "connect":
            raise RDMATransferError(f"unknown ibverbs setup request {request.get('op')!r}")
        peer = str(request["peer"])
        remote = QPInfo.from_dict(request["qp"])
        old = self._served.pop(peer, None)
        if old is not None:  # the reader dropped it (it failed): it asks for a new one
            self._destroy_qp(old)
        qp = self.device.create_qp(1)  # the owner's side only answers
        try:
            self.device.connect(qp, remote)
        except BaseException:
            self._destroy_qp(qp)
            raise
        self._served[peer] = qp
        return {"qp": self.device.local_info(qp).to_dict()}

    # ------------------------------------------------------------ reader side

    def owner_lost(self, owner: str) -> None:
        """The control plane lost ``owner``: break our queue pair to it, so that transfers
        to it fail now (with ``RDMAOwnerError``) instead of waiting on a dead peer."""
        conn = self._poster.conns.get(owner)
        if conn is not None:
            self._poster.break_conn(conn, f"its owner {owner} is gone")

    def _check_owner(self, handle: BufferHandle) -> None:
        why = self._lost(handle.owner) if self._lost is not None else None
        if why is not None:
            raise RDMAOwnerError(
                f"the owner of buffer {handle.buf_id} ({handle.owner}) is gone: {why}"
            )

    def reaches(self, handle: BufferHandle) -> bool:
        return self.state is State.OPEN and self.name in handle.keys

    async def read(self, handle: BufferHandle, offset: int, dst: memoryview) -> None:
        await self._transfer(handle, offset, dst, _verbs.WR_RDMA_READ)

    async def write(self, handle: BufferHandle, offset: int, src: memoryview) -> None:
        await self._transfer(handle, offset, src, _verbs.WR_RDMA_WRITE)

    async def _transfer(
        self, handle: BufferHandle, offset: int, view: memoryview, opcode: int
    ) -> None:
        self._check_open()
        keys = handle.keys.get(self.name)
        if keys is None:
            raise RDMABackendUnavailableError(
                f"buffer {handle.buf_id} of {handle.owner} is not registered with ibverbs"
            )
        view = byte_view(view)
        n = view.nbytes
        if offset < 0 or offset + n > handle.size:
            raise RDMABufferError(
                f"range [{offset}, {offset + n}) is outside buffer "
                f"{handle.buf_id} of {handle.size} bytes"
            )
        reading = opcode == _verbs.WR_RDMA_READ
        if reading and view.readonly:
            raise RDMABufferError("the destination of a read is read-only")
        if n == 0:
            return
        addr = address(view)
        what = (
            f"RDMA {'READ' if reading else 'WRITE'} of {n} bytes at offset {offset} "
            f"of buffer {handle.buf_id} of {handle.owner}"
        )
        for attempt in range(_ATTEMPTS):
            self._check_owner(handle)
            conn = await self._connection(handle.owner)
            local = self._local.acquire(view, addr, _verbs.ACCESS_LOCAL_WRITE if reading else 0)
            t = Transfer(
                what,
                opcode,
                local,
                addr,
                int(keys["addr"]) + offset,
                int(keys["rkey"]),
                n,
                asyncio.get_running_loop().create_future(),
            )
            self._poster.submit(conn, t)
            try:
                async with asyncio.timeout(self.transfer_timeout):
                    await t.future
                return
            except TimeoutError:
                self._poster.abandon(t, conn)
                self._poster.break_conn(
                    conn, f"a transfer on it timed out after {self.transfer_timeout} s"
                )
                raise TimeoutError(
                    f"{what} timed out after {self.transfer_timeout} s; its queue pair was reset"
                ) from None
            except asyncio.CancelledError:
                # work requests already posted finish in the background, into memory that
                # stays referenced (the local region) until they complete
                self._poster.abandon(t, conn)
                raise
            except RDMATransferError as e:
                if t.flushed and t.status is None and attempt + 1 < _ATTEMPTS:
                    continue  # its queue pair broke under it: again, on a new one
                if t.status in _ASK_THE_OWNER:
                    await self._explain(handle, keys, e)
                raise

    async def _explain(self, handle: BufferHandle, keys: dict[str, Any], error: Exception) -> None:
        """After a completion error that the owner's state may explain (a region it
        deregistered, a proc that died), ask it: raise ``RDMABufferDroppedError`` or
        ``RDMAOwnerError`` as the other backends do; return if it does not explain it."""
        request = {"op": "check", "buf": handle.buf_id, "rkey": int(keys["rkey"])}
        try:
            async with asyncio.timeout(config.connect_timeout):
                await self._exchange(handle.owner, self.name, request)
        except RDMABufferDroppedError:
            raise RDMABufferDroppedError(
                f"buffer {handle.buf_id} of {handle.owner} was dropped ({error})"
            ) from error
        except RDMAOwnerError as e:
            raise RDMAOwnerError(f"{e} ({error})") from error
        except Exception as e:  # no answer in time, or an old owner without "check"
            log.debug("ibverbs: the owner could not explain %s: %s", error, e)

    async def _connection(self, owner: str) -> Conn:
        conn = self._poster.conns.get(owner)
        if conn is not None:
            return conn
        async with self._locks.setdefault(owner, asyncio.Lock()):
            conn = self._poster.conns.get(owner)
            if conn is not None:
                return conn
            self._check_open()
            try:
                qp = self.device.create_qp(self._sq_depth)
            except Exception as e:
                raise RDMATransferError(f"creating a queue pair failed: {e}") from e
            try:
                request = {
                    "op": "connect",
                    "peer": self._token,
                    "qp": self.device.local_info(qp).to_dict(),
                }
                answer = await self._exchange(owner, self.name, request)
                self._check_open()
                self.device.connect(qp, QPInfo.from_dict(answer["qp"]))
            except BaseException as e:
                if self.state is State.OPEN:
                    self._destroy_qp(qp)
                if isinstance(e, RDMAError | ClosedError) or not isinstance(e, Exception):
                    raise
                if isinstance(e, SupervisionError):
                    raise RDMAOwnerError(f"the owner of the buffer ({owner}) is gone: {e}") from e
                raise RDMATransferError(
                    f"queue-pair setup with {owner} failed: {type(e).__name__}: {e}"
                ) from e
            conn = self._poster.conns[owner] = Conn(owner, qp, self._sq_depth)
            return conn

    # ------------------------------------------------------------ teardown

    async def aclose(self) -> None:
        """Fail transfers still waiting, destroy queue pairs and regions, stop polling."""
        if self.state is State.CLOSED:
            return
        self.state = State.CLOSED
        poller, self._poster.poller = self._poster.poller, None
        if poller is not None:
            poller.stop()
            await asyncio.to_thread(poller.join)
        qps = self._poster.close("the ibverbs backend was closed")
        qps += self._served.values()
        self._served.clear()
        for qp in qps:  # first: after this the device touches no memory
            self._destroy_qp(qp)
        self._local.clear()
        for region in self._owned.values():
            self._deregister(region)
        self._owned.clear()
        self.device.close()

    def _check_open(self) -> None:
        if self.state is State.CLOSED:
            raise ClosedError("the ibverbs backend was closed")

    def _destroy_qp(self, qp: QueuePair) -> None:
        try:
            self.device.destroy_qp(qp)
        except Exception as e:
            log.warning("ibverbs: destroying queue pair %#x failed: %s", qp.qpn, e)

    def _deregister(self, region: MemoryRegion) -> None:
        try:
            self.device.deregister(region)
        except Exception as e:
            log.warning("ibverbs: deregistering a memory region failed: %s", e)


def make_ibverbs_backend(
    exchange: Exchange, lost: Callable[[str], str | None] | None = None
) -> IbverbsBackend:
    """The backend over the real device the settings name (``rdma_device``, its port
    ``rdma_port`` and GID ``rdma_gid_index``; default: the first device, its port 1, the
    GID :func:`~._verbs.choose_gid` picks)."""
    verbs = _verbs.Verbs(
        config.rdma_device or None, port=config.rdma_port, gid_index=config.rdma_gid_index
    )
    # no deadline of its own: every transfer has one (timeout=, else config.rdma_timeout),
    # and a backend's shorter one would cut a longer one a caller asked for
    return IbverbsBackend(verbs, exchange, transfer_timeout=None, lost=lost)
