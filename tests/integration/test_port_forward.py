"""``PortForwarder``: TCP forwards between the procs of two meshes, as a user of
Monarch's ``monarch.job.PortForwarder`` relies on them: bytes both ways with half-close,
a reset on one end reaching the other, per-point ports, and bad input named."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from danaus import SupervisionError, this_host, this_proc
from danaus.job import PortForwarder

from ..ports import free_ports

pytestmark = pytest.mark.timeout(60)
HOST = "127.0.0.1"


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1 << 16):
        writer.write(data)
        await writer.drain()
    writer.close()


async def round_trip(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(payload)
    writer.write_eof()  # half-close: the echo ends once it has sent everything back
    got = await reader.read()
    writer.close()
    return got


@pytest.fixture
async def procs() -> AsyncIterator[Any]:
    async with this_host().spawn_procs(per_host={"procs": 2}, name="pf") as mesh:
        yield mesh


async def test_bytes_go_both_ways_and_stop_closes_every_forward(procs: Any) -> None:
    service = await asyncio.start_server(echo, HOST, 0)
    target = service.sockets[0].getsockname()[1]
    fwd = await this_proc().spawn("fwd", PortForwarder)
    ports = free_ports(2)
    for port in ports:
        await fwd.forward.call_one(
            procs.slice(procs=0), target, procs.slice(procs=1), f"{HOST}:{port}"
        )
    payload = bytes(range(256)) * 4096  # 1 MiB, in many chunks
    got = await asyncio.gather(*(round_trip(p, payload) for p in ports))
    assert got == [payload, payload]
    await fwd.stop()
    for port in ports:
        with pytest.raises(OSError):
            await asyncio.open_connection(HOST, port)
    service.close()


async def test_a_reset_reaches_the_service_and_per_point_ports_work(procs: Any) -> None:
    gone = asyncio.Event()
    hello = asyncio.Event()

    async def talker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hello.set()
        try:
            while True:  # writes until the other end is reset
                writer.write(b"y" * (1 << 16))
                await writer.drain()
        except OSError:
            gone.set()

    service = await asyncio.start_server(talker, HOST, 0)
    target = service.sockets[0].getsockname()[1]
    ports = free_ports(2)
    fwd = await this_proc().spawn("fwd2", PortForwarder)
    try:
        # every proc forwards its own port (ports[its rank]) to the service
        await fwd.forward.call_one(
            procs, lambda p: target, procs, lambda p: f"{HOST}:{ports[p.rank]}"
        )
        for port in ports:
            _, writer = await asyncio.open_connection(HOST, port)
            await asyncio.wait_for(hello.wait(), 10)
            writer.transport.abort()  # a reset, not a close
            await asyncio.wait_for(gone.wait(), 10)
            hello.clear()
            gone.clear()
    finally:
        await fwd.stop()
        service.close()


async def test_mistakes_are_named_and_leave_nothing_running(procs: Any) -> None:
    fwd = await this_proc().spawn("fwd3", PortForwarder)
    other = this_host().spawn_procs(per_host={"procs": 3}, name="three")
    try:
        with pytest.raises(ValueError, match="same shape"):
            await fwd.forward.call_one(other, 80, procs, f"{HOST}:1")
        with pytest.raises(ValueError, match="'address:port'"):
            await fwd.forward.call_one(procs, 80, procs, "nocolon")
        with pytest.raises(ValueError, match="from 1 to 65535"):
            await fwd.forward.call_one(procs, 70000, procs, f"{HOST}:1")
        with socket.socket() as taken:
            taken.bind((HOST, 0))
            taken.listen()
            with pytest.raises(OSError):
                await fwd.forward.call_one(
                    procs.slice(procs=0),
                    80,
                    procs.slice(procs=1),
                    f"{HOST}:{taken.getsockname()[1]}",
                )
        # the half-made forward was stopped: its destination actors answer no more
        stats = await procs.stats()
        names = {n for rec in stats.values() for n in rec["actors"]}
        assert not any("port_forward" in n for n in names), names
    finally:
        await fwd.stop()
        await other.stop()
    with pytest.raises(SupervisionError):
        await fwd.forward.call_one(procs, 80, procs, f"{HOST}:1")


async def test_a_reader_that_stops_reading_stops_the_sender(procs: Any) -> None:
    """Flow control: bytes in flight are bounded (port_forward.WINDOW), so a service
    writing to a client that reads nothing blocks, instead of its bytes piling up in
    the procs; once the client reads, every byte arrives, in order."""
    total = 96 << 20  # (far past what the window and the sockets' buffers hold)
    finished = asyncio.Event()

    async def firehose(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        block = bytes(range(256)) * 4096  # 1 MiB
        for _ in range(total // len(block)):
            writer.write(block)
            await writer.drain()
        writer.close()
        finished.set()

    service = await asyncio.start_server(firehose, HOST, 0)
    fwd = await this_proc().spawn("fwd4", PortForwarder)
    port = free_ports(1)[0]
    await fwd.forward.call_one(
        procs.slice(procs=0),
        service.sockets[0].getsockname()[1],
        procs.slice(procs=1),
        f"{HOST}:{port}",
    )
    reader, writer = await asyncio.open_connection(HOST, port)
    with pytest.raises(TimeoutError):  # nobody reads: the service cannot finish
        await asyncio.wait_for(finished.wait(), 2)
    got = 0
    while chunk := await reader.read(1 << 20):
        got += len(chunk)
    assert got == total and finished.is_set()
    writer.close()
    await fwd.stop()
    service.close()
