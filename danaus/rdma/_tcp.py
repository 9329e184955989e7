"""The ``tcp`` backend: procs on different hosts.

Each proc with registered buffers runs a data server on its host (a TCP socket apart
from the control connections). Readers open authenticated data connections to it (the
same HMAC challenge-response as the control plane) and move bytes in chunks, several
streams in parallel for large buffers. The owner sends straight from the buffer's memory
and receives straight into it; the reader likewise.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from typing import TYPE_CHECKING

from .. import _auth as auth
from ..actors.seam import parse_addr
from ..config import config
from ..errors import (
    AuthenticationError,
    RDMABufferDroppedError,
    RDMABufferError,
    RDMAOwnerError,
    RDMATransferError,
)
from ._backend import Backend
from ._handle import BufferHandle

if TYPE_CHECKING:
    from ._manager import RDMAManager

log = logging.getLogger("danaus.rdma")

_REQ = struct.Struct("<BQQQ")  # op, buffer id, offset, length
_READ, _WRITE = 1, 2
_OK, _DROPPED, _RANGE = 0, 1, 2
#: a transfer this large is split over several data connections
STREAM_BYTES = 8 << 20
MAX_STREAMS = 4
_SOCK_BUF = 4 << 20


def _tune(sock: socket.socket) -> None:
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # A peer that vanishes without closing (host down, partition): give up after about
    # heartbeat_timeout of unacknowledged data instead of the kernel's ~15 minutes.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(
            socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(config.heartbeat_timeout * 1000)
        )
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, _SOCK_BUF)
        except OSError:
            pass


async def _recv_exact(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, view: memoryview
) -> None:
    got = 0
    n = view.nbytes
    while got < n:
        k = await loop.sock_recv_into(sock, view[got:])
        if k == 0:
            raise ConnectionResetError("data connection closed mid-transfer")
        got += k


class TcpBackend(Backend):
    name = "tcp"

    def __init__(self, mgr: RDMAManager) -> None:
        self.mgr = mgr
        self.loop = mgr.rt.loop
        family, where = parse_addr(mgr.rt.addr)
        host = where[0] if family == "tcp" else "127.0.0.1"
        self._listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, 0))
        self._listener.listen(64)
        self._listener.setblocking(False)
        port = self._listener.getsockname()[1]
        self.listen_addr = f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
        self._pools: dict[str, list[socket.socket]] = {}
        self._active: dict[str, set[socket.socket]] = {}  # data connections in use
        self._owner_of: dict[str, str] = {}  # data address -> owner's control address
        mgr.rt.watch_lost(self.owner_lost)
        self._tasks: set[asyncio.Task[None]] = set()
        self._serving: set[socket.socket] = set()
        self._accept_task = self.loop.create_task(self._accept_loop())

    @classmethod
    def probe(cls) -> str | None:
        return None

    def reaches(self, handle: BufferHandle) -> bool:
        return bool(handle.data_addr)

    # ------------------------------------------------------------ owner side

    async def _accept_loop(self) -> None:
        while True:
            sock, _ = await self.loop.sock_accept(self._listener)
            _tune(sock)
            task = self.loop.create_task(self._serve_conn(sock))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve_conn(self, sock: socket.socket) -> None:
        loop = self.loop
        self._serving.add(sock)
        try:
            key = self.mgr.rt.key
            hello = bytearray(16)
            async with asyncio.timeout(config.handshake_timeout):
                await _recv_exact(loop, sock, memoryview(hello))
            mine = auth.new_nonce()
            await loop.sock_sendall(sock, mine + auth.proof(key, b"acceptor", bytes(hello), mine))
            theirs = bytearray(32)
            async with asyncio.timeout(config.handshake_timeout):
                await _recv_exact(loop, sock, memoryview(theirs))
            if not auth.verify(key, b"dialer", mine, bytes(hello), bytes(theirs)):
                raise AuthenticationError("data connection failed to prove the job key")
            head = bytearray(_REQ.size)
            while True:
                try:
                    await _recv_exact(loop, sock, memoryview(head))
                except ConnectionResetError:
                    return  # the reader closed its pooled connection
                op, buf_id, offset, n = _REQ.unpack(head)
                try:
                    view = self.mgr.local(buf_id, offset, n)
                    status = _OK
                except RDMABufferDroppedError:
                    view, status = None, _DROPPED
                except RDMABufferError:
                    view, status = None, _RANGE
                if op == _READ:
                    await loop.sock_sendall(sock, bytes([status]))
                    if view is not None:
                        await loop.sock_sendall(sock, view)
                elif op == _WRITE:
                    if view is not None:
                        await _recv_exact(loop, sock, view)
                    else:  # drain what the writer sends, then say why it was refused
                        scratch = memoryview(bytearray(min(n, 1 << 20)))
                        left = n
                        while left:
                            k = min(left, scratch.nbytes)
                            await _recv_exact(loop, sock, scratch[:k])
                            left -= k
                    await loop.sock_sendall(sock, bytes([status]))
                else:
                    return
        except (BrokenPipeError, ConnectionResetError) as e:
            # The reader hung up mid-transfer (its deadline passed, or it died): it has
            # its error already, and this owner serves on.
            log.debug("rdma tcp: a reader left mid-transfer: %s", e)
        except (OSError, TimeoutError, AuthenticationError) as e:
            log.warning("rdma tcp: closing a data connection: %s", e)
        finally:
            self._serving.discard(sock)
            sock.close()

    # ------------------------------------------------------------ reader side

    async def _connect(self, data_addr: str, owner: str) -> socket.socket:
        family, where = parse_addr(data_addr)
        if family != "tcp" or isinstance(where, str):
            raise RDMATransferError(f"the data address {data_addr!r} of {owner} is not tcp://")
        host, port = where
        key = self.mgr.rt.key_for(owner)  # an attached host agent's procs have its key
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        _tune(sock)
        try:
            await self.loop.sock_connect(sock, (host, port))
            mine = auth.new_nonce()
            await self.loop.sock_sendall(sock, mine)
            answer = bytearray(48)
            # The owner answers at once, from its loop; twice its own bound on us leaves
            # room for a busy loop before its data server is taken for unreachable.
            async with asyncio.timeout(2 * config.handshake_timeout):
                await _recv_exact(self.loop, sock, memoryview(answer))
            theirs, mac = bytes(answer[:16]), bytes(answer[16:])
            if not auth.verify(key, b"acceptor", mine, theirs, mac):
                raise AuthenticationError(f"data server {data_addr} failed to prove the job key")
            await self.loop.sock_sendall(sock, auth.proof(key, b"dialer", theirs, mine))
        except BaseException:
            sock.close()
            raise
        return sock

    def owner_lost(self, owner: str) -> None:
        """The control plane lost ``owner``: end our data connections to it, pooled and in
        use, so transfers to it fail now (RDMAOwnerError) rather than wait on a dead peer."""
        for data_addr, who in list(self._owner_of.items()):
            if who != owner:
                continue
            for sock in self._pools.pop(data_addr, []):
                sock.close()
            for sock in list(self._active.get(data_addr, ())):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _check_owner(self, handle: BufferHandle) -> None:
        why = self.mgr.rt.why_lost(handle.owner)
        if why is not None:
            raise RDMAOwnerError(
                f"the owner of buffer {handle.buf_id} ({handle.owner}) is gone: {why}"
            )

    async def _one(self, handle: BufferHandle, offset: int, view: memoryview, op: int) -> None:
        self._check_owner(handle)
        pool = self._pools.setdefault(handle.data_addr, [])
        self._owner_of[handle.data_addr] = handle.owner
        try:
            sock = pool.pop() if pool else await self._connect(handle.data_addr, handle.owner)
        except OSError as e:
            raise RDMAOwnerError(
                f"cannot reach the data server of {handle.owner} "
                f"({handle.data_addr}) for buffer {handle.buf_id}: {e}"
            ) from None
        if (
            self.mgr.rt.why_lost(handle.owner) is not None
        ):  # lost while we connected: owner_lost missed it
            sock.close()
            self._check_owner(handle)
        active = self._active.setdefault(handle.data_addr, set())
        active.add(sock)
        ok = False
        try:
            loop = self.loop
            await loop.sock_sendall(sock, _REQ.pack(op, handle.buf_id, offset, view.nbytes))
            status = bytearray(1)
            if op == _READ:
                await _recv_exact(loop, sock, memoryview(status))
                if status[0] == _OK:
                    await _recv_exact(loop, sock, view)
            else:
                await loop.sock_sendall(sock, view)
                await _recv_exact(loop, sock, memoryview(status))
            ok = True
        except OSError as e:
            raise RDMAOwnerError(
                f"the owner of buffer {handle.buf_id} ({handle.owner}) went "
                f"away during the transfer: {e}"
            ) from None
        finally:  # also when cancelled (the deadline): a socket left mid-transfer is closed
            active.discard(sock)
            if ok:
                pool.append(sock)
            else:
                sock.close()
        if status[0] == _DROPPED:
            raise RDMABufferDroppedError(f"buffer {handle.buf_id} of {handle.owner} was dropped")
        if status[0] == _RANGE:
            raise RDMABufferError(
                f"range [{offset}, {offset + view.nbytes}) is outside buffer "
                f"{handle.buf_id} of {handle.owner}"
            )
        if status[0] != _OK:
            raise RDMATransferError(f"data server {handle.data_addr} answered status {status[0]}")

    async def _move(self, handle: BufferHandle, offset: int, view: memoryview, op: int) -> None:
        n = view.nbytes
        streams = max(1, min(MAX_STREAMS, n // STREAM_BYTES))
        if streams == 1:
            await self._one(handle, offset, view, op)
            return
        step = -(-n // streams)
        results = await asyncio.gather(
            *(self._one(handle, offset + i, view[i : i + step], op) for i in range(0, n, step)),
            return_exceptions=True,
        )
        for r in results:  # every stream has ended: only now report a failure
            if isinstance(r, BaseException):
                raise r

    async def read(self, handle: BufferHandle, offset: int, dst: memoryview) -> None:
        await self._move(handle, offset, dst, _READ)

    async def write(self, handle: BufferHandle, offset: int, src: memoryview) -> None:
        await self._move(handle, offset, src, _WRITE)

    async def aclose(self) -> None:
        self._accept_task.cancel()
        for task in list(self._tasks):
            task.cancel()
        for pool in self._pools.values():
            for sock in pool:
                sock.close()
        self._pools.clear()
        self._listener.close()
