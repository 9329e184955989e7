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


class LinearActor(Actor):
    """Monarch's getting-started rref pattern: an actor making its own DTensor shards."""

    def __init__(self) -> None:
        # A generator of its own: the proc's default one is also the tensor engine
        # worker's (seeded as it starts, and per random op), on another thread
        self.w = torch.rand(3, 3, generator=torch.Generator().manual_seed(7))
        self.calls = 0

    @endpoint(propagate=lambda x: x)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert type(x) is torch.Tensor  # the local shard
        self.calls += 1
        return x @ self.w

    @endpoint
    def count(self) -> int:
        return self.calls

    @endpoint
    def weights(self) -> torch.Tensor:
        return self.w

    @endpoint
    def no_propagate(self, x: torch.Tensor) -> torch.Tensor:
        return x
