"""``ParallelWorker``: one actor per proc that holds its piece of the model and trains it.

The controller spawns one per proc after ``danaus.spmd`` has set torchrun's environment
there; each joins ``torch.distributed`` (gloo on CPU, NCCL on GPUs), builds a
``DeviceMesh`` of ``(dp, pp, tp)``, and wraps its piece with torch's own libraries:
``parallelize_module`` for tensor parallel, a ``torch.distributed.pipelining`` stage and
schedule for pipelines, ``DistributedDataParallel`` for replicas. Every step is one call
from the controller to every worker.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..actors import Actor, current_rank, endpoint
from ._layout import Layout
from ._model import LossFn, ModelParts, StageModule, split_batch

OptimizerFactory = Callable[[Iterator[nn.Parameter]], torch.optim.Optimizer]

#: how long a collective may wait for a peer before the rank gives up (s)
COLLECTIVE_TIMEOUT = 120.0


def device() -> torch.device:
    """This proc's device: its local GPU where there is one, else the CPU."""
    if torch.cuda.is_available():
        return torch.device(
            "cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        )
    return torch.device("cpu")


def set_threads() -> None:
    """On CPU, share the host's cores between its procs instead of oversubscribing them."""
    if torch.cuda.is_available():
        return
    cores = len(os.sched_getaffinity(0))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, cores // max(1, local)))


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes this proc holds of ``t`` (its local shard for a DTensor)."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return int(local.numel() * local.element_size())


def optimizer_state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes of an optimizer's state tensors held here (its moments; step counts aside)."""
    return sum(
        tensor_bytes(v)
        for state in opt.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor) and v.dim() > 0
    )


def tied_params(model: nn.Module, parts: ModelParts) -> list[tuple[str, str]]:
    """Pairs (embed-part name, head-part name) of one parameter used in both parts."""
    names: dict[int, str] = {}
    for prefix in parts.embed_paths:
        for n, p in model.get_submodule(prefix).named_parameters():
            names[id(p)] = f"{prefix}.{n}"
    pairs = []
    for prefix in parts.head_paths:
        for n, p in model.get_submodule(prefix).named_parameters():
            if id(p) in names:
                pairs.append((names[id(p)], f"{prefix}.{n}"))
    return pairs


