"""The one thin adapter over pyverbs: a device, its protection domain and completion queue,
memory regions, RC queue pairs, posting work requests and polling completions.

No logic lives here: :mod:`danaus.rdma._ibverbs` decides what to register, when to connect
and what a completion means. Everything that needs an RDMA device is in :class:`Verbs`;
building work requests (:func:`rdma_work_request`) and queue-pair attributes
(:func:`rts_attr`) needs only pyverbs. ``pyverbs`` is imported lazily, so this module
imports on machines without it.

The constants below are the ibverbs ABI values (``<infiniband/verbs.h>``), so the backend
and the fake device can use them without pyverbs; a unit test checks them against
``pyverbs.enums``.
"""

from __future__ import annotations

import ctypes
import os
import secrets
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "ACCESS_LOCAL_WRITE",
    "ACCESS_REMOTE_READ",
    "ACCESS_REMOTE_WRITE",
    "WC_STATUS_NAMES",
    "Completion",
    "Device",
    "GidEntry",
    "MemoryRegion",
    "QPInfo",
    "QueuePair",
    "Verbs",
    "WorkRequest",
    "choose_gid",
    "cuda_dmabuf",
    "device_names",
    "gid_table",
    "qp_init_attr",
    "rdma_work_request",
    "rts_attr",
    "status_text",
]

# enum ibv_access_flags
ACCESS_LOCAL_WRITE = 1
ACCESS_REMOTE_WRITE = 2
ACCESS_REMOTE_READ = 4
# enum ibv_wr_opcode
WR_RDMA_WRITE = 0
WR_RDMA_READ = 4
# enum ibv_wc_opcode
WC_RDMA_WRITE = 1
WC_RDMA_READ = 2
# enum ibv_send_flags
SEND_SIGNALED = 2
# enum ibv_qp_state
QPS_RESET, QPS_INIT, QPS_RTR, QPS_RTS, QPS_ERR = 0, 1, 2, 3, 6
# enum ibv_qp_attr_mask
QP_STATE = 1
# enum ibv_qp_type
QPT_RC = 2
# enum ibv_wc_status
WC_SUCCESS = 0
WC_LOC_PROT_ERR = 4
WC_WR_FLUSH_ERR = 5
WC_REM_INV_REQ_ERR = 9
WC_REM_ACCESS_ERR = 10
WC_RETRY_EXC_ERR = 12
WC_RNR_RETRY_EXC_ERR = 13
WC_STATUS_NAMES: dict[int, str] = {
    0: "IBV_WC_SUCCESS",
    1: "IBV_WC_LOC_LEN_ERR",
    2: "IBV_WC_LOC_QP_OP_ERR",
    3: "IBV_WC_LOC_EEC_OP_ERR",
    4: "IBV_WC_LOC_PROT_ERR",
    5: "IBV_WC_WR_FLUSH_ERR",
    6: "IBV_WC_MW_BIND_ERR",
    7: "IBV_WC_BAD_RESP_ERR",
    8: "IBV_WC_LOC_ACCESS_ERR",
    9: "IBV_WC_REM_INV_REQ_ERR",
    10: "IBV_WC_REM_ACCESS_ERR",
    11: "IBV_WC_REM_OP_ERR",
    12: "IBV_WC_RETRY_EXC_ERR",
    13: "IBV_WC_RNR_RETRY_EXC_ERR",
    14: "IBV_WC_LOC_RDD_VIOL_ERR",
    15: "IBV_WC_REM_INV_RD_REQ_ERR",
    16: "IBV_WC_REM_ABORT_ERR",
    17: "IBV_WC_INV_EECN_ERR",
    18: "IBV_WC_INV_EEC_STATE_ERR",
    19: "IBV_WC_FATAL_ERR",
    20: "IBV_WC_RESP_TIMEOUT_ERR",
    21: "IBV_WC_GENERAL_ERR",
    22: "IBV_WC_TM_ERR",
    23: "IBV_WC_TM_RNDV_INCOMPLETE",
}

# RC timing, as in ibv_rc_pingpong: ~67 ms ack timeout, 7 retries.
_TIMEOUT, _RETRY_CNT, _RNR_RETRY, _MIN_RNR_TIMER = 14, 7, 7, 12
_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1


def status_text(status: int) -> str:
    """A work-completion status as its enum name and pyverbs' words for it."""
    name = WC_STATUS_NAMES.get(status, f"status {status}")
    try:
        from pyverbs.cq import cqe_status_to_str
    except ImportError:
        return name
    return f"{name} ({cqe_status_to_str(status)})"


