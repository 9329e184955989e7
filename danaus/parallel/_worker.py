"""``ParallelWorker``: one actor per proc that holds its piece of the model and trains it.

The controller spawns one per proc after ``danaus.spmd`` has set torchrun's environment
there; each joins ``torch.distributed`` (gloo on CPU, NCCL on GPUs), builds a
``DeviceMesh`` of ``(dp, pp, tp)``, and wraps its piece with torch's own libraries:
``parallelize_module`` for tensor parallel, a ``torch.distributed.pipelining`` stage and
schedule for pipelines, ``DistributedDataParallel`` for replicas. Every step is one call
from the controller to every worker.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import socket
import stat
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..actors import Actor, context, endpoint
from ..config import config
from . import _checkpoint, _tp
from ._copies import Copier, CopyPlan, Place, Places, fetch, roles
from ._errors import ROLLED_BACK
from ._layout import Layout, runs_fsdp
from ._model import (
    LossFn,
    ModelParts,
    Shard,
    StageModule,
    TokenLoss,
    counted_tokens,
    shard_batch,
    split_batch,
)
from ._staging import Staged
from ._staging import fetch as fetch_shard

OptimizerFactory = Callable[[Iterator[nn.Parameter]], torch.optim.Optimizer]

#: how long a collective may wait for a peer before the rank gives up (s)
COLLECTIVE_TIMEOUT = 120.0
#: pipeline schedules kept, one per shape of batch (see ParallelWorker._schedule)
SCHEDULES = 8


def device() -> torch.device:
    """This proc's device: its local GPU where there is one, else the CPU."""
    if torch.cuda.is_available():
        return torch.device(
            "cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        )
    return torch.device("cpu")


#: the dtype of each low precision
LOW = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: fp16's good steps after which the loss scale doubles (it starts at
#: ``config.fp16_loss_scale`` and halves at a step whose gradients overflow, which is
#: skipped): GradScaler's defaults
GROWTH_INTERVAL = 2000


def autocast(dev: torch.device, precision: str) -> Any:
    """The context a forward in ``precision`` runs in: autocast to bfloat16 for
    ``"bf16"``, to float16 for ``"fp16"``, nothing for ``"fp32"``."""
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(dev.type, dtype=LOW[precision])


def _low_precision_hook(dtype: torch.dtype) -> Callable[[Any, Any], Any]:
    """A DDP communication hook that averages each gradient bucket over the replicas in
    ``dtype`` (half the bytes of fp32), written back into the fp32 bucket. (Torch's own
    bf16 hook refuses anything but NCCL; this one runs on gloo too.)"""

    def hook(group: Any, bucket: Any) -> Any:
        buf: torch.Tensor = bucket.buffer()
        low = buf.to(dtype).div_(group.size())

        def back(fut: Any) -> torch.Tensor:
            buf.copy_(fut.value()[0])
            return buf

        return dist.all_reduce(low, group=group, async_op=True).get_future().then(back)

    # DDP checks the hook's annotations as objects (this module's are strings)
    hook.__annotations__ = {
        "group": Any,
        "bucket": dist.GradBucket,  # type: ignore[attr-defined]
        "return": torch.futures.Future[torch.Tensor],
    }
    return hook


class Autocast(nn.Module):
    """``module`` whose forward computes in ``precision`` (its weights, and so its
    gradients and optimizer state, stay as they are: fp32)."""

    def __init__(self, module: nn.Module, precision: str) -> None:
        super().__init__()
        self.inner = module
        self.precision = precision

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        dev = next(self.inner.parameters()).device
        with autocast(dev, self.precision):
            return self.inner(*args, **kwargs)


def checkpoint_blocks(owner: nn.Module, parts: ModelParts, first: int, last: int) -> None:
    """Wrap blocks ``first``..``last`` of ``owner`` (the model, or a stage's copy of it)
    in torch's ``checkpoint_wrapper`` (non-reentrant, keywords passed through): each
    keeps only its input for backward and runs its forward again there. State dict keys
    stay the model's own (the wrapper takes its prefix out)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    container: Any = owner.get_submodule(parts.blocks_path) if parts.blocks_path else owner
    for i in range(first, last + 1):  # (a ModuleList or a Sequential: see find_parts)
        container[i] = checkpoint_wrapper(container[i])


def compile_problem(dev: torch.device) -> str:
    """Why ``torch.compile`` cannot compile here, or ``""``: on CPU, Inductor builds C++
    and needs a compiler (``g++`` or ``$CXX``)."""
    if dev.type != "cpu":
        return ""
    try:
        from torch._inductor import cpp_builder

        cxx = cpp_builder.get_cpp_compiler()
    except Exception as e:  # (it raises its own kinds where none is found)
        return (
            "compile=True: torch.compile's Inductor needs a C++ compiler on CPU and found "
            f"none ({e}); install g++ (or set CXX), or train without compile"
        )
    return "" if cxx else "compile=True: torch.compile found no C++ compiler (install g++)"


def compile_blocks(owner: nn.Module, parts: ModelParts, first: int, last: int) -> None:
    """Compile blocks ``first``..``last`` of ``owner`` in place (``nn.Module.compile``:
    the parameters and state dict keys stay the model's own). Each block compiles when it
    first runs, and once more for the first batch of another length (then with the
    length left dynamic). Raises RuntimeError where there is no compiler."""
    problem = compile_problem(device())
    if problem:
        raise RuntimeError(problem)
    container: Any = owner.get_submodule(parts.blocks_path) if parts.blocks_path else owner
    for i in range(first, last + 1):
        container[i].compile()


def reset_peak(dev: torch.device) -> None:
    """Start counting :func:`peak_bytes` from now: CUDA's peak allocation, or on CPU the
    process's resident high-water mark (Linux's ``clear_refs``; where it cannot be
    reset, the count runs from the process's start)."""
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def release_memory() -> None:
    """Give memory this proc no longer uses back to the system: collect cycles, and on
    glibc trim malloc's heap (freed tensors under its mmap threshold, 32 MiB at most,
    stay in the heap, resident and charged to the proc's cgroup, until trimmed: a
    plan's measuring left 1.2-1.5 GiB so over four procs here)."""
    import gc

    from .._os import trim_malloc

    gc.collect()
    trim_malloc()


def peak_bytes(dev: torch.device) -> int:
    """The most bytes this proc has held at once since :func:`reset_peak`: on CUDA,
    torch's peak allocation on ``dev``; on CPU, the process's peak resident memory
    (everything: the interpreter, torch, the model, its activations)."""
    if dev.type == "cuda":
        return int(torch.cuda.max_memory_allocated(dev))
    hwm = proc_bytes("/proc/self/status", "VmHWM")
    if hwm is not None:
        return hwm
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def current_bytes(dev: torch.device) -> int:
    """What this proc holds now, as :func:`peak_bytes` counts it."""
    if dev.type == "cuda":
        return int(torch.cuda.memory_allocated(dev))
    return proc_bytes("/proc/self/status", "VmRSS") or 0


def proc_bytes(path: str, key: str) -> int | None:
    """The ``key:`` line of a Linux ``/proc`` file given in kB (``VmRSS`` of
    ``/proc/self/status``, ``MemAvailable`` of ``/proc/meminfo``), in bytes; None where
    the file or the line is not there."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(f"{key}:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def set_threads() -> None:
    """On CPU, share the host's cores between its procs instead of oversubscribing them."""
    if torch.cuda.is_available():
        return
    cores = len(os.sched_getaffinity(0))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, cores // max(1, local)))


def zero_loss(output: Any) -> torch.Tensor:
    """A loss of zero that depends on every floating-point tensor of ``output``: its
    backward runs the same path (and the same collectives) as a real loss's, with zero
    gradients."""
    from torch.utils._pytree import tree_leaves

    leaves = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor)]
    parts = [t.sum() * 0 for t in leaves if t.is_floating_point() and t.requires_grad]
    if not parts:
        return torch.zeros((), requires_grad=True)
    return torch.stack([_local(p) for p in parts]).sum()


