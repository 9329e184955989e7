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
from ._worker import BORROW, PULL, REDUCE, Ref

if TYPE_CHECKING:
    from ..mesh import ProcMesh
    from ._client import _Client

_REDUCTIONS = ("sum", "avg", "min", "max", "stack")
_TENSOR_DATA: Any = torch._C.TensorBase.__dict__["data"]  # noqa: SLF001 - torch's


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

    #: its tensor on the workers (freed there when no DTensor holds it any more)
    ref: _Handle
    #: the tensor engine's client of its mesh: what sends the commands for it
    client: _Client
    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]  # noqa: SLF001 - torch's

    @staticmethod
    def _make(client: _Client, shape: Any, stride: Any, offset: int, dtype: torch.dtype) -> DTensor:
        r: DTensor = torch.Tensor._make_wrapper_subclass(  # noqa: SLF001 - torch's
            DTensor,
            shape,
            strides=stride,
            storage_offset=offset,
            dtype=dtype,
            device=client.device,
        )
        r.ref = _Handle(client)
        r.client = client
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
            f"DTensor(mesh={self.client.sizes}, shape={tuple(self.shape)}, "
            f"dtype={self.dtype}{rg}{grad})"
        )

    def __format__(self, spec: str) -> str:
        if spec:
            raise _dispatch.value_error(f"format(t, {spec!r})")
        return repr(self)

    @property  # type: ignore[override]
    def data(self) -> DTensor:
        """The tensor without autograd history (same shards)."""
        return _TENSOR_DATA.__get__(self)  # type: ignore[no-any-return]

    @data.setter
    def data(self, value: DTensor) -> None:
        # nn.Module.to(dtype) and friends swap a parameter's contents this way: the
        # wrapper takes the new metadata, and must refer to the new shards too.
        if not isinstance(value, DTensor) or value.client is not self.client:
            raise TypeError(
                f"a DTensor's .data must be a DTensor of the same mesh, not {type(value).__name__}"
            )
        _TENSOR_DATA.__set__(self, value)
        self.ref = value.ref

    @property
    def ref_id(self) -> int:
        """The id of its tensor on the workers."""
        return self.ref.i

    @property
    def mesh(self) -> ProcMesh:
        """The procs that hold this tensor's shards."""
        return self.client.procs

    def tolist(self) -> Any:
        raise _dispatch.value_error("tolist()")

    def numpy(self, *, force: bool = False) -> Any:
        raise _dispatch.value_error("numpy()")

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        raise _dispatch.value_error("numpy.asarray()")

    def __reduce_ex__(self, proto: Any) -> Any:
        """As an argument of an actor's endpoint: the actor gets its proc's shard. The
        commands that make it run first (this waits for them: call from sync code). Keep
        the DTensor until the call returns: dropping it frees the shards."""
        from ._worker import local_shard

        client = self.client
        seq = client.barrier()
        return (local_shard, (client.rendezvous, self.ref_id, seq))

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
        client = self.client
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
                self.ref,
                list(dims),
                reduction,
                scatter,
                tuple(self.shape),
                self.dtype,
                [out.ref_id],
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
        1: another mesh, or another slice of the same one, as a pipeline's stages); or is
        a slice of this tensor's mesh (each proc gets its own shard); or has this mesh's
        dims and more, which get copies (a broadcast).
        """
        c = self.client
        return _move(self, list(range(len(c.global_ranks))), c.sizes, c.global_ranks, procs)


class MeshSlice:
    """The shards of a DTensor on a slice of its mesh (:func:`slice_mesh`)."""

    def __init__(self, t: DTensor, coords: dict[str, int]) -> None:
        client = t.client
        unknown = [d for d in coords if d not in client.sizes]
        if unknown:
            raise ValueError(f"unknown mesh dims {unknown}; the mesh has {list(client.sizes)}")
        self.tensor = t
        self.procs = client.procs.slice(**coords)

    def __repr__(self) -> str:
        return f"MeshSlice({self.tensor!r}, {self.procs.sizes})"

    def to_mesh(self, procs: ProcMesh) -> DTensor:
        """These shards on ``procs`` (the rules of :meth:`DTensor.to_mesh`), e.g.
        ``slice_mesh(t, dp=0).to_mesh(t.mesh)`` broadcasts ``dp=0``'s shard along dp."""
        client = self.tensor.client
        ranks = list(self.procs.shape.global_ranks())
        index = [client.global_ranks.index(g) for g in ranks]
        return _move(self.tensor, index, dict(self.procs.sizes), ranks, procs)


