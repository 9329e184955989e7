"""Handles, held by the controller, to things that live on the workers: any Python
object (:class:`OpaqueRef`) and the process group of some dims of a mesh
(:class:`RemoteProcessGroup`). Monarch's names for both.

An ``OpaqueRef`` is made inside a ``@remote`` function, on the workers, and comes back to
the controller as a handle; given to another ``@remote`` function, it is the same
object again on each worker::

    @remote(propagate=lambda: OpaqueRef(None))
    def make_model():
        return OpaqueRef(torch.nn.Linear(4, 4))

    @remote(propagate=lambda ref, x: x)
    def forward(ref, x):
        return ref.value(x)

    with procs.activate():
        model = make_model()
        y = forward(model, torch.rand(2, 4))

The object lives on each worker for as long as the controller holds the handle (it is
keyed by a tensor of the tensor engine, freed with it). On the controller, outside a
``@remote`` function, making one or reading ``.value`` raises ``RuntimeError``: the
object is not here.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils._pytree import register_pytree_node
from torch.utils.weak import WeakTensorKeyDictionary

__all__ = ["OpaqueRef", "RemoteProcessGroup"]

_values: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
_keys = itertools.count(1)
#: set in a worker's process (the objects live there), and on the controller while a
#: ``@remote`` function's ``propagate`` runs
_resolvable = False
_propagating = 0


def on_worker() -> None:
    """Called by a tensor engine worker when it starts: this process holds the objects."""
    global _resolvable
    _resolvable = True


@contextlib.contextmanager
def propagating() -> Iterator[None]:
    """While the controller infers a ``@remote`` call's outputs (``propagate``)."""
    global _propagating
    _propagating += 1
    try:
        yield
    finally:
        _propagating -= 1


class OpaqueRef:
    """A handle to an object on the workers (Monarch's ``OpaqueRef``): ``OpaqueRef(obj)``
    inside a ``@remote`` function; ``ref.value`` there gives the object back (and
    ``ref.value = other`` replaces it)."""

    __slots__ = ("_key",)

    def __init__(self, value: Any = None) -> None:
        self._key = torch.tensor(next(_keys), dtype=torch.int64)
        self._check("create")
        if not _propagating:
            _values[self._key] = value

    @classmethod
    def _create(cls, key: torch.Tensor) -> OpaqueRef:
        ref = cls.__new__(cls)
        ref._key = key  # noqa: SLF001 - its own class's field
        return ref

    @property
    def value(self) -> Any:
        self._check("read")
        try:
            return _values[self._key]
        except KeyError:
            raise KeyError(f"{self!r} names no object on this worker (freed?)") from None

    @value.setter
    def value(self, v: Any) -> None:
        self._check("set")
        _values[self._key] = v

    def _check(self, what: str) -> None:
        if not (_resolvable or _propagating):
            raise RuntimeError(
                f"the controller cannot {what} an OpaqueRef's object: it lives on the "
                "workers; do that inside a @remote function"
            )

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return (OpaqueRef._create, (self._key,))

    def __repr__(self) -> str:
        key = self._key
        n = key.item() if type(key) is torch.Tensor and not key.is_meta else "on the mesh"
        return f"OpaqueRef({n})"


def _flatten(ref: OpaqueRef) -> tuple[list[torch.Tensor], None]:
    return [ref._key], None  # noqa: SLF001 - the one field, for torch's pytree


def _unflatten(values: Sequence[Any], _context: None) -> OpaqueRef:
    return OpaqueRef._create(values[0])  # noqa: SLF001


register_pytree_node(OpaqueRef, _flatten, _unflatten)  # type: ignore[arg-type]


class RemoteProcessGroup:
    """The process group of ``dims`` of a mesh (Monarch's ``RemoteProcessGroup``): given
    to a ``@remote`` function, it is, on each worker, the ``torch.distributed``
    process group of the ranks that differ from that worker's only along ``dims`` (gloo
    on CPU, NCCL on CUDA), the one the tensor engine's own ``reduce`` uses::

        pg = procs.process_group(("gpus",))      # or RemoteProcessGroup(("gpus",), procs)

        @remote(propagate=lambda t, pg: t)
        def all_sum(t, pg):
            t = t.clone()
            pg.allreduce([t]).wait()
            return t
    """

    __slots__ = ("device_mesh", "dims")

    def __init__(self, dims: str | Sequence[str], device_mesh: Any) -> None:
        names = (dims,) if isinstance(dims, str) else tuple(dims)
        sizes = device_mesh.sizes
        unknown = [d for d in names if d not in sizes]
        if unknown or not names:
            raise ValueError(
                f"RemoteProcessGroup: dims {list(names)} are not dims of {device_mesh!r} "
                f"(its dims: {list(sizes)})"
            )
        self.dims, self.device_mesh = names, device_mesh

    def size(self) -> int:
        n = 1
        for d in self.dims:
            n *= self.device_mesh.sizes[d]
        return n

    def __repr__(self) -> str:
        return f"RemoteProcessGroup({list(self.dims)}, {self.device_mesh!r})"


class GroupWire:
    """A :class:`RemoteProcessGroup` on its way to the workers: its dims."""

    __slots__ = ("dims",)

    def __init__(self, dims: tuple[str, ...]) -> None:
        self.dims = dims

    def __reduce__(self) -> tuple[Any, ...]:
        return (GroupWire, (self.dims,))


class OpaqueWire:
    """An :class:`OpaqueRef` on its way to the workers: its key's wire form."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key

    def __reduce__(self) -> tuple[Any, ...]:
        return (OpaqueWire, (self.key,))
