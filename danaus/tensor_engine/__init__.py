"""The tensor engine: drive torch on every shard of a mesh from the controller.

``import danaus.tensor_engine`` (it imports torch) enables ``procs.activate()``::

    with procs.activate():
        x = torch.rand(4, 4)          # a DTensor: one 4x4 shard per proc
        y = (x @ x).relu()
        total = y.reduce("procs", "sum")
    print(inspect(total, procs=0))
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

try:
    import torch
except ImportError as e:  # torch is an extra: the actor, mesh and RDMA layers run without it
    raise ImportError(
        f"danaus.tensor_engine needs torch ({e}): install it, e.g. "
        "`pip install 'danaus[torch]'` or your CUDA build of torch"
    ) from e


from ..actors.seam import Future
from ..errors import DataDependentError
from ..mesh import ProcMesh
from ..mesh.seam import TensorEngine, set_tensor_engine
from . import _client, _dispatch
from ._client import activate, active, active_stream
from ._dtensor import Borrow, DTensor, MeshSlice, Stream, slice_mesh
from ._simulator import SimulatedMesh, Simulator
from .functions import function_resolvers, resolve_function
from .gradient import grad_function, grad_generator
from .opaque_ref import OpaqueRef, RemoteProcessGroup

_client.bind_dtensor()

__all__ = [
    "Borrow",
    "DTensor",
    "DataDependentError",
    "MeshSlice",
    "OpaqueRef",
    "RemoteProcessGroup",
    "SimulatedMesh",
    "Simulator",
    "Stream",
    "Tensor",
    "call_on_shard_and_fetch",
    "coalescing",
    "fetch_shard",
    "function_resolvers",
    "get_active_mesh",
    "get_active_stream",
    "grad_function",
    "grad_generator",
    "inspect",
    "no_mesh",
    "reduce",
    "reduce_",
    "remote",
    "show",
    "slice_mesh",
    "to_mesh",
    "world_mesh",
]

#: Monarch's name for a tensor made on a mesh
Tensor = DTensor


def reduce(
    tensors: Any,
    dims: str | tuple[str, ...] | list[str],
    reduction: str = "sum",
    scatter: bool = False,
    mesh: ProcMesh | None = None,
) -> Any:
    """:meth:`DTensor.reduce` on every tensor of ``tensors`` (a pytree: a tensor, or
    lists, tuples and dicts of them), as Monarch's ``monarch.reduce``."""
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t.reduce(dims, reduction, scatter, mesh), tensors)


def reduce_(tensors: Any, dims: str | tuple[str, ...] | list[str], reduction: str = "sum") -> Any:
    """:meth:`DTensor.reduce_` (in place) on every tensor of ``tensors`` (a pytree), as
    Monarch's ``monarch.reduce_``."""
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t.reduce_(dims, reduction), tensors)


def to_mesh(tensors: Any, mesh: ProcMesh, stream: Stream | None = None) -> Any:
    """:meth:`DTensor.to_mesh` (or :meth:`MeshSlice.to_mesh`) on every tensor of
    ``tensors`` (a pytree), as Monarch's ``monarch.to_mesh``. The move runs over the
    data plane, not on a stream: ``stream`` must be None."""
    if stream is not None:
        raise ValueError(
            "to_mesh(stream=...): danaus moves tensors over its data plane, not on a "
            "stream; leave stream out"
        )
    from torch.utils._pytree import tree_map

    return tree_map(
        lambda t: t.to_mesh(mesh),
        tensors,
        is_leaf=lambda t: isinstance(t, MeshSlice),
    )


def fetch_shard(
    t: torch.Tensor, shard: dict[str, int] | None = None, **coords: int
) -> Future[torch.Tensor]:
    """A local copy of the shard of ``t`` at ``shard`` and ``coords`` (coordinates by dim
    name; a dim not given is 0, as in Monarch: rank 0's copy, which is every rank's after
    an all-reduce), where ``t`` is a tensor made on a mesh (a ``DTensor``, typed
    ``torch.Tensor`` as torch's operations return it).

    Raises (when awaited) ``RemoteException`` if the operation that made ``t`` failed on
    the worker: it carries the worker's traceback and the controller line that issued it.
    """
    if not isinstance(t, DTensor):
        raise TypeError(f"fetch_shard takes a DTensor, not {type(t).__name__}")
    return t.client.fetch(t, {**(shard or {}), **coords})


def inspect(t: torch.Tensor, shard: dict[str, int] | None = None, **coords: int) -> torch.Tensor:
    """The value of one shard (:func:`fetch_shard`; rank 0's by default), synchronously
    (scripts, sync endpoints, notebook cells; ``await fetch_shard`` in async code, where
    this raises ``DeadlockError``)."""
    return fetch_shard(t, shard, **coords).get()


