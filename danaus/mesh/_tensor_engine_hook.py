"""Where the tensor engine plugs into the mesh layer: ``procs.activate()`` and
``endpoint.rref`` are the tensor engine's work, but the mesh layer sits below it and never
imports it (nor torch). The tensor engine registers itself here when it is imported
(:func:`set_tensor_engine`); the package root registers how to import it
(:func:`set_tensor_engine_loader`), so a program that never imported it can still call
``procs.activate()``, which imports it on first use."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, NamedTuple

from ._process import process

if TYPE_CHECKING:
    from ._actor_endpoint import ActorEndpoint
    from ._proc_mesh import ProcMesh

__all__ = ["TensorEngine", "set_tensor_engine", "set_tensor_engine_loader", "tensor_engine"]


class TensorEngine(NamedTuple):
    """What the tensor engine does for the mesh layer."""

    #: ``procs.activate()``: torch calls in the ``with`` block make distributed tensors
    activate: Callable[[ProcMesh], AbstractContextManager[object]]
    #: ``endpoint.rref(*args, **kwargs)``: a DTensor (a type of the tensor engine's, hence
    #: ``object`` here) of what every actor's endpoint returns
    rref: Callable[[ActorEndpoint[object], tuple[object, ...], dict[str, object]], object]
    #: ``procs.process_group(dims)``: a ``RemoteProcessGroup`` of those dims
    process_group: Callable[[ProcMesh, tuple[str, ...]], object]
    #: ``procs.rank_tensor(dims)``: a DTensor of each proc's rank along those dims
    rank_tensor: Callable[[ProcMesh, tuple[str, ...]], object]


def set_tensor_engine(engine: TensorEngine) -> None:
    """Called by ``danaus.tensor_engine`` when it is imported."""
    process.tensor_engine = engine


def set_tensor_engine_loader(load: Callable[[], None]) -> None:
    """How to import the tensor engine on first use (``load`` calls
    :func:`set_tensor_engine` by importing it); set by the package root."""
    process.tensor_engine_loader = load


def tensor_engine() -> TensorEngine:
    """The tensor engine, imported first if nothing imported it yet.

    Raises:
        ImportError: it cannot be imported (it needs torch).
    """
    if process.tensor_engine is None and process.tensor_engine_loader is not None:
        process.tensor_engine_loader()
    engine = process.tensor_engine
    if engine is None:
        raise ImportError("the tensor engine is not loaded: import danaus.tensor_engine")
    return engine
