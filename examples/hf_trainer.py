"""A Hugging Face ``transformers.Trainer`` on a danaus mesh, launched from this script (or
a notebook cell) with ``danaus.spmd.launch``: every proc runs ``train()`` with the
variables torchrun would set, so the Trainer runs data parallel over them exactly as
under ``torchrun --nproc-per-node 4``. A small GPT-2 (built from its config, no download)
learns to count.

Run with ``python examples/hf_trainer.py`` (``--procs 2``, ``--steps 30``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any

from danaus import this_host
from danaus.spmd import launch

VOCAB = 64


def train(steps: int, global_batch: int) -> dict[str, Any]:
    """Runs on every rank: a Trainer over this rank's share of each global batch."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=32, vocab_size=VOCAB)
    model = GPT2LMHeadModel(config)
    g = torch.Generator().manual_seed(1)
    starts = torch.randint(0, VOCAB, (steps * global_batch, 1), generator=g)
    rows = (starts + torch.arange(16)) % VOCAB
    data = [{"input_ids": r, "labels": r} for r in rows]
    world = int(os.environ["WORLD_SIZE"])
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out, per_device_train_batch_size=global_batch // world,
            max_steps=steps, learning_rate=3e-3, logging_steps=10, report_to=[],
            use_cpu=True, save_strategy="no", disable_tqdm=True, seed=0,
        )  # fmt: skip
        trainer = Trainer(model=model, args=args, train_dataset=data)
        trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"rank": int(os.environ["RANK"]), "world": world, "losses": losses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=16, help="the global batch")
    a = parser.parse_args()
    with this_host().spawn_procs(per_host={"gpus": a.procs}) as procs:
        results = launch(train, procs, a.steps, a.batch).get()
    first = results.item(gpus=0)
    print(f"trained on {first['world']} ranks; the loss every 10 steps: {first['losses']}")


if __name__ == "__main__":
    main()
