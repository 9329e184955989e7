"""The RDMA manager of one proc: registrations, the validity table, the backends.

Every proc (and the controller) that creates an ``RDMABuffer`` or moves bytes gets one
manager per runtime. Owner side, it keeps each registered buffer alive and reachable; a
system actor ``__rdma__`` answers other procs' setup requests. Reader side, it picks the
backend for each peer (logged once per peer) and holds the backends' client state.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import os
import socket
from typing import Any

from ..actors.seam import (
    Actor,
    CallSpec,
    Future,
    Runtime,
    current_runtime,
    dumps_args,
    endpoint,
    ensure_actor,
)
from ..config import config
from ..errors import (
    ActorError,
    RDMABackendUnavailableError,
    RDMABufferDroppedError,
    RDMABufferError,
    RDMAError,
    RDMAOwnerError,
    RDMATransferError,
    SupervisionError,
)
from ._backend import IBVERBS_DISABLED, Backend, LocalBuffer
from ._handle import BufferHandle

log = logging.getLogger("danaus.rdma")

#: the order backends are preferred in, best first
PREFERENCE = ("ibverbs", "shm", "tcp")


def host_id() -> str:
    """Procs on one machine (one kernel) share this id."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}:{boot}"


class _Slots:
    """Validity words: slot i holds a buffer's id while it is registered, 0 after.

    Readers on the same host read them with process_vm_readv before and after a
    one-sided transfer. The arrays never move (new chunks are added, none freed).
    """

    CHUNK = 4096

    def __init__(self) -> None:
        self.chunks: list[Any] = []
        self.free: list[tuple[int, int]] = []

    def take(self, buf_id: int) -> tuple[int, int, int]:
        if not self.free:
            chunk = (ctypes.c_uint64 * self.CHUNK)()
            self.chunks.append(chunk)
            c = len(self.chunks) - 1
            self.free.extend((c, i) for i in range(self.CHUNK - 1, -1, -1))
        c, i = self.free.pop()
        self.chunks[c][i] = buf_id
        return c, i, ctypes.addressof(self.chunks[c]) + 8 * i

    def release(self, c: int, i: int) -> None:
        self.chunks[c][i] = 0
        self.free.append((c, i))


