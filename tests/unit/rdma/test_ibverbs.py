"""Unit tests of the ibverbs backend against a FAKE device (no RDMA NIC on this machine).

Two backends, an owner and a reader, live in this process, each on its own FAKE device of
one fake fabric (danaus.rdma._fake_verbs), wired with an in-process ``exchange`` that calls
the owner's ``serve``. The fake executes RDMA READ/WRITE work requests as memcpy with an
HCA's checks. The last test runs the real adapter where a device exists.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from danaus.config import config
from danaus.errors import (
    ClosedError,
    RDMABackendUnavailableError,
    RDMABufferError,
    RDMAOwnerError,
    RDMATransferError,
    SupervisionError,
)
from danaus.rdma import _verbs
from danaus.rdma._backend import LocalBuffer
from danaus.rdma._fake_verbs import FakeFabric, FakeVerbs
from danaus.rdma._handle import BufferHandle
from danaus.rdma._ibverbs import IbverbsBackend, State
from danaus.rdma._verbs import Completion, QPInfo, WorkRequest

OWNER = "tcp://127.0.0.1:7001"
OWNER2 = "tcp://127.0.0.1:7002"
KiB = 1 << 10
MiB = 1 << 20


def _have_device() -> bool:
    try:
        return bool(_verbs.device_names())
    except Exception:
        return False


def _posted(dev: FakeVerbs, n: int) -> asyncio.Event:
    """Set once ``n`` more work requests were posted on ``dev``."""
    event = asyncio.Event()
    count = 0

    def on_post(wr: WorkRequest) -> None:
        nonlocal count
        count += 1
        if count >= n:
            event.set()

    dev.on_post = on_post
    return event


def _random(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8)


@dataclass
class Procs:
    """An owner and a reader backend on one FAKE fabric, and the setup requests sent."""

    fabric: FakeFabric
    reader_dev: FakeVerbs
    reader: IbverbsBackend
    owners: dict[str, IbverbsBackend] = field(default_factory=dict)
    exchanges: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    _ids: int = 0

    @property
    def owner(self) -> IbverbsBackend:
        return self.owners[OWNER]

    def add_owner(self, addr: str) -> IbverbsBackend:
        self.owners[addr] = IbverbsBackend(self.fabric.device(f"owner-{addr[-4:]}"), _unused)
        return self.owners[addr]

    def share(self, arr: Any, owner: str = OWNER) -> tuple[LocalBuffer, BufferHandle]:
        """Register ``arr`` (its own memory) with the owner; the handle a reader gets."""
        self._ids += 1
        view = memoryview(arr).cast("B")
        addr = int(np.frombuffer(view, np.uint8).ctypes.data)
        buf = LocalBuffer(self._ids, view, addr, arr)
        keys = self.owners[owner].register(buf)
        handle = BufferHandle(
            owner,
            os.getpid(),
            "host",
            buf.buf_id,
            addr,
            buf.size,
            0,
            "",
            {"ibverbs": keys} if keys else {},
        )
        return buf, handle


async def _unused(owner: str, backend: str, payload: dict[str, Any]) -> dict[str, Any]:
    raise AssertionError("an owner never sets up connections")


def _procs(**reader_kw: Any) -> Procs:
    fabric = FakeFabric()
    reader_dev = fabric.device("reader")
    procs: Procs

    async def exchange(owner: str, backend: str, payload: dict[str, Any]) -> dict[str, Any]:
        assert backend == "ibverbs"
        procs.exchanges.append((owner, payload))
        return await procs.owners[owner].serve(payload)

    kw: dict[str, Any] = {"chunk_bytes": 64 * KiB, **reader_kw}
    procs = Procs(fabric, reader_dev, IbverbsBackend(reader_dev, exchange, **kw))
    procs.add_owner(OWNER)
    return procs


@pytest.fixture
async def procs() -> AsyncIterator[Procs]:
    p = _procs()
    yield p
    await p.reader.aclose()
    for owner in p.owners.values():
        await owner.aclose()


# ------------------------------------------------------------------ moving bytes


async def test_read_round_trips_bytes_in_chunks(procs: Procs) -> None:
    src = _random(MiB)
    _, handle = procs.share(src)
    dst = np.zeros(MiB, np.uint8)
    await procs.reader.read(handle, 0, memoryview(dst))
    assert np.array_equal(dst, src)
    posted = list(procs.reader_dev.posted)
    assert len(posted) == 16  # 1 MiB in 64 KiB chunks
    assert [wr.sge.length for wr in posted] == [64 * KiB] * 16
    assert [wr.remote_addr - handle.addr for wr in posted] == [i * 64 * KiB for i in range(16)]


async def test_read_at_an_offset_into_part_of_a_destination(procs: Procs) -> None:
    src = _random(300_000, seed=1)
    _, handle = procs.share(src)
    dst = np.zeros(200_000, np.uint8)
    await procs.reader.read(handle, 12_345, memoryview(dst)[1000:150_000])
    assert np.array_equal(dst[1000:150_000], src[12_345 : 12_345 + 149_000])
    assert not dst[:1000].any() and not dst[150_000:].any()


async def test_write_round_trips_bytes_with_offset(procs: Procs) -> None:
    target = np.zeros(MiB + 100, np.uint8)
    _, handle = procs.share(target)
    src = _random(MiB, seed=2)
    await procs.reader.write(handle, 100, memoryview(src))
    assert np.array_equal(target[100:], src)
    assert not target[:100].any()
    await procs.reader.write(handle, 0, memoryview(b"read-only source"))  # bytes: no LOCAL_WRITE
    assert bytes(target[:16]) == b"read-only source"


async def test_non_byte_arrays_move_as_their_bytes(procs: Procs) -> None:
    src = np.arange(10_000, dtype=np.float64).reshape(100, 100)
    _, handle = procs.share(src)
    dst = np.empty_like(src)
    await procs.reader.read(handle, 0, memoryview(dst))
    assert np.array_equal(dst, src)


async def test_many_chunks_flow_through_a_small_send_queue() -> None:
    p = _procs(chunk_bytes=4 * KiB, sq_depth=4)
    try:
        src = _random(MiB, seed=3)
        _, handle = p.share(src)
        dst = np.zeros(MiB, np.uint8)
        await asyncio.gather(
            p.reader.read(handle, 0, memoryview(dst)[: MiB // 2]),
            p.reader.read(handle, MiB // 2, memoryview(dst)[MiB // 2 :]),
        )
        assert np.array_equal(dst, src)
        assert len(p.reader_dev.posted) == 256
        assert p.reader_dev.peak_outstanding == 4  # the fake refuses a fifth
    finally:
        await p.reader.aclose()
        await p.owner.aclose()


async def test_empty_transfer_posts_nothing(procs: Procs) -> None:
    _, handle = procs.share(_random(10))
    await procs.reader.read(handle, 10, memoryview(bytearray()))
    assert not procs.reader_dev.posted and not procs.exchanges


# ------------------------------------------------------------------ setup


async def test_queue_pair_is_set_up_once_per_peer(procs: Procs) -> None:
    src = _random(256 * KiB)
    _, handle = procs.share(src)
    dsts = [np.zeros(256 * KiB, np.uint8) for _ in range(8)]
    await asyncio.gather(*(procs.reader.read(handle, 0, memoryview(d)) for d in dsts))
    await procs.reader.read(handle, 0, memoryview(dsts[0]))
    assert all(np.array_equal(d, src) for d in dsts)
    assert [owner for owner, _ in procs.exchanges] == [OWNER]
    procs.add_owner(OWNER2)
    _, handle2 = procs.share(src, owner=OWNER2)
    await procs.reader.read(handle2, 0, memoryview(dsts[1]))
    assert [owner for owner, _ in procs.exchanges] == [OWNER, OWNER2]


async def test_exchange_carries_queue_pair_info_and_both_ends_are_connected(procs: Procs) -> None:
    _, handle = procs.share(_random(100))
    await procs.reader.read(handle, 0, memoryview(bytearray(100)))
    ((_, payload),) = procs.exchanges
    assert payload["op"] == "connect"
    info = QPInfo.from_dict(payload["qp"])
    assert info.gid == procs.reader_dev.gid and info.lid == procs.reader_dev.lid
    conn = procs.reader._poster.conns[OWNER]
    assert info.qpn == conn.qp.qpn and info.psn == conn.qp.psn
    assert procs.reader_dev.connected(conn.qp)
    assert handle.keys["ibverbs"]["device"] == procs.owner.device.name
    assert handle.keys["ibverbs"]["gid"] == procs.owner.device.gid


async def test_owner_gone_during_setup_raises_owner_error() -> None:
    dev = FakeFabric().device()

    async def gone(owner: str, backend: str, payload: dict[str, Any]) -> dict[str, Any]:
        raise SupervisionError(f"{owner} exited")

    reader = IbverbsBackend(dev, gone)
    handle = BufferHandle(OWNER, 1, "h", 1, 0x1000, 100, 0, "", {"ibverbs": {"rkey": 1, "addr": 1}})
    with pytest.raises(RDMAOwnerError, match="is gone"):
        await reader.read(handle, 0, memoryview(bytearray(100)))
    assert dev.qp_states() == {}  # the half-made queue pair was destroyed
    await reader.aclose()


async def test_setup_failing_on_the_owner_raises_transfer_error() -> None:
    dev = FakeFabric().device()

    async def broken(owner: str, backend: str, payload: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("no queue pairs left")

    reader = IbverbsBackend(dev, broken)
    handle = BufferHandle(OWNER, 1, "h", 1, 0x1000, 100, 0, "", {"ibverbs": {"rkey": 1, "addr": 1}})
    with pytest.raises(RDMATransferError, match=r"queue-pair setup .* no queue pairs left"):
        await reader.read(handle, 0, memoryview(bytearray(100)))
    await reader.aclose()


async def test_unknown_setup_request_is_refused(procs: Procs) -> None:
    with pytest.raises(RDMATransferError, match="unknown ibverbs setup request"):
        await procs.owner.serve({"op": "dance"})


# ------------------------------------------------------------------ errors


async def test_wrong_rkey_completes_with_remote_access_error(procs: Procs) -> None:
    src = _random(MiB)
    _, handle = procs.share(src)
    keys = dict(handle.keys["ibverbs"])
    keys["rkey"] = int(keys["rkey"]) + 1000
    bad = BufferHandle(
        OWNER,
        handle.owner_pid,
        "host",
        handle.buf_id,
        handle.addr,
        handle.size,
        0,
        "",
        {"ibverbs": keys},
    )
    dst = np.zeros(MiB, np.uint8)
    with pytest.raises(RDMATransferError, match=r"IBV_WC_REM_ACCESS_ERR \(remote access error\)"):
        await procs.reader.read(bad, 0, memoryview(dst))
    await procs.reader.read(handle, 0, memoryview(dst))  # a new queue pair, and it works
    assert np.array_equal(dst, src)
    assert len(procs.exchanges) == 2
    assert list(procs.reader_dev.qp_states().values()) == [_verbs.QPS_RTS]


async def test_read_past_the_region_completes_with_an_error(procs: Procs) -> None:
    src = _random(64 * KiB)
    _, handle = procs.share(src)
    liar = BufferHandle(
        OWNER,
        handle.owner_pid,
        "host",
        handle.buf_id,
        handle.addr,
        handle.size + 4096,
        0,
        "",
        handle.keys,
    )  # says more than registered
    with pytest.raises(RDMATransferError, match="IBV_WC_REM_ACCESS_ERR"):
        await procs.reader.read(liar, 60 * KiB, memoryview(bytearray(8 * KiB)))


async def test_range_outside_the_handle_is_refused_before_any_work(procs: Procs) -> None:
    _, handle = procs.share(_random(100))
    with pytest.raises(RDMABufferError, match="outside buffer"):
        await procs.reader.read(handle, 50, memoryview(bytearray(51)))
    with pytest.raises(RDMABufferError, match="read-only"):
        await procs.reader.read(handle, 0, memoryview(b"x" * 10))
    assert not procs.exchanges and not procs.reader_dev.posted


async def test_injected_completion_error_fails_the_transfer_then_next_works(procs: Procs) -> None:
    src = _random(MiB)
    _, handle = procs.share(src)
    dst = np.zeros(MiB, np.uint8)
    await procs.reader.read(handle, 0, memoryview(dst[:1000]))
    procs.reader_dev.fail_next(_verbs.WC_RETRY_EXC_ERR)
    with pytest.raises(RDMATransferError, match="IBV_WC_RETRY_EXC_ERR") as info:
        await procs.reader.read(handle, 0, memoryview(dst))  # 16 chunks: 1 fails, 15 flush
    assert "of buffer 1 of " + OWNER in str(info.value)
    await procs.reader.read(handle, 0, memoryview(dst))
    assert np.array_equal(dst, src)
    assert len(procs.exchanges) == 2
    assert not procs.reader._poster.inflight and not procs.reader._poster.draining


async def test_error_fails_the_other_transfers_on_that_queue_pair(procs: Procs) -> None:
    src = _random(MiB)
    _, handle = procs.share(src)
    await procs.reader.read(handle, 0, memoryview(bytearray(10)))  # connect
    procs.reader_dev.hold()
    posted = _posted(procs.reader_dev, 32)
    a = asyncio.ensure_future(procs.reader.read(handle, 0, memoryview(bytearray(MiB))))
    b = asyncio.ensure_future(procs.reader.read(handle, 0, memoryview(bytearray(MiB))))
    await posted.wait()  # 16 chunks each, all held
    procs.reader_dev.fail_next(_verbs.WC_LOC_PROT_ERR)
    procs.reader_dev.release()  # the first held request fails; the rest flush
    ra, rb = await asyncio.gather(a, b, return_exceptions=True)
    assert isinstance(ra, RDMATransferError) and "IBV_WC_LOC_PROT_ERR" in str(ra)
    assert isinstance(rb, RDMATransferError) and "queue pair to" in str(rb)


async def test_unregistered_buffer_cannot_be_read(procs: Procs) -> None:
    buf, handle = procs.share(_random(4096))
    procs.owner.unregister(buf)
    with pytest.raises(RDMATransferError, match="IBV_WC_REM_ACCESS_ERR"):
        await procs.reader.read(handle, 0, memoryview(bytearray(4096)))
    no_keys = BufferHandle(OWNER, 1, "host", 99, 0x1000, 10, 0, "", {})
    assert not procs.reader.reaches(no_keys)
    with pytest.raises(RDMABackendUnavailableError, match="not registered with ibverbs"):
        await procs.reader.read(no_keys, 0, memoryview(bytearray(10)))


async def test_read_only_owner_buffer_can_be_read_not_written(procs: Procs) -> None:
    data = bytes(range(256)) * 16
    _, handle = procs.share(data)
    dst = bytearray(len(data))
    await procs.reader.read(handle, 0, memoryview(dst))
    assert dst == data
    with pytest.raises(RDMATransferError, match="IBV_WC_REM_ACCESS_ERR"):
        await procs.reader.write(handle, 0, memoryview(b"no"))


async def test_stalled_transfer_times_out_and_resets_its_queue_pair() -> None:
    p = _procs(transfer_timeout=0.2)
    try:
        src = _random(256 * KiB)
        _, handle = p.share(src)
        dst = np.zeros(256 * KiB, np.uint8)
        p.reader_dev.hold()
        with pytest.raises(RDMATransferError, match=r"timed out after 0\.2 s"):
            await p.reader.read(handle, 0, memoryview(dst))
        p.reader_dev.release()
        await p.reader.read(handle, 0, memoryview(dst))
        assert np.array_equal(dst, src)
        assert len(p.exchanges) == 2
    finally:
        await p.reader.aclose()
        await p.owner.aclose()


async def test_cancelled_transfer_keeps_its_memory_until_posted_requests_finish(
    procs: Procs,
) -> None:
    src = _random(MiB)
    _, handle = procs.share(src)
    dst = np.zeros(MiB, np.uint8)
    await procs.reader.read(handle, 0, memoryview(dst[:10]))  # connect
    procs.reader_dev.hold()
    posted = _posted(procs.reader_dev, 16)
    task = asyncio.ensure_future(procs.reader.read(handle, 0, memoryview(dst)))
    await posted.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    entry = next(e for e in procs.reader._local.entries.values() if e.region.length == MiB)
    assert entry.inuse == 1 and procs.reader._poster.inflight  # held work requests pin it
    procs.reader_dev.release()
    procs.reader_dev.on_post = None
    await procs.reader.read(handle, 0, memoryview(dst[:10]))  # completes after the held ones
    assert entry.inuse == 0 and not procs.reader._poster.inflight
    assert len(procs.exchanges) == 1  # cancelling does not reset the queue pair


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


@pytest.mark.skipif(
    not _have_device(), reason="needs an RDMA NIC (ibverbs device); none on this machine"
)
async def test_real_device_loopback_read_and_write() -> None:
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
