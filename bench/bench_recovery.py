"""Training through lost procs: what a snapshot costs a step at steady state (snapshots
every step, every 10, none: the floor, measured in the same run), and how long a
trainer takes from a SIGKILL to its next completed step, per layout and per
``on_lost_proc`` mode (against the step time measured on the same procs).

``python -m bench.bench_recovery``
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch

from danaus import this_host
from danaus.parallel import parallelize, plan

PROCS = 4
BATCH, SEQ = 16, 64
STEPS = 12
LAYOUTS: list[tuple[str, dict[str, Any]]] = [
    ("dp=4", {"dp": 4}),
    ("dp=2 x pp=2", {"dp": 2, "pp": 2}),
    ("tp=2 x dp=2", {"tp": 2, "dp": 2}),
]


def _model() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        n_layer=4, n_embd=128, n_head=4, n_positions=SEQ, vocab_size=2048,
        bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    return GPT2LMHeadModel(cfg)


def _adamw(ps: Iterator[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(ps, lr=1e-4)


def _batch(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 2048, (BATCH, SEQ), generator=g)
    return {"input_ids": ids, "labels": ids}


async def _steady(dims: dict[str, Any], mode: str) -> tuple[float, float]:
    """The median step (s) without a snapshot and with one, on the same trainer (a
    snapshot every other step): what a snapshot adds, measured beside its floor."""
    async with this_host().spawn_procs(per_host={"procs": PROCS}) as procs:
        p = await plan(_model(), procs, sample=_batch(0), **dims)
        trainer = parallelize(
            _model(), procs, p, optimizer=_adamw, on_lost_proc=mode, snapshot_every=2
        )
        await trainer.step(_batch(0))  # warm-up (and the first snapshot, at step 2)
        await trainer.step(_batch(1))
        plain: list[float] = []
        snapped: list[float] = []
        for i in range(2, 2 + 2 * STEPS):
            t = time.perf_counter()
            await trainer.step(_batch(i))
            (snapped if (i + 1) % 2 == 0 else plain).append(time.perf_counter() - t)
        await trainer.stop()
    return statistics.median(plain), statistics.median(snapped)


async def _recovery(dims: dict[str, Any], mode: str) -> tuple[float, float, dict[str, Any]]:
    """Seconds from a SIGKILL of rank 1 (between steps) to the next completed step; the
    median step before it; the recovery's record."""
    async with this_host().spawn_procs(per_host={"procs": PROCS}) as procs:
        p = await plan(_model(), procs, sample=_batch(0), **dims)
        trainer = parallelize(
            _model(), procs, p, optimizer=_adamw, on_lost_proc=mode, snapshot_every=4
        )
        times = []
        for i in range(6):  # a snapshot after step 4; steps 5, 6 to run again
            t = time.perf_counter()
            await trainer.step(_batch(i))
            times.append(time.perf_counter() - t)
        t = time.perf_counter()
        os.kill(trainer.procs.pids[1], signal.SIGKILL)
        await trainer.step(_batch(6))
        took = time.perf_counter() - t
        (record,) = await trainer.recoveries()
        await trainer.stop()
    return took, statistics.median(times[1:]), record


async def _main() -> None:
    print(f"GPT-2 (4 layers, 128 wide), batch {BATCH} x {SEQ}, on {PROCS} procs")
    print("\nsteady state: the median step with a snapshot against without (the floor),")
    print("on one trainer; a snapshot's cost spread over its steps, every 10 (the default)")
    print("and every step")
    for name, dims in LAYOUTS:
        for mode in ("respawn", "replan"):
            plain, snapped = await _steady(dims, mode)
            extra = max(0.0, snapped - plain)
            print(
                f"  {name:<12} {mode:<8} {plain * 1e3:6.1f} ms, with a snapshot "
                f"{snapped * 1e3:6.1f} ms ({snapped / plain:.2f}x): every 10 steps "
                f"+{extra / 10 / plain:.1%}, every step +{extra / plain:.1%}"
            )
    print("\nfrom SIGKILL to the next completed step (steps 5-6 since the snapshot run again)")
    for name, dims in LAYOUTS:
        for mode in ("respawn", "replan"):
            took, step, r = await _recovery(dims, mode)
            phases = ", ".join(f"{k} {v:.1f}" for k, v in r["seconds"].items())
            print(
                f"  {name:<12} {mode:<8} {took:5.1f} s = {took / step:5.0f} steps "
                f"(step {step * 1e3:.0f} ms; {phases} s; on {r['procs']} procs, {r['plan']})"
            )


def main() -> None:
    asyncio.run(_main())


if __name__ == "__main__":
    main()
