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
new one.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import itertools
import logging
import os
import secrets
from dataclasses import dataclass, field
from typing import Any

from ..config import config
from ..errors import (
    ClosedError,
    RDMABackendUnavailableError,
    RDMABufferError,
    RDMAError,
    RDMAOwnerError,
    RDMATransferError,
    SupervisionError,
)
from . import _verbs
from ._backend import IBVERBS_DISABLED, Backend, Exchange, LocalBuffer
from ._handle import BufferHandle
from ._ibverbs_parts import LocalMR, LocalRegions, Poller, address, byte_view
from ._memory import is_cuda_tensor
from ._verbs import Completion, Device, QPInfo, QueuePair, Region

__all__ = ["IbverbsBackend", "State", "make_ibverbs_backend"]

log = logging.getLogger("danaus.rdma")

_OWNER_ACCESS = _verbs.ACCESS_LOCAL_WRITE | _verbs.ACCESS_REMOTE_READ | _verbs.ACCESS_REMOTE_WRITE


class State(enum.Enum):
    """Lifecycle of an :class:`IbverbsBackend`."""

    OPEN = "open"
    CLOSED = "closed"


@dataclass(eq=False)
class _Transfer:
    what: str  # for messages: "RDMA READ of 4096 bytes at offset 0 of buffer 3 of <owner>"
    opcode: int
    local: LocalMR
    local_addr: int
    remote_addr: int
    rkey: int
    length: int
    future: asyncio.Future[None]
    posted: int = 0  # bytes posted
    outstanding: int = 0  # work requests posted, not completed
    error: RDMAError | None = None
    finished: bool = False

    @property
    def all_posted(self) -> bool:
        return self.error is not None or self.posted >= self.length


