"""Actors for the SPMD tests (importable by procs)."""

from __future__ import annotations

import os

from danaus import Actor, endpoint

_NAMES = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "TORCHELASTIC_RUN_ID",
)


class Trainer(Actor):
    """Uses torch.distributed the way a DDP actor does, after setup_torch_elastic_env."""

    @endpoint
    def env(self) -> dict[str, str]:
        return {k: os.environ.get(k, "") for k in _NAMES}

    @endpoint
    def all_reduce(self) -> float:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")  # env:// from the variables set
        try:
            t = torch.tensor([float(dist.get_rank() + 1)])
            dist.all_reduce(t)
            return float(t.item())
        finally:
            dist.destroy_process_group()
