"""LightningModules for tests/integration/test_lightning.py (a module of its own, so that
procs import it by name when a pickled trainer refers to it)."""

from __future__ import annotations

import os
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    """A small MLP fitted by SGD; logs ``train_loss``, ``val_loss`` and ``test_loss``."""

    def __init__(self, fail_rank: int = -1, fail_step: int = -1, how: str = "raise") -> None:
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # type: ignore[no-any-return]

    def training_step(self, batch: Any, idx: int) -> torch.Tensor:
        if (
            self.global_rank == self.hparams.fail_rank
            and self.global_step == self.hparams.fail_step
        ):
            if self.hparams.how == "kill":
                import signal

                os.kill(os.getpid(), signal.SIGKILL)  # the proc is lost
            raise ValueError(f"rank {self.global_rank} fails at step {self.global_step} on purpose")
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch: Any, idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def test_step(self, batch: Any, idx: int) -> None:
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def predict_step(self, batch: Any, idx: int) -> tuple[int, torch.Tensor]:
        return int(os.environ.get("RANK", "0")), self.net(batch[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def regression_data(batch_size: int, rows: int = 64, seed: int = 0) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 8, generator=g)
    y = x[:, :1] * 0.5 - x[:, 1:2] + 0.1 * torch.randn(rows, 1, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size)


def fit_by_hand(module: Regressor, loader: DataLoader[Any], epochs: int) -> None:
    """The plain loop a DDP run must equal: SGD on each global batch, in one process. The
    rows come in the order Lightning's DDP deals them out (a ``DistributedSampler``
    shuffled with seed 0 and the epoch): the global batch of a step is the rows the
    ranks' batches of that step hold together."""
    from torch.utils.data import DistributedSampler

    opt = module.configure_optimizers()
    order = DistributedSampler(loader.dataset, num_replicas=1, rank=0, shuffle=True, seed=0)
    loader = DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=order)
    for epoch in range(epochs):
        order.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            nn.functional.mse_loss(module.net(x), y).backward()
            opt.step()


class CausalLM(L.LightningModule):
    """A Hugging Face causal LM (built from a config) whose loss is the model's own;
    ``penalty`` adds an L2 term to it, which a plan's schedule cannot run."""

    def __init__(self, model: nn.Module, penalty: float = 0.0) -> None:
        super().__init__()
        self.model = model
        self.penalty = penalty

    def training_step(self, batch: dict[str, torch.Tensor], idx: int) -> torch.Tensor:
        loss = self.model(**batch).loss
        if self.penalty:
            loss = loss + self.penalty * sum(p.pow(2).sum() for p in self.model.parameters())
        self.log("train_loss", loss, prog_bar=True)
        return loss  # type: ignore[no-any-return]

    def validation_step(self, batch: dict[str, torch.Tensor], idx: int) -> None:
        self.log("val_loss", self.model(**batch).loss)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        from .parallel_models import adamw  # (eps 1e-6: see there)

        return adamw(self.model.parameters())


def lm_rows(n: int, seq: int = 16, seed: int = 1) -> list[dict[str, torch.Tensor]]:
    """``n`` rows of a fine-tuning batch (padded, ``-100`` labels on padding and prompt),
    each a dict (a DataLoader stacks them)."""
    from .parallel_models import padded_lm_batch

    batch = padded_lm_batch(n, seq, seed)
    return [{k: v[i] for k, v in batch.items()} for i in range(n)]
