"""One RDMA conformance suite, run over every backend.

``ibverbs`` cases need an RDMA NIC and skip themselves where there is none (the backend's
logic is unit-tested against a labelled fake device in tests/unit/rdma).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from danaus import Actor, endpoint, this_host
from danaus.config import config
from danaus.errors import (
    RDMABackendUnavailableError,
    RDMABufferDroppedError,
    RDMABufferError,
    RDMAOwnerError,
)
from danaus.rdma import RDMAAction, RDMABuffer, get_rdma_backend

from ..faults import freeze, thaw
from ..hardware import need_rdma_device, rdma_device_missing
from ..timing import within

N = 1 << 20


@pytest.fixture(params=["shm", "tcp", "ibverbs"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Force the backend here (the controller reads) and in procs spawned meanwhile."""
    name: str = request.param
    if name == "ibverbs":
        need_rdma_device()
    monkeypatch.setattr(config, "rdma_backend", name)
    monkeypatch.setenv("DANAUS_RDMA_BACKEND", name)
    return name


class Owner(Actor):
    """Holds registered buffers in its proc."""

    def __init__(self) -> None:
        self.arrays: dict[str, Any] = {}
        self.bufs: dict[str, RDMABuffer] = {}

    @endpoint
    def make(self, name: str, n: int, kind: str = "numpy") -> RDMABuffer:
        a: Any = (
            np.arange(n, dtype=np.uint64).view(np.uint8)[:n].copy()
            if kind == "numpy"
            else torch.arange(n // 4, dtype=torch.float32)
        )
        self.arrays[name] = a
        self.bufs[name] = RDMABuffer(a)
        return self.bufs[name]

    @endpoint
    def digest(self, name: str) -> bytes:
        a = self.arrays[name]
        return bytes(a.numpy().tobytes() if isinstance(a, torch.Tensor) else a.tobytes())

    @endpoint
    async def drop(self, name: str) -> None:
        await self.bufs[name].drop()

    @endpoint
    async def read_from(self, buf: RDMABuffer) -> bytes:
        dst = np.empty(buf.size(), np.uint8)
        await buf.read_into(dst)
        return dst.tobytes()


@pytest.fixture(scope="module")
def owner_mesh() -> Iterator[Any]:
    with this_host().spawn_procs(per_host={"procs": 2}, name="rdma") as procs:
        mesh = procs.spawn("owner", Owner)
        mesh.initialized.get(timeout=within(30))
        yield mesh


def _expected(n: int) -> bytes:
    return np.arange(n, dtype=np.uint64).view(np.uint8)[:n].tobytes()


async def test_read_into_numpy_torch_and_memoryview(backend: str, owner_mesh: Any) -> None:
    buf = await owner_mesh.slice(procs=0).make.call_one("r", N)
    assert buf.size() == N and get_rdma_backend(buf) == backend
    dst = np.empty(N, np.uint8)
    await asyncio.wait_for(buf.read_into(dst), within(20))
    assert dst.tobytes() == _expected(N)
    t = torch.empty(N, dtype=torch.uint8)
    await buf.read_into(t)
    assert t.numpy().tobytes() == _expected(N)
    mv = memoryview(bytearray(N - 100))
    await buf.read_into(mv, offset=100)
    assert bytes(mv) == _expected(N)[100:]


async def test_write_from_with_offset(backend: str, owner_mesh: Any) -> None:
    one = owner_mesh.slice(procs=1)
    buf = await one.make.call_one("w", N)
    src = np.full(N - 4096, 7, np.uint8)
    await asyncio.wait_for(buf.write_from(src, offset=4096), within(20))
    got = await one.digest.call_one("w")
    assert got[:4096] == _expected(N)[:4096] and got[4096:] == src.tobytes()


async def test_large_transfer_is_exact(backend: str, owner_mesh: Any) -> None:
    n = 24 << 20
    buf = await owner_mesh.slice(procs=0).make.call_one("big", n)
    dst = np.empty(n, np.uint8)
    await asyncio.wait_for(buf.read_into(dst), within(60))
    assert dst.tobytes() == _expected(n)


@pytest.mark.parametrize("threads", [1, 3])
async def test_a_large_transfer_in_parts_is_exact_at_any_offset(
    backend: str, owner_mesh: Any, monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    # shm copies transfers of 8 MiB and up in parts at once (config.rdma_copy_threads):
    # parts of odd sizes, at offsets off page boundaries, land where they belong
    monkeypatch.setattr(config, "rdma_copy_threads", threads)
    n = (20 << 20) + 12345
    one = owner_mesh.slice(procs=0)
    buf = await one.make.call_one("odd", n)
    dst = np.empty(n - 777, np.uint8)
    await asyncio.wait_for(buf.read_into(dst, offset=777), within(60))
    assert dst.tobytes() == _expected(n)[777:]
    src = np.frombuffer(os.urandom(n - 4099), np.uint8)
    await asyncio.wait_for(buf.write_from(src, offset=4099), within(60))
    got = await one.digest.call_one("odd")
    assert got[:4099] == _expected(n)[:4099] and got[4099:] == src.tobytes()


async def test_a_tensor_buffer_written_from_a_tensor(backend: str, owner_mesh: Any) -> None:
    one = owner_mesh.slice(procs=0)
    buf = await one.make.call_one("t", 4096, "torch")
    src = torch.linspace(0, 1, 1024)
    await buf.write_from(src)
    assert await one.digest.call_one("t") == src.numpy().tobytes()


async def test_bad_destinations_raise_buffer_errors(backend: str, owner_mesh: Any) -> None:
    buf = await owner_mesh.slice(procs=0).make.call_one("bad", 4096)
    with pytest.raises(RDMABufferError, match="must hold at least"):
        buf.read_into(np.empty(4095, np.uint8))
    with pytest.raises(RDMABufferError, match="must fit"):
        buf.write_from(np.empty(4097, np.uint8))
    with pytest.raises(RDMABufferError, match="contiguous"):
        buf.read_into(torch.empty(64, 128, dtype=torch.uint8).T)
    with pytest.raises(RDMABufferError, match="writable"):
        buf.read_into(b"\0" * 4096)
    with pytest.raises(RDMABufferError, match="outside"):
        buf.read_into(np.empty(10, np.uint8), offset=5000)
    dst = np.empty(4096, np.uint8)
    await buf.read_into(dst)  # the buffer still works
    assert dst.tobytes() == _expected(4096)


async def test_dropped_buffer_raises_and_the_owner_keeps_serving(
    backend: str, owner_mesh: Any
) -> None:
    zero = owner_mesh.slice(procs=0)
    buf = await zero.make.call_one("d", 8192)
    keep = await zero.make.call_one("k", 8192)
    await zero.drop.call_one("d")
    with pytest.raises(RDMABufferDroppedError):
        await asyncio.wait_for(buf.read_into(np.empty(8192, np.uint8)), within(20))
    with pytest.raises(RDMABufferDroppedError):
        await asyncio.wait_for(buf.write_from(np.empty(8192, np.uint8)), within(20))
    dst = np.empty(8192, np.uint8)
    await keep.read_into(dst)
    assert dst.tobytes() == _expected(8192)
    await keep.drop()  # a reader may drop it too
    with pytest.raises(RDMABufferDroppedError):
        await keep.read_into(dst)


async def test_batched_action(backend: str, owner_mesh: Any) -> None:
    a = await owner_mesh.slice(procs=0).make.call_one("a", 4096)
    b = await owner_mesh.slice(procs=1).make.call_one("b", 8192)
    da, db = np.empty(4096, np.uint8), np.empty(8192, np.uint8)
    await RDMAAction().read_into(a, da).read_into(b, db).submit()
    assert da.tobytes() == _expected(4096) and db.tobytes() == _expected(8192)


async def test_a_proc_reads_a_buffer_the_controller_owns(backend: str, owner_mesh: Any) -> None:
    data = np.arange(N, dtype=np.uint8)
    buf = RDMABuffer(data)
    assert buf.owner.startswith("unix:")
    got = await owner_mesh.slice(procs=1).read_from.call_one(buf)
    assert got == data.tobytes()
    await buf.drop()


def test_sync_code_uses_get(backend: str, owner_mesh: Any) -> None:
    buf = owner_mesh.slice(procs=0).make.call_one("s", 4096).get(timeout=within(20))
    dst = np.empty(4096, np.uint8)
    buf.read_into(dst).get(timeout=within(20))
    assert dst.tobytes() == _expected(4096)


async def test_owner_death_mid_transfer_reports_failure(backend: str) -> None:
    from danaus.mesh import set_unhandled_fault_hook

    old = set_unhandled_fault_hook(lambda f: None)
    try:
        async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
            owner = await procs.spawn("owner", Owner)
            buf = await owner.make.call_one("x", 64 << 20)
            os.kill(procs.pids[0], 9)
            with pytest.raises(RDMAOwnerError):
                await asyncio.wait_for(buf.read_into(np.empty(64 << 20, np.uint8)), within(20))
    finally:
        set_unhandled_fault_hook(old)


#: backends that move bytes without the owner's process taking part
ONE_SIDED = {"shm", "ibverbs"}


async def test_a_frozen_owner_never_hangs_a_transfer(backend: str) -> None:
    # SIGSTOP: the owner's sockets stay open and its kernel keeps acknowledging. A
    # one-sided backend still moves the bytes; any other fails by the deadline.
    async with this_host().spawn_procs(per_host={"procs": 1}, name="frozen") as procs:
        owner = await procs.spawn("owner", Owner)
        buf = await owner.make.call_one("z", N)
        dst = np.empty(N, np.uint8)
        await asyncio.wait_for(
            buf.read_into(dst, timeout=within(10)), within(20)
        )  # connections warm
        pid = freeze(procs, 0)
        try:
            for write in (False, True):
                start = time.monotonic()
                move = (
                    buf.write_from(np.full(N, 3, np.uint8), timeout=within(2))
                    if write
                    else buf.read_into(dst, timeout=within(2))
                )
                if backend in ONE_SIDED:
                    await asyncio.wait_for(move, within(20))
                else:
                    with pytest.raises(TimeoutError, match=f"buffer {buf.handle.buf_id} .* of "):
                        await asyncio.wait_for(move, within(20))
                assert time.monotonic() - start < 10
            if backend in ONE_SIDED:
                assert dst.tobytes() == _expected(N)
        finally:
            thaw(pid)
        await asyncio.wait_for(
            buf.read_into(dst, timeout=within(10)), within(20)
        )  # thawed: it serves again
        if backend in ONE_SIDED:
            assert (dst == 3).all()


def test_forcing_an_unavailable_backend_is_a_clear_error(
    owner_mesh: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if rdma_device_missing() is None:
        pytest.skip("this machine has an RDMA NIC, so ibverbs is available")
    buf = owner_mesh.slice(procs=0).make.call_one("f", 4096).get(timeout=within(20))
    monkeypatch.setattr(config, "rdma_backend", "ibverbs")
    with pytest.raises(RDMABackendUnavailableError, match="ibverbs cannot run here"):
        buf.read_into(np.empty(4096, np.uint8)).get(timeout=within(20))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none on this machine")
async def test_cuda_tensor_staged_through_pinned_memory(owner_mesh: Any) -> None:
    dev = torch.arange(4096, dtype=torch.uint8, device="cuda")
    buf = RDMABuffer(dev)
    got = await owner_mesh.slice(procs=0).read_from.call_one(buf)
    assert got == dev.cpu().numpy().tobytes()
    dev.add_(1)  # a later read sees the device's new bytes
    assert await owner_mesh.slice(procs=0).read_from.call_one(buf) == dev.cpu().numpy().tobytes()
    await buf.write_from(torch.zeros(4096, dtype=torch.uint8))
    assert int(dev.sum()) == 0
    dst = torch.empty(4096, dtype=torch.uint8, device="cuda")
    with pytest.raises(RDMABufferError):
        buf.read_into(dst)  # a raw CUDA destination needs staging too: clear error
    await buf.drop()


async def test_read_only_memory_cannot_be_written(backend: str) -> None:
    buf = RDMABuffer(b"a" * 4096)
    with pytest.raises(RDMABufferError, match="read-only"):
        buf.write_from(np.zeros(4096, np.uint8))
    dst = np.empty(4096, np.uint8)
    await buf.read_into(dst)
    assert dst.tobytes() == b"a" * 4096
    await buf.drop()
