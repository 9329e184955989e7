"""RDMA transfers have deadlines: a frozen or lost owner fails them, nothing hangs.

Real procs on this host with the ``tcp`` backend forced (the backend of procs on
different hosts): an owner that is SIGSTOPped keeps its sockets open and its kernel
keeps acknowledging, so only a deadline (or the control plane declaring it lost) ends
a transfer waiting on it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest

from danaus import Actor, attach_to_hosts, endpoint, set_unhandled_fault_hook, this_host
from danaus.config import config
from danaus.errors import RDMAOwnerError
from danaus.rdma import RDMAAction, RDMABuffer, get_rdma_backend

from ..faults import freeze, kill, thaw
from .agents_kit import controller_key, host_agents

N = 1 << 20


def _expected(n: int) -> bytes:
    return np.arange(n, dtype=np.uint64).view(np.uint8)[:n].tobytes()


class Owner(Actor):
    """Registers buffers in its proc."""

    def __init__(self) -> None:
        self.arrays: list[np.ndarray[Any, Any]] = []

    @endpoint
    def make(self, n: int) -> RDMABuffer:
        a = np.arange(n, dtype=np.uint64).view(np.uint8)[:n].copy()
        self.arrays.append(a)
        return RDMABuffer(a)


class Reader(Actor):
    """Moves bytes to and from other procs' buffers and says how it went (and how long
    it took), so that the test sees the reader's own outcome, not a control-plane one."""

    @endpoint
    async def read(self, buf: RDMABuffer, seconds: float | None = None) -> tuple[str, str, float]:
        dst = np.empty(buf.size(), np.uint8)
        start = time.monotonic()
        try:
            if seconds is None:  # the default deadline: config.rdma_timeout
                await buf.read_into(dst)
            else:
                await buf.read_into(dst, timeout=seconds)
        except Exception as e:
            return type(e).__name__, str(e), time.monotonic() - start
        ok = dst.tobytes() == _expected(dst.size)
        return ("ok" if ok else "wrong bytes"), get_rdma_backend(buf), time.monotonic() - start

    @endpoint
    async def write(self, buf: RDMABuffer, seconds: float) -> tuple[str, str, float]:
        start = time.monotonic()
        try:
            await buf.write_from(np.zeros(buf.size(), np.uint8), timeout=seconds)
        except Exception as e:
            return type(e).__name__, str(e), time.monotonic() - start
        return "ok", "", time.monotonic() - start


