"""Actors that take DTensors as arguments (importable by procs)."""

from __future__ import annotations

import torch

from danaus import Actor, endpoint


class ShardReader(Actor):
    """Gets a DTensor argument as its proc's local shard."""

    def __init__(self) -> None:
        self.kept: torch.Tensor | None = None

    @endpoint
    def total(self, t: torch.Tensor, scale: float) -> float:
        assert type(t) is torch.Tensor
        self.kept = t
        return float(t.sum()) * scale

    @endpoint
    async def total_async(self, t: torch.Tensor) -> float:
        return float(t.sum())
