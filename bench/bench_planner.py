"""The planner's search alone, on recorded (hand-made) costs: the seconds ``choose``
takes for meshes of 4 to 4,096 simulated procs, for a model of 32 blocks and a global
batch of 1,024 rows. The floor is the same search for 4 procs, measured in the same run.
Target (issue 40): at most 1 s at every size."""

from __future__ import annotations

import time

from danaus.parallel._planner import candidates, choose
from danaus.parallel._profile import MeshFacts, ModelCost, PartCost

BLOCKS, BATCH = 32, 1024
SIZES = [4, 16, 64, 256, 1024, 4096]
MiB = 2**20


def cost() -> ModelCost:
    """A Llama-like model: 32 equal blocks of 200 MiB of weights, made-up times."""
    sizes = [s for s in range(1, BATCH + 1) if BATCH % s == 0]

    def part(t: float, params: int) -> PartCost:
        return PartCost(
            time_s={s: t * s / BATCH for s in sizes},
            act_bytes={s: 64 * MiB * s // BATCH for s in sizes},
            out_bytes={s: 16 * 1024 * s for s in sizes},
            param_bytes=params,
        )

    return ModelCost(
        blocks=[part(0.5, 200 * MiB) for _ in range(BLOCKS)],
        embed=part(0.1, 500 * MiB),
        head=part(0.2, 500 * MiB),
        opt_ratio=2.0,
        opt_s_per_byte=1e-11,
        threads=1,
    )


def mesh(n: int) -> MeshFacts:
    return MeshFacts(
        procs=n,
        procs_per_host=min(n, 8),
        cores_per_host=64,
        memory_per_proc=80 * 2**30,
        bandwidth=25e9,
        latency_s=5e-6,
        collective_bw=100e9,
        collective_latency_s=20e-6,
        gather_s_per_byte=1e-11,
        scatter_s_per_byte=1e-11,
    )


def search_s(n: int, c: ModelCost) -> tuple[float, int]:
    """Seconds of the search for ``n`` procs (the best of 3), and the layouts weighed."""
    tp_ok = [t for t in (1, 2, 4, 8) if n % t == 0]
    best = float("inf")
    weighed = 0
    for _ in range(3):
        t = time.perf_counter()
        cands = list(candidates(n, BATCH, BLOCKS, can_pipeline=True, tp_ok=tp_ok))
        choose(c, mesh(n), batch=BATCH, cands=cands, layers=None)
        best = min(best, time.perf_counter() - t)
        weighed = len(cands)
    return best, weighed


def main() -> None:
    c = cost()
    floor, _ = search_s(SIZES[0], c)
    print(f"the planner's search on recorded costs ({BLOCKS} blocks, batch {BATCH}):")
    for n in SIZES:
        s, weighed = search_s(n, c)
        print(
            f"{n:>6} procs: {s * 1e3:8.1f} ms for {weighed:>5} layouts "
            f"({s / floor:6.1f}x the 4-proc search; target <= 1 s: "
            f"{'met' if s <= 1.0 else 'MISSED'})"
        )


if __name__ == "__main__":
    main()