@pytest.fixture
def tcp(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """Force the tcp backend here and in the procs (they inherit this environment)."""
    monkeypatch.setattr(config, "rdma_backend", "tcp")
    monkeypatch.setenv("DANAUS_RDMA_BACKEND", "tcp")
    yield {"DANAUS_RDMA_BACKEND": "tcp"}


@pytest.fixture
def quiet_faults() -> Iterator[list[Any]]:
    """Collect supervision failures instead of reporting them (a test kills a proc)."""
    seen: list[Any] = []
    old = set_unhandled_fault_hook(seen.append)
    yield seen
    set_unhandled_fault_hook(old)


@pytest.fixture
async def pair(tcp: dict[str, str]) -> AsyncIterator[tuple[Any, Any, Any]]:
    """An owner in proc 0 and a reader in proc 1 of a fresh mesh; the reader's default
    RDMA deadline is 2 s (``DANAUS_RDMA_TIMEOUT``)."""
    env = {**tcp, "DANAUS_RDMA_TIMEOUT": "2"}
    async with this_host().spawn_procs(per_host={"procs": 2}, name="rdl", env=env) as procs:
        owner = (await procs.spawn("owner", Owner)).slice(procs=0)
        reader = (await procs.spawn("reader", Reader)).slice(procs=1)
        yield procs, owner, reader


async def _warm(reader: Any, buf: RDMABuffer) -> None:
    """One good read first: the reader then holds a pooled data connection to the owner,
    so a later transfer waits on the owner's answer, not on a connection handshake."""
    kind, backend, _ = await asyncio.wait_for(reader.read.call_one(buf), 20)
    assert (kind, backend) == ("ok", "tcp")


async def _keeps_serving(owner: Any, reader: Any, buf: RDMABuffer) -> None:
    """After the owner thaws: the same reader reads the same buffer, and a new one."""
    kind, _, _ = await asyncio.wait_for(reader.read.call_one(buf, 10.0), 20)
    assert kind == "ok"
    fresh = await asyncio.wait_for(owner.make.call_one(4096), 20)
    kind, _, _ = await asyncio.wait_for(reader.read.call_one(fresh, 10.0), 20)
    assert kind == "ok"


async def test_read_from_a_frozen_owner_times_out(pair: tuple[Any, Any, Any]) -> None:
    procs, owner, reader = pair
    buf = await owner.make.call_one(N)
    await _warm(reader, buf)
    pid = freeze(procs, 0)
    try:
        kind, msg, took = await asyncio.wait_for(reader.read.call_one(buf, 2.0), 20)
        assert kind == "TimeoutError", msg
        assert 1.5 <= took < 8, took
        assert buf.owner in msg and f"buffer {buf.handle.buf_id}" in msg
        assert "timeout of 2 s" in msg
    finally:
        thaw(pid)
    await _keeps_serving(owner, reader, buf)


async def test_the_default_deadline_comes_from_the_config(pair: tuple[Any, Any, Any]) -> None:
    procs, owner, reader = pair
    buf = await owner.make.call_one(N)
    await _warm(reader, buf)
    pid = freeze(procs, 0)
    try:
        # no timeout= here: the reader's DANAUS_RDMA_TIMEOUT (2 s) bounds the read
        kind, msg, took = await asyncio.wait_for(reader.read.call_one(buf), 20)
        assert kind == "TimeoutError", msg
        assert took < 8, took
    finally:
        thaw(pid)
    await _keeps_serving(owner, reader, buf)


async def test_write_and_a_large_multi_stream_read_to_a_frozen_owner_time_out(
    pair: tuple[Any, Any, Any],
) -> None:
    procs, owner, reader = pair
    small = await owner.make.call_one(N)
    large = await owner.make.call_one(24 << 20)  # split over 3 data connections
    await _warm(reader, small)
    await _warm(reader, large)
    pid = freeze(procs, 0)
    try:
        done = await asyncio.wait_for(
            asyncio.gather(reader.write.call_one(small, 2.0), reader.read.call_one(large, 2.0)), 30
        )
        for kind, msg, took in done:
            assert kind == "TimeoutError", msg
            assert took < 10, took
    finally:
        thaw(pid)
    await _keeps_serving(owner, reader, large)


async def test_the_controller_reading_a_frozen_owner_times_out(pair: tuple[Any, Any, Any]) -> None:
    procs, owner, _ = pair
    buf = await owner.make.call_one(N)
    dst = np.empty(N, np.uint8)
    await asyncio.wait_for(buf.read_into(dst, timeout=10), 20)
    pid = freeze(procs, 0)
    try:
        start = time.monotonic()
        with pytest.raises(TimeoutError, match=f"buffer {buf.handle.buf_id}") as info:
            await asyncio.wait_for(RDMAAction().read_into(buf, dst).submit(timeout=1.5), 20)
        assert buf.owner in str(info.value)
        assert time.monotonic() - start < 8
    finally:
        thaw(pid)
    await asyncio.wait_for(buf.read_into(dst, timeout=10), 20)
    assert dst.tobytes() == _expected(N)


async def test_an_owner_declared_lost_fails_the_transfer_with_owner_error(
    pair: tuple[Any, Any, Any], quiet_faults: list[Any]
) -> None:
    # The controller watches its procs over the control plane: with a short heartbeat,
    # it declares the frozen owner lost well before the transfer's own deadline.
    procs, owner, _ = pair
    buf = await owner.make.call_one(N)
    dst = np.empty(N, np.uint8)
    await asyncio.wait_for(buf.read_into(dst, timeout=10), 20)
    old = config.heartbeat_interval, config.heartbeat_timeout
    config.heartbeat_interval, config.heartbeat_timeout = 0.5, 3.0
    pid = freeze(procs, 0)
    try:
        start = time.monotonic()
        with pytest.raises(RDMAOwnerError, match=f"buffer {buf.handle.buf_id}") as info:
            await asyncio.wait_for(buf.read_into(dst, timeout=60), 20)
        assert buf.owner in str(info.value)
        assert time.monotonic() - start < 15
    finally:
        config.heartbeat_interval, config.heartbeat_timeout = old
        thaw(pid)
    # the other proc keeps serving
    other = await procs.slice(procs=1).spawn("owner2", Owner)
    fresh = await asyncio.wait_for(other.make.call_one(4096), 20)
    await asyncio.wait_for(fresh.read_into(np.empty(4096, np.uint8), timeout=10), 20)


@pytest.fixture
def two_hosts() -> Iterator[list[str]]:
    """Host agents on 127.0.0.2 and 127.0.0.3 sharing a fresh key, which this controller
    uses for the test."""
    key = os.urandom(32).hex()
    env = dict(os.environ, DANAUS_AUTH_KEY=key, PYTHONPATH=os.getcwd())
    with (
        host_agents([f"tcp://127.0.0.{i}:0" for i in (2, 3)], [env, env]) as agents,
        controller_key(key),
    ):
        yield [addr for addr, _ in agents]


async def test_a_reader_on_another_host_gets_a_timeout_from_a_frozen_owner(
    two_hosts: list[str], tcp: dict[str, str]
) -> None:
    hosts = attach_to_hosts(two_hosts)
    async with hosts.spawn_procs(per_host={"procs": 1}, name="hosts", env=tcp) as procs:
        owner = (await procs.spawn("owner", Owner)).slice(hosts=0)
        reader = (await procs.spawn("reader", Reader)).slice(hosts=1)
        buf = await asyncio.wait_for(owner.make.call_one(N), 30)
        assert buf.owner.startswith("tcp://127.0.0.2:")
        kind, backend, _ = await asyncio.wait_for(reader.read.call_one(buf, 10.0), 20)
        assert (kind, backend) == ("ok", "tcp")
        pid = freeze(procs, 0)
        try:
            kind, msg, took = await asyncio.wait_for(reader.read.call_one(buf, 2.0), 20)
            assert kind == "TimeoutError", msg
            assert took < 8 and buf.owner in msg and f"buffer {buf.handle.buf_id}" in msg
        finally:
            thaw(pid)
        await _keeps_serving(owner, reader, buf)


def test_a_timeout_must_be_a_positive_number() -> None:
    buf = RDMABuffer(np.zeros(16, np.uint8))
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="timeout"):
            buf.read_into(np.empty(16, np.uint8), timeout=bad)
        with pytest.raises(ValueError, match="timeout"):
            RDMAAction().write_from(buf, np.zeros(16, np.uint8)).submit(timeout=bad)
    buf.drop().get(timeout=10)