@dataclass(frozen=True)
class QPInfo:
    """What one side of an RC connection tells the other: enough to reach its queue pair."""

    qpn: int
    psn: int
    lid: int
    gid: str
    mtu: int
    port: int
    rd_atomic: int = 1

    def to_dict(self) -> dict[str, int | str]:
        return {
            "qpn": self.qpn,
            "psn": self.psn,
            "lid": self.lid,
            "gid": self.gid,
            "mtu": self.mtu,
            "port": self.port,
            "rd_atomic": self.rd_atomic,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QPInfo:
        return cls(
            int(d["qpn"]),
            int(d["psn"]),
            int(d["lid"]),
            str(d["gid"]),
            int(d["mtu"]),
            int(d["port"]),
            int(d.get("rd_atomic", 1)),
        )


@dataclass(frozen=True)
class Completion:
    """One work completion. ``opcode`` is only meaningful when ``status`` is success."""

    wr_id: int
    status: int
    opcode: int
    vendor_err: int = 0


@dataclass(eq=False)
class MemoryRegion:
    """A registered memory region.

    Attributes:
        addr: the address of its first byte in the region's own address space (the
            virtual address; for a dma-buf region, its iova): what work requests name.
        length: bytes covered.
        lkey: local key.
        rkey: remote key.
        access: the ``ACCESS_*`` flags it was registered with.
        handle: the device's object (a pyverbs ``MR``, or the fake's record).
    """

    addr: int
    length: int
    lkey: int
    rkey: int
    access: int
    handle: Any


@dataclass(eq=False)
class QueuePair:
    """An RC queue pair and the packet sequence number its send queue starts at."""

    qpn: int
    psn: int
    handle: Any


@dataclass(frozen=True, eq=False)
class WorkRequest:
    """A built, signalled RDMA READ/WRITE with one scatter-gather element.

    ``wr`` (a ``pyverbs.wr.SendWR``) is what gets posted. pyverbs cannot read a SendWR's
    scatter list or remote address back, so they are kept here as well: the ``SGE``
    object (readable) and the remote address and key the ``wr`` was built with.
    """

    wr: Any
    sge: Any
    remote_addr: int
    rkey: int

    @property
    def wr_id(self) -> int:
        return int(self.wr.wr_id)

    @property
    def opcode(self) -> int:
        return int(self.wr.opcode)


def rdma_work_request(
    wr_id: int, opcode: int, local_addr: int, length: int, lkey: int, remote_addr: int, rkey: int
) -> WorkRequest:
    """Build a signalled RDMA READ or WRITE as real pyverbs objects (needs no device)."""
    from pyverbs.wr import SGE, SendWR

    sge = SGE(local_addr, length, lkey)
    wr = SendWR(wr_id=wr_id, opcode=opcode, num_sge=1, sg=[sge], send_flags=SEND_SIGNALED)
    wr.set_wr_rdma(rkey=rkey, addr=remote_addr)
    return WorkRequest(wr, sge, remote_addr, rkey)


def qp_init_attr(send_cq: Any, max_send_wr: int) -> Any:
    """``QPInitAttr`` of an RC queue pair that only posts sends (unsignalled by default)."""
    from pyverbs.qp import QPCap, QPInitAttr

    cap = QPCap(max_send_wr=max_send_wr, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
    return QPInitAttr(qp_type=QPT_RC, scq=send_cq, rcq=send_cq, cap=cap, sq_sig_all=0)


def init_attr(port: int) -> Any:
    """``QPAttr`` for RESET->INIT: the port, and remote reads and writes allowed."""
    from pyverbs.qp import QPAttr

    attr = QPAttr(port_num=port)
    attr.pkey_index = 0
    attr.qp_access_flags = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_WRITE
    return attr


def rts_attr(local: QPInfo, remote: QPInfo, gid_index: int) -> Any:
    """``QPAttr`` for INIT->RTR->RTS towards ``remote`` (needs no device).

    Routed by GID (a global route header) when the remote has no LID, as on RoCE;
    by LID otherwise (InfiniBand).
    """
    from pyverbs.addr import GID, AHAttr, GlobalRoute

    attr = init_attr(local.port)
    attr.path_mtu = min(local.mtu, remote.mtu)
    attr.dest_qp_num = remote.qpn
    attr.rq_psn = remote.psn
    attr.sq_psn = local.psn
    attr.max_dest_rd_atomic = local.rd_atomic
    attr.max_rd_atomic = min(local.rd_atomic, remote.rd_atomic)
    attr.min_rnr_timer = _MIN_RNR_TIMER
    attr.timeout = _TIMEOUT
    attr.retry_cnt = _RETRY_CNT
    attr.rnr_retry = _RNR_RETRY
    if remote.lid == 0:
        gr = GlobalRoute(dgid=GID(remote.gid), sgid_index=gid_index)
        attr.ah_attr = AHAttr(dlid=0, is_global=1, port_num=local.port, gr=gr)
    else:
        attr.ah_attr = AHAttr(dlid=remote.lid, is_global=0, port_num=local.port)
    return attr


def device_names() -> list[str]:
    """Names of the ibverbs devices; raises pyverbs' ``PyverbsRDMAError`` where there are none."""
    from pyverbs.device import get_device_list

    return [_text(dev.name) for dev in get_device_list()]


def cuda_dmabuf(ptr: int, length: int) -> tuple[int, int]:
    """A dma-buf fd over the host-page-aligned range holding CUDA memory ``[ptr, ptr+length)``,
    and the offset of ``ptr`` in it. The caller closes the fd. Raises ``OSError``."""
    lib = ctypes.CDLL("libcuda.so.1")
    page = os.sysconf("SC_PAGE_SIZE")
    start = ptr & ~(page - 1)
    end = (ptr + length + page - 1) & ~(page - 1)
    fd = ctypes.c_int(-1)
    rc = lib.cuMemGetHandleForAddressRange(
        ctypes.byref(fd),
        ctypes.c_uint64(start),
        ctypes.c_size_t(end - start),
        ctypes.c_int(_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD),
        ctypes.c_ulonglong(0),
    )
    if rc != 0:
        raise OSError(f"cuMemGetHandleForAddressRange failed with CUDA error {rc}")
    return fd.value, ptr - start


class Device(Protocol):
    """What the ibverbs backend needs of a device: the real :class:`Verbs` or the fake."""

    name: str
    port: int
    lid: int
    gid: str
    cq_depth: int
    supports_dmabuf: bool

    def register(self, addr: int, length: int, access: int) -> MemoryRegion: ...
    def register_dmabuf(self, fd: int, offset: int, length: int, access: int) -> MemoryRegion: ...
    def deregister(self, region: MemoryRegion) -> None: ...
    def create_qp(self, max_send_wr: int) -> QueuePair: ...
    def local_info(self, qp: QueuePair) -> QPInfo: ...
    def connect(self, qp: QueuePair, remote: QPInfo) -> None: ...
    def set_error(self, qp: QueuePair) -> None: ...
    def destroy_qp(self, qp: QueuePair) -> None: ...
    def post_send(self, qp: QueuePair, wr: WorkRequest) -> None: ...
    def poll_cq(self, max_entries: int) -> list[Completion]: ...
    def close(self) -> None: ...


class Verbs:
    """One opened ibverbs device (pyverbs): context, protection domain, completion queue.

    Args:
        name: the device (e.g. ``"mlx5_0"``); default the first one.
        port: the port queue pairs use.
        gid_index: the GID table entry addressed on RoCE; negative: chosen from the
            table by :func:`choose_gid` (RoCE v2 over IPv4 first).
        cq_depth: completion-queue entries, which bounds the work requests in flight.
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        port: int = 1,
        gid_index: int = -1,
        cq_depth: int = 4096,
    ) -> None:
        from pyverbs.cq import CQ
        from pyverbs.device import Context
        from pyverbs.pd import PD

        if not name:
            names = device_names()
            if not names:
                raise OSError("no RDMA device")
            name = names[0]
        self.name = name
        self.port = port
        self.gid_index = gid_index if gid_index >= 0 else choose_gid(gid_table(name, port))
        self.cq_depth = cq_depth
        self._ctx = Context(name=name)
        try:
            self._pd = PD(self._ctx)
            self._cq = CQ(self._ctx, cq_depth, None, None, 0)
            port_attr = self._ctx.query_port(port)
            self.lid = int(port_attr.lid)
            self.mtu = int(port_attr.active_mtu)
            self.gid = str(self._ctx.query_gid(port, self.gid_index))
            self.rd_atomic = max(1, min(16, int(self._ctx.query_device().max_qp_rd_atom)))
        except BaseException:
            self._ctx.close()
            raise
        try:
            from pyverbs.mr import DmaBufMR  # noqa: F401

            self.supports_dmabuf = True
        except ImportError:
            self.supports_dmabuf = False

    def __repr__(self) -> str:
        return f"<Verbs {self.name} port={self.port} lid={self.lid} gid={self.gid}>"

    def register(self, addr: int, length: int, access: int) -> MemoryRegion:
        from pyverbs.mr import MR

        mr = MR(self._pd, length, access, address=addr)
        return MemoryRegion(addr, length, int(mr.lkey), int(mr.rkey), access, mr)

    def register_dmabuf(self, fd: int, offset: int, length: int, access: int) -> MemoryRegion:
        from pyverbs.mr import DmaBufMR

        # pyverbs registers with iova = offset: work requests address the region from there
        mr = DmaBufMR(self._pd, length, access, dmabuf=fd, offset=offset)
        return MemoryRegion(offset, length, int(mr.lkey), int(mr.rkey), access, mr)

    def deregister(self, region: MemoryRegion) -> None:
        region.handle.close()

    def create_qp(self, max_send_wr: int) -> QueuePair:
        from pyverbs.qp import QP

        qp = QP(self._pd, qp_init_attr(self._cq, max_send_wr), init_attr(self.port))  # -> INIT
        return QueuePair(int(qp.qp_num), secrets.randbits(24), qp)

    def local_info(self, qp: QueuePair) -> QPInfo:
        return QPInfo(qp.qpn, qp.psn, self.lid, self.gid, self.mtu, self.port, self.rd_atomic)

    def connect(self, qp: QueuePair, remote: QPInfo) -> None:
        qp.handle.to_rts(rts_attr(self.local_info(qp), remote, self.gid_index))

    def set_error(self, qp: QueuePair) -> None:
        from pyverbs.qp import QPAttr

        attr = QPAttr()
        attr.qp_state = QPS_ERR
        qp.handle.modify(attr, QP_STATE)

    def destroy_qp(self, qp: QueuePair) -> None:
        qp.handle.close()

    def post_send(self, qp: QueuePair, wr: WorkRequest) -> None:
        qp.handle.post_send(wr.wr)

    def poll_cq(self, max_entries: int) -> list[Completion]:
        _, wcs = self._cq.poll(max_entries)
        return [
            Completion(int(wc.wr_id), int(wc.status), int(wc.opcode), int(wc.vendor_err))
            for wc in wcs
        ]

    def close(self) -> None:
        self._ctx.close()  # closes the CQ, PD, QPs and MRs opened on it


@dataclass(frozen=True, slots=True)
class GidEntry:
    """One entry of a port's GID table, as the kernel lists it in sysfs."""

    index: int
    gid: str  # "fe80:0000:...:0001", eight groups of four hex digits
    kind: str  # "IB/RoCE v1", "RoCE v2", or "" (InfiniBand, or an unused entry)


_IPV4_MAPPED = "0000:0000:0000:0000:0000:ffff:"
_ZERO_GID = ":".join(["0000"] * 8)


def gid_table(device: str, port: int, root: str = "/sys/class/infiniband") -> list[GidEntry]:
    """The port's GID table from sysfs, unused entries left out; empty on InfiniBand
    (addressed by LID, GID 0 is right) or where sysfs does not have it."""
    base = os.path.join(root, device, "ports", str(port))
    try:
        with open(os.path.join(base, "link_layer")) as f:
            if f.read().strip() != "Ethernet":
                return []
        indices = sorted(int(i) for i in os.listdir(os.path.join(base, "gids")))
    except (OSError, ValueError):
        return []
    table = []
    for i in indices:
        try:
            with open(os.path.join(base, "gids", str(i))) as f:
                gid = f.read().strip()
            with open(os.path.join(base, "gid_attrs", "types", str(i))) as f:
                kind = f.read().strip()
        except OSError:  # EINVAL: an unused entry
            continue
        if gid and gid != _ZERO_GID:
            table.append(GidEntry(i, gid, kind))
    return table


def choose_gid(table: list[GidEntry]) -> int:
    """The GID index to address on RoCE, as NCCL and the perftest tools choose it: RoCE v2
    over IPv4 (routable, and what every RoCE fabric configures), then RoCE v2 over a
    global IPv6 address, then any RoCE v2, then RoCE v1; 0 where the table is empty.
    ``config.rdma_gid_index`` (``DANAUS_RDMA_GID_INDEX``) overrides it."""

    def rank(e: GidEntry) -> tuple[int, int]:
        v2 = e.kind == "RoCE v2"
        if v2 and e.gid.startswith(_IPV4_MAPPED):
            return (0, e.index)
        if v2 and not e.gid.startswith("fe80:"):
            return (1, e.index)
        return (2 if v2 else 3, e.index)

    return min(table, key=rank).index if table else 0


def _text(name: bytes | str) -> str:
    return name.decode() if isinstance(name, bytes) else name
