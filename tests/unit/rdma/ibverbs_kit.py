"""What the ibverbs tests share: an owner and a reader backend, each on its own FAKE device
of one fake fabric (danaus.rdma._fake_verbs), wired with an in-process ``exchange`` that
calls the owner's ``serve``; buffers shared with the owner, and a wait for posted work
requests."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from danaus.rdma import _verbs
from danaus.rdma._backend import LocalBuffer
from danaus.rdma._fake_verbs import FakeFabric, FakeVerbs
from danaus.rdma._handle import BufferHandle
from danaus.rdma._ibverbs import IbverbsBackend
from danaus.rdma._verbs import WorkRequest

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