def tp_plan() -> dict[str, Any]:
    """Megatron-style plan for a Llama block: q/k/v and gate/up column-wise,
    o and down row-wise (one all-reduce after attention, one after the MLP)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(),
    }


class ParallelWorker(Actor):
    """Holds this proc's piece of a model (a stage, a tensor-parallel shard, a replica),
    its optimizer, and runs steps on it."""

    def __init__(self) -> None:
        self.layout: Layout | None = None
        self.module: nn.Module | None = None

    @endpoint
    def setup(
        self,
        model: nn.Module,
        parts: ModelParts,
        layout: Layout,
        loss_fn: LossFn | None,
        optimizer: OptimizerFactory,
    ) -> None:
        """Join the process group and build this proc's piece, its wrappers and optimizer."""
        set_threads()
        self.layout = layout
        self.parts = parts
        self.rank = current_rank().rank
        self.dp_i, self.pp_i, self.tp_i = layout.coords(self.rank)
        self.device = device()
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        if not dist.is_initialized():
            dist.init_process_group(backend, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT))
        from torch.distributed.device_mesh import init_device_mesh

        self.mesh = init_device_mesh(
            self.device.type, (layout.dp, layout.pp, layout.tp), mesh_dim_names=("dp", "pp", "tp")
        )
        loss = loss_fn if loss_fn is not None else parts.default_loss(model)
        if loss is None:
            raise ValueError("the model has no loss of its own: give loss_fn=")
        self.loss_fn: LossFn = loss
        self._tied_groups(model, parts, layout)
        first, last = layout.stages[self.pp_i]
        module: nn.Module
        if layout.pp > 1:
            module = parts.stage_module(model, first, last)
        elif parts.can_pipeline:  # the same code path as a pipeline's: output, not a dict
            module = StageModule(model, parts, first, last)
        else:
            module = model
        blocks_owner = module.model if isinstance(module, StageModule) else module
        module.to(self.device)
        if layout.tp > 1:
            self._tensor_parallel(blocks_owner, parts, first, last)
        self.inner = module
        if layout.dp > 1:
            module = self._replicate(module, layout)
        self.module = module
        self.optimizer = optimizer(iter(module.parameters()))
        self.schedule: Any = None
        if layout.pp > 1:
            self._pipeline(module, layout)

    def _tied_groups(self, model: nn.Module, parts: ModelParts, layout: Layout) -> None:
        """A process group of the first and last stage of each pipeline, for the weights
        they share (GPT-2's embedding and head): their grads are summed after backward."""
        self.tied: list[tuple[str, str]] = []
        self.tied_group: Any = None
        if layout.pp == 1:
            return
        self.tied = tied_params(model, parts)
        if not self.tied:
            return
        for dp_i in range(layout.dp):  # every rank takes part in creating every group
            for tp_i in range(layout.tp):
                ranks = [layout.rank(dp_i, 0, tp_i), layout.rank(dp_i, layout.pp - 1, tp_i)]
                group = dist.new_group(ranks)
                if self.rank in ranks:
                    self.tied_group = group

    def _replicate(self, module: nn.Module, layout: Layout) -> nn.Module:
        """Data parallel over the ``dp`` dim: FSDP2 (``fully_shard``) where the plan shards
        (and under pipelines and tensor parallel, which DDP does not compose with), DDP
        otherwise."""
        if layout.sharded or layout.pp > 1 or layout.tp > 1:
            from torch.distributed.fsdp import fully_shard

            # ZeRO-3 where the plan shards for memory; ZeRO-2 (weights kept whole between
            # forward and backward) where it only composes with pp/tp
            fully_shard(module, mesh=self.mesh["dp"], reshard_after_forward=layout.sharded)
            return module
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(module, process_group=self.mesh["dp"].get_group())

    def _tensor_parallel(self, owner: nn.Module, parts: ModelParts, first: int, last: int) -> None:
        from torch.distributed.tensor.parallel import parallelize_module

        blocks = parts.blocks(owner)
        for i in range(first, last + 1):
            parallelize_module(blocks[i], self.mesh["tp"], tp_plan())

    def _pipeline(self, module: nn.Module, layout: Layout) -> None:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        self.stage = PipelineStage(
            module, self.pp_i, layout.pp, self.device, group=self.mesh["pp"].get_group()
        )
        kind = Schedule1F1B if layout.schedule == "1f1b" else ScheduleGPipe
        self.schedule = kind(self.stage, n_microbatches=layout.microbatches, loss_fn=self.loss_fn)

    # --- steps ----------------------------------------------------------------------------

    def _local(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """This replica's share of the global batch (the controller sends it whole)."""
        assert self.layout is not None
        inputs, target = split_batch(batch)
        n = inputs.shape[0] // self.layout.dp
        sl = slice(self.dp_i * n, (self.dp_i + 1) * n)
        return inputs[sl].to(self.device), target[sl].to(self.device)

    def _reports_loss(self) -> bool:
        assert self.layout is not None
        return self.pp_i == self.layout.pp - 1 and self.tp_i == 0

    @endpoint
    def step(self, batch: Any) -> float | None:
        """One training step on this replica's share; the mean loss where this rank
        computes it (the last stage's first tensor-parallel rank), else None."""
        assert self.layout is not None and self.module is not None
        inputs, target = self._local(batch)
        self.module.train()
        self.optimizer.zero_grad(set_to_none=True)
        if self.schedule is not None:
            losses: list[torch.Tensor] = []
            last = self.pp_i == self.layout.pp - 1
            args = (inputs,) if self.pp_i == 0 else ()
            self.schedule.step(*args, target=target if last else None, losses=losses)
            self._sum_tied_grads()
            loss = float(torch.stack(losses).detach().mean()) if last else None
        else:
            loss = self._accumulate(inputs, target)
        self.optimizer.step()
        return loss if self._reports_loss() else None

    def _accumulate(self, inputs: torch.Tensor, target: torch.Tensor) -> float:
        """Forward and backward over the microbatches (gradient accumulation); DDP
        reduces the gradients on the last one."""
        assert self.layout is not None and self.module is not None
        m = self.layout.microbatches
        total = 0.0
        for k, (x, y) in enumerate(zip(inputs.chunk(m), target.chunk(m), strict=True)):
            with self._grad_sync(k == m - 1):
                loss = self.loss_fn(self.module(x), y) / m
                loss.backward()  # type: ignore[no-untyped-call]
            total += float(loss.detach())
        return total

    def _grad_sync(self, sync: bool) -> Any:
        """Replicas reduce gradients on the last microbatch only."""
        from torch.distributed.fsdp import FSDPModule
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(self.module, FSDPModule):
            self.module.set_requires_gradient_sync(sync)
        elif isinstance(self.module, DistributedDataParallel) and not sync:
            return self.module.no_sync()
        return nullcontext()

    def _sum_tied_grads(self) -> None:
        if self.tied_group is None:
            return
        named = dict(self.inner.named_parameters())
        for a, b in self.tied:
            p = named.get(f"model.{a}", named.get(f"model.{b}"))
            if p is not None and p.grad is not None:
                grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                dist.all_reduce(grad, group=self.tied_group)

    @endpoint
    def evaluate(self, batch: Any) -> float | None:
        """The loss on this replica's share, without touching the weights."""
        assert self.layout is not None and self.module is not None
        inputs, target = self._local(batch)
        self.module.eval()
        with torch.no_grad():
            if self.schedule is not None:
                losses: list[torch.Tensor] = []
                last = self.pp_i == self.layout.pp - 1
                args = (inputs,) if self.pp_i == 0 else ()
                self.schedule.eval(*args, target=target if last else None, losses=losses)
                loss = float(torch.stack(losses).detach().mean()) if last else None
            else:
                m = self.layout.microbatches
                loss = (
                    sum(
                        float(self.loss_fn(self.module(x), y))
                        for x, y in zip(inputs.chunk(m), target.chunk(m), strict=True)
                    )
                    / m
                )
        return loss if self._reports_loss() else None

    @endpoint
    def state_dict(self) -> dict[str, torch.Tensor] | None:
        """This stage's weights under the model's own names, whole (tensor-parallel
        shards gathered); from the first replica only (the others hold the same)."""
        assert self.layout is not None
        out: dict[str, torch.Tensor] = {}
        prefix = "model." if isinstance(self.inner, StageModule) else ""
        ident = {n for n, m in self.inner.named_modules() if isinstance(m, nn.Identity) and n}
        for name, t in self.inner.state_dict().items():
            if any(name.startswith(i + ".") for i in ident):
                continue
            full = t.full_tensor() if hasattr(t, "full_tensor") else t  # a collective: all ranks
            if self.dp_i == 0 and self.tp_i == 0:
                out[name.removeprefix(prefix)] = full.detach().to("cpu").clone()
        return out if self.dp_i == 0 and self.tp_i == 0 else None

    @endpoint
    def held_bytes(self) -> dict[str, int]:
        """Bytes this proc holds: weights, gradients, optimizer state."""
        assert self.module is not None
        params = list(self.module.parameters())
        weights = sum(tensor_bytes(p) for p in params)
        grads = sum(tensor_bytes(p.grad) for p in params if p.grad is not None)
        opt = optimizer_state_bytes(self.optimizer)
        total = weights + grads + opt
        return {
            "rank": self.rank,
            "weights": weights,
            "grads": grads,
            "optimizer": opt,
            "total": total,
        }

    @endpoint
    def close(self) -> None:
        """Leave the process group (the trainer stops; the proc may host another)."""
        self.schedule = None
        self.module = None
        if dist.is_initialized():
            dist.destroy_process_group()


def timed(fn: Callable[[], Any]) -> float:
    """Seconds ``fn`` takes, with the device synchronized around it."""
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t