class RDMAManager:
    """Per-runtime state of the data plane. Use :func:`manager`."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.host = host_id()
        self.pid = os.getpid()
        self.buffers: dict[int, LocalBuffer] = {}
        self._slot_of: dict[int, tuple[int, int]] = {}
        self._slots = _Slots()
        self._ids = itertools.count(1)
        self._chosen: dict[str, str] = {}  # peer -> backend name (logged once)
        self._dropped_bufs: list[LocalBuffer] = []  # kept alive for rdma_drop_grace
        self.backends: dict[str, Backend] = {}
        self.unavailable: dict[str, str] = {}
        from ._shm import ShmBackend
        from ._tcp import TcpBackend

        classes: list[type[Backend]] = [ShmBackend, TcpBackend]
        if not config.rdma_disable_ibverbs:
            try:
                from ._ibverbs import IbverbsBackend

                classes.insert(0, IbverbsBackend)
            except ImportError as e:
                self.unavailable["ibverbs"] = f"not built: {e}"
        else:
            self.unavailable["ibverbs"] = IBVERBS_DISABLED
        for cls in classes:
            why = cls.probe()
            if why is not None:
                self.unavailable[cls.name] = why
                continue
            try:
                self.backends[cls.name] = _make(cls, self)
            except Exception as e:  # a backend that cannot start is unavailable, not fatal
                self.unavailable[cls.name] = f"failed to start: {type(e).__name__}: {e}"
        ensure_actor(rt, "__rdma__", lambda: _RDMAService(self))
        rt.on_close(self.aclose)

    def __repr__(self) -> str:
        return f"<RDMAManager {self.rt.addr} buffers={len(self.buffers)} backends={list(self.backends)}>"

    @property
    def data_addr(self) -> str:
        tcp = self.backends.get("tcp")
        return getattr(tcp, "listen_addr", "") if tcp is not None else ""

    # ------------------------------------------------------------ owner side

    def register(
        self, view: memoryview, addr: int, keepalive: Any, cuda: Any = None
    ) -> BufferHandle:
        """Owner side: make these bytes reachable. With ``cuda`` (a CUDA tensor), the bytes
        are its pinned host staging copy, refreshed and written back on request."""
        buf_id = next(self._ids)
        buf = LocalBuffer(buf_id, view, addr, keepalive)
        c, i, valid_addr = self._slots.take(buf_id)
        self._slot_of[buf_id] = (c, i)
        for name, backend in self.backends.items():
            keys = backend.register(buf)
            if keys:
                buf.keys[name] = keys
        if cuda is not None:
            buf.state["cuda"] = cuda
            buf.keys["cuda"] = {"staged": 1}
        self.buffers[buf_id] = buf
        return BufferHandle(
            self.rt.addr,
            self.pid,
            self.host,
            buf_id,
            addr,
            buf.size,
            valid_addr,
            self.data_addr,
            buf.keys,
            not view.readonly,
        )

    def drop(self, buf_id: int) -> None:
        buf = self.buffers.pop(buf_id, None)
        if buf is None:
            return
        c, i = self._slot_of.pop(buf_id)
        self._slots.release(c, i)
        for backend in self.backends.values():
            backend.unregister(buf)
        # One-sided writers check the validity word before and after, so one that raced
        # this drop learns of it only afterwards: keep the memory alive a little longer,
        # so that such a write lands in it, never in memory reused for something else.
        self._dropped_bufs.append(buf)
        self.rt.loop.call_later(config.rdma_drop_grace, self._bury)

    def _bury(self) -> None:
        if self._dropped_bufs:
            self._dropped_bufs.pop(0)

    def local(self, buf_id: int, offset: int, n: int) -> memoryview:
        """Owner side: the registered bytes ``[offset, offset + n)`` of a buffer."""
        buf = self.buffers.get(buf_id)
        if buf is None:
            raise RDMABufferDroppedError(f"buffer {buf_id} of {self.rt.addr} was dropped")
        if offset < 0 or offset + n > buf.size:
            raise RDMABufferError(
                f"range [{offset}, {offset + n}) is outside buffer {buf_id} of {buf.size} bytes"
            )
        return buf.view[offset : offset + n]

    # ------------------------------------------------------------ reader side

    def backend_for(self, handle: BufferHandle) -> Backend:
        """The best backend that reaches ``handle`` from here (or the forced one)."""
        forced = config.rdma_backend
        if forced:
            backend = self.backends.get(forced)
            if backend is None:
                why = self.unavailable.get(
                    forced, f"no backend named {forced!r}; known: {', '.join(PREFERENCE)}"
                )
                raise RDMABackendUnavailableError(
                    f"DANAUS_RDMA_BACKEND={forced} cannot run here: {why}"
                )
            if not backend.reaches(handle):
                raise RDMABackendUnavailableError(
                    f"DANAUS_RDMA_BACKEND={forced} cannot reach the buffer of {handle.owner}"
                )
            return backend
        for name in PREFERENCE:
            backend = self.backends.get(name)
            if backend is not None and backend.reaches(handle):
                if self._chosen.get(handle.owner) != name:
                    self._chosen[handle.owner] = name
                    log.info("rdma: %s -> %s uses the %s backend", self.rt.addr, handle.owner, name)
                return backend
        raise RDMABackendUnavailableError(
            f"no backend reaches the buffer of {handle.owner} from {self.rt.addr} "
            f"(available here: {list(self.backends)}; not: {self.unavailable})"
        )

    async def exchange(self, owner: str, backend: str, request: dict[str, Any]) -> dict[str, Any]:
        """Ask the owner proc's manager (``serve``); its answer, or RDMAOwnerError."""
        rt = self.rt
        fut: Future[Any] = Future(loop=rt.loop)
        enc = dumps_args((backend, request), {}, lambda: "an RDMA setup request")
        rt.send_call(owner, -1, rt.open_future_port(fut), CallSpec("__rdma__", "serve", *enc))
        try:
            result: dict[str, Any] = await fut
        except SupervisionError as e:
            which = f"buffer {request['buf']}" if "buf" in request else "the buffer"
            raise RDMAOwnerError(f"the owner of {which} ({owner}) is gone: {e}") from e
        except ActorError as e:  # the owner raised one of ours: give it back as itself
            cls = _RDMA_ERRORS.get(e.exc_type.rpartition(".")[2])
            if cls is None:
                raise
            raise cls(e.message) from e
        return result

    async def exchange_drop(self, handle: BufferHandle) -> None:
        """Drop a buffer owned by another proc (through its ``__rdma__`` actor)."""
        rt = self.rt
        fut: Future[Any] = Future(loop=rt.loop)
        enc = dumps_args((handle.buf_id,), {}, lambda: "a drop request")
        rt.send_call(handle.owner, -1, rt.open_future_port(fut), CallSpec("__rdma__", "drop", *enc))
        try:
            await fut
        except SupervisionError as e:
            raise RDMAOwnerError(
                f"the owner of buffer {handle.buf_id} ({handle.owner}) is gone: {e}"
            ) from e

    async def aclose(self) -> None:
        for backend in self.backends.values():
            await backend.aclose()
        _managers.pop(id(self.rt), None)


