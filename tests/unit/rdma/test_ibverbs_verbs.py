"""Unit tests of the ibverbs backend's work requests (real pyverbs objects, polled off the
event loop, ABI constants, queue-pair attributes) and of its resources and states
(registration cache, close, the probe), against a FAKE device as in test_ibverbs.py. The
last test runs the real adapter where a device exists.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from danaus.config import config
from danaus.errors import ClosedError, RDMATransferError
from danaus.rdma import _verbs
from danaus.rdma._backend import LocalBuffer
from danaus.rdma._fake_verbs import FakeVerbs
from danaus.rdma._handle import BufferHandle
from danaus.rdma._ibverbs import IbverbsBackend, State
from danaus.rdma._verbs import Completion, QPInfo, WorkRequest

from ...hardware import need_rdma_device
from .ibverbs_kit import OWNER, KiB, MiB, Procs, _have_device, _posted, _procs, _random, _unused

# ------------------------------------------------------------------ the work requests


async def test_work_requests_are_real_pyverbs_objects(procs: Procs) -> None:
    from pyverbs import enums
    from pyverbs.wr import SGE, SendWR

    src = _random(200 * KiB)
    _, handle = procs.share(src)
    dst = np.zeros(200 * KiB, np.uint8)
    await procs.reader.read(handle, 0, memoryview(dst))
    await procs.reader.write(handle, 0, memoryview(dst[:100]))
    reads, writes = list(procs.reader_dev.posted)[:4], list(procs.reader_dev.posted)[4:]
    for wr in [*reads, *writes]:
        assert isinstance(wr, WorkRequest)
        assert isinstance(wr.wr, SendWR) and isinstance(wr.sge, SGE)
        assert wr.wr.num_sge == 1 and wr.wr.send_flags & enums.IBV_SEND_SIGNALED
        assert wr.rkey == handle.keys["ibverbs"]["rkey"]
    assert {wr.wr.opcode for wr in reads} == {enums.IBV_WR_RDMA_READ}
    assert {wr.wr.opcode for wr in writes} == {enums.IBV_WR_RDMA_WRITE}
    assert [wr.sge.length for wr in reads] == [64 * KiB] * 3 + [8 * KiB]
    assert reads[0].sge.addr == dst.ctypes.data and reads[1].sge.addr == dst.ctypes.data + 64 * KiB
    assert len({wr.wr_id for wr in [*reads, *writes]}) == 5


async def test_completions_are_polled_off_the_event_loop(procs: Procs) -> None:
    threads: set[int] = set()
    poll = procs.reader_dev.poll_cq

    def spy(n: int) -> list[Completion]:
        threads.add(threading.get_ident())
        return poll(n)

    procs.reader_dev.poll_cq = spy  # type: ignore[method-assign]
    _, handle = procs.share(_random(MiB))
    await procs.reader.read(handle, 0, memoryview(bytearray(MiB)))
    assert threads and threading.get_ident() not in threads


def test_abi_constants_match_pyverbs() -> None:
    from pyverbs import enums

    assert _verbs.ACCESS_LOCAL_WRITE == enums.IBV_ACCESS_LOCAL_WRITE
    assert _verbs.ACCESS_REMOTE_READ == enums.IBV_ACCESS_REMOTE_READ
    assert _verbs.ACCESS_REMOTE_WRITE == enums.IBV_ACCESS_REMOTE_WRITE
    assert _verbs.WR_RDMA_READ == enums.IBV_WR_RDMA_READ
    assert _verbs.WR_RDMA_WRITE == enums.IBV_WR_RDMA_WRITE
    assert _verbs.WC_RDMA_READ == enums.IBV_WC_RDMA_READ
    assert _verbs.WC_RDMA_WRITE == enums.IBV_WC_RDMA_WRITE
    assert _verbs.SEND_SIGNALED == enums.IBV_SEND_SIGNALED
    assert _verbs.QPS_ERR == enums.IBV_QPS_ERR and _verbs.QPS_RTS == enums.IBV_QPS_RTS
    assert _verbs.QP_STATE == enums.IBV_QP_STATE and _verbs.QPT_RC == enums.IBV_QPT_RC
    for value, name in _verbs.WC_STATUS_NAMES.items():
        assert getattr(enums, name) == value
    assert _verbs.status_text(10) == "IBV_WC_REM_ACCESS_ERR (remote access error)"


def test_queue_pair_attributes_build_without_a_device() -> None:
    from pyverbs.qp import QPAttr, QPInitAttr

    local = QPInfo(
        qpn=0x11,
        psn=123,
        lid=0,
        gid="fe80:0000:0000:0000:0000:0000:0000:0001",
        mtu=5,
        port=1,
        rd_atomic=16,
    )
    roce = QPInfo(
        qpn=0x22,
        psn=456,
        lid=0,
        gid="fe80:0000:0000:0000:0002:c903:0000:0002",
        mtu=3,
        port=1,
        rd_atomic=4,
    )
    attr = _verbs.rts_attr(local, roce, gid_index=3)
    assert isinstance(attr, QPAttr)
    assert (attr.dest_qp_num, attr.rq_psn, attr.sq_psn) == (0x22, 456, 123)
    assert attr.path_mtu == 3 and attr.max_rd_atomic == 4 and attr.max_dest_rd_atomic == 16
    assert attr.qp_access_flags == (
        _verbs.ACCESS_LOCAL_WRITE | _verbs.ACCESS_REMOTE_READ | _verbs.ACCESS_REMOTE_WRITE
    )
    assert attr.ah_attr.is_global == 1 and attr.ah_attr.dgid == roce.gid
    assert attr.ah_attr.sgid_index == 3
    ib = QPInfo(qpn=0x33, psn=7, lid=42, gid=roce.gid, mtu=5, port=1)
    attr = _verbs.rts_attr(local, ib, gid_index=0)
    assert attr.ah_attr.is_global == 0 and attr.ah_attr.dlid == 42
    init = _verbs.qp_init_attr(None, 128)
    assert isinstance(init, QPInitAttr)
    assert init.qp_type == _verbs.QPT_RC and init.cap.max_send_wr == 128
    assert QPInfo.from_dict(ib.to_dict()) == ib


# ------------------------------------------------------------------ resources and states


async def test_local_registrations_are_cached_and_bounded() -> None:
    p = _procs(mr_cache=2)
    try:
        src = _random(4096)
        _, handle = p.share(src)
        dsts = [np.zeros(4096, np.uint8) for _ in range(5)]
        for d in dsts:
            await p.reader.read(handle, 0, memoryview(d))
        assert len(p.reader._local.entries) == 2
        before = dict(p.reader._local.entries)
        await p.reader.read(handle, 0, memoryview(dsts[-1]))
        await p.reader.read(handle, 100, memoryview(dsts[-1])[100:200])  # inside a cached one
        assert p.reader._local.entries == before
        assert all(np.array_equal(d, src) for d in dsts)
    finally:
        await p.reader.aclose()
        await p.owner.aclose()


async def test_repr_states_and_close(procs: Procs) -> None:
    _, handle = procs.share(_random(100))
    await procs.reader.read(handle, 0, memoryview(bytearray(100)))
    assert repr(procs.reader) == (
        "<IbverbsBackend open device=reader peers=1 served=0 local_mrs=1 in_flight=0>"
    )
    assert "served=1" in repr(procs.owner)
    assert procs.reader.reaches(handle)
    await procs.reader.aclose()
    assert procs.reader.state is State.CLOSED and "closed" in repr(procs.reader)
    assert not procs.reader.reaches(handle)
    assert procs.reader_dev.closed
    with pytest.raises(ClosedError):
        await procs.reader.read(handle, 0, memoryview(bytearray(100)))
    await procs.reader.aclose()  # twice is fine


async def test_close_fails_a_pending_transfer(procs: Procs) -> None:
    _, handle = procs.share(_random(MiB))
    await procs.reader.read(handle, 0, memoryview(bytearray(10)))
    procs.reader_dev.hold()
    posted = _posted(procs.reader_dev, 1)
    task = asyncio.ensure_future(procs.reader.read(handle, 0, memoryview(bytearray(MiB))))
    await posted.wait()
    await procs.reader.aclose()
    with pytest.raises(RDMATransferError, match="backend was closed"):
        await task


async def test_owner_close_deregisters_and_destroys(procs: Procs) -> None:
    _, handle = procs.share(_random(100))
    await procs.reader.read(handle, 0, memoryview(bytearray(100)))
    owner_dev = procs.owner.device
    assert isinstance(owner_dev, FakeVerbs) and owner_dev.qp_states()
    await procs.owner.aclose()
    assert owner_dev.closed and not owner_dev.qp_states()
    assert not procs.fabric.regions.keys() - {r.lkey for r in procs.reader_dev._regions.values()}
    assert procs.owner.register(LocalBuffer(7, memoryview(b"x"), 1, None)) == {}


def test_probe_names_why_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "rdma_disable_ibverbs", True)
    assert IbverbsBackend.probe() == "disabled by DANAUS_RDMA_DISABLE_IBVERBS"
    monkeypatch.setattr(config, "rdma_disable_ibverbs", False)
    why = IbverbsBackend.probe()
    if _have_device():
        assert why is None
    else:
        assert why is not None and why.startswith("no RDMA device (")


# ------------------------------------------------------------------ real hardware


async def test_real_device_loopback_read_and_write() -> None:
    need_rdma_device()
    owner: IbverbsBackend

    async def exchange(addr: str, backend: str, payload: dict[str, Any]) -> dict[str, Any]:
        return await owner.serve(payload)

    owner = IbverbsBackend(_verbs.Verbs(), _unused)
    reader = IbverbsBackend(_verbs.Verbs(), exchange, chunk_bytes=256 * KiB)
    try:
        src = _random(4 * MiB, seed=7)
        view = memoryview(src).cast("B")
        buf = LocalBuffer(1, view, src.ctypes.data, src)
        keys = owner.register(buf)
        handle = BufferHandle(
            OWNER, os.getpid(), "host", 1, src.ctypes.data, src.nbytes, 0, "", {"ibverbs": keys}
        )
        dst = np.zeros(4 * MiB, np.uint8)
        await reader.read(handle, 0, memoryview(dst))
        assert np.array_equal(dst, src)
        new = _random(MiB, seed=8)
        await reader.write(handle, MiB, memoryview(new))
        assert np.array_equal(src[MiB : 2 * MiB], new)
    finally:
        await reader.aclose()
        await owner.aclose()


# ------------------------------------------------------------------ choosing the GID


def _sysfs_port(root: Path, link_layer: str, gids: dict[int, tuple[str, str | None]]) -> str:
    """A device's port laid out as the kernel's sysfs shows it (``None``: an unused entry,
    whose type file reads EINVAL, stood in for by a missing file)."""
    port = root / "dev0" / "ports" / "1"
    (port / "gids").mkdir(parents=True)
    (port / "gid_attrs" / "types").mkdir(parents=True)
    (port / "link_layer").write_text(link_layer + "\n")
    for i, (gid, kind) in gids.items():
        (port / "gids" / str(i)).write_text(gid + "\n")
        if kind is not None:
            (port / "gid_attrs" / "types" / str(i)).write_text(kind + "\n")
    return str(root)


ZERO = ":".join(["0000"] * 8)
LINK_LOCAL = "fe80:0000:0000:0000:0200:00ff:fe00:0000"
V4 = "0000:0000:0000:0000:0000:ffff:0a4d:0001"
V6 = "2001:0db8:0000:0000:0000:0000:0000:0001"


def test_roce_v2_over_ipv4_is_chosen_over_link_local_and_v1(tmp_path: Path) -> None:
    # the table a Mellanox RoCE port (and rxe) shows: v1 and v2 of each address
    root = _sysfs_port(
        tmp_path,
        "Ethernet",
        {
            0: (LINK_LOCAL, "IB/RoCE v1"),
            1: (LINK_LOCAL, "RoCE v2"),
            2: (V4, "IB/RoCE v1"),
            3: (V4, "RoCE v2"),
            4: (ZERO, None),
        },
    )
    table = _verbs.gid_table("dev0", 1, root)
    assert [e.index for e in table] == [0, 1, 2, 3]
    assert _verbs.choose_gid(table) == 3


def test_global_ipv6_then_any_v2_then_v1() -> None:
    entries = [
        _verbs.GidEntry(0, LINK_LOCAL, "IB/RoCE v1"),
        _verbs.GidEntry(1, LINK_LOCAL, "RoCE v2"),
        _verbs.GidEntry(2, V6, "RoCE v2"),
    ]
    assert _verbs.choose_gid(entries) == 2
    assert _verbs.choose_gid(entries[:2]) == 1
    assert _verbs.choose_gid(entries[:1]) == 0


def test_infiniband_and_missing_sysfs_use_gid_zero(tmp_path: Path) -> None:
    root = _sysfs_port(tmp_path, "InfiniBand", {0: (LINK_LOCAL, ""), 1: (V4, "")})
    assert _verbs.gid_table("dev0", 1, root) == []
    assert _verbs.gid_table("nosuch", 1, root) == []
    assert _verbs.choose_gid([]) == 0
