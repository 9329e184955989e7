"""A socket joined to a pair of ports: a byte stream carried as actor messages, both
ways, with flow control. Port forwards (``danaus.job.PortForwarder``) and the gateway of
``attach`` (:mod:`danaus.mesh._gateway`) carry connections this way.

Each direction is a stream of messages over a port: ``("data", bytes)`` chunks, each
acknowledged (``("ack", n)``, on the other stream) once written, with at most ``WINDOW``
bytes unacknowledged; then ``("eof",)`` when that side's reader ends (the other side's
writer is half-closed), or ``("abort",)`` when it fails (the other side's socket is
reset). A connection ends once both directions have ended.
"""

from __future__ import annotations

import asyncio
import contextlib

from ..actors.seam import Port, PortReceiver

__all__ = ["CLOSE_TIMEOUT", "WINDOW", "RelayMessage", "Relays", "close_writer"]

CHUNK = 64 << 10
#: how long closing a socket may wait for its peer
CLOSE_TIMEOUT = 1.0
#: a chunk, its acknowledgement, the end of a direction, or its failure
RelayMessage = tuple[str] | tuple[str, bytes] | tuple[str, int]
#: bytes of one direction sent and not yet written on the other side, at most
WINDOW = 4 << 20


async def close_writer(writer: asyncio.StreamWriter, abort: bool = False) -> None:
    if abort:
        writer.transport.abort()
        return
    writer.close()
    try:
        async with asyncio.timeout(CLOSE_TIMEOUT):
            await writer.wait_closed()
    except (OSError, TimeoutError):
        writer.transport.abort()


class _Window:
    """Flow control of one direction: at most ``WINDOW`` bytes sent and not yet written
    by the other side (it acknowledges each chunk once written): a reader that stops
    reading stops this side's reading too, instead of piling bytes up in the procs."""

    def __init__(self) -> None:
        self._unacked = 0
        self._changed = asyncio.Condition()

    async def take(self, n: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self._unacked == 0 or self._unacked + n <= WINDOW)
            self._unacked += n

    async def give(self, n: int) -> None:
        async with self._changed:
            self._unacked = max(0, self._unacked - n)
            self._changed.notify_all()


async def _socket_to_port(
    reader: asyncio.StreamReader, out: Port[RelayMessage], window: _Window
) -> None:
    try:
        while chunk := await reader.read(CHUNK):
            await window.take(len(chunk))
            out.send(("data", chunk))
    except OSError:
        out.send(("abort",))
        raise
    out.send(("eof",))


async def _port_to_socket(
    inbox: PortReceiver[RelayMessage],
    writer: asyncio.StreamWriter,
    ended: asyncio.Event,
    out: Port[RelayMessage],
    window: _Window,
) -> None:
    """The other side's bytes to this socket, each chunk acknowledged once written, and
    its acknowledgements of ours to ``window``; at its "eof", half-close the socket and
    set ``ended``, then keep listening: acknowledgements and an "abort" may still come
    (its socket reset later, seen as an end of its reading first)."""
    while True:
        message = await inbox.recv()
        kind = message[0]
        value = message[1] if len(message) == 2 else None
        if kind == "data" and isinstance(value, bytes) and not ended.is_set():
            writer.write(value)
            await writer.drain()
            out.send(("ack", len(value)))
        elif kind == "ack" and isinstance(value, int):
            await window.give(value)
        elif kind == "eof" and not ended.is_set():
            if writer.can_write_eof():
                writer.write_eof()
            ended.set()
        else:  # "abort" (or what cannot come): this connection is broken
            raise ConnectionAbortedError("the other end of the forwarded connection failed")


class Relays:
    """The forwarded connections of one actor, each a task, ended at its cleanup."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def start(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        out: Port[RelayMessage],
        inbox: PortReceiver[RelayMessage],
    ) -> None:
        task = asyncio.get_running_loop().create_task(self._relay(reader, writer, out, inbox))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _relay(
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        out: Port[RelayMessage],
        inbox: PortReceiver[RelayMessage],
    ) -> None:
        failed = False
        ended = asyncio.Event()
        window = _Window()
        sending = asyncio.ensure_future(_socket_to_port(reader, out, window))
        receiving = asyncio.ensure_future(_port_to_socket(inbox, writer, ended, out, window))
        both_ended = asyncio.ensure_future(ended.wait())
        tasks: set[asyncio.Future[object]] = {sending, receiving, both_ended}  # type: ignore[arg-type]
        try:
            # done when both directions ended, or at the first failure of either
            while not (sending.done() and ended.is_set()):
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
                tasks -= done
        except BaseException as e:  # a socket's error, the other end's abort, or a cancel
            failed = True
            with contextlib.suppress(Exception):
                out.send(("abort",))
            if not isinstance(e, Exception):
                raise
        finally:
            sending.cancel()
            receiving.cancel()
            both_ended.cancel()
            await asyncio.gather(sending, receiving, both_ended, return_exceptions=True)
            await close_writer(writer, abort=failed)

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
