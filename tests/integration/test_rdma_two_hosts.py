"""RDMA between two hosts, each with its own RDMA device: an actor on one reads and
writes a buffer owned by an actor on the other over ibverbs.

The hosts are two host agents on this machine, each listening on its own address and
pinned to its own device (``DANAUS_RDMA_DEVICE``), named by ``DANAUS_TEST_RDMA_HOSTS``
(``device@address,device@address``). ``make test-rdma`` sets it inside its guest, where
``rxe1`` and ``rxe2`` are SoftRoCE devices on the two ends of a veth pair; elsewhere these
tests skip (or fail where ``DANAUS_REQUIRE_RDMA_DEVICE=1``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from danaus import Actor, attach_to_hosts, endpoint, set_unhandled_fault_hook
from danaus.config import config
from danaus.rdma import RDMABuffer, get_rdma_backend

from ..hardware import need_rdma_device
from ..timing import within
from .agents_kit import controller_key, host_agents

KEY = os.urandom(32).hex()
MiB = 1 << 20


def _hosts() -> list[tuple[str, str]]:
    """(device, address) of each host, from DANAUS_TEST_RDMA_HOSTS."""
    spec = os.environ.get("DANAUS_TEST_RDMA_HOSTS", "")
    return [tuple(h.split("@", 1)) for h in spec.split(",") if "@" in h]  # type: ignore[misc]


def _need_two_hosts() -> None:
    need_rdma_device()
    if len(_hosts()) != 2:
        if os.environ.get("DANAUS_REQUIRE_RDMA_DEVICE") == "1":
            pytest.fail("DANAUS_REQUIRE_RDMA_DEVICE=1, but DANAUS_TEST_RDMA_HOSTS names no 2 hosts")
        pytest.skip("needs two RDMA devices on two addresses (DANAUS_TEST_RDMA_HOSTS)")


def _pattern(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


class Owner(Actor):
    """Owns buffers of known random bytes, on host A."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.bufs: dict[str, RDMABuffer] = {}

    @endpoint
    def make(self, name: str, n: int, seed: int) -> RDMABuffer:
        self.arrays[name] = _pattern(n, seed)
        self.bufs[name] = RDMABuffer(self.arrays[name])
        return self.bufs[name]

    @endpoint
    def digest(self, name: str, offset: int, n: int) -> bytes:
        return self.arrays[name][offset : offset + n].tobytes()

    @endpoint
    def device(self) -> str:
        return config.rdma_device

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Reader(Actor):
    """Reads and writes the owner's buffers from host B, and counts its own verbs
    resources (the kernel's view, ``rdma res show``, and the backend's)."""

    def __init__(self) -> None:
        self.dst = np.zeros(64 * MiB, np.uint8)  # one destination, registered once

    @endpoint
    async def read(self, buf: RDMABuffer, n: int, offset: int = 0) -> tuple[str, bytes]:
        view = self.dst[:n]
        await buf.read_into(view, offset=offset, timeout=within(120))
        return get_rdma_backend(buf), view.tobytes()

    @endpoint
    async def read_many(self, bufs: list[RDMABuffer], times: int) -> list[bytes]:
        """Read each buffer ``times`` times, into as many destinations, all at once."""
        dsts = [(b, np.zeros(b.size(), np.uint8)) for b in bufs for _ in range(times)]
        await asyncio.gather(*(b.read_into(d, timeout=within(120)) for b, d in dsts))
        return [d.tobytes() for _, d in dsts]

    @endpoint
    async def write(self, buf: RDMABuffer, data: bytes, offset: int) -> None:
        await buf.write_from(np.frombuffer(data, np.uint8), offset=offset, timeout=within(120))

    @endpoint
    async def read_fails(self, buf: RDMABuffer, n: int) -> str:
        try:
            await buf.read_into(self.dst[:n], timeout=within(120))
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return "no error"

    @endpoint
    def resources(self) -> dict[str, int]:
        from danaus.rdma._ibverbs import IbverbsBackend
        from danaus.rdma._manager import manager

        backend = manager().backends["ibverbs"]
        assert isinstance(backend, IbverbsBackend)
        poster = backend._poster
        mine = os.getpid()

        def kernel(kind: str) -> int:
            out = subprocess.run(
                ["rdma", "-j", "res", "show", kind], capture_output=True, text=True, check=True
            ).stdout
            return sum(1 for r in json.loads(out or "[]") if r.get("pid") == mine)

        return {
            "kernel_qps": kernel("qp"),
            "kernel_mrs": kernel("mr"),
            "conns": len(poster.conns),
            "draining": len(poster.draining),
            "inflight": len(poster.inflight),
            "served": len(backend._served),
            "mrs": len(backend._local) + len(backend._owned),
        }

    @endpoint
    def device(self) -> str:
        return config.rdma_device


