"""Distributed tensors on the controller: shapes inferred locally, work sent to workers.

Inside ``with procs.activate():`` torch calls return :class:`DTensor` s: one shard per proc
of the mesh. Each call is recorded as a command (function, arguments with tensor ids,
result ids) and sent, batched, to a ``TensorWorker`` in every proc, which runs the real
kernel on its shard. The controller never waits per operation: shapes and dtypes come
from running the same call on meta tensors (cached by the arguments' shapes), so a shape
error raises on the controller, at the line that caused it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..actors._api import Future
from ..mesh import ProcMesh
from ._worker import (
    BORROW,
    CALL,
    FREE,
    GET_ATTR,
    PULL,
    REDUCE,
    SET_ATTR,
    Gen,
    Ref,
    TensorWorker,
)

_FACTORIES = {
    "rand",
    "randn",
    "randint",
    "randperm",
    "zeros",
    "ones",
    "empty",
    "full",
    "arange",
    "linspace",
    "logspace",
    "eye",
    "tensor",
    "as_tensor",
    "normal",
    "bernoulli",
    "empty_strided",
}
_RANDOM = {
    "rand",
    "randn",
    "randint",
    "randperm",
    "normal",
    "bernoulli",
    "rand_like",
    "randn_like",
    "randint_like",
    "multinomial",
}
_NO_META = {"backward"}  # run on the workers only; they return None
_LOCAL_ONLY = {
    "size",
    "dim",
    "ndimension",
    "numel",
    "nelement",
    "is_contiguous",
    "element_size",
    "is_floating_point",
    "is_complex",
    "stride",
    "get_device",
}
_NO_VALUE = {
    "item",
    "tolist",
    "numpy",
    "__bool__",
    "__float__",
    "__int__",
    "__index__",
    "__len__",
    "__array__",
    "__iter__",
}
_HERE = os.path.dirname(__file__)
_TORCH = os.path.dirname(torch.__file__)


def _issued_at() -> str:
    """The user's line that issued the current operation (first frame outside us and torch)."""
    f: Any = sys._getframe(2)
    while f is not None:
        path = f.f_code.co_filename
        if not (path.startswith(_HERE) or path.startswith(_TORCH) or "contextlib" in path):
            return f"{path}:{f.f_lineno} in {f.f_code.co_name}"
        f = f.f_back
    return "?"


class _Client:
    """The controller side of one proc mesh's tensor engine."""

    def __init__(self, procs: ProcMesh) -> None:
        self.procs = procs
        sizes = procs.sizes
        world = len(procs)
        # The collectives meet at a store the controller hosts, where every proc reaches it.
        import datetime

        import torch.distributed as dist

        host = _store_host(procs)
        self.store = dist.TCPStore(  # type: ignore[attr-defined]
            host,
            0,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=300),
        )
        self.workers = procs.spawn(
            "tensor_worker", TensorWorker, (host, self.store.port), world, sizes
        )
        self.sizes = sizes
        self.ids = itertools.count(1)
        self.batch: list[tuple[Any, ...]] = []
        self.frees: list[int] = []
        self.lock = threading.Lock()
        self.flush_at = 512

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
        self.workers.run.broadcast(batch)  # danaus pickles it: tensors out of band

    def fetch(self, t: DTensor, coords: dict[str, int]) -> Future[Any]:
        self.flush()
        mesh = self.workers.slice(**coords) if coords else self.workers
        if len(mesh) != 1:
            raise ValueError(
                f"fetch_shard needs coordinates for every dim of {self.sizes} (got {coords})"
            )
        return mesh.fetch.call_one(t._id)


def _store_host(procs: ProcMesh) -> str:
    """The controller's address as the procs reach it: loopback for a local mesh, else the
    local IP of the route to the first host (no packet is sent: a UDP connect)."""
    h = procs._root._procs[0]
    addr = getattr(h, "agent", None) or h.addr or ""
    if not addr.startswith("tcp://"):
        return "127.0.0.1"
    host = addr[len("tcp://") :].rpartition(":")[0].strip("[]")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))
        return str(s.getsockname()[0])


