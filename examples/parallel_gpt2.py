"""Whole-model parallelism: hand danaus a GPT-2 and four procs; it measures, plans the
split, and trains it.

Run with ``python examples/parallel_gpt2.py`` (``--dp 2 --pp 2`` to force a layout,
``--memory-mib 8`` to give each proc less memory than a whole replica needs).
The model is built from its config: no weights are downloaded.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Iterator

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from danaus import this_host
from danaus.parallel import parallelize, plan


def adamw(params: Iterator[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3)


async def main(args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=8, n_embd=128, n_head=4, vocab_size=1024, bos_token_id=0, eos_token_id=0
    )
    model = GPT2LMHeadModel(config)
    # a toy corpus: the next token is the previous one plus one, so the loss falls fast
    start = torch.randint(0, 1024, (args.batch, 1))
    ids = (start + torch.arange(64)) % 1024
    batch = {"input_ids": ids, "labels": ids}

    async with this_host().spawn_procs(per_host={"procs": args.procs}) as procs:
        t = time.perf_counter()
        memory = args.memory_mib * 2**20 if args.memory_mib else None
        p = await plan(model, procs, sample=batch, dp=args.dp, pp=args.pp, memory_per_proc=memory)
        print(f"planned in {time.perf_counter() - t:.1f} s\n{p}\n")
        trainer = parallelize(model, procs, p, optimizer=adamw)
        for step in range(args.steps):
            t = time.perf_counter()
            loss = await trainer.step(batch)
            print(f"step {step}: loss {loss:.4f} ({(time.perf_counter() - t) * 1e3:.0f} ms)")
        held = await trainer.held_bytes()
        print("held per proc (MiB):", [round(h["total"] / 2**20, 2) for h in held])
        state = await trainer.state_dict()
        model.load_state_dict(state)  # the trained weights, back in the plain model
        await trainer.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--dp", type=int, default=None)
    parser.add_argument("--pp", type=int, default=None)
    parser.add_argument("--memory-mib", type=float, default=None)
    asyncio.run(main(parser.parse_args()))
