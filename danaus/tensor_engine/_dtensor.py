"""DTensor: a torch.Tensor with one shard in every proc of a mesh.

On the controller a DTensor is a wrapper tensor without storage (shape, strides and dtype
only), as Monarch's is. Every ATen operation on it reaches ``__torch_dispatch__``, which
records it as a command for the workers and makes the outputs' wrappers from shapes
inferred on meta tensors. Autograd runs here, on the wrappers: ``loss.backward()`` issues
the backward's operations like any others, and ``.grad`` is a DTensor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from . import _dispatch
from ._worker import BORROW, CALL, PULL, REDUCE, Ref

if TYPE_CHECKING:
    from ..mesh import ProcMesh
    from ._client import _Client

_REDUCTIONS = ("sum", "avg", "min", "max", "stack")


class _Handle(Ref):
    """The workers' tensor with id ``i``; freed there when no DTensor holds it any more."""

    __slots__ = ("client",)

    def __init__(self, client: _Client) -> None:
        super().__init__(client.new_id())
        self.client = client

    def __del__(self) -> None:
        self.client.free(self.i)  # may run at GC, in any thread: free() only appends


class DTensor(torch.Tensor):
    """A tensor with one shard in every proc of a mesh; made inside ``procs.activate()``.

    It is a ``torch.Tensor`` (so ``nn.Module`` parameters, optimizers and autograd take
    it) whose values live on the workers: read one shard with ``fetch_shard(t, **coords)``
    or ``inspect(t, **coords)``. Reading a value on the controller (``.item()``,
    ``bool(t)``, ``torch.equal``, ``.tolist()``) raises ``DataDependentError``. Dropping
    the last reference frees the shards.
    """

    _ref: _Handle
    _client: _Client
    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @staticmethod
    def _make(client: _Client, shape: Any, stride: Any, offset: int, dtype: torch.dtype) -> DTensor:
        r: DTensor = torch.Tensor._make_wrapper_subclass(
            DTensor,
            shape,
            strides=stride,
            storage_offset=offset,
            dtype=dtype,
            device=client.device,
        )
        r._ref = _Handle(client)
        r._client = client
        return r

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        return _dispatch.dispatch(func, args, kwargs or {})

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        grad = f", grad_fn={type(self.grad_fn).__name__}" if self.grad_fn is not None else ""
        rg = ", requires_grad=True" if self.requires_grad and not grad else ""
        return (
            f"DTensor(mesh={self._client.sizes}, shape={tuple(self.shape)}, "
            f"dtype={self.dtype}{rg}{grad})"
        )

    def __format__(self, spec: str) -> str:
        return format(repr(self), spec)

    @property
    def _id(self) -> int:
        return self._ref.i

    @property
    def mesh(self) -> ProcMesh:
        """The procs that hold this tensor's shards."""
        return self._client.procs

    def tolist(self) -> Any:
        raise _dispatch.value_error("tolist()")

    def numpy(self, *, force: bool = False) -> Any:
        raise _dispatch.value_error("numpy()")

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        raise _dispatch.value_error("numpy.asarray()")

    def __reduce_ex__(self, proto: Any) -> Any:
        """As an argument of an actor's endpoint: the actor gets its proc's shard (once
        the commands sent before the call made it). Keep the DTensor until the call
        returns: dropping it frees the shards."""
        from ._worker import local_shard

        client = self._client
        client.flush()
        return (local_shard, (client.rendezvous, self._id, client.sent))

    def __deepcopy__(self, memo: Any) -> DTensor:
        out: DTensor = self.detach().clone()  # type: ignore[assignment]
        out.requires_grad_(self.requires_grad)
        memo[id(self)] = out
        return out

    def reduce(
        self,
        dims: str | tuple[str, ...] | list[str],
        reduction: str = "sum",
        scatter: bool = False,
        mesh: ProcMesh | None = None,
    ) -> DTensor:
        """Reduce over the procs along mesh ``dims`` (a collective: gloo, or NCCL on GPU).

        Args:
            dims: mesh dim name(s) to reduce over.
            reduction: ``"sum"``, ``"avg"``, ``"min"``, ``"max"`` or ``"stack"``.
            scatter: each proc keeps its own slice of the result (along dim 0).
            mesh: the result on these procs (a slice of this tensor's mesh), e.g. the
                ``dp=0`` slice to gather there only.
        """
        client = self._client
        dims = (dims,) if isinstance(dims, str) else tuple(dims)
        unknown = [d for d in dims if d not in client.sizes]
        if unknown:
            raise ValueError(f"unknown mesh dims {unknown}; the mesh has {list(client.sizes)}")
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be sum, avg, min, max or stack, not {reduction!r}")
        n = 1
        for d in dims:
            n *= client.sizes[d]
        shape = list(self.shape)
        if reduction == "stack":
            shape = shape if scatter else [n, *shape]
        elif scatter:
            if not shape or shape[0] % n:
                raise ValueError(
                    f"scatter needs dim 0 ({shape[0] if shape else None}) "
                    f"divisible by the {n} procs reduced over"
                )
            shape[0] //= n
        out = DTensor._make(client, shape, _contiguous_strides(shape), 0, self.dtype)
        client.issue(
            (
                REDUCE,
                self._ref,
                list(dims),
                reduction,
                scatter,
                tuple(self.shape),
                self.dtype,
                [out._id],
                _dispatch.issued_at(),
            )
        )
        return out if mesh is None else out.to_mesh(mesh)

    def reduce_(self, dims: str | tuple[str, ...] | list[str], reduction: str = "sum") -> DTensor:
        """In-place :meth:`reduce` (no scatter)."""
        out = self.reduce(dims, reduction)
        with torch.no_grad():
            self.copy_(out)
        return self

    def to_mesh(self, procs: ProcMesh) -> DTensor:
        """This tensor on other procs, moved over the RDMA data plane. Sync code only: it
        waits for the shards' handles.

        ``procs`` has this mesh's shard layout (the same sizes, not counting dims of size
        1: another mesh, or another slice of the same one, as a pipeline's stages), or is
        a slice of this tensor's mesh (each proc gets its own shard).
        """
        from ._client import client_for

        client = self._client
        target = client_for(procs)
        src_ranks = client.global_ranks
        dst_ranks = target.global_ranks
        if _layout(procs.sizes) == _layout(client.sizes):
            picks = list(range(len(dst_ranks)))
        elif target.root is client.root and set(dst_ranks) <= set(src_ranks):
            picks = [src_ranks.index(g) for g in dst_ranks]
        else:
            raise ValueError(
                f"to_mesh needs a mesh of the same shape, or a slice of this tensor's mesh: "
                f"{client.sizes} vs {procs.sizes}"
            )
        client.flush()
        bufs = list(client.workers.publish.call(self._id).get().values())  # in rank order
        shape = list(self.shape)
        out = DTensor._make(target, shape, _contiguous_strides(shape), 0, self.dtype)
        target.issue(
            (
                PULL,
                [bufs[p] for p in picks],
                tuple(shape),
                self.dtype,
                [out._id],
                _dispatch.issued_at(),
            )
        )
        return out


def _layout(sizes: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in sizes.items() if v != 1}


def _contiguous_strides(shape: list[int]) -> list[int]:
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * max(shape[i + 1], 1)
    return strides


_dispatch._late()


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

    def activate(self) -> Any:
        from ._client import stream_scope

        return stream_scope(self)

    def borrow(self, t: DTensor, mutable: bool = False) -> DTensor:
        """``t``, safe to use on this stream (waits for its producer on the default stream).

        ``mutable`` is accepted for Monarch's signature; on CPU workers and with one
        command stream per worker every borrow may be written to.
        """
        t._client.issue((BORROW, t._ref, None, self.name, [t._id], _dispatch.issued_at()))
        return t


__all__ = ["CALL", "DTensor", "Stream"]
