"""Actors that return and raise awkward values (importable by procs)."""

from __future__ import annotations

import os
from typing import Any

from danaus import Actor, endpoint


class Custom(BaseException):
    """A BaseException that is neither SystemExit nor KeyboardInterrupt (like pytest's
    ``Failed`` or greenlet's ``GreenletExit``)."""


_RAISE: dict[str, BaseException] = {
    "KeyboardInterrupt": KeyboardInterrupt("from the endpoint"),
    "SystemExit": SystemExit(3),
    "Custom": Custom("a custom BaseException"),
}

NOT_UTF8 = os.fsdecode(b"report-\xff.txt")  # what os.listdir gives for such a name


class Values(Actor):
    @endpoint
    def echo(self, x: Any) -> Any:
        return x

    @endpoint
    async def aecho(self, x: Any) -> Any:
        return x

    @endpoint
    def make(self, kind: str, n: int) -> Any:
        if kind == "str":
            return "x" * n
        if kind == "list":
            return list(range(n))
        if kind == "bytes":
            return b"\x01" * n
        if kind == "not utf-8":
            return [NOT_UTF8, {"name": NOT_UTF8}]
        raise ValueError(kind)

    @endpoint
    async def amake(self, kind: str, n: int) -> Any:
        return self.make(kind, n)

    @endpoint
    def raise_not_utf8(self) -> None:
        raise FileNotFoundError(f"no such file: {NOT_UTF8}")

    @endpoint
    async def araise_not_utf8(self) -> None:
        raise FileNotFoundError(f"no such file: {NOT_UTF8}")

    @endpoint
    def raise_base(self, which: str) -> None:
        raise _RAISE[which]

    @endpoint
    async def araise_base(self, which: str) -> None:
        raise _RAISE[which]

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Slow(Actor):
    """Takes its time over each message, so a fast sender fills its mailbox."""

    def __init__(self) -> None:
        self.done = 0

    @endpoint
    def work(self, seconds: float) -> None:
        import time

        time.sleep(seconds)
        self.done += 1

    @endpoint
    async def awork(self, seconds: float) -> None:
        import asyncio

        await asyncio.sleep(seconds)
        self.done += 1

    @endpoint
    async def count(self) -> int:
        return self.done


class Consumer(Actor):
    """Receives on a port of its own; can make its proc's loop busy."""

    @endpoint
    async def open(self) -> Any:
        from danaus import Channel

        port, self.receiver = Channel.open()
        return port

    @endpoint
    async def block_loop(self, seconds: float) -> None:
        import time

        time.sleep(seconds)  # noqa: ASYNC251 - blocks the proc's loop on purpose: a busy proc

    @endpoint
    async def collect(self, n: int) -> list[Any]:
        return [await self.receiver.recv() for _ in range(n)]


class Producer(Actor):
    @endpoint
    def send_many(self, port: Any, n: int) -> int:
        for i in range(n):
            port.send(i)
        return n

    @endpoint
    async def ping(self) -> str:
        return "pong"


class NoTorch(Actor):
    """Used where torch cannot be imported: numpy values and RDMA buffers still work."""

    @endpoint
    def double(self, a: Any) -> Any:
        return a * 2

    @endpoint
    def buffer(self, n: int) -> Any:
        import numpy as np

        from danaus.rdma import RDMABuffer

        self.data = np.arange(n, dtype=np.uint8)
        return RDMABuffer(self.data)

    @endpoint
    def torch_loaded(self) -> bool:
        import sys

        return "torch" in sys.modules
