"""A torchrun-style DDP training script (CPU, gloo): runs unchanged under torchrun,
``danaus run`` and as one plain process (no torchrun variables: world of one).

Each rank trains on its shard of a fixed global batch per step; gradients are averaged
by DDP, so every run ends with the same weights as one process on the whole batch.
``--fsdp`` shards the model with FSDP2 (``fully_shard``) instead. ``--out FILE`` writes rank 0's final weights and losses as JSON; ``--fail-rank R`` makes
rank R raise at step 3; ``--time`` prints the mean step time.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--time", action="store_true")
    p.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard) instead of DDP")
    p.add_argument("--nccl", action="store_true", help="NCCL on GPU LOCAL_RANK (else gloo, CPU)")
    args = p.parse_args()
    distributed = "RANK" in os.environ
    device = torch.device("cpu")
    if args.nccl:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if distributed:
        dist.init_process_group("nccl" if args.nccl else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    torch.manual_seed(0)
    model: nn.Module = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).to(device)
    if distributed and args.fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif distributed:
        ids = [device.index] if args.nccl else None
        model = nn.parallel.DistributedDataParallel(model, device_ids=ids)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1)
    losses = []
    times = []
    for step in range(args.steps):
        x = torch.randn(args.batch, 8, generator=data)
        y = x.sum(dim=1, keepdim=True).sin()
        x, y = x.to(device), y.to(device)
        if step == 3 and rank == args.fail_rank:
            raise RuntimeError(f"rank {rank} fails at step {step} on purpose")
        t = time.perf_counter()
        xs, ys = x[rank::world], y[rank::world]
        loss = ((model(xs) - ys) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t)
        losses.append(float(loss.detach()))
    if args.time and rank == 0:
        print(f"step_time_us={1e6 * sum(times[2:]) / len(times[2:]):.1f}", flush=True)
    state = model.state_dict()
    if args.fsdp and distributed:  # every rank takes part in gathering the shards
        state = {k: v.full_tensor() for k, v in state.items()}
    if args.out and rank == 0:
        weights = {k: v.flatten().cpu().tolist() for k, v in state.items()}
        weights = {k.removeprefix("module."): v for k, v in weights.items()}
        with open(args.out, "w") as f:
            json.dump({"weights": weights, "losses": losses, "world": world}, f)
    if distributed:
        dist.barrier()  # gloo may abort ("terminate called") if a peer tears down mid-op
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