_tls = threading.local()


def _active() -> _Client | None:
    stack: list[_Client] = getattr(_tls, "stack", [])
    return stack[-1] if stack else None


class _Mode(TorchFunctionMode):
    """Routes every torch call made inside ``activate()`` to the tensor engine."""

    def __init__(self, client: _Client) -> None:
        super().__init__()
        self.client = client

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name not in _FACTORIES and not _has_tensor(args) and not _has_tensor(kwargs):
            return func(*args, **kwargs)  # no tensor in, none made: local (grad mode, dtypes)
        if name in _LOCAL_VALUE and not _has_dtensor(args):
            return func(*args, **kwargs)  # printing or reading a local tensor stays local
        return _dispatch(self.client, func, args, kwargs)


_LOCAL_VALUE = {"__repr__", "__str__", "__format__", *_NO_VALUE}


def _has_dtensor(obj: Any) -> bool:
    if type(obj) is DTensor:
        return True
    if type(obj) in (tuple, list):
        return any(_has_dtensor(x) for x in obj)
    return False


def _has_tensor(obj: Any) -> bool:
    if isinstance(obj, (DTensor, torch.Tensor)):
        return True
    if type(obj) in (tuple, list):
        return any(_has_tensor(x) for x in obj)
    if type(obj) is dict:
        return any(_has_tensor(x) for x in obj.values())
    return False


def client_for(procs: ProcMesh) -> _Client:
    """The tensor engine of exactly these procs (a slice gets its own workers)."""
    key = (id(procs._root), tuple(procs.shape.labels), tuple(procs.shape.global_ranks()))
    client = _clients.get(key)
    if client is None or client.procs._root._stopped:
        client = _clients[key] = _Client(procs)
    return client


@contextlib.contextmanager
def activate(procs: ProcMesh) -> Iterator[_Client]:
    """Inside, torch calls produce DTensors on ``procs``; commands flush on exit."""
    client = client_for(procs)
    stack = getattr(_tls, "stack", None)
    if stack is None:
        stack = _tls.stack = []
    stack.append(client)
    try:
        with _Mode(client):
            yield client
    finally:
        stack.pop()
        client.flush()


_clients: dict[tuple[Any, ...], _Client] = {}


def _key(obj: Any) -> Any:
    """A hashable stand-in for an argument, as far as output shapes depend on it."""
    t = type(obj)
    if t is DTensor:
        m = obj._meta
        return ("D", m.shape, m.stride(), m.storage_offset(), m.dtype)
    if isinstance(obj, torch.Tensor):
        return ("L", obj.shape, obj.stride(), obj.storage_offset(), obj.dtype)
    if t is bool or t is int or t is float:
        return (t, obj)  # True == 1 == 1.0 as dict keys: the type keeps them apart
    if t is tuple or t is list:
        return (t, tuple(_key(x) for x in obj))
    if t is slice:
        return ("S", _key(obj.start), _key(obj.stop), _key(obj.step))
    if t is dict:
        return ("M", tuple((k, _key(v)) for k, v in obj.items()))
    hash(obj)  # raises TypeError for what cannot be a key
    return obj


def _to_meta(obj: Any) -> Any:
    t = type(obj)
    if t is DTensor:
        return obj._meta
    if isinstance(obj, torch.Tensor):
        return obj.to("meta")
    if t is tuple or t is list:
        return t(_to_meta(x) for x in obj)
    if t is dict:
        return {k: _to_meta(v) for k, v in obj.items()}
    return obj


def _to_wire(obj: Any, client: _Client) -> Any:
    t = type(obj)
    if t is DTensor:
        if obj._client is not client:
            raise ValueError("a DTensor of another mesh: move it with t.to_mesh(procs) first")
        return Ref(obj._id)
    if t is tuple or t is list:
        return t(_to_wire(x, client) for x in obj)
    if t is dict:
        return {k: _to_wire(v, client) for k, v in obj.items()}
    if isinstance(obj, torch.Tensor):
        # Replicated to every shard. Copied now: the batch is pickled at a later flush, and
        # the caller may change the tensor meanwhile.
        return obj.detach().clone()
    return obj


