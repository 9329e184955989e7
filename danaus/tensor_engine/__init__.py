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

from ..actors._api import Future
from ..mesh import ProcMesh, _proc_mesh
from ._dtensor import DTensor, Stream, _active, _Client, _dispatch, activate

__all__ = ["DTensor", "Stream", "fetch_shard", "inspect", "remote"]


def fetch_shard(t: DTensor, **coords: int) -> Future[torch.Tensor]:
    """A local copy of the shard at ``coords`` (every mesh dim; none for a 1-proc mesh).

    Raises (when awaited) ``RemoteException`` if the operation that made ``t`` failed on
    the worker: it carries the worker's traceback and the controller line that issued it.
    """
    if type(t) is not DTensor:
        raise TypeError(f"fetch_shard takes a DTensor, not {type(t).__name__}")
    return t._client.fetch(t, coords)


def inspect(t: DTensor, **coords: int) -> torch.Tensor:
    """The value of one shard, synchronously (scripts, sync endpoints, notebook cells;
    ``await fetch_shard`` in async code, where this raises ``DeadlockError``)."""
    return fetch_shard(t, **coords).get()


def remote(
    fn: Callable[..., Any] | None = None, *, propagate: Callable[..., Any] | None = None
) -> Any:
    """Run ``fn`` on every shard: ``@remote def f(x, y): ...`` then ``f(dx, dy)``.

    Outputs' shapes come from calling ``propagate`` (default: ``fn`` itself) on meta
    tensors on the controller; give ``propagate`` when ``fn`` cannot run on meta tensors.
    """

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        shape_fn = propagate or f

        def call(*args: Any, **kwargs: Any) -> Any:
            client = _active() or next((a._client for a in args if type(a) is DTensor), None)
            if client is None:
                return f(*args, **kwargs)  # no mesh involved: an ordinary call
            return _dispatch(client, _Remote(f, shape_fn), args, kwargs)

        call.__wrapped__ = f  # type: ignore[attr-defined]
        call.__name__ = getattr(f, "__name__", "remote")
        return call

    return wrap(fn) if fn is not None else wrap


class _Remote:
    """A user function in a command: shapes from ``shape_fn``, work done by ``fn``."""

    def __init__(self, fn: Callable[..., Any], shape_fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.shape_fn = shape_fn
        self.__name__ = getattr(fn, "__name__", "remote")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        target = (
            self.shape_fn
            if args and isinstance(args[0], torch.Tensor) and args[0].device.type == "meta"
            else self.fn
        )
        return target(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Remote, (self.fn, self.fn))

    def __hash__(self) -> int:
        return hash((self.fn, self.shape_fn))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Remote) and (self.fn, self.shape_fn) == (other.fn, other.shape_fn)


@contextlib.contextmanager
def _activate(procs: ProcMesh) -> Iterator[_Client]:
    with activate(procs) as client:
        yield client


_proc_mesh.activate_hook = _activate
