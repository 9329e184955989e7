"""Fine-tune a small Hugging Face causal LM on padded text with danaus: the model is
built from its config (no download), the data set is made up here, and ``fit`` trains
it over four procs with a progress bar.

Run with ``python examples/finetune_hf.py`` (``--family qwen2`` for another family:
llama, qwen2, mistral, gemma, phi3; ``--dp 2 --pp 2`` or ``--tp 2`` to force a layout,
``--precision bf16``, ``--checkpointing auto``, ``--compile``, ``--steps 40``). Each example is a prompt and its
answer, padded to the longest in its batch; the loss counts the answers only (the
prompt and the padding are labelled -100), as instruction tuning does.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Iterator

import torch
from torch import nn

from danaus import this_host
from danaus.parallel import parallelize, plan

PAD = 0
WORDS = [f"w{i}" for i in range(1, 200)]


def make_dataset(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """Prompt/answer pairs of different lengths: the prompt counts up a few words from
    a random one, the answer goes on counting (a rule a small model learns in a few
    dozen steps)."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        start, asked, answered = (
            rng.randrange(len(WORDS) - 20),
            rng.randint(2, 8),
            rng.randint(2, 8),
        )
        words = WORDS[start : start + asked + answered]
        pairs.append((" ".join(words[:asked]), " ".join(words[asked:])))
    return pairs


def tokenize(text: str) -> list[int]:
    """A made-up tokenizer: one id per word (a real one comes with the model)."""
    return [int(w[1:]) for w in text.split()]


def collate(pairs: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    """A padded batch as a Hugging Face collator makes it: right padding, the mask 0 on
    it, the labels -100 on the prompt and the padding."""
    rows = [(tokenize(p), tokenize(a)) for p, a in pairs]
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((len(rows), width), PAD)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    labels = torch.full((len(rows), width), -100)
    for r, (p, a) in enumerate(rows):
        n = len(p) + len(a)
        ids[r, :n] = torch.tensor(p + a)
        mask[r, :n] = 1
        labels[r, len(p) : n] = torch.tensor(a)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def batches(
    pairs: list[tuple[str, str]], size: int, epochs: int
) -> Iterator[dict[str, torch.Tensor]]:
    rng = random.Random(1)
    for _ in range(epochs):
        order = pairs[:]
        rng.shuffle(order)
        for i in range(0, len(order) - size + 1, size):
            yield collate(order[i : i + size])


def build(family: str) -> nn.Module:
    torch.manual_seed(0)
    if family != "gpt2":  # any causal LM Hugging Face builds from a config
        from transformers import AutoConfig, AutoModelForCausalLM

        model: nn.Module = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            AutoConfig.for_model(
                family, num_hidden_layers=4, hidden_size=128, intermediate_size=256,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=256,
                max_position_embeddings=64, pad_token_id=PAD, bos_token_id=PAD,
                eos_token_id=PAD,
            )
        )  # fmt: skip
        return model
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(
        GPT2Config(
            n_layer=4, n_embd=128, n_head=4, vocab_size=256, n_positions=64,
            bos_token_id=PAD, eos_token_id=PAD,
        )
    )  # fmt: skip


def adamw(params: Iterator[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=2e-3)


async def main(args: argparse.Namespace) -> None:
    model = build(args.family)
    pairs = make_dataset(512)
    sample = collate(pairs[: args.batch])
    async with this_host().spawn_procs(per_host={"procs": args.procs}) as procs:
        t = time.perf_counter()
        p = await plan(
            model, procs, sample=sample, dp=args.dp, pp=args.pp, tp=args.tp,
            precision=args.precision, checkpointing=args.checkpointing, compile=args.compile,
        )  # fmt: skip
        print(f"planned in {time.perf_counter() - t:.1f} s\n{p}\n", flush=True)
        trainer = parallelize(model, procs, p, optimizer=adamw)
        losses = await trainer.fit(batches(pairs, args.batch, epochs=100), steps=args.steps)
        k = min(5, len(losses))
        print(
            f"mean loss of the first {k} steps {sum(losses[:k]) / k:.4f}, "
            f"of the last {k} {sum(losses[-k:]) / k:.4f} (step {len(losses)})"
        )
        print("losses:", " ".join(f"{v:.3f}" for v in losses))
        model.load_state_dict(await trainer.state_dict())  # the trained weights, here
        await trainer.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--family", choices=["gpt2", "llama", "qwen2", "mistral", "gemma", "phi3"], default="gpt2"
    )
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--dp", type=int, default=None)
    parser.add_argument("--pp", type=int, default=None)
    parser.add_argument("--tp", type=int, default=None)
    parser.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    parser.add_argument(
        "--checkpointing",
        type=lambda s: {"on": True, "off": False, "auto": None}[s],
        default=False,
        metavar="{on,off,auto}",
        help="activation checkpointing; auto: the planner decides per stage",
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile each block")
    asyncio.run(main(parser.parse_args()))
