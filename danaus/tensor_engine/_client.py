"""The controller side of a mesh's tensor engine: the command batch, the workers, and
``activate()``, under which torch calls make DTensors on the mesh."""

from __future__ import annotations

import contextlib
import datetime
import itertools
import socket
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from ..actors.seam import Future
from ..config import config
from ..mesh import ProcMesh
from ..mesh.seam import group_of
from . import _dispatch
from ._worker import FREE, TensorWorker

if TYPE_CHECKING:
    from ._dtensor import DTensor, Stream


class _Client:
    """The controller side of one proc mesh's tensor engine."""

    def __init__(self, procs: ProcMesh) -> None:
        import torch.distributed as dist

        self.procs = procs
        self.group = group_of(procs)  # the whole mesh's procs, also for a slice
        self.sizes = dict(procs.sizes)
        self.global_ranks = list(procs.shape.global_ranks())
        world = len(procs)
        # The collectives meet at a store the controller hosts, where every proc reaches it.
        host = _store_host(procs)
        self.store = dist.TCPStore(  # type: ignore[attr-defined]
            host,
            0,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=config.collective_timeout),
        )
        self.rendezvous = (host, self.store.port)
        self._init_commands()
        self.workers = procs.spawn(
            "tensor_worker",
            TensorWorker,
            (host, self.store.port),
            world,
            self.sizes,
            self.global_ranks,
        )
        # What a DTensor says its device is: the workers run on CUDA where there is one.
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )

    def _init_commands(self) -> None:
        """The command stream's state: ids, the batch being recorded, frees, counts."""
        self.sent = 0  # batches sent
        self.synced = 0  # batches every worker is known to have run
        self.ids = itertools.count(1)
        self.batch: list[tuple[Any, ...]] = []
        self.frees: list[int] = []
        self.lock = threading.Lock()
        self.flush_at = 512

    def __repr__(self) -> str:
        return f"<tensor engine of {self.procs!r}>"

    @property
    def stream(self) -> str | None:
        s: Stream | None = getattr(_tls, "stream", None)
        return None if s is None else s.name

    def new_id(self) -> int:
        return next(self.ids)

    def issue(self, cmd: tuple[Any, ...]) -> None:
        self.batch.append(cmd)
        if len(self.batch) >= self.flush_at:
            self.flush()

    def free(self, i: int) -> None:
        self.frees.append(i)  # may run at GC, in any thread: only append

    def flush(self) -> None:
        """Send the commands recorded so far (in order) to every worker."""
        with self.lock:
            if self.frees:
                frees, self.frees = self.frees, []
                self.batch.append((FREE, frees))
            if not self.batch:
                return
            batch, self.batch = self.batch, []
            self.sent += 1
            self._send(batch, self.sent)

    def _send(self, batch: list[tuple[Any, ...]], seq: int) -> None:
        """Batch number ``seq`` to every worker (under :attr:`lock`, in order)."""
        # danaus pickles it (tensors out of band) with torch calls of its own: local
        with _disable_current_modes():
            self.workers.run.broadcast(batch, seq)

    def barrier(self) -> int:
        """Send the commands so far and wait until every worker ran them; their number.
        Blocks: sync code only (``DeadlockError`` on the loop of danaus's runtime)."""
        self.flush()
        seq = self.sent
        if self.synced < seq:
            self.workers.table_stats.call().get()  # ordered after the batches on each worker
            self.synced = max(self.synced, seq)
        return seq

    def fetch(self, t: DTensor, coords: dict[str, int]) -> Future[Any]:
        self.flush()
        unknown = sorted(set(coords) - set(self.sizes))
        if unknown:
            raise ValueError(f"fetch_shard: {unknown} are not dims of this mesh {self.sizes}")
        point = {dim: coords.get(dim, 0) for dim in self.sizes}  # Monarch: 0 where not given
        return self.workers.slice(**point).fetch.call_one(t.ref_id)


def _store_host(procs: ProcMesh) -> str:
    """The controller's address as the procs reach it: loopback for a local mesh, else the
    local IP of the route to the first host (no packet is sent: a UDP connect)."""
    addr = group_of(procs).host_addr(0)
    if not addr.startswith("tcp://"):
        return "127.0.0.1"
    host = addr[len("tcp://") :].rpartition(":")[0].strip("[]")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))
        return str(s.getsockname()[0])


_tls = threading.local()
_clients: dict[tuple[Any, ...], _Client] = {}


def active() -> _Client | None:
    """The client of the innermost ``activate()`` of this thread (None under ``no_mesh``)."""
    stack: list[_Client | None] = getattr(_tls, "stack", [])
    return stack[-1] if stack else None


def client_for(procs: ProcMesh) -> _Client:
    """The tensor engine of exactly these procs (a slice gets its own workers)."""
    group = group_of(procs)
    key = (id(group), tuple(procs.shape.labels), tuple(procs.shape.global_ranks()))
    client = _clients.get(key)
    if client is None or client.group.stopped:
        client = _clients[key] = _Client(procs)
    return client


class _Mode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Under ``activate()``: factories and operations on local tensors make DTensors on
    the active mesh; operations on DTensors are recorded for their own mesh."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # dynamo never traces this mode: spare every op torch's disable wrapper

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if _DT in types:
            return _dispatch.dispatch(func, args, kwargs)
        client = active()
        if client is None or _dispatch.stays_local(func, args, kwargs):
            return func(*args, **kwargs)
        return _dispatch.dispatch_factory(client, func, args, kwargs)


@contextlib.contextmanager
def _scope(client: _Client | None) -> Iterator[_Client | None]:
    stack = getattr(_tls, "stack", None)
    if stack is None:
        stack = _tls.stack = []
    stack.append(client)
    try:
        if client is None or getattr(_tls, "moded", False):
            yield client
        else:
            _tls.moded = True  # one mode per thread: it reads the innermost scope
            try:
                with _Mode():  # type: ignore[no-untyped-call]
                    yield client
            finally:
                _tls.moded = False
    finally:
        stack.pop()
        if client is not None:
            client.flush()


def activate(procs: ProcMesh) -> contextlib.AbstractContextManager[Any]:
    """Inside, torch calls produce DTensors on ``procs``; commands flush on exit."""
    return _scope(client_for(procs))


def no_mesh() -> contextlib.AbstractContextManager[Any]:
    """Inside, torch calls run locally again (under an outer ``activate()``)."""
    return _scope(None)


@contextlib.contextmanager
def stream_scope(stream: Stream) -> Iterator[Stream]:
    old = getattr(_tls, "stream", None)
    _tls.stream = stream
    try:
        yield stream
    finally:
        _tls.stream = old


def active_stream() -> Stream | None:
    return getattr(_tls, "stream", None)


def bind_dtensor() -> None:
    """Set this module's ``DTensor`` (imported late: a top-level import would be circular)."""
    global _DT
    from ._dtensor import DTensor

    _DT = DTensor


_DT: Any = None
