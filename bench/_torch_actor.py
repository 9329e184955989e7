"""An actor whose module imports torch, as real training actors' modules do."""

from __future__ import annotations

import torch

from danaus import Actor, endpoint


class TorchPing(Actor):
    @endpoint
    def ping(self, x: int) -> int:
        return int(torch.tensor(x).item())
