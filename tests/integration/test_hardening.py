"""Slow or busy peers are slow, not dead: backpressure and busy loops never cost a proc
its life or a message."""

from __future__ import annotations

import asyncio
import os
import select
import signal
from collections.abc import Iterator

import pytest

from danaus import SupervisionError, config, this_host
from danaus.mesh import set_unhandled_fault_hook

from .values_actors import Consumer, Producer, Slow

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def strict_liveness(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A peer silent for 1 s is lost; a mailbox holds 20 messages before backpressure."""
    for name, value in (
        ("heartbeat_interval", 0.2),
        ("heartbeat_timeout", 1.0),
        ("mailbox_limit", 20),
    ):
        monkeypatch.setenv(f"DANAUS_{name.upper()}", str(value))
        monkeypatch.setattr(config, name, value)
    yield


@pytest.mark.parametrize("endpoint_name", ["work", "awork"])
async def test_backpressure_does_not_kill_a_healthy_proc(
    strict_liveness: None, endpoint_name: str
) -> None:
    n = 250  # 2.5 s of work: the receiver holds its connection most of that time
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        slow = await procs.spawn("slow", Slow)
        endpoint = getattr(slow, endpoint_name)
        for _ in range(n):
            await asyncio.wait_for(endpoint.post(0.01), 30)
        assert await asyncio.wait_for(slow.count.call_one(), 30) == n


async def test_a_busy_peer_still_gets_port_messages_over_a_new_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DANAUS_HANDSHAKE_TIMEOUT", "0.5")
    monkeypatch.setattr(config, "handshake_timeout", 0.5)
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        consumer = await procs.slice(procs=0).spawn("consumer", Consumer)
        producer = await procs.slice(procs=1).spawn("producer", Producer)
        port = await consumer.open.call_one()
        busy = consumer.block_loop.call_one(2.0)  # four handshake timeouts
        # The producer dials the consumer's proc for the first time while it is busy.
        assert await asyncio.wait_for(producer.send_many.call_one(port, 100), 30) == 100
        await asyncio.wait_for(busy, 30)
        got = await asyncio.wait_for(consumer.collect.call_one(100), 30)
        assert got == list(range(100))


async def test_a_port_message_that_cannot_be_delivered_fails_its_sender(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DANAUS_CONNECT_TIMEOUT", "1.0")  # how long a refused dial retries
    failed = asyncio.Event()
    failures: list[object] = []

    def hook(failure: object) -> None:
        failures.append(failure)
        if "could not be delivered" in str(failure):
            failed.set()

    set_unhandled_fault_hook(hook)
    try:
        async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
            consumer = await procs.slice(procs=0).spawn("consumer", Consumer)
            producer = await procs.slice(procs=1).spawn("producer", Producer)
            port = await consumer.open.call_one()
            os.kill(procs.pids[0], signal.SIGKILL)
            with pytest.raises(SupervisionError):
                await asyncio.wait_for(consumer.collect.call_one(1), 30)
            # The producer never talked to that proc: its send is queued while dialing,
            # the dial is refused, and the producer hears of it.
            assert await asyncio.wait_for(producer.send_many.call_one(port, 3), 30) == 3
            await asyncio.wait_for(failed.wait(), 30)
            with pytest.raises(SupervisionError, match="could not be delivered"):
                await asyncio.wait_for(producer.ping.call_one(), 30)
    finally:
        set_unhandled_fault_hook(None)


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def test_a_thousand_idle_strangers_cost_a_proc_little(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    monkeypatch.setenv("DANAUS_HANDSHAKE_TIMEOUT", "60")  # they stay for the whole test
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        slow = await procs.spawn("slow", Slow)
        pid = procs.pids[0]
        addr = slow.rank_addrs()[0][1]
        before = _rss(pid)
        socks = []
        try:
            for _ in range(1000):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                socks.append(s)
                # Blocking: waits while the listen backlog is full (the proc accepts on
                # its own). uvloop's sock_connect takes no abstract names.
                s.connect("\0" + addr.removeprefix("unix:@"))
                s.setblocking(False)
            # The proc still serves, having accepted (or refused) every one of them.
            assert await asyncio.wait_for(slow.count.call_one(), 30) == 0
            grown = _rss(pid) - before
            assert grown < (24 << 20), f"{grown >> 20} MiB for 1,000 idle strangers"
            # Past max_unauthenticated (256), strangers are closed as they are accepted.
            by_fd = {s.fileno(): s for s in socks}
            poller = select.poll()
            for fd in by_fd:
                poller.register(fd, select.POLLIN)
            closed: set[int] = set()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while len(closed) < 1000 - config.max_unauthenticated and loop.time() < deadline:
                for fd, _ in poller.poll(1000):
                    if by_fd[fd].recv(1) == b"":
                        closed.add(fd)
                        poller.unregister(fd)
            assert len(closed) == 1000 - config.max_unauthenticated
        finally:
            for s in socks:
                s.close()


async def test_an_actor_calling_a_dead_mesh_it_never_talked_to_fails_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from .exec_actors import Caller, Worker

    failures: list[object] = []
    set_unhandled_fault_hook(failures.append)
    try:
        async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
            target = await procs.slice(procs=0).spawn("target", Worker)
            caller = await procs.slice(procs=1).spawn("caller", Caller, target)
            os.kill(procs.pids[0], signal.SIGKILL)
            with pytest.raises(SupervisionError):
                await asyncio.wait_for(target.incr.call_one(1), 30)
            # The caller's proc never dialed the target's: the refusal is final at once
            # (before: retried for connect_timeout, 30 s).
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises(SupervisionError, match="nothing listens"):
                await asyncio.wait_for(caller.relay.call_one(1), 10)
            assert loop.time() - t0 < 5
    finally:
        set_unhandled_fault_hook(None)
