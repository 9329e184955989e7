"""Tensor-engine benchmark.

(1) Controller issue rate for a stream of 10,000 small elementwise ops on a 2-proc mesh
    (ops/s), and the per-op overhead against running the same ops locally.
(2) A 2,048 x 2,048 matmul per shard, end to end (issue, run, fetch 1 element back),
    against the same matmul run locally.
(3) A 3-layer MLP training step (forward, backward, AdamW step) on DTensors: the ATen ops
    it dispatches per second on the controller, against the same step run locally (its
    ATen ops counted the same way, by a dispatch mode).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from danaus import this_host

from ._stats import format_table


def main() -> None:
    from danaus.tensor_engine import inspect

    n = 10_000
    local = torch.ones(16)
    t = time.perf_counter()
    for _ in range(n):
        local = local + 1
    local_per_op = (time.perf_counter() - t) / n
    with this_host().spawn_procs(per_host={"procs": 2}, name="bench") as procs:
        with procs.activate():
            x = torch.ones(16) + 1  # warm: workers up, the op's first shape inference done
        inspect(x, procs=0)
        with procs.activate():
            x = torch.ones(16)
            t = time.perf_counter()
            for _ in range(n):
                x = x + 1
            issue = time.perf_counter() - t
        t2 = time.perf_counter()
        assert float(inspect(x, procs=1)[0]) == n + 1
        drain = time.perf_counter() - t2
        a = torch.randn(2048, 2048)
        for _ in range(2):
            a @ a  # warm
        t = time.perf_counter()
        a @ a
        mm_local = time.perf_counter() - t
        with procs.activate():
            m = torch.randn(2048, 2048)
            (m @ m)[0, 0]
        inspect(m, procs=0)
        times = []
        for _ in range(3):
            t = time.perf_counter()
            with procs.activate():
                r = (m @ m)[0, :1]
            inspect(r, procs=0)
            times.append(time.perf_counter() - t)
        mm_remote = sorted(times)[1]
    mlp_local, mlp_remote, n_ops = _mlp_step(procs_sizes={"procs": 2})
    rows = [
        {
            "figure": "controller issue rate, 10,000 elementwise ops",
            "value": f"{n / issue:,.0f} ops/s",
            "detail": f"{issue / n * 1e6:.1f} us/op issued vs {local_per_op * 1e6:.1f} us/op run locally; "
            f"workers finished {drain * 1e3:.0f} ms after the last issue",
            "target": ">= 20,000 ops/s; < 50 us/op",
        },
        {
            "figure": "2048x2048 matmul per shard (2 procs)",
            "value": f"{mm_remote * 1e3:.1f} ms",
            "detail": f"local {mm_local * 1e3:.1f} ms: ratio {mm_remote / mm_local:.2f} "
            "(2 shards share these 2 vCPUs)",
            "target": "",
        },
    ]
    rows.append(
        {
            "figure": "3-layer MLP training step (fwd+bwd+AdamW), 2 procs",
            "value": f"{n_ops / mlp_remote:,.0f} ops/s",
            "detail": f"{n_ops} ATen ops/step: {mlp_remote * 1e3:.1f} ms/step issued vs "
            f"{mlp_local * 1e3:.1f} ms/step locally ({n_ops / mlp_local:,.0f} ops/s): "
            f"ratio {mlp_remote / mlp_local:.1f}",
            "target": "",
        }
    )
    print(format_table(rows, ["figure", "value", "detail", "target"]))


def _mlp_step(procs_sizes: dict[str, int]) -> tuple[float, float, int]:
    """Seconds per training step issued on the mesh and run locally, and ATen ops per step."""
    from torch import nn
    from torch.utils._python_dispatch import TorchDispatchMode

    from danaus.tensor_engine import inspect

    class Count(TorchDispatchMode):  # type: ignore[no-untyped-call]
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            Count.n += 1
            return func(*args, **(kwargs or {}))

    def make() -> tuple[nn.Module, torch.optim.Optimizer]:
        m = nn.Sequential(
            nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)
        )
        return m, torch.optim.AdamW(m.parameters(), lr=1e-3)

    def step(m: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> Any:
        loss = ((m(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    steps = 20
    m, opt = make()
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    for _ in range(3):
        step(m, opt, x, y)
    with Count():  # type: ignore[no-untyped-call]
        step(m, opt, x, y)
    n_ops = Count.n

    def best(run: Any) -> float:  # best of 5 rounds: this machine's load varies
        times = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(steps):
                run()
            times.append((time.perf_counter() - t) / steps)
        return min(times)

    local = best(lambda: step(m, opt, x, y))
    m_local, opt_local, x_local, y_local = m, opt, x, y
    with this_host().spawn_procs(per_host=procs_sizes, name="bench_mlp") as procs:
        with procs.activate():
            m, opt = make()
            x, y = torch.randn(32, 64), torch.randn(32, 1)
            for _ in range(3):
                loss = step(m, opt, x, y)
        inspect(loss, procs=0)  # warm: workers up, shapes inferred
        with procs.activate():
            remote = best(lambda: step(m, opt, x, y))
            loss = step(m, opt, x, y)
        inspect(loss, procs=0)
    # again once the procs are gone: a proc still starting or stopping slows the first
    local = min(local, best(lambda: step(m_local, opt_local, x_local, y_local)))
    return local, remote, n_ops


if __name__ == "__main__":
    main()
