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
            f"{real * 1e3:.1f} ms: {simulated / real:.2f}x (peak {m['peak_bytes'] / 2**20:.0f} "
            f"MiB a worker, simulated)"
        )


if __name__ == "__main__":
    main()
