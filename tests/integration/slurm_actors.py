"""Actors for the SLURM tests (importable by procs on the nodes)."""

from __future__ import annotations

import os
import socket
from typing import Any

from danaus import Actor, context, endpoint


class Node(Actor):
    """Says where it runs, and calls a peer on another node."""

    @endpoint
    def where(self) -> dict[str, Any]:
        return {
            "node": os.environ.get("SLURMD_NODENAME", ""),
            "job": os.environ.get("SLURM_JOB_ID", ""),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "addr": context().actor_instance.proc_addr,
        }

    @endpoint
    async def ask(self, peer: Node) -> dict[str, Any]:
        """``where()`` of ``peer`` (a mesh of one actor), asked from here."""
        return await peer.where.call_one()


class Gloo(Actor):
    """torch.distributed with gloo, after ``setup_torch_elastic_env``."""

    @endpoint
    def ddp_step(self) -> dict[str, Any]:
        """One DDP step of a tiny model on this rank's own batch: the gradients every
        rank ends with, and this rank's local gradient (before averaging)."""
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo")
        try:
            rank = dist.get_rank()
            torch.manual_seed(0)
            model = torch.nn.Linear(4, 1)
            x = torch.full((2, 4), float(rank + 1))
            local = torch.nn.Linear(4, 1)
            local.load_state_dict(model.state_dict())
            local(x).sum().backward()
            ddp = DistributedDataParallel(model)
            ddp(x).sum().backward()
            assert model.weight.grad is not None and local.weight.grad is not None
            return {"grad": model.weight.grad.tolist(), "local": local.weight.grad.tolist()}
        finally:
            dist.destroy_process_group()

    @endpoint
    def all_reduce(self, value: float) -> dict[str, Any]:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        try:
            t = torch.tensor([value])
            dist.all_reduce(t)
            return {
                "sum": float(t.item()),
                "rank": dist.get_rank(),
                "world": dist.get_world_size(),
                "node": os.environ.get("SLURMD_NODENAME", ""),
                "master": os.environ["MASTER_ADDR"],
            }
        finally:
            dist.destroy_process_group()
