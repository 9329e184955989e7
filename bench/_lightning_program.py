"""One measurement of bench/bench_lightning.py, in a process of its own:
``python -m bench._lightning_program MODE OUT`` prints its result as JSON (a module of
its own so that ``ddp_spawn`` can pickle the LightningModule by name)."""

from __future__ import annotations

import json
import statistics
import sys
import time
import warnings
from typing import Any

import lightning as L
import torch
from torch import nn

from bench.bench_lightning import BATCH, DIM, STEPS, WARM


class MLP(L.LightningModule):
    """Four tanh layers of ``DIM``; rank 0 writes its median step time to ``out``."""

    def __init__(self, out: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = nn.Sequential(
            *(m for _ in range(4) for m in (nn.Linear(DIM, DIM), nn.Tanh())),
            nn.Linear(DIM, 1),
        )
        self.out = out
        self.stamps: list[float] = []

    def training_step(self, batch: Any, idx: int) -> Any:
        x, y = batch
        return nn.functional.mse_loss(self.model(x), y)

    def on_train_batch_end(self, *args: Any) -> None:
        self.stamps.append(time.perf_counter())

    def on_train_end(self) -> None:
        if self.global_rank == 0:
            _write(self.out, self.stamps)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _write(out: str, stamps: list[float]) -> None:
    gaps = [b - a for a, b in zip(stamps[WARM:], stamps[WARM + 1 :], strict=False)]
    with open(out, "w") as f:
        json.dump({"step_s": statistics.median(gaps)}, f)


def _data(per_rank: int) -> Any:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    g = torch.Generator().manual_seed(0)
    x = torch.randn(STEPS * BATCH, DIM, generator=g)
    return DataLoader(TensorDataset(x, x[:, :1]), batch_size=per_rank, drop_last=True)


def _trainer(strategy: Any, **kw: Any) -> Any:
    import lightning as L

    return L.Trainer(
        strategy=strategy, accelerator="cpu", max_steps=STEPS, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        **kw,
    )  # fmt: skip


def one(mode: str, out: str) -> dict[str, float]:
    """One measurement in this process: the step time (rank 0's median), and the time of
    ``fit`` with its ranks' start (``ddp_spawn`` starts them in ``fit``; the procs here
    are spawned in the time measured)."""
    warnings.filterwarnings("ignore")
    from danaus import this_host
    from danaus.lightning import DanausStrategy

    result: dict[str, float] = {}
    if mode == "ddp_spawn":
        t = time.perf_counter()
        _trainer("ddp_spawn", devices=2).fit(MLP(out), _data(BATCH // 2))
        result["fit_s"] = time.perf_counter() - t
    elif mode in ("danaus", "danaus-plan", "parallelize"):
        t = time.perf_counter()
        with this_host().spawn_procs(per_host={"gpus": 2}) as procs:
            procs.logging_option(stream_to_client=False)
            if mode == "danaus":
                _trainer(DanausStrategy(procs), devices=2).fit(MLP(out), _data(BATCH // 2))
            elif mode == "danaus-plan":
                mse = nn.functional.mse_loss
                _trainer(DanausStrategy(procs, dp=2, loss_fn=mse)).fit(MLP(out), _data(BATCH))
            else:
                _parallelize(procs, MLP(out).model, out)
            result["fit_s"] = time.perf_counter() - t
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    with open(out) as f:
        result.update(json.load(f))
    return result


def _parallelize(procs: Any, model: Any, out: str) -> None:
    import torch

    from danaus.parallel import parallelize, plan

    batches = list(_data(BATCH))
    p = plan(model, procs, sample=tuple(batches[0]), loss_fn=torch.nn.functional.mse_loss, dp=2)
    trainer = parallelize(
        model, procs, p.get(), optimizer=lambda ps: torch.optim.SGD(ps, lr=0.01),
        loss_fn=torch.nn.functional.mse_loss,
    )  # fmt: skip
    stamps = []
    for batch in batches:
        trainer.step(tuple(batch)).get()
        stamps.append(time.perf_counter())
    trainer.stop().get()
    _write(out, stamps)


if __name__ == "__main__":
    print(json.dumps(one(sys.argv[1], sys.argv[2])))
