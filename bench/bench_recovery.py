"""Training through lost procs: what keeping a copy of every rank's state after each
step costs a step at steady state (``respawn`` and ``replan`` keep the same copies;
against the same layout trained with ``on_lost_proc="fail"``, which keeps none: the
floor, measured in the same run, on the same procs, alternated), what an optional
snapshot (``snapshot_every=``) costs (every step, every 10), and how long a trainer
takes from a SIGKILL to its next completed step, per layout and per ``on_lost_proc``
mode (against the step time measured on the same procs).

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
    model = GPT2LMHeadModel(cfg)
    model.loss_type = "ForCausalLM"  # (named: no transformers warning)
    return model


def _adamw(ps: Iterator[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(ps, lr=1e-4)


def _batch(seed: int, rows: int = BATCH) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 2048, (rows, SEQ), generator=g)
    return {"input_ids": ids, "labels": ids}


async def _copies(dims: dict[str, Any], rows: int, rounds: int = 3) -> tuple[float, float]:
    """The median step (s) without copies (``fail``) and with them (``respawn``), on
    batches of ``rows``: one trainer after the other on the same procs, ``rounds`` times
    each, alternated."""
    times: dict[str, list[float]] = {"fail": [], "respawn": []}
    async with this_host().spawn_procs(per_host={"procs": PROCS}) as procs:
        p = await plan(_model(), procs, sample=_batch(0, rows), **dims)
        for _ in range(rounds):
            for mode in times:
                trainer = parallelize(_model(), procs, p, optimizer=_adamw, on_lost_proc=mode)
                for i in range(2):  # warm-up (the optimizer's state, the buffers' size)
                    await trainer.step(_batch(i, rows))
                for i in range(2, 2 + STEPS):
                    t = time.perf_counter()
                    await trainer.step(_batch(i, rows))
                    times[mode].append(time.perf_counter() - t)
                await trainer.stop()
    return statistics.median(times["fail"]), statistics.median(times["respawn"])


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
        trainer = parallelize(_model(), procs, p, optimizer=_adamw, on_lost_proc=mode)
        times = []
        for i in range(6):
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
    print("\nsteady state, respawn or replan: the median step keeping a copy of every rank's state")
    print("after each step, against the same layout keeping none (on_lost_proc='fail', the")
    print("floor), alternated on the same procs; the copy's cost is per step, so a step")
    print(f"of more tokens pays less of it (the last rows: batches of {4 * BATCH} x {SEQ})")
    rows = [(name, dims, BATCH) for name, dims in LAYOUTS]
    rows += [(name, dims, 4 * BATCH) for name, dims in LAYOUTS[1:]]
    for name, dims, n in rows:
        plain, kept = await _copies(dims, n)
        print(
            f"  {name:<12} batch {n:3d}: {plain * 1e3:6.1f} ms, with copies "
            f"{kept * 1e3:6.1f} ms ({kept / plain:.3f}x: {kept / plain - 1:+.1%})"
        )
    print("\nsteady state, an optional snapshot (snapshot_every=N, a fallback where the")
    print("copies are lost): the median step with one against without (the floor), on one")
    print("trainer; a snapshot's cost spread over its steps, every 10 and every step")
    for name, dims in LAYOUTS:
        plain, snapped = await _steady(dims, "replan")
        extra = max(0.0, snapped - plain)
        print(
            f"  {name:<12} {plain * 1e3:6.1f} ms, with a snapshot {snapped * 1e3:6.1f} ms "
            f"({snapped / plain:.2f}x): every 10 steps +{extra / 10 / plain:.1%}, "
            f"every step +{extra / plain:.1%}"
        )
    print("\nfrom SIGKILL of rank 1 after step 6 to the next completed step")
    for name, dims in LAYOUTS:
        for mode in ("respawn", "replan"):
            took, step, r = await _recovery(dims, mode)
            phases = ", ".join(f"{k} {v:.1f}" for k, v in r["seconds"].items())
            print(
                f"  {name:<12} {mode:<8} {took:5.1f} s = {took / step:5.0f} steps "
                f"(step {step * 1e3:.0f} ms; {phases} s; on {r['procs']} procs, {r['plan']}; "
                f"from the {r['restored_from']} of step {r['restored_step']}, "
                f"{r['rerun_steps']} run again)"
            )


def main() -> None:
    asyncio.run(_main())


if __name__ == "__main__":
    main()
