"""``attach(addr)`` (Monarch's ``monarch.actor.attach``): a controller that reaches its
job, and is reached by it, through one connection to one host agent, for a controller
the job's procs cannot dial (outside the cluster's network, behind NAT) and that can
dial nothing of the job but that agent.

Every host agent runs a :class:`Gateway` (a system actor beside its ``HostAgent``). A
controller that attaches to it:

1. *reserves* an address on the agent's host (a listening socket there: ``tcp://HOST:0``
   for an agent on TCP, a fresh abstract Unix name for one on a Unix socket), asking
   from a short-lived runtime of its own;
2. starts its own runtime known to everyone by that address (its listening socket stays
   local, for nobody in particular), and *claims* the reservation over the one
   connection it keeps to the agent, which from then on is the reservation's owner: when
   that connection is lost, the address closes and the agent kills its procs, as for
   any controller;
3. reaches every other address through the agent: each connection it dials is a
   socket pair here, one end served as the connection, the other relayed as actor
   messages to the agent (:mod:`danaus.mesh._byte_relay`), which dials the address from
   its host; and each connection a peer makes to the reserved address is relayed the
   same way back, and served here as if accepted.

The relay carries bytes only: connections still authenticate end to end (the job key)
and their frames are tagged with session keys the agent never learns, so it cannot read
them into anything or slip its own in. Procs this controller starts on its own machine
(``this_host()``) are dialed directly; they reach the controller at its address, through
the agent, as everyone does.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import socket
from typing import cast

from ..actors.seam import (
    Actor,
    Channel,
    Port,
    PortReceiver,
    Runtime,
    all_runtimes,
    current_runtime,
    endpoint,
    parse_addr,
    run_on,
    start_background_runtime,
)
from ..config import config
from ..geometry import Shape
from ._actor_mesh import ActorMesh, mesh_ref
from ._byte_relay import RelayMessage, Relays, close_writer
from ._process import process
from ._procs.local import bind_abstract, started_here

__all__ = ["GATEWAY", "Gateway", "attach"]

log = logging.getLogger("danaus.gateway")

#: The gateway's actor key in a host agent's runtime.
GATEWAY = "__gateway__"


class _Reservation:
    """An address on the agent's host, held for one controller."""

    def __init__(self, addr: str, server: asyncio.Server, token: str) -> None:
        self.addr = addr
        self.server = server
        self.token = token
        self.notify: Port[int] | None = None  # the owner's, once claimed
        self.relays = Relays()
        self.waiting: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}