# ---------------------------------------------------------------- errors logged once


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_caught_transfer_error_is_not_also_logged(
    pair: tuple[Any, Any, Any], quiet_faults: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    # Needs run_task to hand a task's failure only to its Future (see the report on
    # danaus/actors/_runtime.py): the caller receives the error, so nothing logs it.
    procs, owner, _ = pair
    buf = await owner.make.call_one(N)
    dst = np.empty(N, np.uint8)
    await asyncio.wait_for(buf.read_into(dst, timeout=10), 20)
    caplog.set_level(logging.WARNING)
    pid = freeze(procs, 0)
    try:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(buf.read_into(dst, timeout=1), 20)
    finally:
        thaw(pid)
    assert _errors(caplog) == []
    kill(procs, 0)
    with pytest.raises(RDMAOwnerError):
        await asyncio.wait_for(buf.read_into(dst, timeout=10), 20)
    with pytest.raises(RDMAOwnerError):
        await asyncio.wait_for(RDMAAction().read_into(buf, dst).submit(timeout=10), 20)
    assert _errors(caplog) == []


async def test_an_owner_on_another_host_declared_lost_is_fenced_and_fails_its_readers(
    two_hosts: list[str], tcp: dict[str, str], quiet_faults: list[Any]
) -> None:
    # Owner on agent A, reader on agent B, tcp backend: the controller declares the
    # SIGSTOPped owner lost after a few heartbeats; its agent kills it (a fenced proc
    # never comes back as a zombie member), so the reader's transfer, with no timeout
    # of its own (rdma_timeout is 60 s), fails with RDMAOwnerError within moments.
    hosts = attach_to_hosts(two_hosts)
    old = config.heartbeat_interval, config.heartbeat_timeout
    async with hosts.spawn_procs(per_host={"procs": 1}, name="hosts", env=tcp) as procs:
        owner = (await procs.spawn("owner", Owner)).slice(hosts=0)
        reader = (await procs.spawn("reader", Reader)).slice(hosts=1)
        buf = await asyncio.wait_for(owner.make.call_one(N), 30)
        kind, backend, _ = await asyncio.wait_for(reader.read.call_one(buf, 10.0), 20)
        assert (kind, backend) == ("ok", "tcp")
        config.heartbeat_interval, config.heartbeat_timeout = 0.5, 3.0
        pid = freeze(procs, 0)
        try:
            kind, msg, took = await asyncio.wait_for(reader.read.call_one(buf), 30)
            assert kind == "RDMAOwnerError", msg
            assert took < 15 and buf.owner in msg
            # the owner was killed by its agent, not left to come back when thawed
            await _exited(pid, 10)
            failed = owner.failed_ranks
            assert any(
                "no heartbeat for 3.0 s" in why and "fenced: its host agent" in why
                for why in failed.values()
            ), failed
        finally:
            config.heartbeat_interval, config.heartbeat_timeout = old
            thaw(pid)
        # the reader's proc keeps serving
        assert await asyncio.wait_for(reader.read.call_one(buf, 2.0), 20) is not None


async def _exited(pid: int, seconds: float) -> None:
    """Wait until process ``pid`` (not our child) has exited: its pidfd turns readable."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    gone = asyncio.Event()
    loop.add_reader(fd, gone.set)
    try:
        await asyncio.wait_for(gone.wait(), seconds)
    finally:
        loop.remove_reader(fd)
        os.close(fd)
