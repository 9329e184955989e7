"""A large shard of a batch travels by the data plane, not inside the call message.

The controller packs a shard's tensors into one contiguous byte buffer, registers it as
an :class:`~danaus.rdma.RDMABuffer`, and sends the workers a :class:`Staged`: the
buffer's handle and where each tensor lies in it. Each worker reads the bytes straight
into its own memory (shared memory on one host, TCP or RDMA between hosts) and views its
tensors there; the controller drops the buffer when the call has ended.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ._model import Shard

#: a shard of more bytes than this goes by the data plane
LARGE = 1 << 20
#: each tensor starts at a multiple of this in the packed buffer (any dtype's alignment)
ALIGN = 64

#: (where: "inputs", "target" or a kwargs key; dtype; shape; offset in the buffer)
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


def pack(shard: Shard) -> tuple[torch.Tensor, tuple[Spec, ...], dict[str, Any]]:
    """``shard``'s tensors in one uint8 tensor (each at an ``ALIGN``-ed offset), where
    each lies, and its other fields."""
    specs: list[Spec] = []
    rest: dict[str, Any] = {}
    offset = 0
    for where, t in _fields(shard):
        if not isinstance(t, torch.Tensor):
            rest[where] = t
            continue
        specs.append((where, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset))
        offset += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    out = torch.empty(offset, dtype=torch.uint8)
    tensors = dict(_fields(shard))
    for where, _, _, at in specs:
        t = tensors[where].detach().to("cpu").contiguous()
        n = t.numel() * t.element_size()
        out[at : at + n].copy_(t.view(-1).view(torch.uint8))
    return out, tuple(specs), rest


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
    fields: dict[str, Any] = dict(staged.rest)
    for where, dtype, shape, at in staged.specs:
        kind = getattr(torch, dtype)
        n = int(torch.Size(shape).numel()) * torch.empty((), dtype=kind).element_size()
        fields[where] = data[at : at + n].view(kind).view(shape)
    inputs, target = fields.pop("inputs", None), fields.pop("target", None)
    return Shard(inputs, target, fields, staged.shape)


def fetch(staged: Staged, timeout: float) -> Shard:
    """Read ``staged``'s bytes from the controller (from sync code: an endpoint's
    thread) and view its shard in them."""
    data = torch.empty(staged.nbytes, dtype=torch.uint8)
    if staged.nbytes:
        staged.buffer.read_into(data, timeout=timeout).get()
    return unpack(data, staged)
