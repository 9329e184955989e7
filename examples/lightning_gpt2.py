"""A LightningModule trained on a danaus mesh: a small GPT-2 (built from its config, no
download) learns to count, first in the layout the planner chooses, then as a two-stage
pipeline with two replicas of each stage (dp=2 x pp=2), which Lightning alone cannot run.

Run with ``python examples/lightning_gpt2.py`` (``--steps 30``, ``--batch 16``). The
LightningModule is plain Lightning; only the strategy names danaus::

    procs = this_host().spawn_procs(per_host={"gpus": 4})
    trainer = L.Trainer(strategy=DanausStrategy(procs, plan="auto"), max_steps=30)
    trainer.fit(module, loader)
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from danaus import this_host
from danaus.lightning import DanausStrategy

VOCAB = 64


class CountingLM(L.LightningModule):
    """GPT-2 on rows that count up from a random token (modulo the vocabulary)."""

    def __init__(self, layers: int = 4) -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        config = GPT2Config(
            n_layer=layers, n_embd=64, n_head=4, n_positions=32, vocab_size=VOCAB,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )  # fmt: skip
        self.model = GPT2LMHeadModel(config)

    def training_step(self, batch: dict[str, torch.Tensor], idx: int) -> torch.Tensor:
        loss = self.model(**batch).loss
        self.log("train_loss", loss, prog_bar=True)
        return loss  # type: ignore[no-any-return]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.model.parameters(), lr=3e-3)


def counting_rows(n: int, seq: int = 16, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, VOCAB, (n, 1), generator=g)
    ids = (starts + torch.arange(seq)) % VOCAB
    return [{"input_ids": r, "labels": r} for r in ids]


def train(procs: Any, steps: int, batch: int, **layout: Any) -> tuple[list[float], Any]:
    module = CountingLM()
    losses: list[float] = []

    class Record(L.Callback):
        def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
            losses.append(float(trainer.callback_metrics["train_loss"]))

    strategy = DanausStrategy(procs, **layout)
    trainer = L.Trainer(
        strategy=strategy, accelerator="cpu", max_steps=steps, logger=False,
        enable_checkpointing=False, enable_model_summary=False, callbacks=[Record()],
    )  # fmt: skip
    rows = counting_rows(steps * batch)
    loader: DataLoader[Any] = DataLoader(rows, batch_size=batch, drop_last=True)  # type: ignore[arg-type]
    trainer.fit(module, loader)
    return losses, strategy.plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*does not have many workers")
    with this_host().spawn_procs(per_host={"gpus": 4}) as procs:
        for layout in ({"plan": "auto"}, {"dp": 2, "pp": 2}):
            losses, plan = train(procs, args.steps, args.batch, **layout)
            name = ", ".join(f"{k}={v!r}" for k, v in layout.items())
            print(
                f"DanausStrategy(procs, {name}): {plan.strategy}, loss {losses[0]:.3f} -> "
                f"{losses[-1]:.3f} in {len(losses)} steps",
                flush=True,
            )


if __name__ == "__main__":
    main()