@dataclass(eq=False)
class _Conn:
    """The reader's RC queue pair to one owner."""

    owner: str
    qp: QueuePair
    credits: int  # free send-queue slots
    queue: collections.deque[_Transfer] = field(default_factory=collections.deque)
    outstanding: int = 0
    broken: str | None = None  # why, once broken


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
    ) -> None:
        if chunk_bytes <= 0 or sq_depth <= 0 or mr_cache <= 0:
            raise ValueError("chunk_bytes, sq_depth and mr_cache must be positive")
        self.device = device
        self.chunk_bytes = chunk_bytes
        self.transfer_timeout = transfer_timeout
        self.state = State.OPEN
        self._exchange = exchange
        self._sq_depth = sq_depth
        self._mr_cache = mr_cache
        self._token = secrets.token_hex(8)  # who we are to owners
        self._conns: dict[str, _Conn] = {}
        self._draining: set[_Conn] = set()  # broken, waiting for their flushes
        self._locks: dict[str, asyncio.Lock] = {}
        self._served: dict[str, QueuePair] = {}  # reader token -> our queue pair
        self._owned: dict[int, Region] = {}  # buf_id -> region
        self._local = LocalRegions(device, mr_cache, self._deregister)
        self._inflight: dict[int, tuple[_Conn, _Transfer]] = {}
        self._wr_ids = itertools.count(1)
        self._cq_credits = device.cq_depth
        self._poller: Poller | None = None

    def __repr__(self) -> str:
        return (
            f"<IbverbsBackend {self.state.value} device={self.device.name} "
            f"peers={len(self._conns)} served={len(self._served)} "
            f"local_mrs={len(self._local)} in_flight={len(self._inflight)}>"
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

    def _register_cuda(self, ptr: int, size: int, access: int) -> Region:
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
        """Owner side: a reader's queue pair info in, ours (connected to it) out."""
        self._check_open()
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
        conn = await self._connection(handle.owner)
        loop = asyncio.get_running_loop()
        if self._poller is None:
            self._poller = Poller(self.device, loop, self._on_completions, self._on_poll_error)
        addr = address(view)
        local = self._local.acquire(view, addr, _verbs.ACCESS_LOCAL_WRITE if reading else 0)
        what = (
            f"RDMA {'READ' if reading else 'WRITE'} of {n} bytes at offset {offset} "
            f"of buffer {handle.buf_id} of {handle.owner}"
        )
        t = _Transfer(
            what,
            opcode,
            local,
            addr,
            int(keys["addr"]) + offset,
            int(keys["rkey"]),
            n,
            loop.create_future(),
        )
        conn.queue.append(t)
        self._pump(conn)
        try:
            async with asyncio.timeout(self.transfer_timeout):
                await t.future
        except TimeoutError:
            self._abandon(t, conn)
            self._break(conn, f"a transfer on it timed out after {self.transfer_timeout} s")
            raise RDMATransferError(
                f"{what} timed out after {self.transfer_timeout} s; its queue pair was reset"
            ) from None
        except asyncio.CancelledError:
            # work requests already posted finish in the background, into memory that
            # stays referenced (the local region) until they complete
            self._abandon(t, conn)
            raise

    async def _connection(self, owner: str) -> _Conn:
        conn = self._conns.get(owner)
        if conn is not None:
            return conn
        async with self._locks.setdefault(owner, asyncio.Lock()):
            conn = self._conns.get(owner)
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
            conn = self._conns[owner] = _Conn(owner, qp, self._sq_depth)
            return conn

    # ------------------------------------------------------------ posting and completions

    def _pump(self, conn: _Conn) -> None:
        """Post the queued chunks of ``conn`` that its send queue and the CQ have room for."""
        while conn.queue:
            t = conn.queue[0]
            if conn.broken is not None and t.error is None:
                t.error = RDMATransferError(f"{t.what} failed: {conn.broken}")
            if t.all_posted:
                conn.queue.popleft()
                self._finish(t)
                continue
            if conn.credits <= 0 or self._cq_credits <= 0 or self._poller is None:
                return
            n = min(self.chunk_bytes, t.length - t.posted)
            wr_id = next(self._wr_ids)
            wr = _verbs.rdma_work_request(
                wr_id,
                t.opcode,
                t.local_addr + t.posted,
                n,
                t.local.region.lkey,
                t.remote_addr + t.posted,
                t.rkey,
            )
            self._inflight[wr_id] = (conn, t)
            conn.credits -= 1
            conn.outstanding += 1
            t.outstanding += 1
            self._cq_credits -= 1
            self._poller.expect(1)
            try:
                self.device.post_send(conn.qp, wr)
            except Exception as e:
                del self._inflight[wr_id]
                conn.credits += 1
                conn.outstanding -= 1
                t.outstanding -= 1
                self._cq_credits += 1
                self._poller.expect(-1)
                self._break(conn, f"posting a work request failed: {type(e).__name__}: {e}")
                continue
            t.posted += n

    def _on_completions(self, completions: list[Completion]) -> None:
        """On the loop: account for completions polled by the poller thread."""
        touched: dict[int, _Conn] = {}
        for c in completions:
            entry = self._inflight.pop(c.wr_id, None)
            if entry is None:
                continue
            conn, t = entry
            conn.credits += 1
            conn.outstanding -= 1
            t.outstanding -= 1
            self._cq_credits += 1
            if c.status != _verbs.WC_SUCCESS:
                if t.error is None:
                    if c.status == _verbs.WC_WR_FLUSH_ERR and conn.broken is not None:
                        why = conn.broken
                    else:
                        why = (
                            f"work completion {_verbs.status_text(c.status)}, "
                            f"vendor error {c.vendor_err:#x}"
                        )
                    t.error = RDMATransferError(f"{t.what} failed: {why}")
                self._break(
                    conn,
                    f"the queue pair to {conn.owner} failed with "
                    f"{_verbs.WC_STATUS_NAMES.get(c.status, c.status)}",
                )
            self._finish(t)
            touched[id(conn)] = conn
        for conn in touched.values():
            self._pump(conn)
            self._drop_if_drained(conn)
        for conn in list(self._conns.values()):  # CQ room may have been what they lacked
            if conn.queue and id(conn) not in touched:
                self._pump(conn)

    def _on_poll_error(self, exc: BaseException) -> None:
        """On the loop: the poller thread died; fail what waits on it."""
        self._poller = None
        why = f"polling the completion queue failed: {type(exc).__name__}: {exc}"
        inflight, self._inflight = self._inflight, {}
        for conn, t in inflight.values():
            conn.outstanding -= 1
            t.outstanding -= 1
            self._cq_credits += 1
            if t.error is None:
                t.error = RDMATransferError(f"{t.what} failed: {why}")
        for conn in [*self._conns.values(), *self._draining]:
            self._break(conn, why)
            self._drop_if_drained(conn)
        for _, t in inflight.values():
            self._finish(t)

    def _finish(self, t: _Transfer) -> None:
        if t.finished or t.outstanding > 0 or not t.all_posted:
            return
        t.finished = True
        t.local.inuse -= 1
        if not t.future.done():
            if t.error is not None:
                t.future.set_exception(t.error)
            else:
                t.future.set_result(None)
        self._local.evict()

    def _abandon(self, t: _Transfer, conn: _Conn) -> None:
        """The caller stopped waiting: post no more of ``t``."""
        if t.error is None:
            t.error = RDMATransferError(f"{t.what} was abandoned")
        if t in conn.queue:
            conn.queue.remove(t)
        self._finish(t)

    def _break(self, conn: _Conn, why: str) -> None:
        """Stop using ``conn``'s queue pair: error it (flushing what is posted) and fail
        its queued transfers; the next transfer to its owner connects anew."""
        if conn.broken is not None:
            return
        conn.broken = why
        if self._conns.get(conn.owner) is conn:
            del self._conns[conn.owner]
        self._draining.add(conn)
        try:
            self.device.set_error(conn.qp)
        except Exception as e:
            log.warning(
                "ibverbs: could not move the queue pair to %s to the error state: %s", conn.owner, e
            )
        self._pump(conn)

    def _drop_if_drained(self, conn: _Conn) -> None:
        if conn in self._draining and conn.outstanding == 0:
            self._draining.discard(conn)
            self._destroy_qp(conn.qp)

    # ------------------------------------------------------------ teardown

    async def aclose(self) -> None:
        """Fail transfers still waiting, destroy queue pairs and regions, stop polling."""
        if self.state is State.CLOSED:
            return
        self.state = State.CLOSED
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.stop()
            await asyncio.to_thread(poller.join)
        transfers = {id(t): t for _, t in self._inflight.values()}
        for conn in [*self._conns.values(), *self._draining]:
            transfers.update((id(t), t) for t in conn.queue)
        for t in transfers.values():
            if not t.future.done():
                t.future.set_exception(
                    RDMATransferError(f"{t.what} failed: the ibverbs backend was closed")
                )
        qps = [c.qp for c in [*self._conns.values(), *self._draining]]
        qps += self._served.values()
        self._conns.clear()
        self._draining.clear()
        self._served.clear()
        self._inflight.clear()
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

    def _deregister(self, region: Region) -> None:
        try:
            self.device.deregister(region)
        except Exception as e:
            log.warning("ibverbs: deregistering a memory region failed: %s", e)


def make_ibverbs_backend(
    exchange: Exchange, *, device: str | None = None, port: int = 1, gid_index: int = 0
) -> IbverbsBackend:
    """The backend over the real device ``device`` (default: the first one)."""
    return IbverbsBackend(_verbs.Verbs(device, port=port, gid_index=gid_index), exchange)
