"""The sockets of a runtime: its listening address, and dialing a peer.

A runtime binds its address as it is made (so peers can dial before its server task
first runs), serves it with one :class:`~danaus.actors._connection.Connection` per
accepted socket, and dials each peer once. This module owns the :class:`Listener` (the
listening socket, its server, and the bound on connections waiting to authenticate)
and the dial (TLS, ``TCP_NODELAY``, the retry for a socket file not there yet); the
runtime owns the connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
from collections.abc import Callable
from typing import Protocol

from ..config import config
from ._address import parse_addr, tls_context
from ._connection import Connection
from ._peers import peers

__all__ = ["Listener", "Via", "bind", "dial"]


class Via(Protocol):
    """A way to reach peers other than directly (``attach``'s gateway): set as
    ``Runtime.via``, it is asked about each address this runtime dials."""

    def routes(self, addr: str) -> bool:
        """Whether ``addr`` is reached this way (else it is dialed directly)."""
        ...

    async def open(self, addr: str) -> socket.socket:
        """A connected stream socket whose other end reaches ``addr``."""
        ...


log = logging.getLogger("danaus.runtime")
#: where connections' troubles are logged (strangers included)
conn_log = logging.getLogger("danaus.connection")


def _bind_path(sock: socket.socket, path: str) -> None:
    """Bind a socket file that appears only once it listens: bound and listening under a
    name of its own, then renamed into place. A peer that waits for the file to appear
    (a job's worker, found by its socket file) and dials in the moment between
    ``bind`` and ``listen`` would be refused, and a refused dial means the owner is gone."""
    if os.path.exists(path):
        raise OSError(errno.EADDRINUSE, f"{path} exists: another socket is bound there")
    tmp = f"{path}.{os.getpid()}.binding"
    sock.bind(tmp)
    try:
        sock.listen(512)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def bind(addr: str) -> socket.socket:
    """Bind now, so peers can dial before the server task first runs."""
    family, where = parse_addr(addr)
    if family == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        sock = socket.socket(socket.AF_INET6 if ":" in where[0] else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        if isinstance(where, str) and not where.startswith("\0"):
            _bind_path(sock, where)
        else:
            sock.bind(where)
            sock.listen(512)
    except BaseException:
        sock.close()  # e.g. the address is taken: no socket left for the GC to warn about
        raise
    sock.setblocking(False)
    return sock


class Listener:
    """The listening socket of one runtime (bound now, or handed over bound), its server,
    and the log of strangers: connections closed before they authenticated (for bad
    bytes, silence, or past ``config.max_unauthenticated`` waiting), counted, one line
    a second."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, addr: str, sock: socket.socket | None
    ) -> None:
        self.loop = loop
        self._server: asyncio.AbstractServer | None = None
        self._sock = sock if sock is not None else bind(addr)
        self._sock.setblocking(False)
        if addr.startswith("tcp://") and addr.endswith(":0"):
            host, port = self._sock.getsockname()[:2]  # port 0: the kernel picked one
            addr = f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
        #: the address peers dial
        self.addr = addr
        self._refused = 0  # strangers closed since the last log line about them
        self._refused_logged = -1e9
        self._refused_why: BaseException | None = None
        self._refused_flush: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        return f"<Listener {self.addr} serving={self._server is not None}>"

    async def serve(self, accept: Callable[[], Connection]) -> None:
        """Serve the socket: ``accept()`` makes the connection of each peer that dials."""
        sock = self._sock
        if sock.family == socket.AF_UNIX:
            self._server = await self.loop.create_unix_server(accept, sock=sock)
        else:
            self._server = await self.loop.create_server(
                accept, sock=sock, ssl=tls_context(server=True)
            )

    def note_stranger(self, why: BaseException) -> None:
        """A connection that never authenticated was closed: it sent garbage, closed
        mid-frame, stayed silent past the handshake deadline, failed the key, or waited
        longest when too many waited. At most one line a second says so, with a count
        (those of the rest of the second come in the next line), however many come: a
        stranger must not flood the logs."""
        self._refused += 1
        self._refused_why = why
        wait = self._refused_logged + 1.0 - self.loop.time()
        if wait <= 0:
            self._log_strangers()
        elif self._refused_flush is None:
            self._refused_flush = self.loop.call_later(wait, self._log_strangers)

    def _log_strangers(self) -> None:
        self._refused_flush = None
        if not self._refused:
            return
        self._refused_logged = self.loop.time()
        conn_log.error(
            "refused connection(s) before they authenticated: %d since the last such "
            "line (someone local is probing?); the last: %s",
            self._refused,
            self._refused_why,
        )
        self._refused = 0

    def close(self) -> None:
        """Stop listening."""
        if self._refused_flush is not None:
            self._refused_flush.cancel()
            self._log_strangers()
        if self._server is not None:
            self._server.close()
        else:
            self._sock.close()

    def abandon(self) -> None:
        """Release the socket of a runtime whose event loop has closed."""
        self._sock.close()


async def dial(loop: asyncio.AbstractEventLoop, conn: Connection) -> None:
    """Connect ``conn`` to its peer (once the peer is ready, if we spawned it); a peer
    that cannot be reached closes ``conn`` (:meth:`Connection.never_opened`)."""
    assert conn.peer is not None
    try:
        await peers.wait_ready(conn.peer)
        _, where = parse_addr(conn.peer)
        # Every address is listening before anyone learns it (runtimes bind as they
        # are made; a proc's socket is bound by its spawner and handed to it), so a
        # refused connection means its owner is gone: fail now, not after retries.
        # Only a socket file that does not exist yet may still be on its way.
        deadline = loop.time() + config.connect_timeout
        delay = 0.002
        while True:
            try:
                await _connect(loop, conn, where)
                break
            except ConnectionRefusedError as e:
                raise ConnectionRefusedError(
                    f"nothing listens at {conn.peer} any more (its proc exited)"
                ) from e
            except FileNotFoundError:
                if loop.time() + delay > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.1)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        conn.never_opened(e)


async def _connect(
    loop: asyncio.AbstractEventLoop, conn: Connection, where: str | tuple[str, int]
) -> None:
    via = conn.rt.via
    if via is not None and conn.peer is not None and via.routes(conn.peer):
        # the relay dials the peer's own address: its frames are tagged as over TCP
        # (the far end's socket is what the peer sees), whatever this socket pair is
        conn.tag_as_tcp = conn.peer.startswith("tcp://")
        await loop.create_unix_connection(lambda: conn, sock=await via.open(conn.peer))
        return
    if isinstance(where, str):  # unix
        # Connect the socket ourselves: uvloop cannot take abstract (NUL) names.
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, where)
        except BaseException:
            sock.close()
            raise
        await loop.create_unix_connection(lambda: conn, sock=sock)
    else:
        host, port = where
        ctx = tls_context(server=False)
        transport, _ = await loop.create_connection(
            lambda: conn, host, port, ssl=ctx, server_hostname=host if ctx else None
        )
        tsock = transport.get_extra_info("socket")
        if tsock is not None:
            tsock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
