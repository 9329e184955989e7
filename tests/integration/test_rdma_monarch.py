"""Monarch's RDMA API on danaus: larger destinations, read_remote/write_remote, the
backend queries and warning classes, on each backend."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from danaus import rdma, this_host
from danaus.config import config
from danaus.errors import RDMABufferError
from danaus.rdma import RDMAAction

from ..conformance.test_rdma import Owner, _expected
from ..hardware import need_rdma_device
from ..timing import within


@pytest.fixture(params=["shm", "tcp", "ibverbs"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    name: str = request.param
    if name == "ibverbs":
        need_rdma_device()
    monkeypatch.setattr(config, "rdma_backend", name)  # this process: the reader's side
    return name


@pytest.fixture(scope="module")
def owner_mesh() -> Iterator[Any]:
    with this_host().spawn_procs(per_host={"procs": 2}, name="rdma_owners") as procs:
        mesh = procs.spawn("owner", Owner)
        mesh.initialized.get(timeout=within(30))
        yield mesh


async def test_read_into_a_larger_destination_fills_its_prefix(
    backend: str, owner_mesh: Any
) -> None:
    buf = await owner_mesh.slice(procs=0).make.call_one("big", 4096)
    dst = np.full(6000, 0xEE, np.uint8)
    await buf.read_into(dst)
    assert dst[:4096].tobytes() == _expected(4096)
    assert (dst[4096:] == 0xEE).all()  # the rest untouched
    tail = np.full(200, 0xEE, np.uint8)
    await buf.read_into(tail, offset=4000)
    assert tail[:96].tobytes() == _expected(4096)[4000:] and (tail[96:] == 0xEE).all()
    with pytest.raises(RDMABufferError, match="must hold at least"):
        buf.read_into(np.empty(4095, np.uint8))


async def test_write_from_a_smaller_source_fills_the_buffer_start(
    backend: str, owner_mesh: Any
) -> None:
    one = owner_mesh.slice(procs=1)
    buf = await one.make.call_one("small", 4096)
    await buf.write_from(np.full(100, 9, np.uint8), offset=10)
    got = await one.digest.call_one("small")
    want = bytearray(_expected(4096))
    want[10:110] = b"\x09" * 100
    assert got == bytes(want)
    with pytest.raises(RDMABufferError, match="must fit"):
        buf.write_from(np.empty(4097, np.uint8))


async def test_read_remote_write_remote_and_the_backend(backend: str, owner_mesh: Any) -> None:
    one = owner_mesh.slice(procs=0)
    a = await one.make.call_one("a", 4096)
    b = await one.make.call_one("b", 4096)
    dst = np.empty(4096, np.uint8)
    src = np.full(4096, 3, np.uint8)
    await RDMAAction().read_remote(dst, a).write_remote(b, src).submit(timeout=within(30))
    assert dst.tobytes() == _expected(4096)
    assert await one.digest.call_one("b") == src.tobytes()
    assert a.backend == backend == rdma.get_rdma_backend(a)


def test_backend_queries_and_warning_classes() -> None:
    assert rdma.get_rdma_backend() == rdma.backends()[0]
    assert isinstance(rdma.is_ibverbs_available(), bool)
    assert rdma.is_ibverbs_available() == ("ibverbs" in rdma.backends())
    with pytest.deprecated_call():
        assert rdma.is_rdma_available() == rdma.is_ibverbs_available()
    for cls in (
        rdma.RDMAReadTransferWarning,
        rdma.RDMAWriteTransferWarning,
        rdma.RDMATcpFallbackWarning,
    ):
        assert issubclass(cls, Warning)
