"""FAKE: no RDMA NIC here; stands in for the adapter (:class:`danaus.rdma._verbs.Verbs`).

A fake ibverbs device for tests on machines without RDMA hardware. Its queue pairs execute
RDMA READ and RDMA WRITE work requests as ``memmove`` between registered memory, checking
what an HCA checks: the local scatter-gather element lies in a memory region of this
device with that lkey (and local write access for a READ), and the remote address and rkey
lie in a region of the connected peer's device with remote read (READ) or remote write
(WRITE) access. A violation completes with ``IBV_WC_LOC_PROT_ERR`` or
``IBV_WC_REM_ACCESS_ERR`` and, as on hardware, puts the queue pair in the error state,
after which its work requests complete with ``IBV_WC_WR_FLUSH_ERR``.

Two fake procs in one test process are two :class:`FakeVerbs` on one :class:`FakeFabric`,
which holds every fake memory region and queue pair. Work requests are the real pyverbs
objects built by :func:`~danaus.rdma._verbs.rdma_work_request`; the fake keeps each one it
was given in ``posted``.
"""

from __future__ import annotations

import collections
import ctypes
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ._verbs import (
    ACCESS_LOCAL_WRITE,
    ACCESS_REMOTE_READ,
    ACCESS_REMOTE_WRITE,
    QPS_ERR,
    QPS_INIT,
    QPS_RTS,
    SEND_SIGNALED,
    WC_LOC_PROT_ERR,
    WC_RDMA_READ,
    WC_RDMA_WRITE,
    WC_REM_ACCESS_ERR,
    WC_RETRY_EXC_ERR,
    WC_SUCCESS,
    WC_WR_FLUSH_ERR,
    WR_RDMA_READ,
    WR_RDMA_WRITE,
    Completion,
    MemoryRegion,
    QPInfo,
    QueuePair,
    WorkRequest,
)

__all__ = ["FakeFabric", "FakeVerbs", "FakeVerbsError"]


class FakeVerbsError(OSError):
    """FAKE: what a failing verb raises here (pyverbs would raise ``PyverbsRDMAError``)."""


@dataclass(eq=False)
class _FakeMR:
    device: FakeVerbs
    addr: int
    length: int
    lkey: int
    rkey: int
    access: int


@dataclass(eq=False)
class _FakeQP:
    device: FakeVerbs
    qpn: int
    psn: int
    max_send_wr: int
    state: int = QPS_INIT
    remote: QPInfo | None = None
    outstanding: int = 0  # posted, completion not yet polled: what max_send_wr bounds