class _RDMAService(Actor):
    """System actor ``__rdma__``: answers other procs' requests for this proc's manager."""

    def __init__(self, mgr: RDMAManager) -> None:
        self.mgr = mgr

    @endpoint
    async def serve(self, backend: str, request: dict[str, Any]) -> dict[str, Any]:
        if backend == "cuda":
            return self._stage(request)
        b = self.mgr.backends.get(backend)
        if b is None:
            raise RDMABackendUnavailableError(
                f"backend {backend} is not available in {self.mgr.rt.addr}: "
                f"{self.mgr.unavailable.get(backend, 'unknown backend')}"
            )
        return await b.serve(request)

    def _stage(self, request: dict[str, Any]) -> dict[str, Any]:
        """CUDA staging: copy device -> pinned host ("out", before a read) or back ("in")."""
        import torch

        buf = self.mgr.buffers.get(int(request["buf"]))
        if buf is None:
            raise RDMABufferDroppedError(f"buffer {request['buf']} was dropped")
        device, staging = buf.state["cuda"], buf.keepalive[1]
        if request["op"] == "out":
            staging.copy_(device.view(torch.uint8))
        else:
            device.view(torch.uint8).copy_(staging)
        torch.cuda.synchronize(device.device)
        return {}

    @endpoint
    def drop(self, buf_id: int) -> None:
        self.mgr.drop(buf_id)


_RDMA_ERRORS: dict[str, type[RDMAError]] = {
    c.__name__: c
    for c in (
        RDMABufferError,
        RDMABufferDroppedError,
        RDMABackendUnavailableError,
        RDMAOwnerError,
        RDMATransferError,
        RDMAError,
    )
}


def _make(cls: type[Backend], mgr: RDMAManager) -> Backend:
    if cls.name == "ibverbs":
        from ._ibverbs import make_ibverbs_backend

        rt = mgr.rt

        ibverbs = make_ibverbs_backend(mgr.exchange, rt.why_lost)
        rt.watch_lost(ibverbs.owner_lost)
        return ibverbs
    return cls(mgr)  # type: ignore[call-arg]


_managers: dict[int, RDMAManager] = {}


def manager(rt: Runtime | None = None) -> RDMAManager:
    """The RDMA manager of ``rt`` (default: the current runtime), made on first use."""
    rt = rt or current_runtime()
    mgr = _managers.get(id(rt))
    if mgr is None or mgr.rt is not rt:
        mgr = _managers[id(rt)] = RDMAManager(rt)
    return mgr
