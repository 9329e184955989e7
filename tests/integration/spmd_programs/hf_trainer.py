"""A Hugging Face ``Trainer`` on a tiny GPT-2 built from a config (no weights are
downloaded): ``train()`` is what ``danaus.spmd.launch`` runs on every rank; run as a
script (under torchrun) it writes rank 0's result as JSON to ``--out``."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import Any


def train(steps: int = 6, fail_rank: int = -1) -> dict[str, Any]:
    """Train for ``steps`` steps of a global batch of 8 rows; the loss curve, the world
    size, and a checksum of the weights."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=97, n_positions=32)
    model = GPT2LMHeadModel(config)
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, 97, (16,), generator=g) for _ in range(64)]
    data = [{"input_ids": r, "labels": r} for r in rows]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=8 // world,
            max_steps=steps,
            learning_rate=1e-3,
            logging_steps=1,
            report_to=[],
            use_cpu=True,
            seed=0,
            data_seed=0,
            save_strategy="no",
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = Trainer(model=model, args=args, train_dataset=data)
        if rank == fail_rank:
            raise RuntimeError(f"rank {rank} fails before training on purpose")
        trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    total = sum(float(p.detach().double().sum()) for p in model.parameters())
    return {"world": world, "rank": rank, "losses": losses, "weights_sum": total}


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=6)
    a = p.parse_args()
    result = train(a.steps)
    if result["rank"] == 0:
        with open(a.out, "w") as f:
            json.dump(result, f)
