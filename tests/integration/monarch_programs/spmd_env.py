"""A Monarch program using monarch.spmd: torch.distributed in actors (gloo, CPU)."""

import torch
import torch.distributed as dist
from monarch.actor import Actor, endpoint, this_host
from monarch.spmd import setup_torch_elastic_env


class Worker(Actor):
    @endpoint
    def all_reduce(self) -> float:
        dist.init_process_group("gloo")
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        dist.destroy_process_group()
        return float(t.item())


procs = this_host().spawn_procs(per_host={"gpus": 2})
setup_torch_elastic_env(procs)
print("all_reduce", list(procs.spawn("worker", Worker).all_reduce.call().get().values()))
procs.stop().get()
print("done")