@pytest.fixture(scope="module")
def agents() -> Iterator[list[str]]:
    _need_two_hosts()
    envs = [
        dict(
            os.environ,
            DANAUS_AUTH_KEY=KEY,
            DANAUS_RDMA_DEVICE=device,
            DANAUS_RDMA_BACKEND="ibverbs",
            PYTHONPATH=os.getcwd(),
        )
        for device, _ in _hosts()
    ]
    with (
        host_agents([f"tcp://{addr}:0" for _, addr in _hosts()], envs) as agents,
        controller_key(KEY),
    ):
        yield [addr for addr, _ in agents]


@pytest.fixture
async def pair(agents: list[str]) -> Any:
    """An owner on host A, a reader on host B."""
    hosts = attach_to_hosts(agents)
    procs = hosts.spawn_procs(per_host={"procs": 1}, name="rdma2")
    await asyncio.wait_for(procs.initialized, within(600))
    owner = procs.slice(hosts=0).spawn("owner", Owner)
    reader = procs.slice(hosts=1).spawn("reader", Reader)
    await asyncio.wait_for(owner.initialized, within(120))
    await asyncio.wait_for(reader.initialized, within(120))
    try:
        yield owner, reader, procs
    finally:
        await procs.stop()


async def test_each_host_uses_its_own_device(pair: Any) -> None:
    owner, reader, _ = pair
    want = [d for d, _ in _hosts()]
    assert [await owner.device.call_one(), await reader.device.call_one()] == want


async def test_read_and_write_across_hosts_larger_than_a_work_request(pair: Any) -> None:
    owner, reader, _ = pair
    n = 3 * MiB + 12345  # four work requests of 1 MiB, the last one short
    buf = await owner.make.call_one("big", n, 1)
    backend, got = await reader.read.call_one(buf, n)
    assert backend == "ibverbs"
    assert got == _pattern(n, 1).tobytes()
    new = _pattern(2 * MiB + 1, 2).tobytes()
    await reader.write.call_one(buf, new, 777)
    assert await owner.digest.call_one("big", 777, len(new)) == new
    assert await owner.digest.call_one("big", 0, 777) == _pattern(n, 1)[:777].tobytes()


async def test_many_transfers_in_flight(pair: Any) -> None:
    owner, reader, _ = pair
    each, count, times = 256 * 1024 + 3, 8, 8  # 64 transfers, 8 buffers
    bufs = [await owner.make.call_one(f"many{i}", each, 10 + i) for i in range(count)]
    got = await reader.read_many.call_one(bufs, times)
    assert got == [_pattern(each, 10 + i).tobytes() for i in range(count) for _ in range(times)]


async def test_an_owner_killed_mid_transfer_fails_it_and_leaks_nothing(pair: Any) -> None:
    owner, reader, procs = pair
    old = set_unhandled_fault_hook(lambda f: None)
    try:
        small = await owner.make.call_one("small", 4096, 4)
        await reader.read.call_one(small, 4096)  # connected; its memory registered
        before = await reader.resources.call_one()
        assert before["kernel_qps"] == before["conns"] == 1
        n = 48 * MiB
        buf = await owner.make.call_one("doomed", n, 5)
        pid = await owner.pid.call_one()
        # 48 MiB takes seconds under emulation, and the call reaches the reader in
        # milliseconds: the owner dies while the read is under way (or, on fast
        # hardware, just before it: the same error either way)
        reading = asyncio.ensure_future(reader.read_fails.call_one(buf, n))
        os.kill(pid, signal.SIGKILL)
        outcome = await asyncio.wait_for(reading, within(120))
        assert outcome.startswith("RDMAOwnerError: "), outcome
        assert procs.slice(hosts=0).pids[0] == pid
        after = await reader.resources.call_one()
        # the queue pair to the dead owner is gone, in the backend and in the kernel
        assert after["conns"] == after["draining"] == after["inflight"] == 0, after
        assert after["kernel_qps"] == 0, after
        # memory regions: the reader's cached registrations of its own memory, no more
        # (the 48 MiB destination is one more than before), and the kernel agrees
        assert after["kernel_mrs"] == after["mrs"] <= before["mrs"] + 1, (before, after)
    finally:
        set_unhandled_fault_hook(old)


async def test_a_frozen_owner_is_read_and_written_without_its_cpu(pair: Any) -> None:
    # One-sided: the owner's kernel (its RDMA device) serves reads and writes while the
    # owner process is stopped. Setting the queue pair up needs the owner's answer, so
    # the reader reads once first (as the conformance suite's frozen-owner test does).
    owner, reader, _ = pair
    n = 2 * MiB
    buf = await owner.make.call_one("frozen", n, 6)
    await reader.read.call_one(await owner.make.call_one("warm", 4096, 7), 4096)
    pid = await owner.pid.call_one()
    os.kill(pid, signal.SIGSTOP)
    try:
        backend, got = await asyncio.wait_for(reader.read.call_one(buf, n), within(120))
        assert backend == "ibverbs" and got == _pattern(n, 6).tobytes()
        await asyncio.wait_for(reader.write.call_one(buf, b"\x07" * 4096, 0), within(120))
    finally:
        os.kill(pid, signal.SIGCONT)
    assert await owner.digest.call_one("frozen", 0, 4096) == b"\x07" * 4096