_meta_cache: dict[Any, Any] = {}


def _template(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return ("T", tuple(out.shape), out.stride(), out.dtype)
    if isinstance(out, (tuple, list)):
        return ("Q", type(out), tuple(_template(o) for o in out))
    return ("V", out)


def _from_template(tpl: Any) -> Any:
    if tpl[0] == "T":
        return torch.empty_strided(tpl[1], tpl[2], dtype=tpl[3], device="meta")
    if tpl[0] == "V":
        return tpl[1]
    return tpl[1]([_from_template(t) for t in tpl[2]])


def _infer(func: Any, args: Any, kwargs: Any, factory: bool) -> Any:
    try:
        key: Any = (func, _key(args), _key(kwargs))
    except TypeError:
        key = None
    tpl = _meta_cache.get(key) if key is not None else None
    if tpl is None:
        margs, mkwargs = _to_meta(args), _to_meta(kwargs)
        if factory:
            mkwargs["device"] = "meta"
        with torch.no_grad():
            out = func(*margs, **mkwargs)
        tpl = _template(out)
        if key is not None and len(_meta_cache) < 100_000:
            _meta_cache[key] = tpl
    return _from_template(tpl)


def _requires_grad(args: Any, kwargs: Any) -> bool:
    if kwargs.get("requires_grad") is True:
        return True
    return _any_requires_grad(args) or _any_requires_grad(tuple(kwargs.values()))


def _any_requires_grad(obj: Any) -> bool:
    if type(obj) is DTensor:
        return obj._requires_grad
    if type(obj) in (tuple, list):
        return any(_any_requires_grad(x) for x in obj)
    return False


def _dispatch(client: _Client, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    # Our own torch calls (meta inference, seeds) must not come back here through the mode.
    with torch._C.DisableTorchFunction():
        return _dispatch_now(client, func, args, kwargs)


def _dispatch_now(client: _Client, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    name = getattr(func, "__name__", "")
    if name in _NO_VALUE:
        raise TypeError(
            f"{name}() needs the value of a distributed tensor: fetch a shard "
            "first (fetch_shard(t).get(), or inspect(t))"
        )
    first = next((a for a in args if type(a) is DTensor), None)
    if name in _LOCAL_ONLY and first is not None:
        return func(first._meta, *args[1:], **kwargs)
    factory = first is None and name in _FACTORIES
    if name in _NO_META:
        out: Any = None
    else:
        out = _infer(func, args, kwargs, factory)  # shape errors raise here, on the controller
    where = _issued_at()
    inplace = first is not None and (
        (name.endswith("_") and not name.endswith("__"))
        or name in ("__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__")
    )
    wkwargs = _to_wire(kwargs, client)
    if factory:
        wkwargs["device"] = None  # the worker's device (CUDA where present)
    if name in _RANDOM and "generator" not in kwargs:
        # Reproducible with torch.manual_seed on the controller: each random op draws a
        # seed from the controller's RNG; shard r draws from Generator(seed + r).
        wkwargs["generator"] = Gen(int(torch.randint(0, 2**62, (1,)).item()))
    wargs = _to_wire(args, client)
    stream = getattr(_tls, "stream", None)
    if stream is not None:
        wkwargs["__stream__"] = stream
    grad = torch.is_grad_enabled()
    if inplace:
        assert first is not None
        if name == "requires_grad_":
            first._requires_grad = (
                bool(args[1]) if len(args) > 1 else kwargs.get("requires_grad", True)
            )
        elif name in ("detach_",):
            first._requires_grad = False
        if isinstance(out, torch.Tensor):
            first._meta = out  # squeeze_, t_, resize_...: the shape may have changed
        client.issue((CALL, func, wargs, wkwargs, grad, [first._id], where))
        return None if name == "__setitem__" else first
    rg = (
        _requires_grad(args, kwargs)
        and name not in ("detach", "detach_copy")
        and (grad or kwargs.get("requires_grad") is True)
    )
    if isinstance(out, torch.Tensor):
        result = DTensor(client, out, rg and out.is_floating_point())
        client.issue((CALL, func, wargs, wkwargs, grad, [result._id], where))
        return result
    if isinstance(out, (tuple, list)) and any(isinstance(o, torch.Tensor) for o in out):
        # Tuples, torch's named tuples (max, sort, topk...), lists: a DTensor per tensor;
        # the worker stores the tensors of its result under these ids, in order.
        items = [
            DTensor(client, o, rg and o.is_floating_point()) if isinstance(o, torch.Tensor) else o
            for o in out
        ]
        ids = [i._id for i in items if type(i) is DTensor]
        client.issue((CALL, func, wargs, wkwargs, grad, ids, where))
        return type(out)(items)
    client.issue((CALL, func, wargs, wkwargs, grad, [], where))
    return out


def _method(name: str) -> Callable[..., Any]:
    fn = getattr(torch.Tensor, name)

    def method(self: DTensor, *args: Any, **kwargs: Any) -> Any:
        return _dispatch(self._client, fn, (self, *args), kwargs)

    method.__name__ = name
    return method


class DTensor:
    """A tensor with one shard in every proc of a mesh; made inside ``procs.activate()``.

    It behaves like a ``torch.Tensor`` for shapes, dtypes and operations (each of which
    runs on every shard); its values live on the workers: read one with
    ``fetch_shard(t, **coords)`` or ``inspect(t, **coords)``. Dropping the last reference
    frees the shards.
    """

    __slots__ = ("__weakref__", "_client", "_id", "_meta", "_requires_grad")

    def __init__(self, client: _Client, meta: torch.Tensor, requires_grad: bool = False) -> None:
        self._client = client
        self._id = client.new_id()
        self._meta = meta
        self._requires_grad = requires_grad
        weakref.finalize(self, client.free, self._id)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        first = next(
            a for a in itertools.chain(args, (kwargs or {}).values()) if type(a) is DTensor
        )
        return _dispatch(first._client, func, args, kwargs or {})

    def __repr__(self) -> str:
        return (
            f"DTensor(shape={tuple(self._meta.shape)}, dtype={self._meta.dtype}, "
            f"mesh={self._client.sizes}, id={self._id})"
        )

    @property
    def shape(self) -> torch.Size:
        return self._meta.shape

    @property
    def dtype(self) -> torch.dtype:
        return self._meta.dtype

    @property
    def ndim(self) -> int:
        return self._meta.ndim

    @property
    def requires_grad(self) -> bool:
        return self._requires_grad

    @property
    def T(self) -> DTensor:
        return self.t()  # type: ignore[no-any-return]

    @property
    def grad(self) -> DTensor | None:
        """The shards' ``.grad`` (a new DTensor; its shards are None until a backward ran)."""
        if not self._requires_grad:
            return None
        with torch._C.DisableTorchFunction():
            g = DTensor(self._client, torch.empty_like(self._meta))
        self._client.issue((GET_ATTR, self._id, "grad", [g._id], _issued_at()))
        return g

    @grad.setter
    def grad(self, value: DTensor | None) -> None:
        wire = None if value is None else Ref(value._id)
        self._client.issue((SET_ATTR, self._id, "grad", wire, [], _issued_at()))

    def reduce(
        self, dims: str | tuple[str, ...] | list[str], reduction: str = "sum", scatter: bool = False
    ) -> DTensor:
        """Reduce over the procs along mesh ``dims`` (a collective: gloo, or NCCL on GPU).

        Args:
            dims: mesh dim name(s) to reduce over.
            reduction: ``"sum"``, ``"avg"``, ``"min"``, ``"max"`` or ``"stack"``.
            scatter: each proc keeps its own slice of the result (along dim 0).
        """
        dims = (dims,) if isinstance(dims, str) else tuple(dims)
        unknown = [d for d in dims if d not in self._client.sizes]
        if unknown:
            raise ValueError(
                f"unknown mesh dims {unknown}; the mesh has {list(self._client.sizes)}"
            )
        if reduction not in ("sum", "avg", "min", "max", "stack"):
            raise ValueError(f"reduction must be sum, avg, min, max or stack, not {reduction!r}")
        n = 1
        for d in dims:
            n *= self._client.sizes[d]
        shape = list(self._meta.shape)
        if reduction == "stack":
            shape = shape if scatter else [n, *shape]
        elif scatter:
            if not shape or shape[0] % n:
                raise ValueError(
                    f"scatter needs dim 0 ({shape[0] if shape else None}) "
                    f"divisible by the {n} procs reduced over"
                )
            shape[0] //= n
        with torch._C.DisableTorchFunction():
            out = DTensor(self._client, torch.empty(shape, dtype=self.dtype, device="meta"))
        self._client.issue(
            (
                REDUCE,
                self._id,
                list(dims),
                reduction,
                scatter,
                tuple(self._meta.shape),
                self.dtype,
                [out._id],
                _issued_at(),
            )
        )
        return out

    def reduce_(self, dims: str | tuple[str, ...] | list[str], reduction: str = "sum") -> DTensor:
        """In-place :meth:`reduce` (no scatter)."""
        out = self.reduce(dims, reduction)
        self._client.issue(
            (
                CALL,
                torch.Tensor.copy_,
                (Ref(self._id), Ref(out._id)),
                {},
                False,
                [self._id],
                _issued_at(),
            )
        )
        return self

    def to_mesh(self, procs: ProcMesh) -> DTensor:
        """This tensor on another mesh of the same shape (rank r's shard to rank r), moved
        over the RDMA data plane. Sync code only: it waits for the shards' handles."""
        client = self._client
        if procs.sizes != client.sizes:
            raise ValueError(
                f"to_mesh needs a mesh of the same shape: {client.sizes} vs {procs.sizes}"
            )
        target = client_for(procs)
        client.flush()
        bufs = client.workers.publish.call(self._id).get()  # in rank order
        out = DTensor(target, self._meta.clone())
        target.issue((PULL, bufs.values(), tuple(self.shape), self.dtype, [out._id], _issued_at()))
        return out

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") and not name.startswith("__"):
            raise AttributeError(name)
        attr = getattr(torch.Tensor, name, None)
        if attr is None or not callable(attr):
            raise AttributeError(f"DTensor has no attribute {name!r}")
        return _method(name).__get__(self)


for _name in (
    "__add__",
    "__radd__",
    "__sub__",
    "__rsub__",
    "__mul__",
    "__rmul__",
    "__truediv__",
    "__rtruediv__",
    "__matmul__",
    "__rmatmul__",
    "__pow__",
    "__rpow__",
    "__neg__",
    "__abs__",
    "__getitem__",
    "__setitem__",
    "__lt__",
    "__le__",
    "__gt__",
    "__ge__",
    "__eq__",
    "__ne__",
    "__and__",
    "__or__",
    "__iadd__",
    "__isub__",
    "__imul__",
    "__itruediv__",
    "__floordiv__",
    "__mod__",
    *_NO_VALUE,
):
    setattr(DTensor, _name, _method(_name))
DTensor.__hash__ = object.__hash__  # type: ignore[method-assign]


class Stream:
    """A second ordering of work: ``with stream.activate():`` issues onto it.

    On GPU workers it is a CUDA stream, so its kernels overlap the default stream's;
    ``stream.borrow(t)`` makes work on this stream wait for ``t``'s producer on the
    default stream. On CPU workers every command already runs in order, so streams only
    keep their meaning for when the same program runs on GPUs.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Stream({self.name!r})"

    @contextlib.contextmanager
    def activate(self) -> Iterator[Stream]:
        old = getattr(_tls, "stream", None)
        _tls.stream = self.name
        try:
            yield self
        finally:
            _tls.stream = old

    def borrow(self, t: DTensor) -> DTensor:
        """``t``, safe to use on this stream (waits for its producer on the default stream)."""
        t._client.issue((BORROW, t._id, None, self.name, [t._id], _issued_at()))
        return t