class FakeFabric:
    """FAKE: no RDMA NIC here; stands in for the network between fake devices.

    Holds every fake memory region (by rkey) and queue pair (by number) of the
    :class:`FakeVerbs` made with :meth:`device`.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.regions: dict[int, _FakeMR] = {}  # rkey -> region
        self.qps: dict[int, _FakeQP] = {}
        self.devices: list[FakeVerbs] = []
        self._keys = itertools.count(0x1000)
        self._qpns = itertools.count(0x100)

    def device(self, name: str | None = None, *, cq_depth: int = 4096) -> FakeVerbs:
        """A new fake device (one per fake proc) on this fabric."""
        return FakeVerbs(self, name or f"fake{len(self.devices)}", cq_depth=cq_depth)

    def next_key(self) -> int:
        return next(self._keys)

    def next_qpn(self) -> int:
        return next(self._qpns)


class FakeVerbs:
    """FAKE: no RDMA NIC here; stands in for the adapter (:class:`~danaus.rdma._verbs.Verbs`).

    Same methods as the adapter. Work requests run when posted; their completions wait in
    the completion queue until :meth:`poll_cq` (from any thread).

    Test hooks: :meth:`fail_next` completes the next work requests with an error status;
    :meth:`hold` keeps posted work requests pending (a stalled network) until
    :meth:`release` or until their queue pair enters the error state; ``on_post`` is called
    with each work request after it is posted; ``peak_outstanding`` is the most work
    requests one queue pair had outstanding (posted, completion not yet polled).
    """

    supports_dmabuf = False

    def __init__(self, fabric: FakeFabric, name: str, *, cq_depth: int = 4096) -> None:
        self.fabric = fabric
        self.name = name
        self.cq_depth = cq_depth
        self.port = 1
        self.lid = len(fabric.devices) + 1
        self.gid = f"fe80:0000:0000:0000:0000:0000:0000:{self.lid:04x}"
        self.mtu = 5  # IBV_MTU_4096
        self.posted: collections.deque[WorkRequest] = collections.deque(maxlen=4096)
        self.on_post: Callable[[WorkRequest], None] | None = None
        self.peak_outstanding = 0
        self.closed = False
        self._cq: collections.deque[tuple[Completion, _FakeQP]] = collections.deque()
        self._fail: collections.deque[int] = collections.deque()
        self._held: list[tuple[_FakeQP, WorkRequest]] = []
        self._holding = False
        self._regions: dict[int, _FakeMR] = {}  # lkey -> region
        self._qps: dict[int, _FakeQP] = {}
        fabric.devices.append(self)

    def __repr__(self) -> str:
        return (
            f"<FakeVerbs {self.name} FAKE regions={len(self._regions)} "
            f"qps={len(self._qps)} cq={len(self._cq)}>"
        )

    # ------------------------------------------------------------ test hooks

    def fail_next(self, status: int = WC_REM_ACCESS_ERR, count: int = 1) -> None:
        """Complete the next ``count`` posted work requests with ``status`` (no copy)."""
        with self.fabric.lock:
            self._fail.extend([status] * count)

    def hold(self) -> None:
        """Keep work requests posted from now on pending, as if the network stalled."""
        with self.fabric.lock:
            self._holding = True

    def release(self) -> None:
        """Stop holding, and run the work requests held so far."""
        with self.fabric.lock:
            self._holding = False
            held, self._held = self._held, []
            for qp, wr in held:
                self._run(qp, wr)

    def qp_states(self) -> dict[int, int]:
        """Queue-pair number -> state (``QPS_*``) of this device's queue pairs."""
        with self.fabric.lock:
            return {qpn: qp.state for qpn, qp in self._qps.items()}

    def connected(self, qp: QueuePair) -> bool:
        """Both ends in RTS, each connected to the other."""
        with self.fabric.lock:
            mine = self._qps.get(qp.qpn)
            if mine is None or mine.state != QPS_RTS or mine.remote is None:
                return False
            peer = self.fabric.qps.get(mine.remote.qpn)
            return (
                peer is not None
                and peer.state == QPS_RTS
                and peer.remote is not None
                and peer.remote.qpn == mine.qpn
            )

    # ------------------------------------------------------------ the adapter's interface

    def register(self, addr: int, length: int, access: int) -> MemoryRegion:
        with self.fabric.lock:
            self._check_open()
            if addr == 0 or length <= 0:
                raise FakeVerbsError(f"FAKE: cannot register {length} bytes at {addr:#x}")
            if access & ACCESS_REMOTE_WRITE and not access & ACCESS_LOCAL_WRITE:
                raise FakeVerbsError("FAKE: remote write access needs local write access (EINVAL)")
            key = self.fabric.next_key()
            mr = _FakeMR(self, addr, length, key, key, access)
            self._regions[key] = mr
            self.fabric.regions[key] = mr
            return MemoryRegion(addr, length, key, key, access, mr)

    def register_dmabuf(self, fd: int, offset: int, length: int, access: int) -> MemoryRegion:
        raise FakeVerbsError("FAKE: the fake device has no dma-buf support")

    def deregister(self, region: MemoryRegion) -> None:
        with self.fabric.lock:
            mr = self._regions.pop(region.lkey, None)
            if mr is None:
                raise FakeVerbsError(f"FAKE: region with lkey {region.lkey:#x} is not registered")
            del self.fabric.regions[mr.rkey]

    def create_qp(self, max_send_wr: int) -> QueuePair:
        with self.fabric.lock:
            self._check_open()
            qpn = self.fabric.next_qpn()
            psn = qpn * 7 & 0xFFFFFF
            qp = _FakeQP(self, qpn, psn, max_send_wr)
            self._qps[qpn] = qp
            self.fabric.qps[qpn] = qp
            return QueuePair(qpn, psn, qp)

    def local_info(self, qp: QueuePair) -> QPInfo:
        return QPInfo(qp.qpn, qp.psn, self.lid, self.gid, self.mtu, self.port, 16)

    def connect(self, qp: QueuePair, remote: QPInfo) -> None:
        with self.fabric.lock:
            mine = self._qp(qp)
            if mine.state != QPS_INIT:
                raise FakeVerbsError(f"FAKE: QP {qp.qpn:#x} is in state {mine.state}, not INIT")
            mine.remote = remote
            mine.state = QPS_RTS

    def set_error(self, qp: QueuePair) -> None:
        with self.fabric.lock:
            self._to_error(self._qp(qp))

    def destroy_qp(self, qp: QueuePair) -> None:
        with self.fabric.lock:
            mine = self._qp(qp)
            del self._qps[mine.qpn]
            del self.fabric.qps[mine.qpn]
            self._held = [(q, wr) for q, wr in self._held if q is not mine]

    def post_send(self, qp: QueuePair, wr: WorkRequest) -> None:
        from pyverbs.wr import SGE, SendWR

        with self.fabric.lock:
            self._check_open()
            mine = self._qp(qp)
            if not isinstance(wr.wr, SendWR) or not isinstance(wr.sge, SGE):
                raise TypeError(f"FAKE: post_send takes pyverbs work requests, not {wr.wr!r}")
            if mine.state not in (QPS_RTS, QPS_ERR):
                raise FakeVerbsError(f"FAKE: post_send on QP {qp.qpn:#x} in state {mine.state}")
            if mine.outstanding >= mine.max_send_wr:
                raise FakeVerbsError(f"FAKE: send queue of QP {qp.qpn:#x} is full (ENOMEM)")
            if wr.wr.num_sge != 1:
                raise FakeVerbsError("FAKE: the fake device takes one SGE per work request")
            self.posted.append(wr)
            mine.outstanding += 1
            self.peak_outstanding = max(self.peak_outstanding, mine.outstanding)
            if self._holding and mine.state == QPS_RTS:
                self._held.append((mine, wr))
            else:
                self._run(mine, wr)
        if self.on_post is not None:
            self.on_post(wr)

    def poll_cq(self, max_entries: int) -> list[Completion]:
        with self.fabric.lock:
            out: list[Completion] = []
            while self._cq and len(out) < max_entries:
                completion, qp = self._cq.popleft()
                qp.outstanding -= 1
                out.append(completion)
            return out

    def close(self) -> None:
        with self.fabric.lock:
            for qp in list(self._qps.values()):
                del self.fabric.qps[qp.qpn]
            for mr in list(self._regions.values()):
                del self.fabric.regions[mr.rkey]
            self._qps.clear()
            self._regions.clear()
            self._held.clear()
            self.closed = True

    # ------------------------------------------------------------ the "HCA"

    def _run(self, qp: _FakeQP, wr: WorkRequest) -> None:
        if qp.state == QPS_ERR:
            return self._complete(qp, wr, WC_WR_FLUSH_ERR)
        if self._fail:
            return self._complete(qp, wr, self._fail.popleft())
        peer = self.fabric.qps.get(qp.remote.qpn) if qp.remote is not None else None
        if (
            peer is None
            or peer.state != QPS_RTS
            or peer.remote is None
            or peer.remote.qpn != qp.qpn
        ):
            return self._complete(qp, wr, WC_RETRY_EXC_ERR)  # nobody answers
        opcode, sge = wr.opcode, wr.sge
        if opcode == WR_RDMA_READ:
            local_need, remote_need = ACCESS_LOCAL_WRITE, ACCESS_REMOTE_READ
        elif opcode == WR_RDMA_WRITE:
            local_need, remote_need = 0, ACCESS_REMOTE_WRITE
        else:
            raise FakeVerbsError(f"FAKE: opcode {opcode} is not RDMA READ/WRITE")
        local = self._regions.get(sge.lkey)
        if (
            local is None
            or not _within(local, sge.addr, sge.length)
            or (local.access & local_need) != local_need
        ):
            return self._complete(qp, wr, WC_LOC_PROT_ERR)
        remote = self.fabric.regions.get(wr.rkey)
        if (
            remote is None
            or remote.device is not peer.device
            or not _within(remote, wr.remote_addr, sge.length)
            or not remote.access & remote_need
        ):
            self._to_error(peer)  # the responder's QP fails too (an access error)
            return self._complete(qp, wr, WC_REM_ACCESS_ERR)
        if opcode == WR_RDMA_READ:
            ctypes.memmove(sge.addr, wr.remote_addr, sge.length)
        else:
            ctypes.memmove(wr.remote_addr, sge.addr, sge.length)
        self._complete(qp, wr, WC_SUCCESS)

    def _complete(self, qp: _FakeQP, wr: WorkRequest, status: int) -> None:
        if status == WC_SUCCESS and not wr.wr.send_flags & SEND_SIGNALED:
            qp.outstanding -= 1  # (hardware frees it with a later signalled completion)
            return
        opcode = WC_RDMA_READ if wr.opcode == WR_RDMA_READ else WC_RDMA_WRITE
        qp.device._cq.append((Completion(wr.wr_id, status, opcode), qp))  # noqa: SLF001 - a FakeVerbs' own
        if status != WC_SUCCESS and qp.state != QPS_ERR:
            self._to_error(qp)

    def _to_error(self, qp: _FakeQP) -> None:
        qp.state = QPS_ERR
        dev = qp.device
        flushed = [wr for q, wr in dev._held if q is qp]  # noqa: SLF001 - a FakeVerbs' own
        dev._held = [(q, wr) for q, wr in dev._held if q is not qp]  # noqa: SLF001 - a FakeVerbs' own
        for wr in flushed:
            dev._complete(qp, wr, WC_WR_FLUSH_ERR)  # noqa: SLF001 - a FakeVerbs' own

    def _qp(self, qp: QueuePair) -> _FakeQP:
        mine = self._qps.get(qp.qpn)
        if mine is None:
            raise FakeVerbsError(f"FAKE: no QP {qp.qpn:#x} on {self.name}")
        return mine

    def _check_open(self) -> None:
        if self.closed:
            raise FakeVerbsError(f"FAKE: device {self.name} is closed")


def _within(mr: _FakeMR, addr: int, length: int) -> bool:
    return mr.addr <= addr and addr + length <= mr.addr + mr.length
