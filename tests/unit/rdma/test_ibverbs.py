"""Unit tests of the ibverbs backend against a FAKE device (no RDMA NIC on this machine):
moving bytes, queue-pair setup, and errors. The work requests themselves, resources and
states, and the real adapter: test_ibverbs_verbs.py; the fake both use: ibverbs_kit.py.

Two backends, an owner and a reader, live in this process, each on its own FAKE device of
one fake fabric (danaus.rdma._fake_verbs), wired with an in-process ``exchange`` that calls
the owner's ``serve``. The fake executes RDMA READ/WRITE work requests as memcpy with an
HCA's checks.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from danaus.errors import (
    RDMABackendUnavailableError,
    RDMABufferDroppedError,
    RDMABufferError,
    RDMAOwnerError,
    RDMATransferError,
    SupervisionError,
)
from danaus.rdma import _verbs
from danaus.rdma._fake_verbs import FakeFabric
from danaus.rdma._handle import BufferHandle
from danaus.rdma._ibverbs import IbverbsBackend
from danaus.rdma._verbs import QPInfo

from .ibverbs_kit import OWNER, OWNER2, KiB, MiB, Procs, _posted, _procs, _random

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
    # connect, ask the owner (the buffer is there: a wrong key is not a drop), connect again
    assert [e[1]["op"] for e in procs.exchanges] == ["connect", "check", "connect"]
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
    assert [e[1]["op"] for e in procs.exchanges] == ["connect", "check", "connect"]
    assert not procs.reader._poster.inflight and not procs.reader._poster.draining


async def test_an_error_fails_its_transfer_and_the_others_run_again_on_a_new_queue_pair(
    procs: Procs,
) -> None:
    src = _random(MiB)
    _, handle = procs.share(src)
    await procs.reader.read(handle, 0, memoryview(bytearray(10)))  # connect
    procs.reader_dev.hold()
    posted = _posted(procs.reader_dev, 32)
    dst_a, dst_b = np.zeros(MiB, np.uint8), np.zeros(MiB, np.uint8)
    a = asyncio.ensure_future(procs.reader.read(handle, 0, memoryview(dst_a)))
    b = asyncio.ensure_future(procs.reader.read(handle, 0, memoryview(dst_b)))
    await posted.wait()  # 16 chunks each, all held
    procs.reader_dev.fail_next(_verbs.WC_LOC_PROT_ERR)
    procs.reader_dev.release()  # the first held request fails; the rest flush
    ra, rb = await asyncio.gather(a, b, return_exceptions=True)
    assert isinstance(ra, RDMATransferError) and "IBV_WC_LOC_PROT_ERR" in str(ra)
    assert rb is None and np.array_equal(dst_b, src)  # flushed, then read again
    assert [e[1]["op"] for e in procs.exchanges] == ["connect", "connect"]
    assert list(procs.reader_dev.qp_states().values()) == [_verbs.QPS_RTS]


async def test_dropped_buffer_raises_dropped_as_every_backend_does(procs: Procs) -> None:
    buf, handle = procs.share(_random(4096))
    procs.owner.unregister(buf)
    with pytest.raises(RDMABufferDroppedError, match=r"buffer 1 of .* was dropped") as info:
        await procs.reader.read(handle, 0, memoryview(bytearray(4096)))
    assert "IBV_WC_REM_ACCESS_ERR" in str(info.value)  # what the device said, kept
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
        with pytest.raises(TimeoutError, match=r"timed out after 0\.2 s"):
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


async def test_an_owner_the_control_plane_lost_fails_transfers_now() -> None:
    # A dead owner's device drops our requests, and the reader's retries may never give
    # up (SoftRoCE's do not): the control plane's word breaks the queue pair instead.
    gone: dict[str, str] = {}
    p = _procs(lost=gone.get)
    try:
        src = _random(256 * KiB)
        _, handle = p.share(src)
        dst = np.zeros(256 * KiB, np.uint8)
        await p.reader.read(handle, 0, memoryview(dst))  # connected
        p.reader_dev.hold()  # the owner answers nothing any more
        posted = _posted(p.reader_dev, 4)
        reading = asyncio.ensure_future(p.reader.read(handle, 0, memoryview(dst)))
        await posted.wait()
        gone[OWNER] = "its proc exited (killed by SIGKILL)"
        p.reader.owner_lost(OWNER)
        with pytest.raises(RDMAOwnerError, match=r"buffer 1 .* is gone: its proc exited"):
            await asyncio.wait_for(reading, 10)
        with pytest.raises(RDMAOwnerError, match="is gone"):  # and later ones at once
            await p.reader.read(handle, 0, memoryview(dst))
        p.reader_dev.release()
        assert not p.reader._poster.conns and not p.reader._poster.inflight
        assert [e[1]["op"] for e in p.exchanges] == ["connect"]
    finally:
        await p.reader.aclose()
        await p.owner.aclose()