def slice_mesh(t: DTensor, **coords: int) -> MeshSlice:
    """``t``'s shards on the procs at ``coords`` of its mesh, to move with ``.to_mesh``."""
    return MeshSlice(t, coords)


def _move(
    t: DTensor, index: list[int], sizes: dict[str, int], ranks: list[int], procs: ProcMesh
) -> DTensor:
    """Pull into each proc of ``procs`` one of the shards of ``t`` on the workers at
    ``index`` (a mesh of ``sizes``, procs ``ranks``)."""
    from ._client import client_for

    client = t.client
    target = client_for(procs)
    dst = target.global_ranks
    picks = _picks(sizes, ranks, dict(procs.sizes), dst, target.group is client.group)
    if picks is None:
        raise ValueError(
            "to_mesh needs a mesh of the same shape, a slice of the tensor's mesh, or a "
            f"mesh with its dims and more: {sizes} vs {dict(procs.sizes)}"
        )
    readers = [0] * len(client.global_ranks)
    for p in picks:
        readers[index[p]] += 1
    client.flush()
    bufs = list(client.workers.publish.call(t.ref_id, readers).get().values())  # rank order
    shape = list(t.shape)
    out = DTensor._make(target, shape, _contiguous_strides(shape), 0, t.dtype)
    sources = [bufs[index[p]].pop() for p in picks]  # a snapshot per reader
    target.issue((PULL, sources, tuple(shape), t.dtype, [out.ref_id], _dispatch.issued_at()))
    return out


def _picks(
    src: dict[str, int], src_ranks: list[int], dst: dict[str, int], dst_ranks: list[int], same: bool
) -> list[int] | None:
    """For each destination proc, the source proc (an index into ``src_ranks``) whose
    shard it gets; None where the layouts do not fit."""
    if _layout(src) == _layout(dst):
        return list(range(len(dst_ranks)))
    if same and set(dst_ranks) <= set(src_ranks):
        return [src_ranks.index(g) for g in dst_ranks]
    if any(dst.get(d) != n for d, n in _layout(src).items()):
        return None
    names = list(dst)
    picks = []
    for j in range(len(dst_ranks)):  # broadcast: the source proc at our coords on its dims
        coords, r = {}, j
        for d in reversed(names):
            coords[d] = r % dst[d]
            r //= dst[d]
        i = 0
        for d, n in src.items():
            i = i * n + (coords[d] if n != 1 else 0)
        picks.append(i)
    return picks


def _layout(sizes: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in sizes.items() if v != 1}


def _contiguous_strides(shape: list[int]) -> list[int]:
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * max(shape[i + 1], 1)
    return strides


_dispatch.bind_dtensor()


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

    def borrow(self, t: DTensor, mutable: bool = False) -> tuple[DTensor, Borrow]:
        """``borrowed, borrow = stream.borrow(t)``, as Monarch's: ``borrowed`` is ``t``,
        safe to use on this stream (work here waits for its producer on the default
        stream); ``borrow.drop()`` makes the default stream wait for this stream's work
        on it.

        ``mutable`` is Monarch's promise that only this stream writes to ``t`` meanwhile;
        danaus does not check it (workers run every command in order on CPU).
        """
        t.client.issue((BORROW, t.ref, None, self.name, [t.ref_id], _dispatch.issued_at()))
        return t, Borrow(t, self, mutable)


class Borrow:
    """A tensor lent to a :class:`Stream`; :meth:`drop` gives it back."""

    def __init__(self, t: DTensor, stream: Stream, mutable: bool) -> None:
        self.tensor: DTensor | None = t
        self.stream = stream
        self.mutable = mutable

    def __repr__(self) -> str:
        state = "dropped" if self.tensor is None else "lent"
        return f"Borrow({self.stream!r}, mutable={self.mutable}, {state})"

    def drop(self) -> None:
        """The default stream waits for this stream's work on the tensor from here on."""
        t, self.tensor = self.tensor, None
        if t is not None:
            t.client.issue(
                (BORROW, t.ref, self.stream.name, None, [t.ref_id], _dispatch.issued_at())
            )


__all__ = ["Borrow", "DTensor", "MeshSlice", "Stream", "slice_mesh"]
