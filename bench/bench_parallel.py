"""Whole-model parallelism: tokens/s of each strategy on 4 procs against the same model
trained in one process on the same global batch (the floor, measured in the same run),
the planner's estimated step against the measured one, and each proc's measured peak
memory (its resident high-water mark on CPU, fresh procs for each row): fp32 against
bf16, activation checkpointing off against on, torch.compile off against on."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch

from danaus import this_host
from danaus.parallel import parallelize, plan

PROCS = 4
BATCH, SEQ = 16, 64
STEPS = 8
STRATEGIES: list[tuple[str, dict[str, int]]] = [
    ("dp=4", {"dp": 4}),
    ("pp=4", {"pp": 4}),
    ("dp=2 x pp=2", {"dp": 2, "pp": 2}),
    ("tp=2 x dp=2", {"tp": 2, "dp": 2}),
    ("tp=4", {"tp": 4}),
    ("planner's choice", {}),
    # the same layout, one thing changed at a time
    ("dp=4 bf16", {"dp": 4, "bf16": 1}),  # the forward under autocast; weights stay fp32
    ("dp=4 ckpt", {"dp": 4, "ckpt": 1}),  # activation checkpointing: blocks recompute
    ("dp=4 compile", {"dp": 4, "compile": 1}),  # torch.compile (Inductor) per block
    ("pp=4 ckpt", {"pp": 4, "ckpt": 1}),
]


def _model() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        num_hidden_layers=8,
        hidden_size=256,
        intermediate_size=512,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=2048,
        max_position_embeddings=SEQ,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return LlamaForCausalLM(cfg)


def _adamw(ps: Iterator[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(ps, lr=1e-4)


def _batch() -> dict[str, torch.Tensor]:
    """A fine-tuning batch: rows of 16 to 64 tokens, right-padded, labels -100 on the
    padding."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 2048, (BATCH, SEQ), generator=g)
    lengths = torch.randint(SEQ // 4, SEQ + 1, (BATCH, 1), generator=g)
    mask = (torch.arange(SEQ) < lengths).long()
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask, "labels": labels}


def one_process(batch: dict[str, Any]) -> float:
    """Median seconds of a step of the same model in this process, on every core."""
    model = _model()
    opt = _adamw(model.parameters())
    times = []
    for i in range(STEPS + 2):
        t = time.perf_counter()
        opt.zero_grad()
        model(**batch).loss.backward()
        opt.step()
        if i >= 2:
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def _bytes_out() -> int:
    """Bytes this controller has written to its connections so far."""
    from danaus.actors._stats import proc_record
    from danaus.actors.seam import current_runtime

    return int(proc_record(current_runtime())["bytes_out"])


Row = tuple[str, float, float, str, float, int, int, float, float]


async def _row(name: str, dims: dict[str, int], batch: dict[str, Any]) -> Row:
    """One strategy on fresh procs (so that their high-water marks are its own)."""
    async with this_host().spawn_procs(per_host={"procs": PROCS}) as procs:
        p = await plan(
            _model(),
            procs,
            sample=batch,
            optimizer=_adamw,
            dp=dims.get("dp"),
            pp=dims.get("pp"),
            tp=dims.get("tp"),
            precision="bf16" if dims.get("bf16") else "fp32",
            checkpointing=bool(dims.get("ckpt")),
            compile=bool(dims.get("compile")),
        )
        trainer = parallelize(_model(), procs, p, optimizer=_adamw)
        for _ in range(2):  # set up, warm up (and compile)
            await trainer.step(batch)
        times = []
        before = _bytes_out()
        for _ in range(STEPS):
            t = time.perf_counter()
            await trainer.step(batch)
            times.append(time.perf_counter() - t)
        sent = (_bytes_out() - before) / STEPS
        held = await trainer.held_bytes()
        await trainer.stop()
    peak = max(h["peak"] for h in held)
    step = statistics.median(times)
    est, strategy, want = p.estimated_step_s, p.strategy, p.peak_bytes_per_proc
    return (name, step, est, strategy, sent, want, peak, p.profile_s, p.search_s)


async def strategies(batch: dict[str, Any]) -> list[Row]:
    return [await _row(name, dims, batch) for name, dims in STRATEGIES]


def main() -> None:
    batch = _batch()
    tokens = int(batch["attention_mask"].sum())
    rows = asyncio.run(strategies(batch))
    floor = one_process(batch)  # after the procs are gone: it has the cores to itself
    print(
        f"Llama, 8 layers, hidden 256, batch {BATCH}x{SEQ} padded ({tokens} tokens), AdamW, "
        f"fp32 unless the row says, CPU (gloo), "
        f"{PROCS} procs on {len(__import__('os').sched_getaffinity(0))} cores"
    )
    print(f"one process: {tokens / floor:,.0f} tokens/s ({floor * 1e3:.0f} ms/step)")
    whole = sum(t.numel() * t.element_size() for t in batch.values())
    for name, step, est, strategy, sent, peak, rss, profile_s, search_s in rows:
        print(
            f"{name:>17}: {tokens / step:>8,.0f} tokens/s ({step * 1e3:4.0f} ms/step), "
            f"{floor / step:.2f}x one process; planner estimated {est * 1e3:.0f} ms "
            f"(measured / estimated {step / est:.2f}); peak {rss / 2**20:.0f} MiB/proc "
            f"measured (resident), the training state and activations "
            f"{peak / 2**20:.1f} MiB estimated; the controller sent {sent / 1024:.0f} "
            f"KiB/step ({sent / whole:.2f}x the batch); planned in "
            f"{profile_s + search_s:.1f} s (measuring {profile_s:.1f} s, search "
            f"{search_s * 1e3:.0f} ms)"
            + (f" [chose {strategy}]" if name.startswith("planner's") else "")
        )


if __name__ == "__main__":
    main()
