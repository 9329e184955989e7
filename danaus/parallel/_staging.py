"""A large shard of a batch travels by the data plane, not inside the call message.

The controller packs a shard's tensors into one contiguous byte buffer, registers it as
an :class:`~danaus.rdma.RDMABuffer`, and sends the workers a :class:`Staged`: the
buffer's handle and where each tensor lies in it. Each worker reads the bytes straight
into its own memory (shared memory on one host, TCP or RDMA between hosts) and views its
tensors there; the controller drops the buffer when the call has ended.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ._model import Shard

#: a shard of more bytes than this goes by the data plane
LARGE = 1 << 20
#: each tensor starts at a multiple of this in the packed buffer (any dtype's alignment)
ALIGN = 64

#: (where: "inputs", "target" or a kwargs key, or a copy's tensor's name; dtype; shape;
#: offset in the buffer)
Spec = tuple[str, str, tuple[int, ...], int]


@dataclass(frozen=True)
class Staged:
    """A shard whose tensors wait in one registered buffer on the controller."""

    buffer: Any  # an RDMABuffer (picklable handle)
    specs: tuple[Spec, ...]
    nbytes: int
    #: the shape of the replica's inputs (see ``Shard.shape``)
    shape: tuple[int, ...]
    #: what was not a tensor (a None input or target of a middle stage), as is
    rest: dict[str, Any]


def _fields(shard: Shard) -> list[tuple[str, Any]]:
    return [("inputs", shard.inputs), ("target", shard.target), *shard.kwargs.items()]


def layout_of(tensors: Mapping[str, torch.Tensor]) -> tuple[tuple[Spec, ...], int]:
    """Where each of ``tensors`` goes in one packed buffer (each at an ``ALIGN``-ed
    offset), and the bytes they take."""
    specs: list[Spec] = []
    offset = 0
    for name, t in tensors.items():
        specs.append((name, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset))
        offset += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    return tuple(specs), offset


def pack_into(
    out: torch.Tensor,
    tensors: Mapping[str, torch.Tensor],
    specs: tuple[Spec, ...],
    only: Container[str] | None = None,
    skip: Container[str] = (),
) -> None:
    """Copy ``tensors`` (on any device, contiguous or not) into ``out``, a uint8 tensor
    laid out as :func:`layout_of` says: those named in ``only`` where given, and none
    named in ``skip``."""
    copy_each(*packing(out, tensors, specs, only, skip))


def packing(
    out: torch.Tensor,
    tensors: Mapping[str, torch.Tensor],
    specs: tuple[Spec, ...],
    only: Container[str] | None = None,
    skip: Container[str] = (),
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """What :func:`pack_into` copies: where in ``out`` (views of it) and from which of
    ``tensors``, for :func:`copy_each`; made once, for a copy made again each step."""
    dsts, srcs = [], []
    for (name, _, _, at), t in zip(specs, tensors.values(), strict=True):
        if (only is not None and name not in only) or name in skip:
            continue
        n = t.numel() * t.element_size()
        if n:
            dsts.append(out[at : at + n].view(t.dtype).view(t.shape))
            srcs.append(t.detach())
    return dsts, srcs


def copy_each(dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> None:
    """``dsts[i].copy_(srcs[i])`` for each: on CPU in one call of torch's, which holds
    Python's lock only to start (a copy per tensor from Python held it for 2.5 ms of a
    4 ms copy of a GPT-2's 209 tensors: time that a step's own Python waited for)."""
    if not dsts:
        return
    foreach = getattr(torch, "_foreach_copy_", None)
    with torch.no_grad():
        if foreach is not None and all(t.device.type == "cpu" for t in srcs):
            foreach(dsts, srcs)
            return
        for d, t in zip(dsts, srcs, strict=True):
            d.copy_(t)


def views(data: torch.Tensor, specs: Iterable[Spec]) -> dict[str, torch.Tensor]:
    """The tensors a packed buffer holds, as views of ``data``."""
    out = {}
    for name, dtype, shape, at in specs:
        kind = getattr(torch, dtype)
        n = int(torch.Size(shape).numel()) * torch.empty((), dtype=kind).element_size()
        out[name] = data[at : at + n].view(kind).view(shape)
    return out


def pack(shard: Shard) -> tuple[torch.Tensor, tuple[Spec, ...], dict[str, Any]]:
    """``shard``'s tensors in one uint8 tensor (each at an ``ALIGN``-ed offset), where
    each lies, and its other fields."""
    tensors = {k: t for k, t in _fields(shard) if isinstance(t, torch.Tensor)}
    rest = {k: t for k, t in _fields(shard) if not isinstance(t, torch.Tensor)}
    specs, size = layout_of(tensors)
    out = torch.empty(size, dtype=torch.uint8)
    pack_into(out, tensors, specs)
    return out, specs, rest


class Packed:
    """A shard packed (in the caller's thread), to register on danaus's loop."""

    def __init__(self, shard: Shard) -> None:
        self.data, self.specs, self.rest = pack(shard)
        self.shape = shard.shape

    def register(self) -> Staged:
        """The packed bytes registered for the workers to read (the caller drops the
        buffer once they have)."""
        from ..rdma import RDMABuffer

        buffer = RDMABuffer(self.data)
        return Staged(buffer, self.specs, int(self.data.numel()), self.shape, self.rest)


def unpack(data: torch.Tensor, staged: Staged) -> Shard:
    """The shard whose tensors ``data`` (the buffer's bytes, read here) holds."""
    fields: dict[str, Any] = {**staged.rest, **views(data, staged.specs)}
    inputs, target = fields.pop("inputs", None), fields.pop("target", None)
    return Shard(inputs, target, fields, staged.shape)


def fetch(staged: Staged, timeout: float) -> Shard:
    """Read ``staged``'s bytes from the controller (from sync code: an endpoint's
    thread) and view its shard in them."""
    data = torch.empty(staged.nbytes, dtype=torch.uint8)
    if staged.nbytes:
        staged.buffer.read_into(data, timeout=timeout).get()
    return unpack(data, staged)