def show(t: torch.Tensor, shard: dict[str, int] | None = None, **coords: int) -> None:
    """Print the value of one shard (:func:`inspect`)."""
    print(inspect(t, shard, **coords))


def get_active_mesh() -> ProcMesh:
    """The procs of the innermost ``activate()``; ``ValueError`` outside one."""
    client = active()
    if client is None:
        raise ValueError("no mesh is active: use `with procs.activate():`")
    return client.procs


_MAIN = Stream("main")


def get_active_stream() -> Stream:
    """The stream work is issued onto (``Stream("main")`` outside ``stream.activate()``)."""
    return active_stream() or _MAIN


class _NoMesh:
    """``with no_mesh.activate():`` (Monarch's spelling) or ``with no_mesh():`` inside
    ``activate()``: torch calls run locally again."""

    def __repr__(self) -> str:
        return "no_mesh"

    def activate(self) -> contextlib.AbstractContextManager[Any]:
        return _client.no_mesh()

    def __call__(self) -> contextlib.AbstractContextManager[Any]:
        return _client.no_mesh()


no_mesh = _NoMesh()


@contextlib.contextmanager
def coalescing() -> Iterator[None]:
    """A batching hint (Monarch's): danaus already sends commands in batches, so this
    keeps the semantics and changes nothing."""
    yield


def call_on_shard_and_fetch(
    fn: Callable[..., Any], *args: Any, shard: dict[str, int] | None = None, **kwargs: Any
) -> Future[Any]:
    """Run the ``@remote`` function ``fn`` on the mesh of its DTensor arguments and fetch
    its (tensor) result from the shard at ``shard`` (a dim not given is 0, as in Monarch)."""
    out = fn(*args, **kwargs)
    if not isinstance(out, DTensor):
        raise TypeError(
            "call_on_shard_and_fetch needs a @remote function that returns a tensor on "
            f"the mesh; {getattr(fn, '__name__', fn)} returned {type(out).__name__}"
        )
    return fetch_shard(out, shard)