def rng_state() -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """The CPU's and this proc's GPUs' random states (dropout's), to roll a step back."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return torch.random.get_rng_state(), cuda


def set_rng_state(state: tuple[torch.Tensor, list[torch.Tensor] | None]) -> None:
    cpu, cuda = state
    torch.random.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes this proc holds of ``t`` (its local shard for a DTensor)."""
    local = _local(t)
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


class ParallelWorker(Actor):
    """Holds this proc's piece of a model (a stage, a tensor-parallel shard, a replica),
    its optimizer, and runs steps on it."""

    def __init__(self) -> None:
        self.layout: Layout | None = None
        self.module: nn.Module | None = None
        #: what the proc held before the model came: on CPU its resident memory
        #: (the interpreter, torch), on CUDA what torch had allocated
        self.baseline = current_bytes(device())

    @endpoint
    def setup(
        self,
        model: nn.Module,
        parts: ModelParts,
        layout: Layout,
        loss_fn: LossFn | None,
        optimizer: OptimizerFactory,
        data: Callable[[int, int, int], Any] | None = None,
        tied: list[tuple[str, str]] | None = None,
        resume: str | None = None,
        copies: CopyPlan | None = None,
    ) -> Places:
        """Join the process group and build this proc's piece, its wrappers and optimizer;
        ``data(step, dp_rank, dp_size)``, where given, loads this replica's rows.

        ``model``: of a pipeline, only this proc's stage (:meth:`ModelParts.cut`); else
        the whole model. ``tied``: the weights the model shares between two names
        (:func:`tied_params`: a pipeline's first and last stage each hold one).
        ``resume``: a checkpoint's directory (:mod:`._checkpoint`), whose weights and
        optimizer state this rank's piece starts from. ``copies``: where this rank
        keeps a copy of its state after each step (:mod:`._copies`), and, where given,
        the peer whose copy it starts from (a lost proc's successor). Returns where its
        state lies in the model's whole tensors (:meth:`_places`)."""
        self.data = data
        set_threads()
        self.layout = layout
        self.parts = parts
        # its own rank (current_rank() is its place in the slice a stage was sent to)
        self.rank = context().actor_instance.rank.rank
        self.dp_i, self.pp_i, self.tp_i = layout.coords(self.rank)
        self.device = device()
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        before = _sockets()
        if not dist.is_initialized():
            dist.init_process_group(backend, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT))
        #: the process group this worker joined (left by :meth:`release`)
        self._world: Any = dist.group.WORLD
        from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

        names = ("dp", "pp", "tp")
        if layout.order:  # unlike procs, reordered so that each stage's are alike
            self.mesh = DeviceMesh(
                self.device.type, torch.tensor(layout.grid()), mesh_dim_names=names
            )
        else:
            self.mesh = init_device_mesh(
                self.device.type, (layout.dp, layout.pp, layout.tp), mesh_dim_names=names
            )
        own = parts.default_loss(model) if loss_fn is None else None
        loss = loss_fn if loss_fn is not None else own
        if loss is None:
            raise ValueError("the model has no loss of its own: give loss_fn=")
        self.loss_fn: LossFn = loss
        #: the model's own loss: a step's loss is the global batch's token mean (the sum
        #: over its counted labels over their count, however rows fall into replicas and
        #: microbatches); a loss_fn of the user's is averaged over them instead
        self.own_loss: TokenLoss | None = own
        self._counted = 0  # the global batch's counted labels, this step
        #: fp16: the loss is scaled up before backward (so small gradients do not
        #: flush to zero) and the gradients down after it; 1 otherwise, and in evaluate
        self.loss_scale = config.fp16_loss_scale if layout.precision == "fp16" else 1.0
        self._scale_now = 1.0
        self._good_steps = 0
        self.skipped_steps = 0
        #: the first error the user's code (the loss, ``data``) raised this step here
        self._user_error: Exception | None = None
        self._tied_groups(tied or [], layout)
        #: the connections its process groups opened (gloo's, their store's), which
        #: :meth:`release` shuts: gloo has no abort, and its groups outlive their
        #: destruction where anything still refers to them (a device mesh does)
        self._group_sockets = _opened_since(before)
        #: each tied weight's other name (a checkpoint may hold its state under either)
        self.aliases = {a: b for a, b in tied or []} | {b: a for a, b in tied or []}
        first, last = layout.stages[self.pp_i]
        module: nn.Module
        # a pipeline's stage (its piece, cut by the trainer), or a whole model run along
        # a pipeline's path (for its output)
        if layout.pp > 1 or parts.can_pipeline or parts.family == "hf":
            module = StageModule(model, parts, first, last)
        else:
            module = model
        blocks_owner = module.model if isinstance(module, StageModule) else module
        # the checkpoint's tensors (its metadata, read once)
        have = _checkpoint.tensors(resume) if resume is not None else {}
        if resume is not None:  # whole weights, before anything splits them
            mine = model.state_dict()
            saved = _checkpoint.read(resume, [f"model.{k}" for k in mine], have)
            model.load_state_dict({k: saved[f"model.{k}"] for k in mine})
            del saved, mine
        module.to(self.device)
        if layout.tp > 1:
            self._tensor_parallel(blocks_owner, parts, first, last)
        if layout.checkpointing and layout.checkpointing[self.pp_i]:
            checkpoint_blocks(blocks_owner, parts, first, last)
        if layout.compile:
            compile_blocks(blocks_owner, parts, first, last)
        self.inner = module
        if layout.precision != "fp32":
            module = Autocast(module, layout.precision)
        if layout.dp > 1:
            module = self._replicate(module, layout)
        self.module = module
        self.optimizer = optimizer(iter(module.parameters()))
        if resume is not None:
            self._load_optimizer(resume, have)
            if layout.precision == "fp16":  # the loss scale the checkpoint's run had reached
                counts = _checkpoint.meta(resume)
                saved_scale, good = counts.get("loss_scale"), counts.get("good_steps")
                if isinstance(saved_scale, (int, float)) and saved_scale > 0:
                    self.loss_scale = float(saved_scale)
                if isinstance(good, int) and good >= 0:  # (steps since it last grew)
                    self._good_steps = good
        #: the steps this rank's state has taken (counted as the controller counts
        #: them: a rolled-back step is none), and its copies' side, where it keeps them
        self.applied = 0 if copies is None else copies.start
        self.copier: Copier | None = None
        self._state_views: tuple[Any, dict[str, torch.Tensor], frozenset[str]] | None = None
        if copies is not None:
            self._keep_copies(copies)
        #: a pipeline's schedule per shape of a replica's batch, the most recent last:
        #: a stage sizes its buffers for the activations of the first step it runs
        self._schedules: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        release_memory()  # the model as it came (the message, what was cut away)
        reset_peak(self.device)
        return self._places()

    # --- checkpoints ----------------------------------------------------------------------

    def _named_params(self) -> list[tuple[str, nn.Parameter]]:
        """This proc's parameters in its optimizer's order, each under the model's own
        name (without the stage's ``model.``, the checkpoint wrapper's prefix)."""
        staged = isinstance(self.inner, StageModule)
        return [(own_name(name, staged), p) for name, p in self.inner.named_parameters()]

    def _own_layout(self, name: str, t: torch.Tensor, back: bool) -> torch.Tensor:
        """Tensor ``name`` (whole) from the layout the tensor-parallel plan split into
        the model's own (``back``), or from the model's own into the split one."""
        assert self.layout is not None
        if self.layout.tp == 1:
            return t
        p = self.parts
        turn = _tp.whole if back else _tp.split_layout
        return turn(name, t, p.tp_plan, p.blocks_path, self.layout.tp, p.family == "gpt2")

    def _load_optimizer(
        self, path: str, have: dict[str, tuple[tuple[int, ...], torch.dtype]]
    ) -> None:
        """The optimizer's state of each of this proc's parameters from the checkpoint at
        ``path`` (whole, in the model's own layout; ``have``: its tensors): each rank
        cuts its shard out."""
        from torch.distributed.tensor import DTensor, distribute_tensor

        by_param: dict[str, list[str]] = {}  # a parameter's name: its state's keys
        for k in have:
            if k.startswith("optim."):
                by_param.setdefault(k.removeprefix("optim.").rpartition(".")[0], []).append(k)
        params = self._named_params()
        # (a tied weight's state may be under its other name)
        keys = [by_param.get(n, by_param.get(self.aliases.get(n, n), [])) for n, _ in params]
        saved = _checkpoint.read(path, [k for ks in keys for k in ks], have)  # at once
        state: dict[int, dict[str, Any]] = {}
        for i, ((name, p), ks) in enumerate(zip(params, keys, strict=True)):
            got: dict[str, Any] = {}
            for key in ks:  # (none: a parameter the optimizer never stepped)
                t = saved.pop(key)
                if t.dim() > 0:  # a tensor of the parameter's shape (not Adam's step)
                    t = self._own_layout(name, t, back=False).to(self.device)
                    if isinstance(p, DTensor):
                        t = distribute_tensor(t, p.device_mesh, p.placements, src_data_rank=None)
                got[key.rpartition(".")[2]] = t
            if got:
                state[i] = got
        self._set_optimizer_state(state)

    # --- copies of the state in memory, for a lost proc's successor ------------------------

    def _keep_copies(self, copies: CopyPlan) -> None:
        """Start keeping a copy of this rank's state after each step, and of the state
        it starts from (DDP replicas hold the same state: the first two keep one for
        every rank; any other rank keeps its own, and its peer's keeper reads it),
        from the copy ``copies.restore`` names, where given."""
        assert self.layout is not None
        same, keeps, peer = roles(self.layout, self.rank, copies.stride)
        if copies.restore is not None:
            assert copies.source is not None
            self._load_copy(
                fetch(copies.source, copies.restore[self.rank], self.rank, copies.start)
            )
        self.copier = Copier(self.rank, copies.keepers, same if keeps else None, peer)
        # the state it starts from is a copy too: a proc lost before the first step
        # ends (or right after a recovery) is restored from it, with no step run again
        self.copier.after_step(self.applied, *self._own_state())

    def _own_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any], frozenset[str]]:
        """This rank's state as it lies here (no copy, no gather): its shards of the
        weights and buffers (``m.<name>``) and of the optimizer's state (``o.<i>.<key>``,
        ``i`` a parameter's place in the optimizer), its other values, and the names of
        its buffers (which a forward may change: copied at once). The tensors are views,
        looked up again only when the optimizer's state changes shape (its first step):
        the same dict each step, whose copy's layout the copier keeps."""
        opt = self.optimizer
        params = [p for g in opt.param_groups for p in g["params"]]
        states = [opt.state.get(p, {}) for p in params]
        key = tuple(
            (id(p), k, id(v) if isinstance(v, torch.Tensor) else None)
            for p, st in zip(params, states, strict=True)
            for k, v in st.items()
        )
        if self._state_views is None or self._state_views[0] != key:
            tensors = {f"m.{k}": _local(t) for k, t in self.inner.state_dict().items()}
            weights = {f"m.{k}" for k, _ in self.inner.named_parameters(remove_duplicate=False)}
            for i, st in enumerate(states):
                for k, v in st.items():
                    if isinstance(v, torch.Tensor):
                        tensors[f"o.{i}.{k}"] = _local(v)
            buffers = frozenset(k for k in tensors if k.startswith("m.") and k not in weights)
            self._state_views = (key, tensors, buffers)
        rest: dict[str, Any] = {"loss_scale": self.loss_scale, "good_steps": self._good_steps}
        for i, st in enumerate(states):
            for k, v in st.items():
                if not isinstance(v, torch.Tensor):
                    rest[f"o.{i}.{k}"] = v
        return self._state_views[1], rest, self._state_views[2]

    def _places(self) -> Places:
        """Where each tensor of this rank's copies lies in the model's whole tensors: for a
        re-plan, which builds them from every rank's copy (:func:`._copies.whole_state`)."""
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        assert self.layout is not None

        def place(t: torch.Tensor) -> Place | None:
            if not isinstance(t, DTensor):
                return None
            local, offset = compute_local_shape_and_global_offset(
                t.shape, t.device_mesh, t.placements
            )
            return tuple(t.shape), tuple(offset), tuple(local)

        staged = isinstance(self.inner, StageModule)
        model = {
            f"m.{k}": (own_name(k, staged), place(t)) for k, t in self.inner.state_dict().items()
        }
        params = tuple((name, place(p)) for name, p in self._named_params())
        return Places(self.rank, self.layout.tp, model, params)

    def _load_copy(self, saved: dict[str, Any]) -> None:
        """This rank's state from a copy of its predecessor's (:meth:`_own_state`, under
        the same layout)."""
        from torch.distributed.tensor import DTensor

        assert self.module is not None
        with torch.no_grad():
            for k, t in self.inner.state_dict().items():
                _local(t).copy_(saved[f"m.{k}"])
        params = list(self.module.parameters())  # the optimizer's order
        state: dict[int, dict[str, Any]] = {}
        for key, v in saved.items():
            if not key.startswith("o."):
                continue
            i, k = key[2:].split(".", 1)
            p = params[int(i)]
            if isinstance(v, torch.Tensor):  # (a count, Adam's step, stays on the CPU)
                v = v.to(self.device, copy=True) if v.dim() > 0 else v.clone()
                if v.dim() > 0 and isinstance(p, DTensor):
                    v = DTensor.from_local(v, p.device_mesh, p.placements, run_check=False)
            state.setdefault(int(i), {})[k] = v
        self._set_optimizer_state(state)
        self.loss_scale, self._good_steps = saved["loss_scale"], saved["good_steps"]

    def _set_optimizer_state(self, state: dict[int, dict[str, Any]]) -> None:
        """The optimizer's state, by each parameter's place in its order (its own
        hyperparameters kept: those of the optimizer given to ``parallelize``)."""
        whole = self.optimizer.state_dict()
        whole["state"] = state
        self.optimizer.load_state_dict(whole)

    @endpoint
    def save(self, path: str) -> dict[str, Any]:
        """Write this stage's weights and optimizer state, whole, into the checkpoint at
        ``path`` (every rank of the trainer calls it: it gathers shards, then DCP's save
        coordinates the writers). What the controller keeps beside them: this rank's
        fp16 loss scale. A write that fails (a full disk) fails on every rank, which
        all go on."""
        assert self.layout is not None
        with _quiet_gathers():
            state = self._gathered()
            owner = state is not None
            out = {f"model.{k}": v for k, v in (state or {}).items()}
            for name, p in self._named_params():
                for key, v in sorted(self.optimizer.state.get(p, {}).items()):
                    if not isinstance(v, torch.Tensor):
                        continue
                    full = v.full_tensor() if hasattr(v, "full_tensor") else v  # collective
                    if owner:
                        full = self._own_layout(name, full, back=True) if full.dim() else full
                        out[f"optim.{name}.{key}"] = full.detach().to("cpu").clone()
        _checkpoint.save(path, out)  # (a failure: every rank raises it, none waits)
        return {"rank": self.rank, "loss_scale": self.loss_scale, "good_steps": self._good_steps}

    def _tied_groups(self, tied: list[tuple[str, str]], layout: Layout) -> None:
        """A process group of the first and last stage of each pipeline, for the weights
        they share (``tied``: GPT-2's embedding and head): their grads are summed after
        backward."""
        self.tied: list[tuple[str, str]] = []
        self.tied_group: Any = None
        if layout.pp == 1:
            return
        self.tied = list(tied)
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
        low = LOW.get(layout.precision)
        if runs_fsdp(layout.dp, layout.pp, layout.tp, layout.sharded):
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            # ZeRO-3 where the plan shards for memory; ZeRO-2 (weights kept whole between
            # forward and backward) where it only composes with pp/tp. In a low
            # precision the weights are gathered and the gradients reduced in it (the
            # sharded weights and the optimizer stay fp32)
            fully_shard(
                module,
                mesh=self.mesh["dp"],
                reshard_after_forward=layout.sharded,
                mp_policy=MixedPrecisionPolicy(param_dtype=low, reduce_dtype=low),
            )
            return module
        from torch.nn.parallel import DistributedDataParallel

        # the gradients live in DDP's all-reduce buckets instead of beside them: one copy
        # of the gradients held, not two
        ddp = DistributedDataParallel(
            module, process_group=self.mesh["dp"].get_group(), gradient_as_bucket_view=True
        )
        if low is not None:  # the gradients' all-reduce in the low precision
            ddp.register_comm_hook(self.mesh["dp"].get_group(), _low_precision_hook(low))
        return ddp

    def _tensor_parallel(self, owner: nn.Module, parts: ModelParts, first: int, last: int) -> None:
        blocks = parts.blocks(owner)
        for i in range(first, last + 1):
            _tp.apply(blocks[i], self.mesh["tp"], parts.tp_plan)

    def _schedule(self, shape: tuple[int, ...]) -> Any:
        """The pipeline schedule for a replica's batch of ``shape`` (None without a
        pipeline). Sequence lengths change from batch to batch (each is padded to its
        longest row), and a stage sizes its buffers on the first step it runs: one
        schedule per shape, the ``SCHEDULES`` most recently used kept."""
        assert self.layout is not None and self.module is not None
        if self.layout.pp == 1:
            return None
        if shape in self._schedules:
            self._schedules.move_to_end(shape)
            return self._schedules[shape]
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        stage = PipelineStage(
            self.module, self.pp_i, self.layout.pp, self.device, group=self.mesh["pp"].get_group()
        )
        kind = Schedule1F1B if self.layout.schedule == "1f1b" else ScheduleGPipe
        schedule = kind(
            stage,
            n_microbatches=self.layout.microbatches,
            loss_fn=self._microbatch_loss,
            scale_grads=self.own_loss is None,  # a token mean's parts add up already
        )
        self._schedules[shape] = schedule
        if len(self._schedules) > SCHEDULES:
            self._schedules.popitem(last=False)
        return schedule

    # --- steps ----------------------------------------------------------------------------

    def _local(self, shard: Shard | Staged) -> tuple[Any, Any, dict[str, torch.Tensor]]:
        """What the controller sent this rank of its replica's rows (see
        :func:`shard_batch`), on this proc's device: inputs, target, the other inputs."""
        if isinstance(shard, Staged):  # a large shard: its bytes wait on the data plane
            shard = fetch_shard(shard, COLLECTIVE_TIMEOUT)

        def here(t: Any) -> Any:
            return t.to(self.device) if isinstance(t, torch.Tensor) else t

        kwargs = {k: here(v) for k, v in shard.kwargs.items()}
        return here(shard.inputs), here(shard.target), kwargs

    def _reports_loss(self) -> bool:
        assert self.layout is not None
        return self.pp_i == self.layout.pp - 1 and self.tp_i == 0

    def _microbatch_loss(self, output: Any, target: Any) -> torch.Tensor:
        """A microbatch's loss as backward takes it. The model's own: its counted labels'
        summed loss over the global batch's count, times dp (the replicas' gradients are
        averaged), so that the gradients add up to the global token mean's. A user's
        loss_fn: as it returns it (the schedule or the caller averages)."""
        assert self.layout is not None
        try:
            if self.own_loss is None:
                loss = self.loss_fn(output, target)
                if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                    raise TypeError(
                        f"loss_fn returned {type(loss).__name__}"
                        f"{tuple(loss.shape) if isinstance(loss, torch.Tensor) else ''}: "
                        "backward needs one number, a tensor of one element"
                    )
                return loss * self._scale_now
            loss = self.own_loss(output, target, num_items_in_batch=self._counted)
        except Exception as e:
            # the user's loss raised (a NaN check, a shape it refuses): backward still
            # runs, on a zero loss, so that every collective of the step is met; the
            # ranks then agree to roll the step back (see step)
            if self._user_error is None:
                self._user_error = e
            return zero_loss(output)
        return loss * (self.layout.dp * self._scale_now)

    def _reported(self, losses: list[torch.Tensor]) -> float:
        """This replica's part of the step's loss from its microbatches' losses: their
        sum over dp (the token mean's share), or their mean (a user's loss_fn)."""
        assert self.layout is not None
        total = math.fsum(float(v.detach()) for v in losses) / self._scale_now
        return total / self.layout.dp if self.own_loss is not None else total / len(losses)

    def _own_shard(self, step: int) -> tuple[Shard, int]:
        """This rank's shard of step ``step``, loaded here by ``data``, and the labels
        the global batch counts (the replicas' counts added up: a collective over dp)."""
        assert self.layout is not None and self.data is not None
        last = self.pp_i == self.layout.pp - 1
        try:
            rows = self.data(step, self.dp_i, self.layout.dp)
            shard = shard_batch(rows, 1, 0, self.pp_i == 0, last)
            counted = counted_tokens(split_batch(rows)[1]) if self.own_loss is not None else 0
        except Exception as e:  # the user's data raised, or gave rows that are no batch
            self._user_error = e
        # every rank learns whether any rank's data raised, before any of them computes
        self._agree(overflow=False)
        if self.own_loss is None:
            return shard, 0
        count = torch.tensor([counted], dtype=torch.int64)
        if self.layout.dp > 1:
            group = self.mesh["dp"].get_group()
            count = count.to(self.device)
            dist.all_reduce(count, group=group)
        return shard, int(count.item())

    @endpoint
    def step(
        self, shard: Shard | Staged | None, counted: int = 0, data_step: int | None = None
    ) -> float | None:
        """One training step on this rank's ``shard`` of a global batch whose labels
        count ``counted`` tokens in all (for the model's own loss), or on the shard
        ``data`` loads here for step ``data_step``. This replica's part of the loss
        where this rank computes it (the last stage's first tensor-parallel rank), else
        None."""
        return self._unless_lost(self._step, shard, counted, data_step)

    def _unless_lost(self, fn: Callable[..., float | None], *args: Any) -> float | None:
        """``fn(*args)``, a step or an evaluation. Where it raises other than a user's
        error (which every rank rolled back, and the worker goes on from), a peer was
        lost (gloo: "connection closed by peer") or this rank is broken: its process
        groups' connections are shut for writing at once, so that the ranks waiting in
        a collective for this one fail too, and so on, rather than each waiting for the
        collective's timeout (the groups themselves are left by :meth:`release`, which
        the trainer calls where it keeps the proc: leaving them here could wait on
        gloo's threads). The error's frames, which hold the model, go: its traceback is
        kept as text, in a note."""
        try:
            return fn(*args)
        except BaseException as e:
            if ROLLED_BACK in getattr(e, "__notes__", ()):
                raise
            text = "".join(traceback.format_exception(e)).rstrip()
            seen: set[int] = set()
            link: BaseException | None = e
            while link is not None and id(link) not in seen:  # (and those it came from)
                seen.add(id(link))
                link.__traceback__ = None
                link = link.__cause__ or link.__context__
            e.add_note(f"on rank {self.rank}, where it shut its process groups:\n{text}")
            failed = e
        self._shut_groups()
        raise failed

    def _shut_groups(self) -> None:
        """Shut this worker's process groups' connections for writing (gloo's, where the
        groups are still its own; NCCL's are never shut here)."""
        world = getattr(self, "_world", None)
        if world is not None and dist.is_initialized() and dist.group.WORLD is world:
            if dist.get_backend() == "gloo":
                _shut(self._group_sockets)

    def _step(
        self, shard: Shard | Staged | None, counted: int, data_step: int | None
    ) -> float | None:
        assert self.layout is not None and self.module is not None
        self._user_error = None
        rng = rng_state()
        try:
            if shard is None:
                assert data_step is not None
                shard, counted = self._own_shard(data_step)
            inputs, target, kwargs = self._local(shard)
            self._counted = counted
            self._scale_now = self.loss_scale
            self.module.train()
            self.optimizer.zero_grad(set_to_none=True)
            schedule = self._schedule(shard.shape)
            if schedule is not None:
                losses = self._through(schedule.step, inputs, target, kwargs)
                self._sum_tied_grads()
                loss = self._reported(losses) if losses is not None else None
            else:
                loss = self._accumulate(inputs, target, kwargs)
            if self._unscaled():
                self.optimizer.step()
        except _RolledBack:
            self.optimizer.zero_grad(set_to_none=True)
            set_rng_state(rng)  # dropout draws as if the step had never been sent
            self._raise_user_error()
            return None
        self.applied += 1
        if self.copier is not None:
            self.copier.after_step(self.applied, *self._own_state())
        return loss if self._reports_loss() else None

    def _agree(self, overflow: bool) -> bool:
        """Every rank learns whether any rank's fp16 gradients overflowed (True where
        one did) and whether any rank's user code raised this step (then every rank
        raises :class:`_RolledBack`, before any has changed its weights): one small
        all-reduce over the whole mesh."""
        flags = torch.tensor(
            [float(overflow), float(self._user_error is not None)], device=self.device
        )
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        if flags[1].item():
            raise _RolledBack
        return bool(flags[0].item())

    def _raise_user_error(self) -> None:
        """After a rolled-back step: this rank's own error, noted as rolled back (what
        the controller raises to the user); nothing where another rank's code raised."""
        e = self._user_error
        self._user_error = None
        if e is None:
            return
        e.add_note(ROLLED_BACK)
        raise e

    def _unscaled(self) -> bool:
        """fp16: the gradients scaled back down; False (the step to be skipped, the
        scale halved) where any rank's overflowed, which every rank learns, so that all
        skip it together. Where none did for ``GROWTH_INTERVAL`` steps, the scale
        doubles. In other precisions True, unless (in any precision) a user's error on
        any rank rolls the step back (:meth:`_agree`)."""
        assert self.module is not None and self.layout is not None
        if self.copier is not None:  # (the all-reduce below then says all copies are held)
            self.copier.wait_held()
        if self.layout.precision != "fp16":
            return not self._agree(overflow=False)
        inv = 1.0 / self._scale_now
        bad = torch.zeros((), device=self.device)
        for p in self.module.parameters():
            if p.grad is not None:
                g = _local(p.grad)
                g.mul_(inv)
                bad = torch.maximum(bad, (~torch.isfinite(g)).any().to(bad.dtype))
        if self._agree(overflow=bool(bad.item())):
            self.loss_scale /= 2
            self._good_steps = 0
            self.skipped_steps += 1
            self.optimizer.zero_grad(set_to_none=True)
            return False
        self._good_steps += 1
        if self._good_steps >= GROWTH_INTERVAL:
            self.loss_scale *= 2
            self._good_steps = 0
        return True

    def _through(
        self, run: Callable[..., Any], inputs: Any, target: Any, kwargs: dict[str, torch.Tensor]
    ) -> list[torch.Tensor] | None:
        """A pipeline schedule's ``step`` or ``eval`` on this stage's share: the first
        stage feeds the inputs, the last the target; every stage its other inputs. The
        microbatches' losses on the last stage, else None."""
        assert self.layout is not None
        last = self.pp_i == self.layout.pp - 1
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.pp_i == 0 else ()
        run(*args, target=target if last else None, losses=losses, **kwargs)
        return losses if last else None

    def _microbatches(
        self, inputs: torch.Tensor, target: Any, kwargs: dict[str, torch.Tensor]
    ) -> list[tuple[torch.Tensor, Any, dict[str, torch.Tensor]]]:
        assert self.layout is not None
        m = self.layout.microbatches
        chunks = {k: v.chunk(m) for k, v in kwargs.items()}
        return [
            (x, y, {k: c[i] for k, c in chunks.items()})
            for i, (x, y) in enumerate(zip(inputs.chunk(m), target.chunk(m), strict=True))
        ]

    def _accumulate(
        self, inputs: torch.Tensor, target: Any, kwargs: dict[str, torch.Tensor]
    ) -> float:
        """Forward and backward over the microbatches (gradient accumulation); DDP
        reduces the gradients on the last one."""
        assert self.layout is not None and self.module is not None
        m = self.layout.microbatches
        scale = 1 if self.own_loss is not None else m  # a user's loss: the mean of them
        losses = []
        for k, (x, y, kw) in enumerate(self._microbatches(inputs, target, kwargs)):
            with self._grad_sync(k == m - 1):
                loss = self._microbatch_loss(self.module(x, **kw), y) / scale
                loss.backward()  # type: ignore[no-untyped-call]
            losses.append(loss.detach() * scale)
        return self._reported(losses)

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
                dist.all_reduce(_local(p.grad), group=self.tied_group)

    @endpoint
    def evaluate(self, shard: Shard | Staged, counted: int = 0) -> float | None:
        """This replica's part of the loss on a global batch (as :meth:`step` gives
        it), without touching the weights."""
        return self._unless_lost(self._evaluate, shard, counted)

    def _evaluate(self, shard: Shard | Staged, counted: int) -> float | None:
        assert self.layout is not None and self.module is not None
        self._user_error = None
        inputs, target, kwargs = self._local(shard)
        self._counted = counted
        self._scale_now = 1.0
        self.module.eval()
        try:
            with torch.no_grad():
                schedule = self._schedule(shard.shape)
                if schedule is not None:
                    piped = self._through(schedule.eval, inputs, target, kwargs)
                    loss = self._reported(piped) if piped is not None else None
                else:
                    loss = self._reported(
                        [
                            self._microbatch_loss(self.module(x, **kw), y)
                            for x, y, kw in self._microbatches(inputs, target, kwargs)
                        ]
                    )
            self._agree(overflow=False)
        except _RolledBack:
            self._raise_user_error()
            return None
        return loss if self._reports_loss() else None

    @endpoint
    def state_dict(self) -> dict[str, torch.Tensor] | None:
        """This stage's weights under the model's own names, whole (tensor-parallel
        shards gathered); from the first replica only (the others hold the same)."""
        with _quiet_gathers():
            return self._gathered()

    def _gathered(self) -> dict[str, torch.Tensor] | None:
        assert self.layout is not None
        ident = {n for n, m in self.inner.named_modules() if isinstance(m, nn.Identity) and n}
        out: dict[str, torch.Tensor] = {}
        for name, t in self.inner.state_dict().items():
            if any(name.startswith(i + ".") for i in ident):
                continue
            full = t.full_tensor() if hasattr(t, "full_tensor") else t  # a collective: all ranks
            if self.dp_i == 0 and self.tp_i == 0:
                own = own_name(name, isinstance(self.inner, StageModule))
                full = self._own_layout(own, full, back=True)  # (GPT-2's Conv1D made Linear)
                out[own] = full.detach().to("cpu").clone()
        return out if self.dp_i == 0 and self.tp_i == 0 else None

    @endpoint
    def held_bytes(self) -> dict[str, int]:
        """Bytes this proc holds: weights, gradients, optimizer state, their total; and
        ``peak``, the most it has held at once since the trainer set up (see
        :func:`peak_bytes`: on CPU the whole process's resident memory), and
        ``baseline``, what it held before the model came (so ``peak - baseline`` is
        what training added); ``copies``, the bytes of the copies of its state it
        keeps for a lost proc's successor (:mod:`._copies`)."""
        assert self.module is not None
        params = list(self.module.parameters())
        weights = sum(tensor_bytes(p) for p in params)
        grads = sum(tensor_bytes(p.grad) for p in params if p.grad is not None)
        opt = optimizer_state_bytes(self.optimizer)
        total = weights + grads + opt
        return {
            "copies": 0 if self.copier is None else self.copier.nbytes(),
            "rank": self.rank,
            "weights": weights,
            "grads": grads,
            "optimizer": opt,
            "total": total,
            "peak": peak_bytes(self.device),
            "baseline": self.baseline,
        }

    @endpoint
    def release(self) -> None:
        """Let go of this rank's piece of the model, its optimizer and its process
        groups, keeping the copies of its state (which its keeper serves to the workers
        that take over): the trainer recovers from a lost proc and keeps this proc. The
        groups' connections are shut first (:meth:`_shut_groups`), so that a rank
        waiting in a collective for this one fails at once; the groups are then
        destroyed, and the proc is free for the recovery's new worker."""
        for name in ("module", "inner", "optimizer", "mesh", "tied_group", "_state_views"):
            if hasattr(self, name):
                setattr(self, name, None)
        if hasattr(self, "_schedules"):
            self._schedules.clear()
        self._shut_groups()
        world, self._world = getattr(self, "_world", None), None
        self._group_sockets = {}
        if world is not None and dist.is_initialized() and dist.group.WORLD is world:
            dist.destroy_process_group()
        del world
        gc.collect()

    @endpoint
    def close(self) -> None:
        """Leave the process groups (:meth:`release`) and free the copies' buffers (the
        trainer stops, or a recovery has read the copies; the proc may host another)."""
        self.release()  # (first: a rank waiting on this one fails at once)
        copier = getattr(self, "copier", None)
        if copier is not None:
            copier.close()
            self.copier = None


