"""The tensor engine's simulator against a real mesh: the same DDP step (an MLP of three
768-wide layers, 512 rows, gradients averaged over dp) simulated with costs measured
here, and run on real procs (the floor: what it simulates, in the same run), per step.
``OMP_NUM_THREADS=1`` for the procs and the measuring alike."""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

D = 768
STEPS = 5


def _program(mesh: Any, steps: int) -> Any:
    import torch
    from torch import nn

    with mesh.activate():
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Linear(D, D), nn.ReLU(), nn.Linear(D, D), nn.ReLU(), nn.Linear(D, 1)
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(512, D), torch.randn(512, 1)
        for _ in range(steps):
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            for p in model.parameters():
                grad: Any = p.grad  # (a DTensor)
                grad.reduce_("dp", "avg")
            opt.step()
            opt.zero_grad()
    return loss


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    from danaus import this_host
    from danaus.tensor_engine import Simulator, inspect

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=UserWarning)
    for n in (1, 2, 4):
        # (warm, as the real run is: the controller's first commands cost it more)
        _program(Simulator(hosts=1, gpus=n, trace_path=None).mesh.rename(gpu="dp"), 1)
        sim = Simulator(hosts=1, gpus=n, trace_path=None)
        _program(sim.mesh.rename(gpu="dp"), STEPS)
        [m] = sim.summary()["meshes"]
        simulated = m["end_s"] / STEPS
        with this_host().spawn_procs(per_host={"dp": n}, env={"OMP_NUM_THREADS": "1"}) as procs:
            inspect(_program(procs, 1))  # (warm: the procs' first use)
            start = time.perf_counter()
            inspect(_program(procs, STEPS))
            real = (time.perf_counter() - start) / STEPS
        print(
            f"DDP step on {n} proc(s): simulated {simulated * 1e3:.1f} ms vs real "
            f"{real * 1e3:.1f} ms: {simulated / real:.2f}x"
        )
    _memory()


def _memory() -> None:
    """One step on one proc from cold: the simulated peak against the real proc's growth
    of resident memory to its high-water mark (which also holds the allocator's cache
    and the operations' own temporaries)."""
    from danaus import this_host
    from danaus.tensor_engine import Simulator, inspect

    from ._actors import Memory

    sim = Simulator(hosts=1, gpus=1, trace_path=None)
    _program(sim.mesh.rename(gpu="dp"), 1)
    simulated = sim.summary()["meshes"][0]["peak_bytes"]
    with this_host().spawn_procs(per_host={"dp": 1}, env={"OMP_NUM_THREADS": "1"}) as procs:
        memory = procs.spawn("memory", Memory)
        import torch

        with procs.activate():
            inspect(torch.zeros(1))  # (the engine's worker up)
        before = memory.status.call_one().get()
        inspect(_program(procs, 1))
        after = memory.status.call_one().get()
    real = after["VmHWM"] - before["VmRSS"]
    print(
        f"one step's peak memory on 1 proc: simulated {simulated / 2**20:.1f} MiB vs the "
        f"proc's resident growth {real / 2**20:.1f} MiB: {simulated / real:.2f}x"
    )


if __name__ == "__main__":
    main()
