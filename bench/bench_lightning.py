"""Lightning on a mesh: ``DanausStrategy(procs)`` against Lightning's own ``ddp_spawn`` on
2 ranks (the floor: the same module, data and steps, in the same run), per training step
and for a whole ``fit``; and a plan's step from Lightning's loop
(``DanausStrategy(procs, dp=2)``) against the same plan's ``Trainer.step`` called
directly (the floor: what the Lightning loop adds).

Each measurement is a fresh process (``bench/_lightning_program.py``), alternated twice,
best kept: the machine is shared and noisy. ``OMP_NUM_THREADS=1`` for every rank.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

STEPS = 60
WARM = 10  # steps left out of the step time (start-up, first allocations)
BATCH = 64  # the global batch: 32 rows a rank
DIM = 256


def _measure(mode: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.json")
        r = subprocess.run(
            [sys.executable, "-m", "bench._lightning_program", mode, out],
            capture_output=True, text=True, timeout=600,
            env=dict(os.environ, PYTHONPATH=os.getcwd(), OMP_NUM_THREADS="1"),
        )  # fmt: skip
        if r.returncode != 0:
            raise RuntimeError(f"{mode}: {r.stderr[-3000:]}")
        return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def main() -> None:
    modes = ("ddp_spawn", "danaus", "parallelize", "danaus-plan")
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for _ in range(2):
        for m in modes:
            runs[m].append(_measure(m))
    best = {m: {k: min(r[k] for r in rs) for k in rs[0]} for m, rs in runs.items()}
    ours, theirs = best["danaus"], best["ddp_spawn"]
    print(
        f"Lightning DDP step, 2 ranks (MLP {DIM}x4, batch {BATCH}): DanausStrategy "
        f"{ours['step_s'] * 1e3:.2f} ms vs ddp_spawn {theirs['step_s'] * 1e3:.2f} ms: "
        f"{ours['step_s'] / theirs['step_s']:.2f}x"
    )
    print(
        f"spawning 2 ranks and trainer.fit of {STEPS} steps: DanausStrategy "
        f"{ours['fit_s']:.2f} s vs ddp_spawn {theirs['fit_s']:.2f} s: "
        f"{ours['fit_s'] / theirs['fit_s']:.2f}x"
    )
    plan, direct = best["danaus-plan"], best["parallelize"]
    print(
        f"a plan's step (dp=2) from Lightning's loop {plan['step_s'] * 1e3:.2f} ms vs "
        f"Trainer.step called directly {direct['step_s'] * 1e3:.2f} ms: "
        f"{plan['step_s'] / direct['step_s']:.2f}x"
    )


if __name__ == "__main__":
    main()