def remote(fn: Any = None, *, propagate: Callable[..., Any] | None = None) -> Any:
    """Run ``fn`` on every shard: ``@remote def f(x, y): ...`` then ``f(dx, dy)``.

    ``fn`` is a callable or what :data:`function_resolvers` accepts, such as an import
    path (``remote("my_pkg.ops.step", propagate=...)``: imported on the workers).

    Outputs' shapes come from calling ``propagate`` (default: ``fn`` itself) on meta
    tensors on the controller; give ``propagate`` when ``fn`` cannot run on meta tensors.
    ``f.call(...)`` runs ``fn`` on every proc of the active mesh (each DTensor argument
    as that proc's shard) and fetches the results, as Monarch's does: a future of a
    ``ValueMesh`` (``f.call(...).get()``).
    """

    def wrap(target: Any) -> Callable[..., Any]:
        f = resolve_function(target)
        shape_fn = propagate or f

        def call(*args: Any, **kwargs: Any) -> Any:
            client = _client_of(args, kwargs)
            if client is None:
                return f(*args, **kwargs)  # no mesh involved: an ordinary call
            return _dispatch.call_function(client, f, shape_fn, args, kwargs)

        def fetching(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
            client = _client_of(args, kwargs)
            if client is None:
                raise RuntimeError(
                    f"{getattr(f, '__name__', f)}.call(): no mesh is active and no argument "
                    "is a tensor on a mesh (use `with procs.activate():`)"
                )
            return _dispatch.fetching_call(client, f, args, kwargs)

        def call_and_fetch(*args: Any, **kwargs: Any) -> Any:
            from torch.utils._python_dispatch import _disable_current_modes

            endpoint, wargs, wkwargs = fetching(args, kwargs)
            with _disable_current_modes():  # danaus pickles them, with torch calls of its own
                return endpoint.call(*wargs, **wkwargs)

        call.__wrapped__ = f  # type: ignore[attr-defined]
        setattr(call, "_remote_impl", f)  # Monarch's name for the body  # noqa: B010
        call.__name__ = getattr(f, "__name__", "remote")
        call.call = call_and_fetch  # type: ignore[attr-defined]
        call.endpoint_call = fetching  # type: ignore[attr-defined]  # for send(f, ...)
        return call

    return wrap(fn) if fn is not None else wrap


def world_mesh(ctx: Any, hosts: Any, gpu_per_host: int, _processes: Any = None) -> ProcMesh:
    """Monarch's first-generation ``world_mesh``: a device mesh of ``gpu_per_host``
    procs on each of ``hosts``, with dims ``("host", "gpu")``, ready for ``activate()``.

    ``hosts`` is a :class:`~danaus.HostMesh` of one dim (``None``: this host alone) or
    a list of host agents' addresses (``tcp://host:port``: :func:`~danaus.attach_to_hosts`).
    ``ctx`` and ``_processes`` were that API's supervisor context and process list;
    danaus has neither and ignores them.
    """
    from ..mesh import HostMesh, attach_to_hosts, this_host

    if not isinstance(gpu_per_host, int) or isinstance(gpu_per_host, bool) or gpu_per_host < 1:
        raise ValueError(f"world_mesh: gpu_per_host must be a positive int, not {gpu_per_host!r}")
    if hosts is None:
        hosts = this_host()
    elif not isinstance(hosts, HostMesh):
        hosts = attach_to_hosts(list(hosts))
    dims = list(hosts.sizes)
    if not dims:
        alone: ProcMesh = hosts.spawn_procs(per_host={"host": 1, "gpu": gpu_per_host})
        return alone
    if len(dims) != 1:
        raise ValueError(
            f"world_mesh: hosts must have one dim (they are {hosts.sizes}); slice or flatten "
            "them first"
        )
    procs: ProcMesh = hosts.spawn_procs(per_host={"gpu": gpu_per_host})
    return procs.rename(**{dims[0]: "host"}) if dims[0] != "host" else procs


def _client_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The tensor engine a ``@remote`` call goes to: the active mesh's, else that of its
    first argument on a mesh; None where no mesh is involved."""
    return active() or next(
        (a.client for a in (*args, *kwargs.values()) if isinstance(a, DTensor)), None
    )


class _ActorCall:
    """Runs on a worker, for ``endpoint.rref``: calls the endpoint of the actor of this
    proc with its local shards, through the actor's mailbox, and gives its result."""

    def __init__(self, wire: str, cls: type, method: str) -> None:
        self.wire, self.cls, self.method = wire, cls, method

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from ..actors.seam import current_runtime
        from ..mesh import Shape
        from ..mesh.seam import mesh_ref

        rt = current_runtime()  # (the worker's thread is an actor's: its proc's runtime)
        here: Any = mesh_ref(self.wire, self.cls, Shape.from_sizes({}), {0: rt.addr})
        return getattr(here, self.method).call_one(*args, **kwargs).get()

    def __repr__(self) -> str:
        return f"{self.cls.__name__}.{self.method} (rref)"


def _rref(endpoint: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    from ..actors.seam import endpoints_of

    mesh = endpoint.mesh
    ep = endpoints_of(mesh.actor_class)[endpoint.name]
    if ep.propagate is None or not callable(ep.propagate):
        raise ValueError(
            f"{mesh.actor_class.__name__}.{endpoint.name}.rref needs @endpoint(propagate=fn): fn "
            "gives the output's shape from the arguments' (e.g. propagate=lambda x: x)"
        )
    client = active() or next(
        (a.client for a in (*args, *kwargs.values()) if isinstance(a, DTensor)), None
    )
    if client is None:
        raise ValueError(
            f"{mesh.actor_class.__name__}.{endpoint.name}.rref needs a DTensor argument or an "
            "active mesh (procs.activate())"
        )
    fn = _ActorCall(mesh.wire_name, mesh.actor_class, endpoint.name)
    return _dispatch.call_function(client, fn, ep.propagate, args, kwargs)


def _activate(procs: ProcMesh) -> contextlib.AbstractContextManager[Any]:
    return activate(procs)


def _rank_tensor(procs: ProcMesh, dims: tuple[str, ...]) -> Any:
    """A DTensor (int64, no dims) whose shard on each proc of ``procs`` is its rank along
    ``dims``, row-major (Monarch's ``DeviceMesh.rank``)."""
    unknown = [d for d in dims if d not in procs.sizes]
    if unknown or not dims:
        raise ValueError(f"rank_tensor: dims {list(dims)} are not dims of {procs!r}")
    sizes = dict(procs.sizes)
    with activate(procs):
        return _rank_on_worker(dims, sizes)


def _rank_of(dims: tuple[str, ...], sizes: dict[str, int]) -> torch.Tensor:
    from ..actors import current_rank

    point = current_rank()
    rank = 0
    for d in dims:
        rank = rank * sizes[d] + point[d]
    return torch.tensor(rank, dtype=torch.int64)


_rank_on_worker = remote(_rank_of, propagate=lambda dims, sizes: torch.zeros((), dtype=torch.int64))


set_tensor_engine(
    TensorEngine(
        activate=_activate,
        rref=_rref,
        process_group=lambda p, d: RemoteProcessGroup(d, p),
        rank_tensor=_rank_tensor,
    )
)
