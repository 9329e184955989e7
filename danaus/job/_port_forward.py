"""``PortForwarder``: TCP port forwards between the procs of two meshes (Monarch's
``monarch.job.PortForwarder``), like ``ssh -L`` through the job's own connections: each
source proc listens on an address, and each connection accepted there is joined to a new
connection to ``127.0.0.1:<port>`` made by the destination proc at the same point.

A forwarded connection is two one-way streams of messages over ports: ``("data",
bytes)`` chunks, each acknowledged (``("ack", n)``, on the other stream) once written,
with at most ``WINDOW`` bytes unacknowledged; then ``("eof",)`` when that side's reader
ends (the other side's writer is half-closed), or ``("abort",)`` when it fails (the other
side's socket is reset). A connection ends once both directions have ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable

from ..actors._api import Actor, Channel, Point, Port, PortReceiver, current_rank, endpoint

__all__ = ["PortForwarder"]

_LOOPBACK = "127.0.0.1"
_CHUNK = 64 << 10
#: how long closing a socket may wait for its peer
_CLOSE_TIMEOUT = 1.0

#: a chunk, its acknowledgement, the end of a direction, or its failure
Message = tuple[str] | tuple[str, bytes] | tuple[str, int]
#: bytes of one direction sent and not yet written on the other side, at most
WINDOW = 4 << 20
PortSpec = int | Callable[[Point], int]
AddressSpec = str | Callable[[Point], str]


def _port(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise ValueError(f"{name} must be a TCP port, an int from 1 to 65535, not {value!r}")
    return value


def _address(value: object) -> tuple[str, int]:
    if not isinstance(value, str):
        raise ValueError(f"src_address must be 'address:port' text, not {value!r}")
    host, colon, port = value.rpartition(":")
    if not colon or not host:
        raise ValueError(f"src_address must be 'address:port', not {value!r}")
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"src_address {value!r}: the port is not a number") from None
    return host.removeprefix("[").removesuffix("]"), _port("src_address's port", number)


async def _close(writer: asyncio.StreamWriter, abort: bool = False) -> None:
    if abort:
        writer.transport.abort()
        return
    writer.close()
    try:
        async with asyncio.timeout(_CLOSE_TIMEOUT):
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
    reader: asyncio.StreamReader, out: Port[Message], window: _Window
) -> None:
    try:
        while chunk := await reader.read(_CHUNK):
            await window.take(len(chunk))
            out.send(("data", chunk))
    except OSError:
        out.send(("abort",))
        raise
    out.send(("eof",))


async def _port_to_socket(
    inbox: PortReceiver[Message],
    writer: asyncio.StreamWriter,
    ended: asyncio.Event,
    out: Port[Message],
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


class _Relays:
    """The forwarded connections of one actor, each a task, ended at its cleanup."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def start(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        out: Port[Message],
        inbox: PortReceiver[Message],
    ) -> None:
        task = asyncio.get_running_loop().create_task(self._relay(reader, writer, out, inbox))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _relay(
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        out: Port[Message],
        inbox: PortReceiver[Message],
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
            await _close(writer, abort=failed)

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _Destination(Actor):
    """Opens the connections to the forwarded service, on its proc's loopback."""

    def __init__(self) -> None:
        self._port: int | None = None
        self._relays = _Relays()

    @endpoint
    async def configure(self, dst_port: PortSpec) -> None:
        self._port = _port("dst_port", dst_port(current_rank()) if callable(dst_port) else dst_port)

    @endpoint
    async def open(self, back: Port[Message]) -> Port[Message]:
        """Connect to the service; where to send it the source's bytes."""
        if self._port is None:
            raise RuntimeError("this port forward's destination has no port yet")
        reader, writer = await asyncio.open_connection(_LOOPBACK, self._port)
        to_here, inbox = Channel[Message].open()
        self._relays.start(reader, writer, back, inbox)
        return to_here

    async def __cleanup__(self, exc: BaseException | None) -> None:
        del exc
        await self._relays.close()


class _Source(Actor):
    """Listens on the forwarded address; joins each connection to a destination's."""

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._destination: _Destination | None = None
        self._relays = _Relays()

    @endpoint
    async def listen(self, destination: _Destination, src_address: AddressSpec) -> None:
        point = current_rank()
        self._destination = destination.slice(**dict(point))  # the same point there
        host, port = _address(src_address(point) if callable(src_address) else src_address)
        # (reuse_port: procs of one host may share the address; the kernel spreads
        # the connections among them)
        self._server = await asyncio.start_server(self._accepted, host, port, reuse_port=True)

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        destination = self._destination
        if destination is None:
            await _close(writer, abort=True)
            return
        try:
            back, inbox = Channel[Message].open()
            to_there = await destination.open.call_one(back)
        except Exception:  # the service refused, or its proc is gone: reset this one
            await _close(writer, abort=True)
            return
        self._relays.start(reader, writer, to_there, inbox)

    async def __cleanup__(self, exc: BaseException | None) -> None:
        del exc
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(OSError, TimeoutError):
                async with asyncio.timeout(_CLOSE_TIMEOUT):
                    await server.wait_closed()
        await self._relays.close()


class PortForwarder(Actor):
    """Owns port forwards: spawn it (on this proc: ``this_proc().spawn("fwd",
    PortForwarder)``), call :meth:`forward` for each, and stop it to end them all (their
    listening sockets close, their connections are reset)."""

    def __init__(self) -> None:
        self._meshes: list[_Source | _Destination] = []

    @endpoint
    async def forward(
        self,
        dst_proc_mesh: object,
        dst_port: PortSpec,
        src_proc_mesh: object,
        src_address: AddressSpec,
    ) -> None:
        """Forward, at each point of ``src_proc_mesh``, the address ``src_address``
        (``"host:port"``, or a function of the point giving one) to
        ``127.0.0.1:dst_port`` (an int, or a function of the point) at the same point of
        ``dst_proc_mesh``. Returns once every source listens.

        Raises:
            ValueError: the meshes' shapes differ, or an address or port is malformed
                (one given as a function is checked at its point).
            OSError: a source could not listen (the address is taken); nothing of this
                forward is left running.
        """
        from ..mesh import ProcMesh

        if not isinstance(dst_proc_mesh, ProcMesh) or not isinstance(src_proc_mesh, ProcMesh):
            raise TypeError("forward() takes two proc meshes (destination, then source)")
        if dict(dst_proc_mesh.sizes) != dict(src_proc_mesh.sizes):
            raise ValueError(
                "the destination and source proc meshes must have the same shape: "
                f"{dict(dst_proc_mesh.sizes)} != {dict(src_proc_mesh.sizes)}"
            )
        if not callable(dst_port):
            _port("dst_port", dst_port)
        if not callable(src_address):
            _address(src_address)
        tag = uuid.uuid4().hex[:12]
        spawned: list[_Source | _Destination] = []
        try:
            destination = await dst_proc_mesh.spawn(f"port_forward_dst_{tag}", _Destination)
            spawned.append(destination)
            await destination.configure.call(dst_port)
            source = await src_proc_mesh.spawn(f"port_forward_src_{tag}", _Source)
            spawned.append(source)
            await source.listen.call(destination, src_address)
        except BaseException:
            await asyncio.gather(*(m.stop() for m in spawned), return_exceptions=True)
            raise
        self._meshes += spawned

    async def __cleanup__(self, exc: BaseException | None) -> None:
        del exc
        meshes, self._meshes = self._meshes, []
        await asyncio.gather(*(m.stop() for m in meshes), return_exceptions=True)
