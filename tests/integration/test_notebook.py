"""A real Jupyter kernel (ipykernel, driven by nbclient) runs danaus from notebook cells:
``.get()`` in plain cells, ``await`` in cells that await, mixed across cells."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[2]

CELLS = [
    # setup
    """import asyncio
import torch
import danaus
from danaus import Accumulator, Channel, this_host
from tests.integration.exec_actors import Holder, Sender, Worker""",
    # spawn, with .get() in plain cells
    """procs = this_host().spawn_procs(per_host={"procs": 2})
w = procs.spawn("w", Worker)
w.initialized.get()""",
    """assert w.incr.call(5).get().values() == [5, 5]
one = w.slice(procs=0)
assert one.incr.call_one(1).get() == 6""",
    # await in a cell that awaits
    """assert (await one.incr.call_one(1)) == 7""",
    # a call made by a plain cell, awaited by the next one
    """pending = w.slice(procs=1).incr.call_one(1)""",
    """assert (await pending) == 6""",
    # every adverb, both ways
    """assert sorted(w.aget.call().get().values()) == [6, 7]
assert w.aget.choose().get() in (6, 7)
assert sorted(f.get() for f in w.aget.stream()) == [6, 7]
w.incr.broadcast(1)
assert Accumulator(w.aget, 0, lambda a, b: a + b).accumulate().get() == 7 + 8""",
    """assert sorted((await w.aget.call()).values()) == [7, 8]
assert (await w.aget.choose()) in (7, 8)
assert sorted([v async for v in w.aget.stream()]) == [7, 8]
assert sorted([await f for f in w.aget.stream()]) == [7, 8]  # Monarch's way
assert (await Accumulator(w.aget, 0, lambda a, b: a + b).accumulate()) == 15""",
    # ports
    """port, recv = Channel.open()
sender = procs.spawn("s", Sender)
sender.slice(procs=0).send_to.call_one(port, 41).get()
assert recv.recv().get() == 41""",
    """await sender.slice(procs=1).send_to.call_one(port, 42)
assert (await recv.recv()) == 42""",
    # RDMA transfers
    """holder = procs.slice(procs=1).spawn("h", Holder)
buf = holder.buffer.call_one(64).get()
dst = torch.zeros(64, dtype=torch.uint8)
buf.read_into(dst).get()
assert dst.tolist() == list(range(64))""",
    """dst2 = torch.zeros(64, dtype=torch.uint8)
await buf.read_into(dst2)
assert torch.equal(dst, dst2)""",
    # .get() refuses only where it would deadlock: in a coroutine of the kernel's loop,
    # on a future of that same loop
    """async def blocks_its_own_loop():
    return one.aget.call_one().get()

try:
    await blocks_its_own_loop()
except danaus.DeadlockError as e:
    assert "use `await`" in str(e)
else:
    raise AssertionError(".get() on the kernel loop's own future did not refuse")""",
    # a plain statement's call runs on danaus's background loop: .get() and await both work
    """fut = one.aget.call_one()
assert fut.get() == 8 and (await fut) == 8""",
    # stop with .get()
    """procs.stop().get()
print("stopped")""",
]


def _run(cells: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Run ``cells`` in a real kernel (a kernel spec of our own: this interpreter,
    whatever other kernels the machine has); the cells, with their outputs."""
    spec = tmp_path / "kernels" / "danaus-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "danaus test",
                "language": "python",
            }
        )
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    old = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}{os.pathsep}{old}" if old else str(ROOT))
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name="danaus-test", resources={"metadata": {"path": str(ROOT)}}
    )
    client.execute()
    return list(nb.cells)


@pytest.mark.slow
def test_a_notebook_drives_meshes_with_get_and_await_in_any_mix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    last = _run(CELLS, tmp_path, monkeypatch)[-1].outputs
    assert any("stopped" in out.get("text", "") for out in last), last


#: Lightning and launch from a notebook: a LightningModule and a function defined in
#: cells (pickled by value), trained on the procs of a mesh
TRAINING_CELLS = [
    """import os, warnings
import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from danaus import this_host
from danaus.lightning import DanausStrategy
from danaus.spmd import launch
warnings.filterwarnings("ignore")
procs = this_host().spawn_procs(per_host={"gpus": 2})""",
    """class Fit(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)
    def training_step(self, batch, idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

x = torch.randn(32, 4)
module = Fit()
before = module.net.weight.detach().clone()
trainer = L.Trainer(strategy=DanausStrategy(procs), accelerator="cpu", devices=2,
                    max_epochs=2, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(module, DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4))
assert trainer.global_step == 8 and not torch.equal(before, module.net.weight)""",
    """def world():
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    return int(os.environ["RANK"]), float(t)

got = await launch(world, procs)
print("launched", got.values())""",
    """procs.stop().get()""",
]


@pytest.mark.slow
def test_lightning_and_launch_from_a_notebook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("lightning")
    cells = _run(TRAINING_CELLS, tmp_path, monkeypatch)
    text = "".join(out.get("text", "") for out in cells[2].outputs)
    assert "launched [(0, 2.0), (1, 2.0)]" in text, cells[2].outputs