def _sockets() -> dict[int, int]:
    """This process's open sockets (any family): their descriptors, and each one's inode
    (which tells a descriptor closed and reused since). Empty where /proc has none."""
    out: dict[int, int] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in names:
        try:
            st = os.stat(f"/proc/self/fd/{name}")
        except OSError:  # (the listing's own descriptor, closed by now)
            continue
        if stat.S_ISSOCK(st.st_mode):
            out[int(name)] = st.st_ino
    return out


def _opened_since(before: dict[int, int]) -> dict[int, int]:
    """The TCP connections opened since ``before`` (:func:`_sockets`), but danaus's own:
    none accepted on this proc's listening port, none to a peer's (danaus's connections
    are TCP where its transport is; the ports alone tell them, whatever the hosts are
    called)."""
    from ..actors.seam import current_runtime

    rt = current_runtime()
    ports = _tcp_ports([rt.addr, *rt.conns])
    out = {}
    for fd, ino in _sockets().items():
        if before.get(fd) == ino:
            continue
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with sock:
            if sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                if sock.getsockname()[1] in ports or sock.getpeername()[1] in ports:
                    continue
            except OSError:  # (a listening socket: no peer, nothing to shut)
                continue
        out[fd] = ino
    return out


def _tcp_ports(addrs: list[str]) -> set[int]:
    """The ports of those of ``addrs`` that are ``tcp://HOST:PORT`` (any other, or one
    that does not parse, gives none)."""
    from ..actors.seam import parse_addr

    ports = set()
    for addr in addrs:
        with contextlib.suppress(ValueError):
            family, where = parse_addr(addr)
            if family == "tcp" and isinstance(where, tuple):
                ports.add(where[1])
    return ports


