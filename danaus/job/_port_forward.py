"""``PortForwarder``: TCP port forwards between the procs of two meshes (Monarch's
``monarch.job.PortForwarder``), like ``ssh -L`` through the job's own connections: each
source proc listens on an address, and each connection accepted there is joined to a new
connection to ``127.0.0.1:<port>`` made by the destination proc at the same point.

A forwarded connection is a byte stream over a pair of ports, both ways, with flow
control (:mod:`danaus.mesh._byte_relay`).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable

from ..actors.seam import Actor, Channel, Port, current_rank, endpoint
from ..geometry import Point
from ..mesh.seam import CLOSE_TIMEOUT, RelayMessage, Relays, close_writer

__all__ = ["PortForwarder"]

_LOOPBACK = "127.0.0.1"
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


class _Destination(Actor):
    """Opens the connections to the forwarded service, on its proc's loopback."""

    def __init__(self) -> None:
        self._port: int | None = None
        self._relays = Relays()

    @endpoint
    async def configure(self, dst_port: PortSpec) -> None:
        self._port = _port("dst_port", dst_port(current_rank()) if callable(dst_port) else dst_port)

    @endpoint
    async def open(self, back: Port[RelayMessage]) -> Port[RelayMessage]:
        """Connect to the service; where to send it the source's bytes."""
        if self._port is None:
            raise RuntimeError("this port forward's destination has no port yet")
        reader, writer = await asyncio.open_connection(_LOOPBACK, self._port)
        to_here, inbox = Channel[RelayMessage].open()
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
        self._relays = Relays()

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
            await close_writer(writer, abort=True)
            return
        try:
            back, inbox = Channel[RelayMessage].open()
            to_there = await destination.open.call_one(back)
        except Exception:  # the service refused, or its proc is gone: reset this one
            await close_writer(writer, abort=True)
            return
        self._relays.start(reader, writer, to_there, inbox)

    async def __cleanup__(self, exc: BaseException | None) -> None:
        del exc
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(OSError, TimeoutError):
                async with asyncio.timeout(CLOSE_TIMEOUT):
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