class Gateway(Actor):
    """In a host agent: the addresses it holds for attached controllers, and the
    connections it relays for them (see the module's docstring)."""

    def __init__(self, host: str | None) -> None:
        #: the TCP host reserved addresses are on; None: an agent on a Unix socket
        self.host = host
        self.reserved: dict[str, _Reservation] = {}  # by address
        self.dialed = Relays()
        self._ids = itertools.count(1)
        self._counts = {"dialed": 0, "accepted": 0}

    @endpoint
    async def reserve(self) -> tuple[str, str]:
        """Listen on a fresh address of this host for a controller to claim; return the
        address and the secret that claims it. Unclaimed after ``attach_timeout`` s, it
        closes."""
        rt = current_runtime()
        rt.watch_lost(self._owner_lost)  # (once: the runtime keeps one of each)
        token = secrets.token_hex(16)  # only the controller that reserved it claims it
        holder: list[_Reservation] = []

        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._accepted(holder[0], reader, writer)

        if self.host is not None:
            server = await asyncio.start_server(accepted, self.host, 0)
            host, port = server.sockets[0].getsockname()[:2]
            addr = f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
        else:
            sock, addr = bind_abstract()
            server = await asyncio.start_unix_server(accepted, sock=sock)
        r = _Reservation(addr, server, token)
        holder.append(r)
        self.reserved[addr] = r
        rt.loop.call_later(config.attach_timeout, self._expire, addr, token)
        return addr, token

    @endpoint
    async def claim(self, addr: str, token: str, notify: Port[int]) -> None:
        """The caller, known to everyone as ``addr``, owns that reservation from now on;
        connections made to it are announced to ``notify`` (a number to ``join``)."""
        r = self.reserved.get(addr)
        if r is None or r.token != token:
            raise ValueError(f"no reservation of {addr} with that secret (expired?)")
        if r.notify is not None:
            raise ValueError(f"{addr} is claimed already")
        r.notify = notify
        for number in list(r.waiting):
            notify.send(number)

    @endpoint
    async def join(self, addr: str, number: int, back: Port[RelayMessage]) -> Port[RelayMessage]:
        """Relay connection ``number`` made to ``addr`` to ``back``; where to send it
        the owner's bytes."""
        r = self.reserved.get(addr)
        pair = r.waiting.pop(number, None) if r is not None else None
        if r is None or pair is None:
            raise ValueError(f"no connection {number} waits at {addr}")
        to_here, inbox = Channel[RelayMessage].open()
        r.relays.start(pair[0], pair[1], back, inbox)
        return to_here

    @endpoint
    async def connect(self, addr: str, back: Port[RelayMessage]) -> Port[RelayMessage]:
        """Dial ``addr`` from this host and relay it to ``back``; where to send it the
        caller's bytes. Fails (``OSError``) as the dial does, within ``connect_timeout``."""
        _, where = parse_addr(addr)
        async with asyncio.timeout(config.connect_timeout):
            if isinstance(where, str):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.setblocking(False)
                try:
                    await asyncio.get_running_loop().sock_connect(sock, where)
                except BaseException:
                    sock.close()
                    raise
                reader, writer = await asyncio.open_unix_connection(sock=sock)
            else:
                reader, writer = await asyncio.open_connection(where[0], where[1])
                tsock = writer.get_extra_info("socket")
                if tsock is not None:
                    tsock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        to_here, inbox = Channel[RelayMessage].open()
        self.dialed.start(reader, writer, back, inbox)
        self._counts["dialed"] += 1
        return to_here

    @endpoint
    def counts(self) -> dict[str, int]:
        """Connections relayed so far: ``dialed`` for attached controllers, ``accepted``
        at their addresses; and the addresses held now (``reserved``)."""
        return {**self._counts, "reserved": len(self.reserved)}

    async def _accepted(
        self, r: _Reservation, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if len(r.waiting) >= config.max_unauthenticated:
            await close_writer(writer, abort=True)  # nobody joins them: a flood
            return
        number = next(self._ids)
        r.waiting[number] = (reader, writer)
        self._counts["accepted"] += 1
        if r.notify is not None:
            r.notify.send(number)
        # not joined in time (the owner is gone or stalled): let it go
        asyncio.get_running_loop().call_later(config.connect_timeout, self._drop, r, number)

    def _drop(self, r: _Reservation, number: int) -> None:
        pair = r.waiting.pop(number, None)
        if pair is not None:
            pair[1].transport.abort()

    def _expire(self, addr: str, token: str) -> None:
        r = self.reserved.get(addr)
        if r is not None and r.token == token and r.notify is None:
            log.warning("reservation of %s was not claimed in time: closed", addr)
            self._close(addr)

    def _owner_lost(self, owner: str) -> None:
        if owner in self.reserved:
            log.warning("attached controller %s is gone: closing its address", owner)
            self._close(owner)

    def _close(self, addr: str) -> None:
        r = self.reserved.pop(addr, None)
        if r is None:
            return
        r.server.close()
        for _, writer in r.waiting.values():
            writer.transport.abort()
        r.waiting.clear()
        asyncio.get_running_loop().create_task(r.relays.close())

    async def __cleanup__(self, exc: BaseException | None) -> None:
        del exc
        for addr in list(self.reserved):
            self._close(addr)
        await self.dialed.close()


class _Route:
    """The controller's side: which addresses go through the gateway, and the relays."""

    def __init__(self, rt: Runtime, agent: str, gateway: ActorMesh[Gateway]) -> None:
        self.rt = rt
        self.agent = agent
        self.gateway = gateway
        self.relays = Relays()

    def routes(self, addr: str) -> bool:
        return addr != self.agent and addr != self.rt.addr and not started_here(addr)

    async def open(self, addr: str) -> socket.socket:
        here, there = socket.socketpair()
        try:
            back, inbox = Channel[RelayMessage].open()
            to_there = cast("Port[RelayMessage]", await self.gateway.connect.call_one(addr, back))
            await self._relay(there, to_there, inbox)
        except BaseException:
            here.close()
            there.close()
            raise
        here.setblocking(False)
        return here

    async def accepting(self, numbers: PortReceiver[int]) -> None:
        """Serve each connection made to this controller's address, as the gateway
        announces them."""
        while True:
            number = await numbers.recv()
            self.rt.spawn_task(self._join(number))

    async def _join(self, number: int) -> None:
        here, there = socket.socketpair()
        try:
            back, inbox = Channel[RelayMessage].open()
            joined = await self.gateway.join.call_one(self.rt.addr, number, back)
            to_there = cast("Port[RelayMessage]", joined)
            await self._relay(there, to_there, inbox)
            here.setblocking(False)
            await self.rt.accept_socket(here, tag_as_tcp=self.rt.addr.startswith("tcp://"))
        except Exception as e:  # that peer's connection only: the others go on
            here.close()
            there.close()
            log.warning("connection %d through the gateway could not be joined: %s", number, e)

    async def _relay(
        self, sock: socket.socket, out: Port[RelayMessage], inbox: PortReceiver[RelayMessage]
    ) -> None:
        sock.setblocking(False)
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        self.relays.start(reader, writer, out, inbox)


def attach(addr: str, *, key_file: str | None = None) -> None:
    """Reach the job, and be reached by it, only through the host agent at ``addr``
    (``tcp://host:port``, or ``ipc:///path`` / ``unix:/path`` on this machine), as
    Monarch's ``attach``: the first thing this controller does with danaus.

    ``attach_to_workers`` / ``attach_to_hosts`` then give meshes of that agent's host (or
    of others its host can reach); ``this_host()`` is still this machine. The key is as
    for ``attach_to_hosts``: ``key_file``, ``DANAUS_AUTH_KEY``, else this user's default.

    Attaching again through the same agent does nothing (a job's ``state()`` may ask).

    Raises:
        RuntimeError: danaus already runs in this process (call ``attach`` first), or
            it is attached through another agent.
        ValueError: ``addr`` is not a host agent's address.
        ConnectionError: no host agent answers at ``addr`` (within ``attach_timeout``),
            or it refuses the key.
    """
    from ._procs.host_agent import agent_address, use_agents_key

    agent = agent_address(addr)
    if process.attached is not None:
        if process.attached == agent:
            return  # attached there already (a job's state() asks again)
        raise RuntimeError(
            f"attach({addr!r}): this process is attached through {process.attached} already; "
            "detaching is not possible: attach elsewhere from a new process"
        )
    if any(not rt.closed for rt in all_runtimes()):  # (danaus has begun here)
        raise RuntimeError(
            "danaus already runs in this process; call attach(addr) before anything else "
            "of danaus (the first spawn, call or other message)"
        )
    use_agents_key([agent], key_file)
    try:
        reserved, token = asyncio.run(_reserve(agent))
    except Exception as e:
        raise ConnectionError(
            f"attach({addr!r}): no gateway of a host agent answered there: {e}"
        ) from e
    sock, _ = bind_abstract()  # where it listens: nobody need dial it there
    rt = start_background_runtime(reserved, sock)
    gateway = _gateway_ref(agent)
    route = _Route(rt, agent, gateway)
    numbers, receiver = _open_channel(rt)
    try:
        gateway.claim.call_one(reserved, token, numbers).get(timeout=config.attach_timeout)
    except Exception as e:
        raise ConnectionError(f"attach({addr!r}): the gateway's address was not ours: {e}") from e

    def install() -> None:
        rt.via = route
        rt.spawn_task(route.accepting(receiver))

    run_on(rt, install)
    process.attached = agent


async def _reserve(agent: str) -> tuple[str, str]:
    """From a runtime of its own, closed after: the gateway's reservation."""
    rt = current_runtime()
    try:
        async with asyncio.timeout(config.attach_timeout):
            reserved = await _gateway_ref(agent).reserve.call_one()
        return cast("tuple[str, str]", reserved)
    finally:
        await rt.aclose()


def _gateway_ref(agent: str) -> ActorMesh[Gateway]:
    return mesh_ref(GATEWAY, Gateway, Shape.from_sizes({}), {0: agent})


def _open_channel(rt: Runtime) -> tuple[Port[int], PortReceiver[int]]:
    from ..actors.seam import call_in_loop

    return call_in_loop(rt, Channel[int].open)