def _shut(sockets: dict[int, int]) -> None:
    """Shut these TCP connections (descriptor -> inode, as :func:`_opened_since` gave
    them) for writing, each where it is still the same socket: whoever waits on one at
    its other end fails at once ("connection closed by peer"), as if this process had
    exited, and so, once that end closes it, does whoever waits on it here. (Shut for
    reading too, gloo's own loop here fails, and aborts the process.)"""
    for fd, ino in sockets.items():
        try:
            if os.fstat(fd).st_ino != ino:
                continue
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with sock, contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)


def own_name(name: str, staged: bool) -> str:
    """A stage's (``staged``) or a model's name of a tensor, as the model itself names
    it (without the stage's ``model.``, the checkpoint wrapper's prefix)."""
    name = name.replace("._checkpoint_wrapped_module", "")
    return name.removeprefix("model.") if staged else name


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t``: a DTensor's local shard, else ``t``."""
    return t.to_local() if hasattr(t, "to_local") else t


@contextmanager
def _quiet_gathers() -> Iterator[None]:
    """Gathering a weight sharded over dp and tp takes two all-gathers, which DTensor
    warns of on every rank for every weight: a note on its own speed, which a user can
    do nothing about, silenced while this gathers."""
    quiet = logging.getLogger("torch.distributed.tensor._redistribute")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        yield
    finally:
        quiet.setLevel(level)


class _RolledBack(Exception):
    """Some rank's user code raised this step: every rank drops it (see ``_agree``)."""


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
